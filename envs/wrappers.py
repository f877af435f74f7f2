"""POMDP observation wrappers (masking, flickering, noise) and a Discrete action offset.

Each wrapper draws its randomness from the env's own ``np_random`` so a seeded env is reproducible,
and records its constructor arguments (``gymnasium.utils.RecordConstructorArgs``) so ``env.spec``
describes the whole stack and ``gymnasium.make(env.spec)`` rebuilds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np


class MaskObservation(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Drop observation indices (e.g. velocities): the result has ``obs_dim - len(indices)`` dims."""

    def __init__(self, env: gym.Env, indices: Sequence[int]) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, indices=[int(i) for i in indices])
        gym.ObservationWrapper.__init__(self, env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box) and len(space.shape) == 1
        self.keep = np.array([i for i in range(space.shape[0]) if i not in set(indices)])
        self.observation_space = gym.spaces.Box(
            low=space.low[self.keep], high=space.high[self.keep], dtype=space.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.keep]


class FlickerObservation(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Zero the whole observation with probability ``p`` at each step (flickering Pong, DRQN).

    The observation space is widened to contain 0 where the env's bounds exclude it.
    """

    def __init__(self, env: gym.Env, p: float) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, p=float(p))
        gym.ObservationWrapper.__init__(self, env)
        self.p = float(p)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box)
        self.observation_space = gym.spaces.Box(
            low=np.minimum(space.low, 0), high=np.maximum(space.high, 0), dtype=space.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        if self.np_random.random() < self.p:
            return np.zeros_like(observation)
        return observation


class GaussianObservationNoise(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Add ``N(0, std^2)`` noise to every observation component (the space becomes unbounded)."""

    def __init__(self, env: gym.Env, std: float) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, std=float(std))
        gym.ObservationWrapper.__init__(self, env)
        self.std = float(std)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=space.shape, dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        noise = self.np_random.normal(0.0, self.std, size=observation.shape)
        return (observation + noise).astype(observation.dtype)


class ShiftDiscreteActions(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """Expose ``Discrete(n, start=s)`` as ``Discrete(n)``: agent index ``a`` is env action ``a + s``.

    Agents emit indices ``0..n-1`` (argmax rows, one-hot columns); without the shift an env whose
    actions start elsewhere would receive the wrong (or invalid) actions.
    """

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ActionWrapper.__init__(self, env)
        space = env.action_space
        assert isinstance(space, gym.spaces.Discrete)
        self.start = int(space.start)
        self.action_space = gym.spaces.Discrete(int(space.n))

    def action(self, action: int | np.integer) -> int:
        return int(action) + self.start
