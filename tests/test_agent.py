"""The agent contract: both learners implement the Learner protocol, and agents come from a registry."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from agents.agent import AGENTS, Learner, lookup, register
from agents.config import AGENT_CONFIGS, Config, validate
from agents.loop import Counters, build_agent
from agents.networks import NetworkConfig, NumpyNetwork
from agents.rddpg import RDDPGConfig
from agents.rdqn import RDQNConfig
from agents.replay import ReplayConfig
from envs.config import ConfigError, EnvConfig
from envs.make import EnvSpec

LOW, HIGH = np.array([-2.0, -1.0], np.float32), np.array([2.0, 1.0], np.float32)
SPECS = {"rdqn": EnvSpec(3, True, 4), "rddpg": EnvSpec(3, False, 2, LOW, HIGH)}


def small_config(kind: str) -> Config:
    # tau=0.5: one update moves the target well clear of float32 round-off, halfway to the online net.
    if kind == "rdqn":
        agent = RDQNConfig(batch_size=4, tau=0.5)
    else:
        agent = RDDPGConfig(batch_size=4, tau=0.5, twin_critics=True)
    network = NetworkConfig(units=8, pre_layers=[8], post_layers=[8], inputs=["prev_action", "prev_reward"])
    return Config(agent=agent, network=network, replay=ReplayConfig(capacity=1000, burn_in=2, trace_length=3))


def batch_from_contract(learner: Learner, batch_size: int, seed: int) -> dict[str, np.ndarray]:
    """A random replay batch built only from what the protocol exposes: ``[B, L, ...]`` rows."""
    rng = np.random.default_rng(seed)
    b, length = batch_size, learner.seq_len
    batch = {}
    for key, (shape, dtype) in learner.replay_fields().items():
        if np.issubdtype(dtype, np.integer):
            batch[key] = rng.integers(0, 2, (b, length, *shape)).astype(dtype)
        else:
            batch[key] = rng.uniform(-1, 1, (b, length, *shape)).astype(dtype)
    for key in ("reward", "terminated", "truncated", "first"):
        batch[key] = np.zeros((b, length), np.float32)
    batch["reward"] = rng.normal(size=(b, length)).astype(np.float32)
    batch["valid"] = np.ones((b, length), np.float32)
    batch["state"] = 0.1 * rng.normal(size=(b, learner.state_dim)).astype(np.float32)
    return batch


def mirror_outputs(network, x: dict[str, np.ndarray]) -> np.ndarray:
    mirror = NumpyNetwork(network)
    out, _ = mirror.step(x, mirror.initial_state(len(x["obs"])))
    return out


@pytest.mark.parametrize("kind", ["rdqn", "rddpg"])
def test_both_learners_implement_the_whole_contract(kind: str) -> None:
    config, spec = small_config(kind), SPECS[kind]
    learner, policy = build_agent(config, spec, Counters())
    assert isinstance(learner, Learner)
    fields = learner.replay_fields()
    assert {"obs", "action", "prev_action", "prev_reward"} <= set(fields)
    assert learner.seq_len == 2 + 3 + config.agent.n_step and learner.state_dim == 2 * 8  # LSTM (h, c)
    assert "updates" in learner.trackables() and learner.trackables()["updates"] is learner.updates
    rng, extras = np.random.default_rng(1), policy.net.network.encoder.extras_dim
    x = {k: rng.normal(size=(5, n)).astype(np.float32) for k, n in (("obs", 3), ("extras", extras))}
    before = mirror_outputs(learner.eval_network("target"), x)
    metrics = learner.step(batch_from_contract(learner, config.agent.batch_size, seed=0))
    assert int(learner.updates) == 1
    td = [k for k in metrics if k.endswith("td_error")]
    assert td and all(metrics[k].shape == (4, 3) for k in td)
    assert all(np.isfinite(v).all() for k, v in metrics.items() if np.ndim(v) == 0)
    # The acting mirror lags until sync_policy; then it acts as the online network does.
    online = learner.eval_network("online")
    assert not np.allclose(policy.net.step(x, policy.net.initial_state(5))[0], mirror_outputs(online, x))
    learner.sync_policy(policy)
    np.testing.assert_allclose(policy.net.step(x, policy.net.initial_state(5))[0], mirror_outputs(online, x))
    # The target network is the EMA: it moved (tau > 0) but is not the online network.
    target = learner.eval_network("target")
    assert target is not online and not np.allclose(mirror_outputs(target, x), before)
    assert not np.allclose(mirror_outputs(target, x), mirror_outputs(online, x))
    assert {online, target} <= set(learner.networks())
    with pytest.raises(ValueError, match="online|target"):
        learner.eval_network("average")
    scalars = learner.schedule_scalars(100)
    assert scalars and all(k.startswith("charts/") and isinstance(v, float) for k, v in scalars.items())


def test_an_object_missing_a_member_is_not_a_learner() -> None:
    class NoEval:
        seq_len, state_dim, updates = 3, 0, None

        def step(self, batch): ...
        def replay_fields(self): ...
        def trackables(self): ...
        def networks(self): ...
        def sync_policy(self, policy): ...
        def schedule_scalars(self, env_steps): ...

    assert not isinstance(NoEval(), Learner)
    NoEval.eval_network = lambda self, which: None
    assert isinstance(NoEval(), Learner)


@dataclass
class DummyConfig:
    """A third agent kind, known only to this test."""

    kind: str = "dummy"
    name: str = "dummy"
    n_step: int = 1
    batch_size: int = 2
    width: int = 3

    def validate(self) -> None:
        if self.width < 1:
            raise ConfigError(f"agent.width={self.width!r} is invalid: allowed integers >= 1")

    def validate_network(self, network: NetworkConfig) -> None: ...

    def validate_for_env(self, env: EnvConfig, spec: EnvSpec) -> None: ...


@pytest.fixture
def dummy_agent():
    built = []

    def build(config, spec, counters):
        built.append((config.agent.width, spec.obs_dim, counters))
        return "learner", "policy"

    register("dummy", DummyConfig, build)
    yield built
    del AGENTS["dummy"]


def test_a_registered_agent_is_built_validated_and_listed_without_loop_changes(dummy_agent) -> None:
    assert "dummy" in AGENT_CONFIGS and AGENT_CONFIGS["dummy"] is DummyConfig
    config = Config(agent=DummyConfig(width=7))
    validate(config)
    counters = Counters()
    assert build_agent(config, EnvSpec(5, True, 2), counters) == ("learner", "policy")
    assert dummy_agent == [(7, 5, counters)]
    config.agent.width = 0
    with pytest.raises(ConfigError, match=r"^agent.width=0 is invalid"):
        validate(config)


def test_registry_rejects_unknown_kinds_and_conflicting_registrations(dummy_agent) -> None:
    assert set(AGENT_CONFIGS) == {"rdqn", "rddpg", "dummy"}
    with pytest.raises(ConfigError, match=r"^agent.kind='ppo' is invalid: allowed .*rdqn") as err:
        build_agent(Config(agent=RDQNConfig(kind="ppo")), SPECS["rdqn"], Counters())
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="already registered"):
        register("dummy", RDQNConfig, lookup("rdqn").build)
    register("dummy", *lookup("dummy"))  # the same entry again is harmless
