"""A slow simulator for acting-throughput figures: ``recurrl/SlowCartPole-v0``.

CartPole-v1 whose every step sleeps ``step_ms`` milliseconds (default 5) before returning, as an
env served by a remote or heavy simulator would: acting waits while the CPU is free. It is what
``scripts/measure_scaling.py`` uses to show how ``runner=ray`` scales with the number of workers
when the env, not the CPU, sets the pace.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.utils import RecordConstructorArgs


class SlowCartPoleEnv(CartPoleEnv, RecordConstructorArgs):
    """CartPole whose :meth:`step` takes at least ``step_ms`` milliseconds (``[4]`` obs, 2 actions)."""

    def __init__(self, step_ms: float = 5.0, render_mode: str | None = None) -> None:
        if not (isinstance(step_ms, int | float) and np.isfinite(step_ms) and step_ms >= 0):
            raise TypeError(f"step_ms={step_ms!r} is invalid: allowed >= 0 (milliseconds)")
        RecordConstructorArgs.__init__(self, step_ms=step_ms, render_mode=render_mode)
        CartPoleEnv.__init__(self, render_mode=render_mode)
        self.step_ms = float(step_ms)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        time.sleep(self.step_ms / 1000.0)
        return super().step(action)


def register() -> None:
    """Register ``recurrl/SlowCartPole-v0`` with gymnasium (idempotent), CartPole's 500-step limit."""
    if "recurrl/SlowCartPole-v0" not in gym.registry:
        gym.register(
            id="recurrl/SlowCartPole-v0", entry_point="envs.slow:SlowCartPoleEnv", max_episode_steps=500
        )
