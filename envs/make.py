"""Build seeded single and vectorised environments from an :class:`EnvConfig`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from envs import faults, memory
from envs.config import ConfigError, EnvConfig
from envs.wrappers import (
    FlickerObservation,
    GaussianObservationNoise,
    MaskObservation,
    ShiftDiscreteActions,
)

memory.register()
faults.register()
log = logging.getLogger(__name__)
# env ids already warned about having no time limit (one warning per id and process).
_warned_no_time_limit: set[str] = set()


@dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about an env: sizes and, for continuous control, bounds."""

    obs_dim: int
    discrete: bool
    num_actions: int  # discrete: number of actions; continuous: action dimension
    action_low: np.ndarray | None = None  # [A] continuous only
    action_high: np.ndarray | None = None  # [A] continuous only


def _make_base(config: EnvConfig) -> gym.Env:
    kwargs = dict(config.kwargs)
    if config.max_episode_steps is not None:
        kwargs["max_episode_steps"] = int(config.max_episode_steps)
    try:
        return gym.make(config.id, **kwargs)
    except (gym.error.Error, ModuleNotFoundError, ImportError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"env.id={config.id!r} cannot be made: {first}") from None
    except TypeError as exc:
        raise ConfigError(f"env.kwargs={dict(config.kwargs)} rejected by {config.id}: {exc}") from None


def _one_line(space: gym.spaces.Space) -> str:
    return " ".join(str(space).split())  # a Box with per-index bounds prints arrays over lines


def has_time_limit(env: gym.Env) -> bool:
    """Whether episodes of ``env`` are sure to end: a TimeLimit in the stack, a registered
    ``spec.max_episode_steps``, or an env declaring ``metadata["episodes_always_end"]``."""
    if env.spec is not None and env.spec.max_episode_steps is not None:
        return True
    if env.unwrapped.metadata.get("episodes_always_end", False):
        return True
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return True
        env = env.env
    return False


def _warn_if_unbounded(env: gym.Env, config: EnvConfig) -> None:
    if config.max_episode_steps is not None or config.id in _warned_no_time_limit:
        return
    if not has_time_limit(env):
        _warned_no_time_limit.add(config.id)
        log.warning(
            "env.id=%r has no time limit and env.max_episode_steps is null: episodes may never end "
            "and greedy evaluation stops at its step cap; set env.max_episode_steps=<steps>",
            config.id,
        )


def make_env(config: EnvConfig, seed: int | None = None) -> gym.Env:
    """One env with the POMDP wrappers of ``config`` applied, reset once with ``seed``.

    Logs one warning (per env id) naming ``env.max_episode_steps`` when the env has no time limit,
    and exposes a ``Discrete(n, start=s)`` action space as ``Discrete(n)`` (index ``a`` -> ``a + s``).
    """
    env = _make_base(config)
    space = env.observation_space
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
        env.close()
        raise ConfigError(
            f"env.id={config.id!r} has observation space {_one_line(space)}; a flat Box [obs] is required"
        )
    _warn_if_unbounded(env, config)
    if isinstance(env.action_space, gym.spaces.Discrete) and int(env.action_space.start) != 0:
        env = ShiftDiscreteActions(env)
    obs_dim = space.shape[0]
    bad = [i for i in config.mask_obs if not 0 <= int(i) < obs_dim]
    if bad:
        env.close()
        raise ConfigError(
            f"env.mask_obs={list(config.mask_obs)} has index {bad[0]} outside [0, {obs_dim - 1}] "
            f"for {config.id}"
        )
    if len(set(config.mask_obs)) >= obs_dim:
        env.close()
        raise ConfigError(f"env.mask_obs={list(config.mask_obs)} masks every observation index")
    if config.mask_obs:
        env = MaskObservation(env, [int(i) for i in config.mask_obs])
    if config.flicker > 0:
        env = FlickerObservation(env, config.flicker)
    if config.obs_noise > 0:
        env = GaussianObservationNoise(env, config.obs_noise)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def make_vec_env(config: EnvConfig, seed: int, num_envs: int | None = None) -> gym.vector.VectorEnv:
    """``num_envs`` (default ``config.num_envs``) envs in a SyncVectorEnv, env ``i`` seeded ``seed + i``.

    Autoreset is gymnasium's NEXT_STEP mode: the step that ends an episode returns its final
    observation; the following step ignores the action and returns the first observation of the
    next episode. The actor and replay rely on that (the final observation gets a row of its own,
    which is what truncated episodes bootstrap from).
    """
    n = int(config.num_envs if num_envs is None else num_envs)
    make_env(config, seed).close()  # validate once, with a clear error, before vectorising
    fns = [lambda i=i: make_env(config, seed + i) for i in range(n)]
    vec = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    vec.reset(seed=[seed + i for i in range(n)])
    return vec


def describe_env(config: EnvConfig) -> EnvSpec:
    """Sizes and bounds of the env described by ``config`` (builds and closes one instance)."""
    env = make_env(config, seed=0)
    try:
        obs_dim = int(env.observation_space.shape[0])
        space = env.action_space
        if isinstance(space, gym.spaces.Discrete):
            return EnvSpec(obs_dim=obs_dim, discrete=True, num_actions=int(space.n))
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            low = np.asarray(space.low, dtype=np.float32)
            high = np.asarray(space.high, dtype=np.float32)
            if config.action_scale is not None:
                low = np.full_like(low, -float(config.action_scale))
                high = np.full_like(high, float(config.action_scale))
            return EnvSpec(obs_dim, False, int(space.shape[0]), low, high)
        raise ConfigError(
            f"env.id={config.id!r} has unsupported action space {_one_line(space)}; "
            "allowed Discrete(n) or a flat Box [A]"
        )
    finally:
        env.close()
