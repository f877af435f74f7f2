"""The agent contract: what the training loop asks of a learner, and the registry of agents.

Each agent module (:mod:`agents.rdqn`, :mod:`agents.rddpg`) holds its config dataclass, its learner
and one builder with the :data:`Builder` signature, and registers them under its ``agent.kind``::

    register("rdqn", RDQNConfig, build_rdqn)

:func:`agents.loop.build_agent` looks the kind up here and :data:`agents.config.AGENT_CONFIGS`
(the schemas Hydra checks ``conf/agent/*.yaml`` against) reads the same table, so a new agent
lives in its own module and the loop does not change. :mod:`agents.config` imports the built-in
agent modules, which registers them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from envs.config import ConfigError, check, finite

if TYPE_CHECKING:
    import numpy as np
    import tensorflow as tf

    from agents.actor import Policy
    from agents.config import Config
    from agents.networks import NetworkConfig
    from envs.config import EnvConfig
    from envs.make import EnvSpec

Batch = dict[str, "np.ndarray"]


@runtime_checkable
class Learner(Protocol):
    """Everything the training loop calls on a learner.

    Replay batches hold ``[B, L]`` rows, ``L = seq_len = burn_in + trace_length + n_step``; the
    recurrent state stored with each row is flat, ``[B, state_dim]``.
    """

    # Rows per sampled sequence, L.
    seq_len: int
    # Width of the flat recurrent state replay stores per row (0 for an mlp core).
    state_dim: int
    # Update counter; the loop writes its own count here before each checkpoint.
    updates: tf.Variable

    def step(self, batch: Batch) -> dict[str, np.ndarray]:
        """One update from replay rows (``obs`` ``[B, L, O]``, ``state`` ``[B, state_dim]``, the
        per-row fields of :meth:`replay_fields` and ``reward``, ``terminated``, ``truncated``,
        ``first``, ``valid`` ``[B, L]``). Returns numpy metrics: scalars (written as ``losses/*``),
        ``<prefix>td_error`` with ``<prefix>mask`` ``[B, T]`` pairs and ``histogram/*`` arrays."""
        ...

    def replay_fields(self) -> dict[str, tuple[tuple[int, ...], type]]:
        """Per-row fields replay must store besides the common ones: name -> (shape, dtype)."""
        ...

    def trackables(self) -> dict[str, object]:
        """Objects a checkpoint must hold to resume this learner exactly."""
        ...

    def networks(self) -> list[Any]:
        """Every network whose input normalisation follows the observation statistics."""
        ...

    def eval_network(self, which: str) -> Any:
        """The network a greedy evaluation acts with, ``which`` in ``online|target`` (and ``average``
        where the config keeps one: ``agent.average_tau``); the loop wraps
        it in :class:`agents.networks.NumpyNetwork` (``[E, F] -> [E, O]`` one step at a time)."""
        ...

    def sync_policy(self, policy: Policy) -> None:
        """Refresh the acting policy's numpy mirror after an update."""
        ...

    def schedule_scalars(self, env_steps: int) -> dict[str, float]:
        """Exploration schedule values to log at ``env_steps`` (``charts/*`` tags)."""
        ...


class StepCounter(Protocol):
    """The loop's progress counters as a builder sees them: read live by exploration schedules."""

    env_steps: int


class AgentConfig(Protocol):
    """What the loop and :func:`agents.config.validate` need from an agent's config dataclass."""

    kind: str
    name: str
    n_step: int
    batch_size: int

    def validate(self) -> None:
        """Range checks of the agent's own fields (:class:`ConfigError`, one line)."""
        ...

    def validate_network(self, network: NetworkConfig) -> None:
        """Checks of the network settings that depend on this agent."""
        ...

    def validate_for_env(self, env: EnvConfig, spec: EnvSpec) -> None:
        """Checks that need the env (e.g. the action space kind)."""
        ...


Builder = Callable[["Config", "EnvSpec", StepCounter], "tuple[Learner, Policy]"]


class AgentEntry(NamedTuple):
    """One registered agent kind: its config dataclass and its builder."""

    config: type
    build: Builder


AGENTS: dict[str, AgentEntry] = {}


def register(kind: str, config: type, build: Builder) -> None:
    """Make ``agent.kind=<kind>`` build with ``build(config, spec, counters)``."""
    known = AGENTS.get(kind)
    if known is not None and known != (config, build):
        raise ValueError(f"agent kind {kind!r} is already registered to {known.config.__name__}")
    AGENTS[kind] = AgentEntry(config, build)


def lookup(kind: str) -> AgentEntry:
    """The registered entry of ``agent.kind``; a one-line :class:`ConfigError` if there is none."""
    if kind not in AGENTS:
        raise ConfigError(f"agent.kind={kind!r} is invalid: allowed {'|'.join(AGENTS)}")
    return AGENTS[kind]


class _ConfigsByKind(Mapping[str, type]):
    """A live read-only view ``kind -> config dataclass`` of :data:`AGENTS`."""

    def __getitem__(self, kind: str) -> type:
        return AGENTS[kind].config

    def __iter__(self) -> Iterator[str]:
        return iter(AGENTS)

    def __len__(self) -> int:
        return len(AGENTS)


CONFIGS_BY_KIND: Mapping[str, type] = _ConfigsByKind()


def validate_common(a: Any) -> None:
    """Checks of the fields every built-in agent config shares (tau, gamma, n_step, ...)."""
    check(finite(a.tau) and 0 < a.tau <= 1, "agent.tau", a.tau, "(0, 1]")
    check(finite(a.gamma) and 0 <= a.gamma <= 1, "agent.gamma", a.gamma, "[0, 1]")
    check(a.n_step >= 1, "agent.n_step", a.n_step, "integers >= 1")
    lam = getattr(a, "td_lambda", None)
    if lam is not None:
        check(finite(lam) and 0 <= lam <= 1, "agent.td_lambda", lam, "[0, 1] or null")
    check(a.batch_size >= 1, "agent.batch_size", a.batch_size, "integers >= 1")
    check(finite(a.lr) and a.lr > 0, "agent.lr", a.lr, "> 0")
    check(a.target_update_period >= 1, "agent.target_update_period", a.target_update_period, ">= 1")
    average = getattr(a, "average_tau", None)
    if average is not None:
        check(finite(average) and 0 < average <= 1, "agent.average_tau", average, "(0, 1] or null")
    check(finite(a.max_grad_norm) and a.max_grad_norm > 0, "agent.max_grad_norm", a.max_grad_norm, "> 0")
