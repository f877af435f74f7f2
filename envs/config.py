"""Typed environment configuration (filled by Hydra in ``scripts/``, plain dataclass here)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# Values of EnvConfig.preprocessing.
PREPROCESSING = ("none", "atari", "minigrid_onehot")


@dataclass
class EnvConfig:
    """How to build one (vectorised) training environment."""

    # Short preset name, used in run directory names.
    name: str = "cartpole_p"
    # Any gymnasium id, including third-party ids of the form ``module:Env-v0``.
    id: str = "CartPole-v1"
    # Keyword arguments passed to ``gymnasium.make``.
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Indices of a flat Box observation left out (e.g. velocities), making the task a POMDP.
    mask_obs: list[int] = field(default_factory=list)
    # Probability that every Box leaf of the observation is zeroed at a step (flickering, as in DRQN).
    flicker: float = 0.0
    # Standard deviation of additive Gaussian noise on every Box leaf of the observation.
    obs_noise: float = 0.0
    # Standard preprocessing applied before the POMDP wrappers: none | atari (gymnasium's
    # AtariPreprocessing: 4-frame skip with max-pooling, 84x84 grayscale [84, 84, 1] uint8, up to 30
    # no-op starts; the base env must be made with frameskip=1). No frame stacking: the core remembers.
    # | minigrid_onehot (MiniGrid's OneHotPartialObsWrapper: each cell's object, colour and state
    # indices become 0/1 channels, [7, 7, 20] for the default view, instead of one ordinal value
    # each, in which the goal (8) and lava (9) are neighbours; MiniGrid envs only).
    preprocessing: str = "none"
    # Keys of a Dict observation left out before encoding (e.g. MiniGrid's ``mission`` text).
    drop_keys: list[str] = field(default_factory=list)
    # An episode with at least this return counts as a success: evaluations also log the success
    # rate (MiniGrid pays a positive reward only for reaching the goal). null: no success rate.
    success_return: float | None = None
    # Number of environments stepped together (gymnasium SyncVectorEnv).
    num_envs: int = 8
    # A time limit in agent steps (gymnasium's TimeLimit; under Atari preprocessing, after its frame
    # skip). Envs without one need it (a warning says so). An env that ends its episodes itself
    # sooner still does: lengthen those through its own option (MiniGrid: env.kwargs.max_steps).
    max_episode_steps: int | None = None
    # Episodes cut by the time limit end as terminated (no bootstrap past the last step): for tasks
    # whose step limit is part of the task, e.g. MiniGrid, whose reward falls with the step count.
    time_limit_terminal: bool = False
    # Continuous control only: actions lie in [-action_scale, action_scale] in every dimension,
    # replacing the env's bounds (needed when those are infinite). null: the env's own bounds.
    action_scale: float | None = None

    def validate(self) -> None:
        """Range checks of these fields; raises :class:`ConfigError` naming the first bad key."""
        check(self.num_envs >= 1, "env.num_envs", self.num_envs, "integers >= 1")
        check(finite(self.flicker) and 0 <= self.flicker < 1, "env.flicker", self.flicker, "[0, 1)")
        check(finite(self.obs_noise) and self.obs_noise >= 0, "env.obs_noise", self.obs_noise, ">= 0")
        allowed = "|".join(PREPROCESSING)
        check(self.preprocessing in PREPROCESSING, "env.preprocessing", self.preprocessing, allowed)
        success = self.success_return
        check(success is None or finite(success), "env.success_return", success, "a finite number or null")


class ConfigError(ValueError):
    """A configuration value is out of its allowed range; the message is one line for the user."""


def check(ok: bool, key: str, value: object, allowed: str) -> None:
    """Raise ``key=value is invalid: allowed ...`` (one line) unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: allowed {allowed}")


def finite(x: object) -> bool:
    """A finite int or float (not a bool, not nan or inf)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
