"""The top-level run configuration and its validation.

Everything here is a plain dataclass: Hydra (in ``scripts/``) fills them from ``conf/``, tests and
notebooks build them directly. :func:`validate` turns out-of-range values into a one-line
:class:`ConfigError` before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.acting import RunnerConfig, training_envs
from agents.agent import CONFIGS_BY_KIND, lookup
from agents.networks import NetworkConfig
from agents.rddpg import RDDPGConfig  # noqa: F401  (importing an agent module registers it)
from agents.rdqn import RDQNConfig
from agents.records import flatten
from agents.replay import ReplayConfig
from envs.config import ConfigError, EnvConfig
from envs.config import check as _check
from envs.config import finite as _finite
from envs.make import EnvSpec

# Agent config schema by ``agent.kind``, read live from the agent registry (agents.agent); Hydra
# registers each as ``<kind>_schema``.
AGENT_CONFIGS: Mapping[str, type] = CONFIGS_BY_KIND


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

    def validate(self) -> None:
        """Range checks of these fields; raises :class:`ConfigError` naming the first bad key."""
        _check(self.total_env_steps >= 1, "train.total_env_steps", self.total_env_steps, "integers >= 1")
        _check(self.learning_starts >= 0, "train.learning_starts", self.learning_starts, "integers >= 0")
        ups = self.updates_per_step
        _check(_finite(ups) and ups > 0, "train.updates_per_step", ups, "> 0")
        _check(self.log_every_updates >= 1, "train.log_every_updates", self.log_every_updates, ">= 1")
        every = self.checkpoint_every_env_steps
        _check(every >= 1, "train.checkpoint_every_env_steps", every, ">= 1")
        for key in ("tf_intra_op_threads", "tf_inter_op_threads"):
            val = getattr(self, key)
            _check(val >= 0, f"train.{key}", val, "integers >= 0 (0 = TF's choice)")


# Weights a greedy evaluation can act with (average only where agent.average_tau keeps it).
EVAL_NETWORKS = ("online", "target", "average")


@dataclass
class EvalConfig:
    """Greedy evaluation on separate env instances."""

    # Env steps between evaluations (also run at the end).
    every_env_steps: int = 1_000
    # Greedy episodes per evaluation (run in parallel, one env each).
    episodes: int = 10
    # Network evaluated: online, target (the EMA of the online weights, a smoother policy) or
    # average (the slower EMA kept with agent.average_tau).
    network: str = "online"

    def validate(self) -> None:
        """Range checks of these fields; raises :class:`ConfigError` naming the first bad key."""
        _check(self.every_env_steps >= 1, "eval.every_env_steps", self.every_env_steps, ">= 1")
        _check(self.episodes >= 1, "eval.episodes", self.episodes, "integers >= 1")
        _check(self.network in EVAL_NETWORKS, "eval.network", self.network, "|".join(EVAL_NETWORKS))


@dataclass
class Config:
    """A whole run."""

    agent: Any = field(default_factory=RDQNConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    # Seeds envs, networks, exploration and replay sampling.
    seed: int = 0
    # A run directory to continue from its last complete checkpoint.
    resume: str | None = None
    # Where this run writes (scripts/train.py sets it to Hydra's output directory).
    run_dir: str = "runs/default"


def validate(config: Config) -> None:
    """Check every range that does not need the env; raises :class:`ConfigError` (one line).

    Each section's dataclass checks its own fields; the checks across sections are here.
    """
    a, n = config.agent, config.network
    lookup(a.kind)
    a.validate()
    n.validate()
    a.validate_network(n)
    config.replay.validate()
    priority = config.replay.priority_exponent
    allowed = f"0 for agent={a.name} (prioritized replay needs an agent that weights its loss: rdqn)"
    _check(
        priority == 0 or getattr(a, "supports_priorities", False),
        "replay.priority_exponent",
        priority,
        allowed,
    )
    config.env.validate()
    config.runner.validate()
    _validate_capacity(config.replay, training_envs(config), a.n_step)
    config.train.validate()
    config.eval.validate()
    kept = getattr(a, "average_tau", None) is not None
    allowed = "online|target (average needs agent.average_tau set: without it no average is kept)"
    _check(config.eval.network != "average" or kept, "eval.network", config.eval.network, allowed)


def _validate_capacity(r: ReplayConfig, num_envs: int, n_step: int) -> None:
    seq = r.burn_in + r.trace_length + n_step
    per_env = r.capacity // max(num_envs, 1)
    _check(
        per_env >= seq,
        "replay.capacity",
        r.capacity,
        f">= {seq * num_envs} (a sequence of burn_in + trace_length + n_step = {seq} rows "
        f"per env x {num_envs} envs)",
    )


def validate_for_env(config: Config, spec: EnvSpec) -> None:
    """Checks that need the env: the action space must suit the agent (its config says how), and
    the replay must fit in the memory this machine has available."""
    config.agent.validate_for_env(config.env, spec)
    available = available_memory_bytes()
    need = replay_bytes(config, spec)
    if available is not None and need > available:
        per_row = need // max(config.replay.capacity, 1)
        _check(
            False,
            "replay.capacity",
            config.replay.capacity,
            f"at most {available // per_row} here: {per_row} bytes per row need {need / 2**30:.2f} GiB and "
            f"{available / 2**30:.2f} GiB of memory is available",
        )


def replay_bytes(config: Config, spec: EnvSpec) -> int:
    """Bytes the replay's rows take at ``replay.capacity``: the observation leaves in their own
    dtypes, the recurrent state, actions and the per-row scalars (agents/replay.py)."""
    from envs.spaces import row_bytes

    n = config.network
    state = {"mlp": 0, "gru": 1}.get(n.cell, 2) * n.units * 4  # (h, c) for the LSTMs
    action = 4 if spec.discrete else 4 * spec.num_actions  # int32 index, or float32 [A]
    extras = (4 * spec.num_actions + 4) if n.inputs else 0  # prev_action (one-hot or [A]), prev_reward
    per_row = row_bytes(spec.observation) + state + action + extras + 5 * 4
    envs = training_envs(config)
    return int(per_row) * (config.replay.capacity // envs) * envs


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo (None where it cannot be read)."""
    try:
        for line in open("/proc/meminfo").read().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def config_from_dict(data: dict) -> Config:
    """Rebuild a typed :class:`Config` from ``dataclasses.asdict`` output (e.g. ``config.json``)."""
    from omegaconf import OmegaConf

    network = data.get("network", {})
    if "kernel" in network:  # the key's earlier name (config.json of runs written before the rename)
        data = {**data, "network": {**{k: v for k, v in network.items() if k != "kernel"}}}
        data["network"].setdefault("backend", network["kernel"])
    agent_cls = lookup(data["agent"]["kind"]).config
    schema = OmegaConf.structured(Config(agent=agent_cls()))
    merged = OmegaConf.merge(schema, data)
    return OmegaConf.to_object(merged)


