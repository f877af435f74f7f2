"""Running observation normalisation, shared by acting (numpy) and learning (TF).

Position-only observations (a pole angle of a few hundredths of a radian) carry velocity only in
the tiny differences between steps; scaling them to unit variance is what lets a recurrent core
read those differences quickly. Statistics are a running mean/variance over
every observation the training envs produced (Chan et al.'s parallel update); the networks hold
the current ``mean``/``std`` as non-trainable weights and apply ``clip((x - mean) / std, -clip, clip)``
to their first ``norm_dim`` input features. Replay keeps raw observations.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class ObsNormalizer:
    """Running mean and variance of ``[O]`` observations, pushed into networks that normalise."""

    def __init__(self, dim: int, eps: float = 1e-2) -> None:
        self.count = 0.0
        self.mean = np.zeros(dim, np.float64)
        self.m2 = np.zeros(dim, np.float64)
        self.eps = eps

    def update(self, batch: np.ndarray) -> None:
        """Fold a batch ``[N, O]`` into the statistics."""
        batch = np.asarray(batch, np.float64).reshape(-1, self.mean.shape[0])
        n = batch.shape[0]
        if n == 0:
            return
        b_mean = batch.mean(axis=0)
        b_m2 = ((batch - b_mean) ** 2).sum(axis=0)
        total = self.count + n
        delta = b_mean - self.mean
        self.mean = self.mean + delta * n / total
        self.m2 = self.m2 + b_m2 + delta**2 * self.count * n / total
        self.count = total

    @property
    def std(self) -> np.ndarray:
        """``[O]`` standard deviation, floored at ``eps`` (constant features are left unscaled)."""
        if self.count < 2:
            return np.ones_like(self.mean)
        return np.maximum(np.sqrt(self.m2 / self.count), self.eps)

    def push(self, networks: Iterable) -> None:
        """Write the current mean/std into every network that normalises its inputs."""
        mean, std = self.mean.astype(np.float32), self.std.astype(np.float32)
        for net in networks:
            if net.encoder.norm_dim:
                net.encoder.input_mean.assign(mean)
                net.encoder.input_std.assign(std)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint."""
        return {"count": np.array([self.count]), "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.count = float(state["count"][0])
        self.mean, self.m2 = state["mean"].copy(), state["m2"].copy()
