"""The training loop under resume, kills and non-finite numbers: history kept once, nothing lost."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from agents.checkpoint import Checkpointer
from agents.config import Config, load_run_config
from agents.loop import NonFiniteError, train
from agents.metrics import read_progress
from envs.config import ConfigError
from tests.helpers import event_steps


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_resuming_a_finished_run_changes_nothing(tiny_config: Config, caplog) -> None:
    first = train(copy.deepcopy(tiny_config))
    run = Path(tiny_config.run_dir)
    before = _files(run)
    with caplog.at_level(logging.INFO, logger="recurrl"):
        again = train(load_run_config(str(run), []))
    assert _files(run) == before
    assert again == json.loads((run / "summary.json").read_text())
    assert again["best_eval_return_mean"] == first["best_eval_return_mean"] is not None
    assert "already reached train.total_env_steps=400" in caplog.text


def test_resume_keeps_evaluations_and_applies_a_new_learning_rate(tiny_config: Config, caplog) -> None:
    train(copy.deepcopy(tiny_config))
    run = str(Path(tiny_config.run_dir))
    with caplog.at_level(logging.INFO, logger="recurrl"):
        resumed = load_run_config(run, ["train.total_env_steps=800", "agent.lr=2.5e-05"])
    assert "resume: agent.lr=2.5e-05 (was 0.001)" in caplog.text
    summary = train(resumed)
    assert [e["env_steps"] for e in summary["evaluations"]] == [200, 400, 600, 800]
    assert summary["status"] == "finished"
    reader = tf.train.load_checkpoint(str(Path(run) / "ckpt" / "ckpt-800"))
    rates = [reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if "learning_rate" in k]
    assert rates and all(np.isclose(r, 2.5e-05) for r in rates)


def test_a_decaying_learning_rate_resumes_on_its_schedule_and_cannot_be_switched(tiny_config: Config) -> None:
    tiny_config.agent.lr_end = 1e-4
    tiny_config.agent.lr_decay_updates = 1000
    train(copy.deepcopy(tiny_config))
    run = tiny_config.run_dir
    with pytest.raises(ConfigError, match=r"^agent.lr_end=None cannot switch .*allowed a rate > 0"):
        load_run_config(run, ["agent.lr_end=null"])  # the optimiser's saved layout differs
    summary = train(load_run_config(run, ["train.total_env_steps=600", "agent.lr_end=5e-4"]))
    assert summary["status"] == "finished" and summary["env_steps"] == 600
    reader = tf.train.load_checkpoint(str(Path(run) / "ckpt" / "ckpt-600"))
    names = reader.get_variable_to_shape_map()
    assert not any("learning_rate" in k for k in names)  # a schedule: no rate variable to overwrite
    suffix = "iterations/.ATTRIBUTES/VARIABLE_VALUE"  # the optimiser's step counter
    iterations = [int(reader.get_tensor(k)) for k in names if k.endswith(suffix)]
    assert iterations and iterations[0] == summary["updates"]  # the schedule's clock went on
    constant = copy.deepcopy(tiny_config)
    constant.agent.lr_end = None
    constant.run_dir = str(Path(run).parent / "constant")
    train(constant)
    with pytest.raises(ConfigError, match=r"^agent.lr_end=0.0001 cannot switch .*allowed null"):
        load_run_config(constant.run_dir, ["agent.lr_end=1e-4"])


def test_updates_after_the_last_log_interval_are_written_at_the_end(tiny_config: Config) -> None:
    tiny_config.train.log_every_updates = 1000  # more than the run's 76 updates
    summary = train(copy.deepcopy(tiny_config))
    run = Path(tiny_config.run_dir)
    assert 0 < summary["updates"] < 1000
    assert event_steps(run, "losses/loss") == [400]  # one partial window, at the last step
    assert event_steps(run, "td/abs_mean") == [400]


def test_kill_after_an_evaluation_then_resume_keeps_each_step_once(tiny_config: Config) -> None:
    tiny_config.eval.every_env_steps = 100
    train(copy.deepcopy(tiny_config))
    run = Path(tiny_config.run_dir)
    # As if killed after the evaluation at 400 but before its checkpoint: history runs past the
    # newest complete checkpoint (200).
    for p in (run / "ckpt").glob("*400*"):
        p.unlink()
    assert [r["env_steps"] for r in read_progress(run / "progress.csv")] == [100, 200, 300, 400]
    summary = train(load_run_config(str(run), []))
    assert [r["env_steps"] for r in read_progress(run / "progress.csv")] == [100, 200, 300, 400]
    assert [e["env_steps"] for e in summary["evaluations"]] == [100, 200, 300, 400]
    assert event_steps(run, "eval/return_mean") == [100, 200, 300, 400]
    losses = event_steps(run, "losses/loss")  # written every 5 updates, before and after the resume
    assert losses == sorted(set(losses)) and min(losses) < 200 < max(losses)
    episodes = event_steps(run, "charts/episode_return")  # several episodes may end on one step
    assert episodes == sorted(episodes) and max(episodes) > 200


def test_overrides_on_resume_restating_the_run_are_accepted_frozen_keys_refused(tiny_config: Config) -> None:
    train(copy.deepcopy(tiny_config))
    run = tiny_config.run_dir
    same = load_run_config(run, ["agent=rdqn", "env=cue", "network.units=16", "+env.kwargs.delay=2"])
    assert same.network.units == 16 and same.resume == run
    for override, key in [
        ("network.units=32", "network.units"),
        ("env.num_envs=2", "env.num_envs"),
        ("+env.kwargs.delay=3", "env.kwargs.delay"),
        ("+env.kwargs.size=3", "env.kwargs.size"),
        ("replay.capacity=8000", "replay.capacity"),
        ("seed=3", "seed"),
        ("agent.twin_q=true", "agent.twin_q"),
        ("agent.reward_head=1.0", "agent.reward_head"),
        ("agent.average_tau=0.01", "agent.average_tau"),
        ("agent=rddpg", "agent=rddpg"),
        ("env=cartpole_p", "env=cartpole_p"),
    ]:
        with pytest.raises(ConfigError, match=f"^{key}.* cannot change a resumed run"):
            load_run_config(run, [override])
    changed = load_run_config(run, ["agent.lr=0.01", "eval.episodes=2", "replay.burn_in=1"])
    assert (changed.agent.lr, changed.eval.episodes, changed.replay.burn_in) == (0.01, 2, 1)


@pytest.mark.parametrize("field", ["reward", "obs"])
def test_nonfinite_env_output_stops_the_run_and_keeps_the_checkpoint(tiny_config: Config, field: str) -> None:
    tiny_config.env.id = "recurrl/NaNReward-v0"
    tiny_config.env.kwargs = {"nan_after": 80, "what": field}  # each env's step 80: env step 4 x 80
    with pytest.raises(NonFiniteError) as err:
        train(tiny_config)
    what = "reward nan" if field == "reward" else "observation nan at obs index 0"
    assert str(err.value).startswith(f"non-finite {what} from env 0 at env step 320;")
    assert "last checkpoint (env step 200) is kept" in str(err.value)
    run = Path(tiny_config.run_dir)
    assert Checkpointer(run).complete_steps() == [200]
    with np.load(run / "ckpt" / "state-200.npz") as state:
        assert np.isfinite(state["replay/data/reward"]).all()
    assert json.loads((run / "summary.json").read_text())["status"].startswith("stopped: non-finite")


def test_nonfinite_loss_stops_before_a_checkpoint(tiny_config: Config, monkeypatch) -> None:
    from agents.rdqn import RDQNLearner

    step, calls = RDQNLearner.step, []

    def poisoned(self, batch):
        metrics = step(self, batch)
        calls.append(1)
        return {**metrics, "loss": np.float32("nan")} if len(calls) == 60 else metrics

    monkeypatch.setattr(RDQNLearner, "step", poisoned)
    with pytest.raises(NonFiniteError, match=r"^non-finite learner loss \(nan\) at env step 336;"):
        train(tiny_config)
    assert Checkpointer(Path(tiny_config.run_dir)).complete_steps() == [200]


def _update_paths(config: Config, monkeypatch) -> list[list[str]]:
    """The project files one rdqn update passes through, from ``replay.sample`` to the TensorBoard
    write of its TD errors, in call order with repeats of the same file merged: for the first
    update (the step is traced: the model code runs in Python) and for the 30th (compiled)."""
    import sys

    from agents import metrics, replay

    root = str(Path(__file__).resolve().parents[1]) + "/"
    paths: list[list[str]] = []
    current: list[str] = []

    def profile(frame, event, arg) -> None:
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(root) and "/.venv/" not in name and "/tests/" not in name:
            rel = name[len(root) :]
            if not current or current[-1] != rel:
                current.append(rel)

    sample, write = replay.SequenceReplay.sample, metrics.MetricsWriter.learner
    calls = {"n": 0}

    def traced_sample(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] in (1, 30):
            current.clear()
            sys.setprofile(profile)
        return sample(self, *args, **kwargs)

    def traced_write(self, *args, **kwargs):
        out = write(self, *args, **kwargs)
        if sys.getprofile() is profile:
            sys.setprofile(None)
            paths.append(list(current))
        return out

    monkeypatch.setattr(replay.SequenceReplay, "sample", traced_sample)
    monkeypatch.setattr(metrics.MetricsWriter, "learner", traced_write)
    try:
        train(config)
    finally:
        sys.setprofile(None)
    return paths


def test_one_update_takes_a_straight_path(tmp_path: Path, monkeypatch) -> None:
    """The shipped rdqn preset's update crosses files in one direction: replay -> learner ->
    network (encoder, recurrence; target then online) -> returns -> optimiser -> target update ->
    acting-policy sync -> metrics, at most 17 switches between files while the step is traced and
    5 once it is compiled."""
    from tests.test_config import _compose  # its module registers the config schemas

    short = ["train.total_env_steps=1400", "train.learning_starts=1000", "train.log_every_updates=1"]
    quiet = ["train.progress_bar=false", "eval.every_env_steps=100000", "eval.episodes=1"]
    config = _compose(["env=cartpole_p", f"run_dir={tmp_path / 'run'}", *short, *quiet])
    traced, compiled = _update_paths(config, monkeypatch)
    assert len(traced) - 1 <= 17, " -> ".join(traced)
    assert compiled == [
        "agents/replay.py",
        "agents/rdqn.py",
        "agents/compiled.py",
        "agents/rdqn.py",
        "agents/networks.py",
        "agents/metrics.py",
    ]
    # Each network is entered once: the target unroll, then the online unroll in segments.
    assert traced.count("agents/networks.py") == 3  # two unrolls, then the acting-policy sync
