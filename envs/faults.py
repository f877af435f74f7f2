"""Env faults: a cheap check for non-finite observations and rewards, and tiny envs that produce them.

``recurrl/NaNReward-v0`` returns a NaN reward (or, with ``what="obs"``, a NaN observation) from step
``nan_after`` on; ``recurrl/NoTimeLimit-v0`` never ends an episode and is registered without a time
limit. Both exist so tests can exercise those faults through ``env.id`` like any other env.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def describe_non_finite(obs: np.ndarray | dict[str, np.ndarray], reward: np.ndarray) -> str | None:
    """One line naming the first non-finite value of a vectorised step, or None if all are finite.

    ``obs`` is ``[E, O]`` (or ``[E, ...]``), or a dict of such observation leaves (each named in the
    message unless it is the single leaf ``obs``); ``reward`` ``[E]``. Rewards are checked first;
    within each array the lowest env index wins. All-finite batches cost one ``np.isfinite(...).all()``
    per float array.
    """
    reward = np.asarray(reward).reshape(-1)  # [E]
    if not np.isfinite(reward).all():
        env = int(np.flatnonzero(~np.isfinite(reward))[0])
        return f"non-finite reward {float(reward[env])} from env {env}"
    leaves = obs if isinstance(obs, dict) else {"obs": obs}
    for name, value in leaves.items():
        value = np.asarray(value)
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            flat = value.reshape(len(value), -1)  # [E, O]
            env, index = (int(i[0]) for i in np.nonzero(~np.isfinite(flat)))
            where = f"at obs index {index}" if name == "obs" else f"in leaf {name} at index {index}"
            return f"non-finite observation {float(flat[env, index])} {where} from env {env}"
    return None


class NaNRewardEnv(gym.Env):
    """A 2-d random walk paying reward 1 per step until step ``nan_after``, then NaN.

    With ``what="obs"`` the observation turns NaN instead (the reward stays 1). Observations are
    ``[position, step / 100]``; episodes never terminate, the registered time limit (100 steps)
    truncates them.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, nan_after: int = 10, what: str = "reward") -> None:
        if what not in ("reward", "obs"):
            raise TypeError(f"what={what!r} is invalid: allowed reward|obs")
        self.nan_after, self.what = int(nan_after), what
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t, self._x = 0, 0.0

    def _obs(self) -> np.ndarray:
        if self.what == "obs" and self._t >= self.nan_after:
            return np.full(2, np.nan, np.float32)
        return np.array([self._x, self._t / 100.0], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t, self._x = 0, float(self.np_random.normal())
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._t += 1
        self._x += 1.0 if int(action) == 1 else -1.0
        bad = self.what == "reward" and self._t >= self.nan_after
        return self._obs(), float("nan") if bad else 1.0, False, False, {}


class NoTimeLimitEnv(gym.Env):
    """Observations of ``size`` Gaussian values, reward 1 per step, and an episode that never ends."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, size: int = 4) -> None:
        self.size = int(size)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(self.size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> np.ndarray:
        return self.np_random.normal(size=self.size).astype(np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return self._obs(), 1.0, False, False, {}


def register() -> None:
    """Register the fault envs with gymnasium (idempotent); NoTimeLimit-v0 gets no time limit."""
    for env_id, entry_point, limit in (
        ("recurrl/NaNReward-v0", "envs.faults:NaNRewardEnv", 100),
        ("recurrl/NoTimeLimit-v0", "envs.faults:NoTimeLimitEnv", None),
    ):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, max_episode_steps=limit)
