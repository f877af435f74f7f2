"""Typed environment configuration (filled by Hydra in ``scripts/``, plain dataclass here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EnvConfig:
    """How to build one (vectorised) training environment."""

    # Short preset name, used in run directory names.
    name: str = "cartpole_p"
    # Any gymnasium id, including third-party ids of the form ``module:Env-v0``.
    id: str = "CartPole-v1"
    # Keyword arguments passed to ``gymnasium.make``.
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Observation indices replaced by zeros (e.g. velocities), making the task a POMDP.
    mask_obs: list[int] = field(default_factory=list)
    # Probability that the whole observation is zeroed at a step (flickering, as in DRQN).
    flicker: float = 0.0
    # Standard deviation of additive Gaussian observation noise.
    obs_noise: float = 0.0
    # Number of environments stepped together (gymnasium SyncVectorEnv).
    num_envs: int = 8
    # Overrides the env's own time limit when set; envs without one need it (a warning says so).
    max_episode_steps: int | None = None
    # Continuous control only: half-range of the action box when the env's bounds are infinite.
    action_scale: float | None = None


class ConfigError(ValueError):
    """A configuration value is out of its allowed range; the message is one line for the user."""
