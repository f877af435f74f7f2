"""Tiny memory tasks: a cue shown once at t=0, the answer asked after a few blank steps.

A memoryless policy cannot beat chance on them; a recurrent one solves them in seconds. They are
registered with gymnasium as ``recurrl/CueMemory-v0`` (discrete) and
``recurrl/CueMemoryContinuous-v0`` (continuous), so they work through ``env.id`` like any other env.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class CueMemoryEnv(gym.Env):
    """Observation ``[cue, query]``: ``cue`` is +-1 at t=0 and 0 after; ``query`` is 1 at the last step.

    Discrete: the action at the query step must equal the cue's class (0 for -1, 1 for +1) for
    reward +1, else -1. Continuous: reward ``1 - |a - cue|`` at the query step. Earlier actions earn
    nothing. The episode terminates after the query step, ``delay + 1`` steps in all.
    """

    # Episodes end by themselves (delay + 1 steps), so no time limit is needed: see make.has_time_limit.
    metadata: dict[str, Any] = {"render_modes": [], "episodes_always_end": True}

    def __init__(self, delay: int = 4, continuous: bool = False) -> None:
        self.delay = int(delay)
        self.continuous = bool(continuous)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        if self.continuous:
            self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        else:
            self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._cue = 1.0

    def _obs(self) -> np.ndarray:
        cue = self._cue if self._t == 0 else 0.0
        query = 1.0 if self._t == self.delay else 0.0
        return np.array([cue, query], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        self._cue = 1.0 if self.np_random.random() < 0.5 else -1.0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = 0.0
        terminated = self._t == self.delay
        if terminated:
            if self.continuous:
                a = float(np.clip(np.asarray(action).reshape(-1)[0], -1.0, 1.0))
                reward = 1.0 - abs(a - self._cue)
            else:
                reward = 1.0 if (int(action) == 1) == (self._cue > 0) else -1.0
        self._t += 1
        return self._obs(), reward, terminated, False, {}


def register() -> None:
    """Register the memory tasks with gymnasium (idempotent)."""
    for env_id, continuous in (
        ("recurrl/CueMemory-v0", False),
        ("recurrl/CueMemoryContinuous-v0", True),
    ):
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point="envs.memory:CueMemoryEnv",
                kwargs={"continuous": continuous},
            )
