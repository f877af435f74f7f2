"""Build seeded single and vectorised environments from an :class:`EnvConfig`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from envs import faults, memory
from envs.config import PREPROCESSING, ConfigError, EnvConfig
from envs.spaces import Observation, observation_leaves, vector_observation
from envs.spaces import one_line as _one_line
from envs.wrappers import (
    MAX_JOINT_ACTIONS,
    FlickerObservation,
    GaussianObservationNoise,
    JointDiscreteActions,
    MaskObservation,
    ShiftDiscreteActions,
    TimeLimitAsTerminal,
    has_box_leaf,
)

memory.register()
faults.register()
log = logging.getLogger(__name__)
# env ids already warned about having no time limit (one warning per id and process).
_warned_no_time_limit: set[str] = set()


# Extras that provide envs of other packages, named in the error when an id cannot be made.
EXTRAS = {"popgym": "popgym", "minigrid": "minigrid", "ale_py": "atari"}


@dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about an env: its observation leaves, action sizes and, for
    continuous control, bounds. ``observation`` may be given as an int: one flat vector of that size."""

    observation: Observation
    discrete: bool
    num_actions: int  # discrete: number of actions; continuous: action dimension
    action_low: np.ndarray | None = None  # [A] continuous only
    action_high: np.ndarray | None = None  # [A] continuous only

    def __post_init__(self) -> None:
        if isinstance(self.observation, int | np.integer):
            object.__setattr__(self, "observation", vector_observation(int(self.observation)))

    @property
    def obs_dim(self) -> int:
        """Width of a flat vector observation (the single ``obs`` leaf)."""
        if len(self.observation) != 1 or self.observation[0].kind != "vector":
            raise ValueError(f"observation {[leaf.name for leaf in self.observation]} is not one vector")
        return self.observation[0].width


