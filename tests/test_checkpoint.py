"""Checkpoints: complete or ignored, damaged ones skipped on restore, nothing half-written kept."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from agents.checkpoint import SENTINEL, Checkpointer
from agents.config import Config
from agents.loop import build_agent
from agents.networks import NetworkConfig
from agents.rddpg import RDDPGConfig
from agents.rdqn import RDQNConfig
from agents.run_state import Counters
from envs import describe_env
from envs.config import ConfigError, EnvConfig


def _saved(tmp_path: Path, steps=(1000, 2000), keep: int = 2) -> tuple[Checkpointer, tf.Variable]:
    var = tf.Variable(0.0)
    ckpt = Checkpointer(tmp_path, max_to_keep=keep, var=var)
    for step in steps:
        var.assign(float(step))
        ckpt.save(step, {"x": np.full(3, step)}, {"counters": {"env_steps": step}})
    return ckpt, var


def _restore(ckpt: Checkpointer) -> tuple[int, dict]:
    got = {}
    step = ckpt.restore_latest(lambda extra, info: got.update(extra=extra, info=info))
    return step, got


def test_round_trip_and_pruning(tmp_path: Path) -> None:
    ckpt, var = _saved(tmp_path, steps=(1000, 2000, 3000))
    var.assign(-1.0)
    step, got = _restore(ckpt)
    assert step == 3000 and float(var.numpy()) == 3000.0
    assert got["extra"]["x"].tolist() == [3000] * 3 and got["info"]["counters"]["env_steps"] == 3000
    names = sorted(p.name for p in ckpt.dir.iterdir())
    assert not any("1000" in n for n in names), names  # only the newest two are kept
    assert {SENTINEL.format(step=s) for s in (2000, 3000)} <= set(names)
    assert not any(n.startswith(".") or "tmp" in n for n in names), names


@pytest.mark.parametrize(
    "damage",
    ["empty sentinel", "truncated state", "missing state", "truncated weights", "missing weights"],
)
def test_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt, var = _saved(tmp_path)
    d = ckpt.dir
    if damage == "empty sentinel":
        (d / SENTINEL.format(step=2000)).write_text("")
    elif damage == "truncated state":
        raw = (d / "state-2000.npz").read_bytes()
        (d / "state-2000.npz").write_bytes(raw[: len(raw) // 2])
    elif damage == "missing state":
        (d / "state-2000.npz").unlink()
    elif damage == "truncated weights":
        data = next(d.glob("ckpt-2000.data-*"))
        data.write_bytes(data.read_bytes()[:3])
    else:
        (d / "ckpt-2000.index").unlink()
    var.assign(-1.0)
    with caplog.at_level(logging.WARNING, logger="recurrl"):
        step, got = _restore(ckpt)
    assert step == 1000 and float(var.numpy()) == 1000.0 and got["extra"]["x"][0] == 1000
    assert "checkpoint at env step 2000 skipped" in caplog.text


def test_checkpoint_the_caller_rejects_is_skipped_too(tmp_path: Path) -> None:
    ckpt, _ = _saved(tmp_path)

    def apply(extra: dict, info: dict) -> None:
        if info["counters"]["env_steps"] == 2000:
            raise ValueError("replay field obs: saved (5, 2) does not fit buffer (5, 3)")

    assert ckpt.restore_latest(apply) == 1000

    def out_of_memory(extra: dict, info: dict) -> None:
        raise MemoryError  # the machine's fault, not the checkpoint's: the newest is not skipped

    with pytest.raises(MemoryError):
        ckpt.restore_latest(out_of_memory)
    assert ckpt.complete_steps() == [1000, 2000]


def test_no_usable_checkpoint_is_one_line(tmp_path: Path) -> None:
    ckpt, _ = _saved(tmp_path)
    for step in (1000, 2000):
        (ckpt.dir / f"state-{step}.npz").write_bytes(b"")
    with pytest.raises(ConfigError) as err:
        _restore(ckpt)
    message = str(err.value)
    assert "\n" not in message and "no usable checkpoint" in message
    assert "step 2000" in message and "step 1000" in message


def test_a_failed_save_leaves_no_temp_file_and_no_sentinel(tmp_path: Path, monkeypatch) -> None:
    ckpt, _ = _saved(tmp_path, steps=(1000,))

    def broken_savez(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(2000, {"x": np.zeros(2)}, {})
    names = sorted(p.name for p in ckpt.dir.iterdir())
    assert not any(n.startswith(".") or n.endswith(".tmp") for n in names), names
    assert ckpt.latest() == 1000


def test_unfinished_save_is_ignored_and_cleaned_by_the_next(tmp_path: Path) -> None:
    ckpt, var = _saved(tmp_path, steps=(1000,))
    ckpt.checkpoint.write(str(ckpt.dir / "ckpt-2000"))  # a kill after the weights, before the rest
    (ckpt.dir / ".state-2000.123.tmp").write_bytes(b"partial")
    assert ckpt.latest() == 1000
    ckpt.save(3000, {"x": np.zeros(1)}, {})
    names = sorted(p.name for p in ckpt.dir.iterdir())
    assert not any("2000" in n for n in names), names


def test_sentinel_is_json_with_the_step(tmp_path: Path) -> None:
    ckpt, _ = _saved(tmp_path, steps=(1000,))
    info = json.loads((ckpt.dir / SENTINEL.format(step=1000)).read_text())
    assert info["step"] == 1000 and info["tf_prefix"] == "ckpt-1000"


def _learner_config(agent: str) -> Config:
    """A learner with every kind of weight: LayerNorm dense stacks, post layers, observation
    statistics, the average network (the dueling value head for rdqn, twin critics for rtd3)."""
    network = NetworkConfig(units=8, pre_layers=[8, 8], post_layers=[8], layer_norm=True)
    if agent == "rdqn":
        network.dueling = True
        agent_config = RDQNConfig(batch_size=4, average_tau=0.05)
        return Config(agent=agent_config, env=EnvConfig(id="CartPole-v1"), network=network)
    env = EnvConfig(id="Pendulum-v1", mask_obs=[2])
    agent_config = RDDPGConfig(batch_size=4, twin_critics=True, average_tau=0.05)
    return Config(agent=agent_config, env=env, network=network)


def _state(learner) -> dict[str, np.ndarray]:
    """Every weight of the learner's networks (by path) and every optimiser variable (by position:
    an optimiser's variable paths carry its instance number)."""
    out = {}
    for name, obj in learner.trackables().items():
        if isinstance(obj, keras.layers.Layer):
            out.update({f"{name}:{w.path}": np.asarray(w) for w in obj.weights})
        elif isinstance(obj, keras.optimizers.Optimizer):
            out.update({f"{name}:{i}": np.asarray(v) for i, v in enumerate(obj.variables)})
    return out


