"""Running observation normalisation, shared by acting (numpy) and learning (TF).

Position-only observations (a pole angle of a few hundredths of a radian) carry velocity only in
the tiny differences between steps; scaling them to unit variance is what lets a recurrent core
read those differences quickly. Statistics are a running mean/variance over
every observation the training envs produced (Chan et al.'s parallel update), one set per vector
leaf (per feature) and per image leaf (per channel, over every pixel); discrete leaves are one-hot
and need none. The networks' encoders hold the current ``mean``/``std`` as non-trainable weights
and apply ``clip((x - mean) / std, -clip, clip)``. Replay keeps raw observations.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from envs.spaces import Leaf, Observation, vector_observation


class RunningMoments:
    """Running mean and variance of ``[N, D]`` samples."""

    def __init__(self, dim: int, eps: float = 1e-2) -> None:
        self.count = 0.0
        self.mean = np.zeros(dim, np.float64)
        self.m2 = np.zeros(dim, np.float64)
        self.eps = eps

    def update(self, batch: np.ndarray) -> None:
        """Fold a batch ``[N, D]`` into the statistics."""
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
        """``[D]`` standard deviation, floored at ``eps`` (a constant feature normalises to 0 instead of
        dividing by 0; a nearly constant one's rare deviations are scaled by up to ``1 / eps``, then
        clipped); ones before two observations."""
        if self.count < 2:
            return np.ones_like(self.mean)
        return np.maximum(np.sqrt(self.m2 / self.count), self.eps)


def _samples(leaf: Leaf, value: np.ndarray) -> np.ndarray:
    """A leaf's batch ``[E, *shape]`` as rows of the units it is normalised by: ``[N, D]``."""
    if leaf.kind == "vector":
        return value.reshape(len(value), -1)
    if leaf.channels_first:
        value = np.moveaxis(value, 1, -1)
    return value.reshape(-1, leaf.image_shape[-1])  # every pixel is a sample of its channel


class ObsNormalizer:
    """Running statistics of every vector and image observation leaf, pushed into the networks'
    encoders. ``observation``: the env's leaves (an int ``D``: one flat vector leaf ``obs``)."""

    def __init__(self, observation: Observation | int, eps: float = 1e-2) -> None:
        if isinstance(observation, int | np.integer):
            observation = vector_observation(int(observation))
        self.leaves = [leaf for leaf in observation if leaf.normalized]
        self.moments = {
            leaf.name: RunningMoments(leaf.image_shape[-1] if leaf.kind == "image" else leaf.width, eps)
            for leaf in self.leaves
        }

    def update(self, obs: dict[str, np.ndarray] | np.ndarray) -> None:
        """Fold one batch of observation leaves ``{name: [E, ...]}`` (or the flat ``obs`` array) in."""
        if not isinstance(obs, dict):
            obs = {"obs": obs}
        for leaf in self.leaves:
            self.moments[leaf.name].update(_samples(leaf, np.asarray(obs[leaf.name])))

    def push(self, networks: Iterable) -> None:
        """Write the current mean/std into every network that normalises its inputs."""
        values = {
            name: (m.mean.astype(np.float32), m.std.astype(np.float32)) for name, m in self.moments.items()
        }
        for net in networks:
            for name, (mean_var, std_var) in net.encoder.stats.items():
                mean_var.assign(values[name][0])
                std_var.assign(values[name][1])

    def state_dict(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint (the flat ``obs`` leaf's keys carry no prefix)."""
        out = {}
        for name, m in self.moments.items():
            prefix = "" if name == "obs" else f"{name}/"
            out.update({f"{prefix}count": np.array([m.count]), f"{prefix}mean": m.mean, f"{prefix}m2": m.m2})
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`state_dict`."""
        for name, m in self.moments.items():
            prefix = "" if name == "obs" else f"{name}/"
            m.count = float(state[f"{prefix}count"][0])
            m.mean, m.m2 = state[f"{prefix}mean"].copy(), state[f"{prefix}m2"].copy()
