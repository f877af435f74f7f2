"""End to end: a smoke run's artefacts, resume, determinism, and a memory task only an RNN solves."""

from __future__ import annotations

import copy
import csv
import json
import time
from pathlib import Path

import numpy as np
import pytest

from agents.checkpoint import Checkpointer
from agents.config import Config
from agents.loop import train
from agents.metrics import PROGRESS_COLUMNS, read_progress
from envs.config import ConfigError
from tests.helpers import event_tags, tag_events

TD_TAGS = ["td/mean", "td/abs_mean", "td/abs_max", "td/histogram", "td/by_position/t00-00"]


def test_smoke_run_writes_everything(tiny_config: Config) -> None:
    summary = train(tiny_config)
    run = Path(tiny_config.run_dir)
    tags = event_tags(run)
    for tag in TD_TAGS + [
        "losses/loss",
        "losses/q_mean",
        "losses/grad_norm",
        "charts/epsilon",
        "charts/episode_return",
        "charts/episode_length",
        "eval/return_mean",
        "perf/env_steps_per_s",
        "perf/updates_per_s",
        "hparams/final_eval_return_mean",
        "hparams/best_eval_return_mean",
        "_hparams_/session_start_info",
    ]:
        assert tag in tags, tag
    rows = list(csv.DictReader(open(run / "progress.csv")))
    assert tuple(rows[0]) == PROGRESS_COLUMNS and [int(r["env_steps"]) for r in rows] == [200, 400]
    saved = json.loads((run / "summary.json").read_text())
    # Learning starts at env step 100; then 4 envs x 0.25 updates per env step = 1 update per step.
    assert saved["env_steps"] == summary["env_steps"] == 400 and saved["updates"] == 76
    assert Checkpointer(run).latest() == 400
    assert (run / "config.json").exists()
    # Which implementation ran is recorded: the summary and TensorBoard's text tab.
    assert set(saved["kernels"]) == {"recurrence", "dense", "reason"} and "run/kernels" in tags


def test_perf_rates_leave_out_compile_and_checkpoint_writes(tiny_config: Config, monkeypatch) -> None:
    """perf/env_steps_per_s is the steady rate: the first update (which traces and compiles) and
    checkpoint writes are timed on their own and left out of it."""
    import agents.loop
    from agents.rdqn import RDQNLearner

    pause, step, save = 3.0, RDQNLearner.step, agents.loop.save_run_state
    calls = []

    def slow_first_step(self, batch):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(pause)
        return step(self, batch)

    def slow_save(*args, **kwargs):
        time.sleep(pause)
        return save(*args, **kwargs)

    monkeypatch.setattr(RDQNLearner, "step", slow_first_step)
    monkeypatch.setattr(agents.loop, "save_run_state", slow_save)
    train(tiny_config)
    run = Path(tiny_config.run_dir)
    # Windows of 200 env steps: the first holds the first update, the second follows the
    # checkpoint at 200. Counting either pause would put its rate at or below 200 / pause.
    rates = tag_events(run, "perf/env_steps_per_s")
    assert [s for s, _ in rates] == [200, 400] and min(r for _, r in rates) > 200 / pause
    assert [s for s, _ in tag_events(run, "perf/first_update_s")] == [100]
    assert tag_events(run, "perf/first_update_s")[0][1] >= pause
    checkpoints = tag_events(run, "perf/checkpoint_s")
    assert [s for s, _ in checkpoints] == [200, 400] and min(v for _, v in checkpoints) >= pause


def test_resume_continues_counters_and_refuses_to_clobber(tiny_config: Config) -> None:
    first = train(copy.deepcopy(tiny_config))
    run = Path(tiny_config.run_dir)
    events_before = sorted(p.name for p in (run / "tb").iterdir())
    with pytest.raises(ConfigError, match="already holds a run"):
        train(copy.deepcopy(tiny_config))  # same run dir without resume: nothing overwritten
    assert sorted(p.name for p in (run / "tb").iterdir()) == events_before
    resumed = copy.deepcopy(tiny_config)
    resumed.resume = str(run)
    resumed.train.total_env_steps = 800
    second = train(resumed)
    assert first["env_steps"] == 400 and second["env_steps"] == 800
    assert second["updates"] == first["updates"] + 100  # 100 more vector steps, 1 update each
    rows = list(csv.DictReader(open(run / "progress.csv")))
    assert [int(r["env_steps"]) for r in rows] == [200, 400, 600, 800]
    assert Checkpointer(run).latest() == 800