@pytest.mark.parametrize("agent", ["rdqn", "rddpg"])
def test_every_network_weight_round_trips(tmp_path: Path, agent: str) -> None:
    """Online and target networks come back whole: encoder dense stacks and observation statistics
    (layers Keras keeps in lists, which TensorFlow's object graph does not see), cores, post layers,
    heads; and the optimisers' moments."""
    config = _learner_config(agent)
    spec = describe_env(config.env)
    saved, _ = build_agent(config, spec, Counters())
    rng = np.random.default_rng(0)
    for obj in saved.trackables().values():
        if isinstance(obj, keras.layers.Layer | keras.optimizers.Optimizer):
            for v in obj.weights if isinstance(obj, keras.layers.Layer) else obj.variables:
                if v.dtype == "float32":
                    v.assign(rng.normal(size=v.shape).astype(np.float32))
    before = _state(saved)
    assert any("encoder/pre_1/ln_gamma" in k for k in before) and any("input_std" in k for k in before)
    assert any(k.startswith("average_") for k in before)
    Checkpointer(tmp_path, **saved.trackables()).save(100, {"x": np.zeros(1)}, {})
    fresh, _ = build_agent(config, spec, Counters())
    assert any(not np.array_equal(v, before[k]) for k, v in _state(fresh).items())
    Checkpointer(tmp_path, **fresh.trackables()).load(100)
    after = _state(fresh)
    assert after.keys() == before.keys()
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def test_older_layout_still_loads_with_a_warning(tmp_path: Path, caplog) -> None:
    """A checkpoint written by tracking the model objects (no layout in its sentinel) is read that
    way, saying what that layout did not save."""
    config = _learner_config("rdqn")
    learner, _ = build_agent(config, describe_env(config.env), Counters())
    ckpt = Checkpointer(tmp_path, **learner.trackables())
    ckpt.save(100, {"x": np.zeros(1)}, {})
    tf.train.Checkpoint(**learner.trackables()).write(ckpt._prefix(100))  # the older layout
    sentinel = ckpt.dir / SENTINEL.format(step=100)
    info = json.loads(sentinel.read_text())
    del info["layout"]
    sentinel.write_text(json.dumps(info))
    head = learner.online_q.head.kernel
    want = np.asarray(head)
    head.assign(np.zeros(head.shape, np.float32))
    with caplog.at_level(logging.WARNING, logger="recurrl"):
        assert ckpt.restore_latest(lambda extra, info: None) == 100
    np.testing.assert_array_equal(np.asarray(head), want)
    assert "older layout" in caplog.text