# Keys a resumed run cannot change: they fix the networks' shapes or which networks exist (a second
# Q head, an average network), the env (and so the replay's layout) or the random streams the
# checkpoint continues. Everything else (learning rates, budgets,
# schedules, evaluation and logging settings, the backend that runs the same weights) may change.
FROZEN_ON_RESUME = (
    "env.",
    "network.",
    "replay.capacity",
    "agent.kind",
    "agent.name",
    "agent.twin_critics",
    "agent.twin_q",
    "agent.reward_head",
    "agent.short_gamma",
    "agent.average_tau",
    "agent.shared_core",
    "seed",
    "runner.kind",
    "runner.num_actors",
    "runner.envs_per_actor",
)
MUTABLE_UNDER_FROZEN = ("network.backend",)


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
    except (ValueError, KeyError, OmegaConfBaseException) as exc:
        raise ConfigError(f"resume={run_dir!r}: {path} is unreadable ({str(exc).splitlines()[0]})") from None
    overrides = [o.lstrip("+") for o in (overrides or []) if not o.lstrip("+").startswith("hydra.")]
    keys = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key in ("agent", "env", "runner"):  # a group: only the run's own preset is accepted
            own = saved.runner.kind if key == "runner" else getattr(saved, key).name
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
        if key == "agent.lr_end" and (old is None) != (new is None):  # the optimiser's saved layout differs
            allowed = "null (the run's rate is constant)" if old is None else "a rate > 0 (its rate decays)"
            raise ConfigError(
                f"agent.lr_end={new!r} cannot switch a resumed run between a constant and a decaying "
                f"learning rate (it was {old!r}): allowed {allowed}"
            )
        logging.getLogger("recurrl").info("resume: %s=%r (was %r)", key, new, old)
    config.resume = str(run_dir)
    config.run_dir = str(run_dir)
    return config