def _make_base(config: EnvConfig) -> gym.Env:
    kwargs = dict(config.kwargs)
    # Under Atari preprocessing the limit counts agent steps (4 frames each): applied after it.
    if config.max_episode_steps is not None and config.preprocessing != "atari":
        kwargs["max_episode_steps"] = int(config.max_episode_steps)
    try:
        return gym.make(config.id, **kwargs)
    except (gym.error.Error, ModuleNotFoundError, ImportError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        module = config.id.partition(":")[0] if ":" in config.id else ""
        if module in EXTRAS and isinstance(exc, ImportError):
            first += f" (install it with: pip install 'recurrl[{EXTRAS[module]}]')"
        raise ConfigError(f"env.id={config.id!r} cannot be made: {first}") from None
    except TypeError as exc:
        raise ConfigError(f"env.kwargs={dict(config.kwargs)} rejected by {config.id}: {exc}") from None


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

    Logs one warning (per env id) naming ``env.max_episode_steps`` when the env has no time limit.
    Actions are exposed as agents emit them: ``Discrete(n, start=s)`` as ``Discrete(n)`` (index
    ``a`` -> ``a + s``) and ``MultiDiscrete(nvec)`` as one joint ``Discrete(prod(nvec))``.
    Raises :class:`ConfigError` (one line) for a setting or a space recurrl cannot handle.
    """
    env = _make_base(config)
    try:
        env = _wrap(env, config)
    except ConfigError:
        env.close()
        raise
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def _wrap(env: gym.Env, config: EnvConfig) -> gym.Env:
    _warn_if_unbounded(env, config)
    if config.preprocessing == "atari":
        env = _atari(env, config)
        if config.max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env, int(config.max_episode_steps))
    elif config.preprocessing == "minigrid_onehot":
        env = _minigrid_onehot(env, config)
    env = _drop_keys(env, config)
    try:
        observation_leaves(env.observation_space)
    except ConfigError as exc:
        raise ConfigError(f"env.id={config.id!r}: {exc}") from None
    env = _adapt_actions(env, config)
    if config.mask_obs:
        env = MaskObservation(env, _mask_indices(env.observation_space, config))
    for key, value in (("flicker", config.flicker), ("obs_noise", config.obs_noise)):
        if value > 0 and not has_box_leaf(env.observation_space):
            raise ConfigError(
                f"env.{key}={value} applies to Box observation leaves and "
                f"{config.id} has none ({_one_line(env.observation_space)}): allowed 0"
            )
    if config.flicker > 0:
        env = FlickerObservation(env, config.flicker)
    if config.obs_noise > 0:
        env = GaussianObservationNoise(env, config.obs_noise)
    if config.time_limit_terminal:
        env = TimeLimitAsTerminal(env)
    return env


def _atari(env: gym.Env, config: EnvConfig) -> gym.Env:
    try:
        return gym.wrappers.AtariPreprocessing(
            env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True, grayscale_newaxis=True
        )
    except (gym.error.Error, ValueError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(
            f"env.preprocessing=atari cannot wrap {config.id}: {first} (make the env with "
            "env.kwargs.frameskip=1; install recurrl[atari])"
        ) from None


def _minigrid_onehot(env: gym.Env, config: EnvConfig) -> gym.Env:
    """MiniGrid's own one-hot view: ``image`` [H, W, 3] category indices -> [H, W, 20] 0/1 uint8."""
    others = "|".join(p for p in PREPROCESSING if p != "minigrid_onehot")
    try:
        from minigrid.minigrid_env import MiniGridEnv
        from minigrid.wrappers import OneHotPartialObsWrapper
    except ImportError:
        raise ConfigError(
            f"env.preprocessing=minigrid_onehot needs MiniGrid: install recurrl[minigrid]; allowed {others}"
        ) from None
    space = env.observation_space
    view = space.spaces.get("image") if isinstance(space, gym.spaces.Dict) else None
    if not isinstance(env.unwrapped, MiniGridEnv) or view is None or view.shape[-1:] != (3,):
        raise ConfigError(
            f"env.preprocessing=minigrid_onehot wraps MiniGrid envs (a Dict observation whose 'image' is "
            f"[H, W, 3] cell indices); {config.id} has {_one_line(space)}: allowed {others}"
        )
    return OneHotPartialObsWrapper(env)


def _drop_keys(env: gym.Env, config: EnvConfig) -> gym.Env:
    if not config.drop_keys:
        return env
    space = env.observation_space
    if not isinstance(space, gym.spaces.Dict):
        raise ConfigError(
            f"env.drop_keys={list(config.drop_keys)} needs a Dict observation; {config.id} has "
            f"{_one_line(space)}: allowed []"
        )
    unknown = [k for k in config.drop_keys if k not in space.spaces]
    if unknown:
        raise ConfigError(
            f"env.drop_keys has {unknown[0]!r}, not a key of {config.id}'s observation: allowed any "
            f"of {sorted(space.spaces)}"
        )
    kept = [k for k in space.spaces if k not in set(config.drop_keys)]
    if not kept:
        raise ConfigError(f"env.drop_keys={list(config.drop_keys)} leaves no observation key")
    return gym.wrappers.FilterObservation(env, kept)


def _adapt_actions(env: gym.Env, config: EnvConfig) -> gym.Env:
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete) and int(space.start) != 0:
        return ShiftDiscreteActions(env)
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1:
        joint = int(np.prod(space.nvec.astype(np.int64)))
        if joint > MAX_JOINT_ACTIONS:
            raise ConfigError(
                f"env.id={config.id!r} has action space {_one_line(space)}: {joint} joint actions, "
                f"allowed at most {MAX_JOINT_ACTIONS}"
            )
        return JointDiscreteActions(env)
    return env


def _mask_indices(space: gym.spaces.Space, config: EnvConfig) -> list[int]:
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
        raise ConfigError(
            f"env.mask_obs={list(config.mask_obs)} applies to a flat Box observation and "
            f"{config.id} has {_one_line(space)}: allowed [] (env.drop_keys leaves out Dict keys)"
        )
    obs_dim = space.shape[0]
    bad = [i for i in config.mask_obs if not 0 <= int(i) < obs_dim]
    if bad:
        raise ConfigError(
            f"env.mask_obs={list(config.mask_obs)} has index {bad[0]} outside [0, {obs_dim - 1}] "
            f"for {config.id}"
        )
    if len(set(config.mask_obs)) >= obs_dim:
        raise ConfigError(f"env.mask_obs={list(config.mask_obs)} masks every observation index")
    return [int(i) for i in config.mask_obs]


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
        observation = observation_leaves(env.observation_space)
        space = env.action_space
        if isinstance(space, gym.spaces.Discrete):
            return EnvSpec(observation, discrete=True, num_actions=int(space.n))
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            low = np.asarray(space.low, dtype=np.float32)
            high = np.asarray(space.high, dtype=np.float32)
            if config.action_scale is not None:
                low = np.full_like(low, -float(config.action_scale))
                high = np.full_like(high, float(config.action_scale))
            return EnvSpec(observation, False, int(space.shape[0]), low, high)
        raise ConfigError(
            f"env.id={config.id!r} has unsupported action space {_one_line(space)}; "
            "allowed Discrete(n), MultiDiscrete(nvec) (rdqn) or a flat Box [A]"
        )
    finally:
        env.close()
