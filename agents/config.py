"""The top-level run configuration and its validation.

Everything here is a plain dataclass: Hydra (in ``scripts/``) fills them from ``conf/``, tests and
notebooks build them directly. :func:`validate` turns out-of-range values into a one-line
:class:`ConfigError` before anything is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents.cells import CELLS
from agents.kernels import BACKENDS
from agents.networks import NetworkConfig
from agents.rddpg import RDDPGConfig
from agents.rdqn import RDQNConfig
from agents.replay import ReplayConfig
from envs.config import ConfigError, EnvConfig
from envs.make import EnvSpec

# Agent config schema by ``agent.kind`` (Hydra registers each as ``<kind>_schema``).
AGENT_CONFIGS: dict[str, type] = {"rdqn": RDQNConfig, "rddpg": RDDPGConfig}


@dataclass
class TrainConfig:
    """Training loop settings."""

    # Env steps to collect in total (summed over vectorised envs).
    total_env_steps: int = 15_000
    # Env steps collected before the first learner update (rdqn acts by its epsilon schedule,
    # rddpg/rtd3 take uniform random actions), so the first batches come from many episodes.
    learning_starts: int = 1_000
    # Learner updates per env step (fractional: 0.25 = one update every 4 env steps).
    updates_per_step: float = 0.5
    # Learner metrics are averaged and written every this many updates.
    log_every_updates: int = 50
    # Env steps between checkpoints (a final one is always written).
    checkpoint_every_env_steps: int = 5_000
    # Show a progress bar (env steps, recent return, steps/s).
    progress_bar: bool = True
    # Make TF ops deterministic (same seed, same numbers).
    deterministic: bool = True
    # TF thread pools (0 = TF's choice, all cores). One thread per op and two ops at a time suits
    # the learner: its target and online unrolls are two chains of small ops, and an op split over
    # both cores waits for the thread busy with the other chain (figures: docs/performance.md).
    # Set both to 0 on a many-core machine with large networks. Applied when the process first uses
    # TF; later runs in the same process keep the first setting (a warning says so).
    tf_intra_op_threads: int = 1
    tf_inter_op_threads: int = 2


@dataclass
class EvalConfig:
    """Greedy evaluation on separate env instances."""

    # Env steps between evaluations (also run at the end).
    every_env_steps: int = 1_000
    # Greedy episodes per evaluation (run in parallel, one env each).
    episodes: int = 10
    # Network evaluated: online, or target (the EMA of the online weights, a smoother policy).
    network: str = "online"


@dataclass
class Config:
    """A whole run."""

    agent: Any = field(default_factory=RDQNConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # Seeds envs, networks, exploration and replay sampling.
    seed: int = 0
    # A run directory to continue from its last complete checkpoint.
    resume: str | None = None
    # Where this run writes (scripts/train.py sets it to Hydra's output directory).
    run_dir: str = "runs/default"


def _check(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: allowed {allowed}")


def _num(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def validate(config: Config) -> None:
    """Check every range that does not need the env; raises :class:`ConfigError` (one line)."""
    a, n, r, t, e, v = (
        config.agent,
        config.network,
        config.replay,
        config.train,
        config.env,
        config.eval,
    )
    _check(_num(a.tau) and 0 < a.tau <= 1, "agent.tau", a.tau, "(0, 1]")
    _check(_num(a.gamma) and 0 <= a.gamma <= 1, "agent.gamma", a.gamma, "[0, 1]")
    _check(a.n_step >= 1, "agent.n_step", a.n_step, "integers >= 1")
    _check(a.batch_size >= 1, "agent.batch_size", a.batch_size, "integers >= 1")
    _check(_num(a.lr) and a.lr > 0, "agent.lr", a.lr, "> 0")
    _check(a.target_update_period >= 1, "agent.target_update_period", a.target_update_period, ">= 1")
    _check(_num(a.max_grad_norm) and a.max_grad_norm > 0, "agent.max_grad_norm", a.max_grad_norm, "> 0")
    if a.kind == "rdqn":
        for key in ("epsilon_start", "epsilon_end"):
            val = getattr(a, key)
            _check(_num(val) and 0 <= val <= 1, f"agent.{key}", val, "[0, 1]")
        _check(a.epsilon_decay_steps >= 1, "agent.epsilon_decay_steps", a.epsilon_decay_steps, ">= 1")
        _check(a.huber_delta > 0, "agent.huber_delta", a.huber_delta, "> 0")
    if a.kind == "rddpg":
        _validate_rddpg(a, n)
    _check(n.cell in CELLS, "network.cell", n.cell, "one of " + "|".join(CELLS))
    extras = ("prev_action", "prev_reward")
    _check(all(i in extras for i in n.inputs), "network.inputs", list(n.inputs), "any of " + "|".join(extras))
    _check(n.units >= 1, "network.units", n.units, "integers >= 1")
    _check(n.backend in BACKENDS, "network.backend", n.backend, "|".join(BACKENDS))
    _check(
        n.backend != "native" or n.cell == "lstm",
        "network.backend",
        n.backend,
        f"auto|graph|scan for cell={n.cell}",
    )
    for key in ("pre_layers", "post_layers"):
        widths = list(getattr(n, key))
        _check(all(w >= 1 for w in widths), f"network.{key}", widths, "widths >= 1")
    _check(r.burn_in >= 0, "replay.burn_in", r.burn_in, "integers >= 0")
    _check(r.trace_length >= 1, "replay.trace_length", r.trace_length, "integers >= 1")
    _check(
        r.initial_state in ("stored", "zero"),
        "replay.initial_state",
        r.initial_state,
        "stored|zero",
    )
    _check(e.num_envs >= 1, "env.num_envs", e.num_envs, "integers >= 1")
    seq = r.burn_in + r.trace_length + a.n_step
    per_env = r.capacity // max(e.num_envs, 1)
    _check(
        per_env >= seq,
        "replay.capacity",
        r.capacity,
        f">= {seq * e.num_envs} (a sequence of burn_in + trace_length + n_step = {seq} rows "
        f"per env x {e.num_envs} envs)",
    )
    _check(_num(e.flicker) and 0 <= e.flicker < 1, "env.flicker", e.flicker, "[0, 1)")
    _check(_num(e.obs_noise) and e.obs_noise >= 0, "env.obs_noise", e.obs_noise, ">= 0")
    _check(t.total_env_steps >= 1, "train.total_env_steps", t.total_env_steps, "integers >= 1")
    _check(t.learning_starts >= 0, "train.learning_starts", t.learning_starts, "integers >= 0")
    _check(
        _num(t.updates_per_step) and t.updates_per_step > 0,
        "train.updates_per_step",
        t.updates_per_step,
        "> 0",
    )
    _check(t.log_every_updates >= 1, "train.log_every_updates", t.log_every_updates, ">= 1")
    _check(
        t.checkpoint_every_env_steps >= 1,
        "train.checkpoint_every_env_steps",
        t.checkpoint_every_env_steps,
        ">= 1",
    )
    for key in ("tf_intra_op_threads", "tf_inter_op_threads"):
        _check(getattr(t, key) >= 0, f"train.{key}", getattr(t, key), "integers >= 0 (0 = TF's choice)")
    _check(v.every_env_steps >= 1, "eval.every_env_steps", v.every_env_steps, ">= 1")
    _check(v.episodes >= 1, "eval.episodes", v.episodes, "integers >= 1")
    _check(v.network in ("online", "target"), "eval.network", v.network, "online|target")


def _validate_rddpg(a, n: NetworkConfig) -> None:
    for key in ("actor_lr", "critic_lr"):
        val = getattr(a, key)
        _check(val is None or (_num(val) and val > 0), f"agent.{key}", val, "> 0 or null (agent.lr)")
    _check(a.exploration in ("gaussian", "ou"), "agent.exploration", a.exploration, "gaussian|ou")
    for key in ("exploration_noise", "target_noise", "noise_clip", "preactivation_penalty"):
        val = getattr(a, key)
        _check(_num(val) and val >= 0, f"agent.{key}", val, ">= 0")
    _check(_num(a.ou_theta) and 0 < a.ou_theta <= 1, "agent.ou_theta", a.ou_theta, "(0, 1]")
    _check(a.policy_delay >= 1, "agent.policy_delay", a.policy_delay, "integers >= 1")
    _check(
        len(n.post_layers) >= 1,
        "network.post_layers",
        list(n.post_layers),
        "at least one layer for agent=rddpg/rtd3 (the critic joins the action there)",
    )


def validate_for_env(config: Config, spec: EnvSpec) -> None:
    """Checks that need the env: action space kind must suit the agent."""
    if config.agent.kind == "rdqn" and not spec.discrete:
        raise ConfigError(
            f"agent=rdqn needs a discrete action space but env.id={config.env.id!r} is continuous; "
            "use agent=rddpg or agent=rtd3"
        )
    if config.agent.kind == "rddpg":
        if spec.discrete:
            raise ConfigError(
                f"agent=rddpg/rtd3 needs a continuous (Box) action space but env.id={config.env.id!r} "
                "is discrete; use agent=rdqn"
            )
        scale = config.env.action_scale
        _check(scale is None or (_num(scale) and scale > 0), "env.action_scale", scale, "> 0 or null")
        low, high = spec.action_low, spec.action_high
        if not (np.isfinite(low).all() and np.isfinite(high).all() and (high > low).all()):
            raise ConfigError(
                f"env.id={config.env.id!r} has action bounds low={low.tolist()} high={high.tolist()}; "
                "set env.action_scale=<half-range> (actions then lie in [-scale, scale])"
            )


def config_from_dict(data: dict) -> Config:
    """Rebuild a typed :class:`Config` from ``dataclasses.asdict`` output (e.g. ``config.json``)."""
    from omegaconf import OmegaConf

    kind = data["agent"]["kind"]
    if kind not in AGENT_CONFIGS:
        raise ConfigError(f"agent.kind={kind!r} is invalid: allowed {'|'.join(AGENT_CONFIGS)}")
    agent_cls = AGENT_CONFIGS[kind]
    schema = OmegaConf.structured(Config(agent=agent_cls()))
    merged = OmegaConf.merge(schema, data)
    return OmegaConf.to_object(merged)


# Keys a resumed run cannot change: they fix the networks' shapes, the env (and so the replay's
# layout) or the random streams the checkpoint continues. Everything else (learning rates, budgets,
# schedules, evaluation and logging settings, the backend that runs the same weights) may change.
FROZEN_ON_RESUME = (
    "env.",
    "network.",
    "replay.capacity",
    "agent.kind",
    "agent.name",
    "agent.twin_critics",
    "agent.shared_core",
    "seed",
)
MUTABLE_UNDER_FROZEN = ("network.backend",)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``{"a.b.c": value}`` (an empty dict stays a value)."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: data}


def _frozen(key: str) -> bool:
    if key.startswith(MUTABLE_UNDER_FROZEN):
        return False
    return any(key == f or key.startswith(f) if f.endswith(".") else key == f for f in FROZEN_ON_RESUME)


def load_run_config(run_dir: str, overrides: list[str] | None = None) -> Config:
    """The config a run was started with (``run_dir/config.json``), with ``key=value`` overrides.

    Overrides that restate the run's own values (``agent=rdqn`` for an rdqn run) are accepted;
    changing a key of :data:`FROZEN_ON_RESUME` is a :class:`ConfigError` naming the key; every key
    that does change is logged.
    """
    import dataclasses
    import json
    import logging
    from pathlib import Path

    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"resume={run_dir!r} holds no run: {path} is missing")
    try:
        saved = config_from_dict(json.loads(path.read_text()))
    except (ValueError, OmegaConfBaseException) as exc:
        raise ConfigError(f"resume={run_dir!r}: {path} is unreadable ({str(exc).splitlines()[0]})") from None
    overrides = [o.lstrip("+") for o in (overrides or []) if not o.lstrip("+").startswith("hydra.")]
    keys = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key in ("agent", "env"):  # a group: only the run's own preset is accepted
            own = getattr(saved, key).name
            if value != own:
                raise ConfigError(f"{key}={value} cannot change a resumed run (it was {key}={own})")
        else:
            keys.append(item)
    node = OmegaConf.structured(saved)
    OmegaConf.set_struct(node.env.kwargs, False)  # free-form: a new key must reach the frozen check
    try:
        node.merge_with_dotlist(keys)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"override rejected on resume: {str(exc).splitlines()[0]}") from None
    config = OmegaConf.to_object(node)
    before, after = flatten(dataclasses.asdict(saved)), flatten(dataclasses.asdict(config))
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new or key in ("resume", "run_dir"):
            continue
        if _frozen(key):
            raise ConfigError(
                f"{key}={new!r} cannot change a resumed run (it was {old!r}); start a new run instead"
            )
        logging.getLogger("recurrl").info("resume: %s=%r (was %r)", key, new, old)
    config.resume = str(run_dir)
    config.run_dir = str(run_dir)
    return config