def test_same_seed_same_numbers(tiny_config: Config, tmp_path: Path) -> None:
    a, b, c = (copy.deepcopy(tiny_config) for _ in range(3))
    a.run_dir, b.run_dir, c.run_dir = (str(tmp_path / n) for n in "abc")
    c.seed = 1
    ra, rb = train(a), train(b)
    train(c)
    assert ra["evaluations"] == [
        dict(e, wall_time_s=e2["wall_time_s"])
        for e, e2 in zip(rb["evaluations"], ra["evaluations"], strict=True)
    ]
    # progress.csv is identical but for the wall-clock column.
    rows_a, rows_b = (read_progress(Path(r.run_dir) / "progress.csv") for r in (a, b))
    assert [dict(r, wall_time_s=0) for r in rows_a] == [dict(r, wall_time_s=0) for r in rows_b]
    assert len(rows_a) == 2
    ka = np.load(Path(a.run_dir) / "ckpt" / "state-400.npz")["replay/data/reward"]
    kb = np.load(Path(b.run_dir) / "ckpt" / "state-400.npz")["replay/data/reward"]
    kc = np.load(Path(c.run_dir) / "ckpt" / "state-400.npz")["replay/data/reward"]
    np.testing.assert_array_equal(ka, kb)
    assert not np.array_equal(ka, kc)


@pytest.mark.slow
def test_memory_task_lstm_learns_and_mlp_cannot(tiny_config: Config, tmp_path: Path) -> None:
    """A cue at t=0, asked for 4 blank steps later: +1 if recalled, -1 if not (chance = 0)."""
    results = {}
    for cell in ("lstm", "mlp"):
        config = copy.deepcopy(tiny_config)
        config.run_dir = str(tmp_path / cell)
        config.env.kwargs = {"delay": 4}
        config.env.num_envs = 8
        config.network.cell = cell
        config.replay.burn_in, config.replay.trace_length = 0, 6
        config.agent.n_step, config.agent.gamma, config.agent.tau = 1, 0.9, 0.05
        config.agent.epsilon_decay_steps = 1000
        config.train.total_env_steps = 2400
        config.train.learning_starts = 200
        config.train.updates_per_step = 0.25
        config.eval.every_env_steps = 800
        config.eval.episodes = 50
        results[cell] = train(config)["final_eval_return_mean"]
    # 50 greedy episodes: a policy at chance scores 0 +- 0.14 (sd); a solved one scores 1.
    assert results["lstm"] >= 0.9, results
    assert results["mlp"] <= 0.5, results


def test_load_run_config_applies_overrides_and_keeps_agent(tiny_config: Config) -> None:
    from agents.config import load_run_config

    train(copy.deepcopy(tiny_config))
    run = tiny_config.run_dir
    loaded = load_run_config(run, ["train.total_env_steps=800", "resume=elsewhere"])
    assert loaded.train.total_env_steps == 800 and loaded.resume == run and loaded.run_dir == run
    assert loaded.env.id == "recurrl/CueMemory-v0" and loaded.network.units == 16
    with pytest.raises(ConfigError, match="cannot change a resumed run"):
        load_run_config(run, ["agent=rddpg"])
    with pytest.raises(ConfigError, match="override rejected"):
        load_run_config(run, ["train.total_env_stepz=800"])


def test_rdqn_with_previous_action_and_reward_inputs(tiny_config: Config) -> None:
    """network.inputs works for rdqn: replay stores the extras, learner and actor see the same width."""
    from agents.loop import Counters, build_agent
    from envs import describe_env

    tiny_config.network.inputs = ["prev_action", "prev_reward"]
    spec = describe_env(tiny_config.env)
    learner, policy = build_agent(tiny_config, spec, Counters())
    encoder = learner.online_q.encoder
    assert encoder.extras_dim == spec.num_actions + 1
    assert encoder.feature_dim == spec.obs_dim + spec.num_actions + 1
    assert learner.replay_fields()["prev_action"] == ((spec.num_actions,), np.float32)
    assert policy.inputs == tiny_config.network.inputs
    summary = train(tiny_config)
    assert summary["env_steps"] == 400 and summary["updates"] == 76
