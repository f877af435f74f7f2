"""POMDP observation wrappers: masking, flickering and noise.

Each wrapper draws its randomness from the env's own ``np_random`` so a seeded env is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np


class MaskObservation(gym.ObservationWrapper):
    """Drop observation indices (e.g. velocities): the result has ``obs_dim - len(indices)`` dims."""

    def __init__(self, env: gym.Env, indices: Sequence[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box) and len(space.shape) == 1
        self.keep = np.array([i for i in range(space.shape[0]) if i not in set(indices)])
        self.observation_space = gym.spaces.Box(
            low=space.low[self.keep], high=space.high[self.keep], dtype=space.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.keep]


class FlickerObservation(gym.ObservationWrapper):
    """Zero the whole observation with probability ``p`` at each step (flickering Pong, DRQN)."""

    def __init__(self, env: gym.Env, p: float) -> None:
        super().__init__(env)
        self.p = float(p)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        if self.np_random.random() < self.p:
            return np.zeros_like(observation)
        return observation


class GaussianObservationNoise(gym.ObservationWrapper):
    """Add ``N(0, std^2)`` noise to every observation component."""

    def __init__(self, env: gym.Env, std: float) -> None:
        super().__init__(env)
        self.std = float(std)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        noise = self.np_random.normal(0.0, self.std, size=observation.shape)
        return (observation + noise).astype(observation.dtype)
