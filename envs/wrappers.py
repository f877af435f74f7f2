"""POMDP observation wrappers (masking, flickering, noise), the Discrete action adapters and a
wrapper that ends time-limited episodes as terminal.

Flickering and noise act on every Box leaf of the observation (a flat Box, or the Box leaves of a
Dict/Tuple observation such as MiniGrid's image); discrete leaves pass through unchanged.

Each wrapper draws its randomness from the env's own ``np_random`` so a seeded env is reproducible,
and records its constructor arguments (``gymnasium.utils.RecordConstructorArgs``) so ``env.spec``
describes the whole stack and ``gymnasium.make(env.spec)`` rebuilds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

# Largest MultiDiscrete action space exposed as one joint Discrete (one Q-value per combination).
MAX_JOINT_ACTIONS = 4096


def map_box_spaces(space: gym.spaces.Space, fn) -> gym.spaces.Space:
    """``space`` with ``fn(box) -> box`` applied to every Box leaf."""
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({k: map_box_spaces(s, fn) for k, s in space.spaces.items()})
    if isinstance(space, gym.spaces.Tuple):
        return gym.spaces.Tuple(tuple(map_box_spaces(s, fn) for s in space.spaces))
    return fn(space) if isinstance(space, gym.spaces.Box) else space


def map_box_values(space: gym.spaces.Space, obs: Any, fn) -> Any:
    """``obs`` with ``fn(box, value) -> value`` applied to the value of every Box leaf."""
    if isinstance(space, gym.spaces.Dict):
        return {k: map_box_values(space.spaces[k], v, fn) for k, v in obs.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(map_box_values(s, v, fn) for s, v in zip(space.spaces, obs, strict=True))
    return fn(space, obs) if isinstance(space, gym.spaces.Box) else obs


def has_box_leaf(space: gym.spaces.Space) -> bool:
    """Whether any leaf of ``space`` is a Box."""
    found = []
    map_box_spaces(space, lambda box: found.append(box) or box)
    return bool(found)


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
    """Zero every Box leaf of the observation with probability ``p`` at each step (flickering
    Pong, DRQN). Bounds are widened to contain 0 where the env's exclude it."""

    def __init__(self, env: gym.Env, p: float) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, p=float(p))
        gym.ObservationWrapper.__init__(self, env)
        self.p = float(p)
        self.observation_space = map_box_spaces(
            env.observation_space,
            lambda box: gym.spaces.Box(np.minimum(box.low, 0), np.maximum(box.high, 0), dtype=box.dtype),
        )

    def observation(self, observation: Any) -> Any:
        if self.np_random.random() < self.p:
            return map_box_values(self.observation_space, observation, lambda box, v: np.zeros_like(v))
        return observation


class GaussianObservationNoise(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Add ``N(0, std^2)`` noise to every component of every Box leaf. Float leaves become
    unbounded; integer leaves (uint8 images) are rounded and clipped to their bounds."""

    def __init__(self, env: gym.Env, std: float) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, std=float(std))
        gym.ObservationWrapper.__init__(self, env)
        self.std = float(std)
        self.observation_space = map_box_spaces(env.observation_space, _noisy_box)

    def observation(self, observation: Any) -> Any:
        return map_box_values(self.observation_space, observation, self._add_noise)

    def _add_noise(self, box: gym.spaces.Box, value: np.ndarray) -> np.ndarray:
        noisy = value + self.np_random.normal(0.0, self.std, size=np.shape(value))
        if np.issubdtype(box.dtype, np.integer):
            noisy = np.clip(np.rint(noisy), box.low, box.high)
        return noisy.astype(box.dtype)


def _noisy_box(box: gym.spaces.Box) -> gym.spaces.Box:
    if np.issubdtype(box.dtype, np.integer):
        return box
    return gym.spaces.Box(-np.inf, np.inf, shape=box.shape, dtype=box.dtype)


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


class JointDiscreteActions(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """Expose ``MultiDiscrete(nvec, start)`` as one ``Discrete(prod(nvec))``: joint index ``a`` is
    the env action ``unravel_index(a, nvec) + start``.

    A Q-network then has one output per combination, so the greedy joint action is exact (no
    independence assumption between dimensions); the size is capped at ``MAX_JOINT_ACTIONS``.
    """

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ActionWrapper.__init__(self, env)
        space = env.action_space
        assert isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1
        self.nvec = space.nvec.astype(np.int64)
        self.start = np.broadcast_to(space.start, self.nvec.shape).astype(np.int64)
        self.action_space = gym.spaces.Discrete(int(np.prod(self.nvec)))

    def action(self, action: int | np.integer) -> np.ndarray:
        return np.array(np.unravel_index(int(action), self.nvec), np.int64) + self.start


class TimeLimitAsTerminal(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Report an episode cut by its time limit as terminated (``truncated`` becomes ``terminated``).

    For tasks whose step limit is part of the task, e.g. MiniGrid, whose reward falls with the step
    count: an agent with memory can track the steps taken, so the value after the last step is
    zero, not a bootstrap from the next state. Without it, a value estimate that drifts upwards can
    make never ending an episode look better than the task's own terminal reward.
    """

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, bool(terminated or truncated), False, info
