"""Acting sources: where the training loop's replay rows come from (``runner.kind``).

``local`` steps one :class:`agents.actor.Actor` in the learner's process (``env.num_envs`` envs);
``ray`` gathers blocks of rows from Ray worker processes (:mod:`agents.distributed`,
``runner.num_actors * runner.envs_per_actor`` envs). Both write their rows into the learner's
:class:`agents.replay.SequenceReplay` inside :meth:`ActingSource.collect`, so the loop reads the same
for both::

    acted = source.collect()          # rows written to replay, what arrived with them
    ... learner updates ...
    source.after_updates(counters)    # new weights for acting, when due
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from agents.actor import Actor
from envs import make_vec_env
from envs.config import check, finite

if TYPE_CHECKING:
    from agents.actor import Policy
    from agents.config import Config
    from agents.replay import SequenceReplay
    from agents.run_state import Counters
    from envs.make import EnvSpec


@dataclass
class RunnerConfig:
    """Where acting runs (``runner=local|ray``)."""

    # Acting in the learner's process (local) or in Ray worker processes (ray).
    kind: str = "local"
    # ray: acting workers (one process each).
    num_actors: int = 2
    # ray: envs each worker steps together; replay's env axis is num_actors * envs_per_actor.
    envs_per_actor: int = 1
    # ray: env steps per env in one block of rows a worker sends to the learner.
    rows_per_block: int = 16
    # ray: learner updates between weight broadcasts to the workers.
    weight_sync_every: int = 10
    # ray: a running cluster to join (ray.init(address=...)); empty starts a local Ray.
    address: str = ""
    # ray, local Ray only: CPUs Ray may schedule on (0 = the machine's cores, or
    # num_actors * actor_cpus if that is more).
    num_cpus: int = 0
    # ray: CPUs Ray reserves for each worker (fractions let several workers share a core).
    actor_cpus: float = 1.0
    # ray: times Ray restarts a worker whose process died (-1 = no limit).
    max_restarts: int = 3

    def validate(self) -> None:
        """Range checks of these fields; raises :class:`ConfigError` naming the first bad key."""
        check(self.kind in ("local", "ray"), "runner.kind", self.kind, "local|ray")
        for key in ("num_actors", "envs_per_actor", "rows_per_block", "weight_sync_every"):
            check(getattr(self, key) >= 1, f"runner.{key}", getattr(self, key), "integers >= 1")
        check(self.num_cpus >= 0, "runner.num_cpus", self.num_cpus, "integers >= 0 (0 = Ray's default)")
        cpus = self.actor_cpus
        check(finite(cpus) and cpus >= 0, "runner.actor_cpus", cpus, ">= 0")
        check(self.max_restarts >= -1, "runner.max_restarts", self.max_restarts, "integers >= -1")
        if self.kind != "ray":
            return
        missing = "local (ray is not installed: pip install -e '.[ray]')"
        check(importlib.util.find_spec("ray") is not None, "runner.kind", self.kind, missing)
        need = self.num_actors * cpus
        fits = self.address or not self.num_cpus or need <= self.num_cpus
        allowed = f"num_actors * runner.actor_cpus ({need:g}) <= runner.num_cpus={self.num_cpus}"
        check(fits, "runner.num_actors", self.num_actors, allowed)


def training_envs(config: Config) -> int:
    """Env columns of replay: ``env.num_envs`` (local) or ``num_actors * envs_per_actor`` (ray)."""
    r = config.runner
    return r.num_actors * r.envs_per_actor if r.kind == "ray" else config.env.num_envs


def with_training_envs(config: Config) -> Config:
    """``config`` with ``env.num_envs`` set to :func:`training_envs` (what the learner's side builds
    with: replay's env axis, rdqn's epsilon ladder)."""
    n = training_envs(config)
    if n == config.env.num_envs:
        return config
    return dataclasses.replace(config, env=dataclasses.replace(config.env, num_envs=n))


@dataclass
class Acted:
    """What one :meth:`ActingSource.collect` wrote and what arrived with it."""

    # Rows written to replay, summed over env columns (the loop's env steps).
    env_steps: int
    # Observations that arrived, ``[n, ...]`` (normaliser statistics, non-finite check).
    obs: Any
    # Rewards that arrived, ``[n]``.
    reward: np.ndarray
    # Returns and lengths of the episodes that ended.
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    # Per episode, the env steps into this collect at which it ended (1..env_steps); empty: all at
    # its end. A Ray round spans many steps, and its episodes are logged where each one ended.
    ends: list[int] = field(default_factory=list)


class ActingSource(Protocol):
    """What the loop asks of acting."""

    # Env columns of replay the source writes.
    num_envs: int

    def collect(self) -> Acted:
        """Write the next rows of every env column into replay."""
        ...

    def after_updates(self, counters: Counters) -> None:
        """Called after the loop's learner updates (acting picks up new weights when due)."""
        ...

    def scalars(self) -> dict[str, float]:
        """``perf/*`` values to log since the last call."""
        ...

    def summary(self) -> dict[str, Any]:
        """Entries for the run's summary."""
        ...

    def close(self) -> None: ...


class LocalSource:
    """One :class:`Actor` in the learner's process: one row per env per :meth:`collect`."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor
        self.num_envs = actor.num_envs

    def collect(self) -> Acted:
        stats = self.actor.step(explore=True)
        return Acted(self.num_envs, self.actor.obs, self.actor.prev_reward, stats.returns, stats.lengths)

    def after_updates(self, counters: Counters) -> None:
        """Nothing to send: the loop syncs the policy's mirror after each update."""

    def scalars(self) -> dict[str, float]:
        return {}

    def summary(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.actor.env.close()


def make_source(
    config: Config,
    spec: EnvSpec,
    policy: Policy,
    replay: SequenceReplay,
    counters: Counters,
    env_seed: int,
    reset_seed: int,
) -> ActingSource:
    """The acting source of ``runner.kind``; training envs are seeded ``env_seed + column`` and
    first reset with ``reset_seed + column``."""
    if config.runner.kind == "ray":
        from agents.distributed import RaySource  # imports ray

        return RaySource(config, spec, policy, replay, counters, env_seed, reset_seed)
    env = make_vec_env(config.env, seed=env_seed)
    return LocalSource(Actor(env, policy, replay, seed=reset_seed))
