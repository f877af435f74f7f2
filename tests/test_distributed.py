"""runner=ray: workers' rows land in their own replay columns, runs finish, checkpoint and resume, and
a killed worker is restarted without an n-step target crossing the restart."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.ray

import ray  # noqa: E402

import agents.loop  # noqa: E402
from agents.acting import RunnerConfig, with_training_envs  # noqa: E402
from agents.config import Config, load_run_config  # noqa: E402
from agents.distributed import ActingWorker, RaySource, RowSink, start_ray, write_round  # noqa: E402
from agents.loop import Counters, build_agent, train  # noqa: E402
from agents.rdqn import epsilon_ladder  # noqa: E402
from agents.replay import SequenceReplay  # noqa: E402
from envs import EnvConfig, describe_env, make_vec_env  # noqa: E402
from envs.config import ConfigError  # noqa: E402
from scripts.overrides import check  # noqa: E402
from scripts.train import cli  # noqa: E402
from tests.helpers import ROOT, TINY_TRAIN_OVERRIDES, event_tags, tag_events  # noqa: E402

BAD = [
    ("runner=foo", "runner=foo is invalid: allowed local|ray"),
    ("runner=ray runner.num_actors=0", "runner.num_actors=0 is invalid: allowed integers >= 1"),
    ("runner.rows_per_block=0", "runner.rows_per_block=0 is invalid: allowed integers >= 1"),
    ("runner.bogus=1", "runner.bogus is not a key: allowed actor_cpus|address|"),
    (
        "runner=ray runner.num_cpus=2 runner.num_actors=4",
        "runner.num_actors=4 is invalid: allowed num_actors",
    ),
    ("runner.max_restarts=-2", "runner.max_restarts=-2 is invalid: allowed integers >= -1"),
]


@pytest.mark.parametrize(("args", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_runner_settings_are_one_line(args: str, expected: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        cli(args.split())
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1 and expected in err[0], err


def test_good_runner_settings_pass_the_command_line_check() -> None:
    assert check(["runner=ray", "runner.num_actors=4"]) is None
    assert check(["runner=ray", "runner.num_cpus=2", "runner.actor_cpus=0.5", "runner.num_actors=4"]) is None


def _replay(num_envs: int, capacity: int = 40) -> SequenceReplay:
    return SequenceReplay(capacity, num_envs, 3, {"obs": ((2,), np.float32), "action": ((), np.int32)}, 1)


def test_end_episodes_closes_only_the_selected_columns() -> None:
    replay = _replay(4)
    row = {k: np.zeros_like(v[0]) for k, v in replay.data.items()}
    row["valid"][:] = 1.0  # every env in the middle of an episode
    for _ in range(3):
        replay.add(**row)
    replay.end_episodes(slice(2, 4))
    d = replay.data
    assert d["valid"][2].tolist() == [1, 1, 0, 0]  # the newest row of columns 2, 3 is a final row
    assert d["truncated"][1].tolist() == [0, 0, 1, 1]  # the row before it bootstraps from it
    replay.end_episodes()
    assert d["valid"][2].tolist() == [0, 0, 0, 0] and d["truncated"][1].tolist() == [1, 1, 1, 1]


def test_round_puts_worker_rows_in_its_columns_and_the_sink_copies() -> None:
    replay, e, k = _replay(6), 2, 4
    sinks = [RowSink(list(replay.data)) for _ in range(3)]
    for i, sink in enumerate(sinks):
        row = {key: np.zeros_like(v[0][:e]) for key, v in replay.data.items()}
        for t in range(k):
            row["reward"][:] = 10 * i + t  # in place, as the Actor updates prev_action
            sink.add(**row)
    written = write_round(replay, [s.take() for s in sinks])
    assert written == k * 6 and replay.pos == k
    expected = [[10 * (c // e) + t for c in range(6)] for t in range(k)]
    assert replay.data["reward"][:k].tolist() == expected
    assert all(v == [] for v in sinks[0].data.values())


def test_worker_takes_its_ladder_slice_and_seeds_its_columns(tiny_config: Config) -> None:
    """A worker built in this process (no Ray): worker 1 of 2, 2 envs each, acts for columns 2, 3."""
    config = _ray_config(tiny_config)
    config.agent.epsilon_ladder = True
    spec = describe_env(config.env)
    learner, _ = build_agent(with_training_envs(config), spec, Counters())
    keys = list(SequenceReplay(400, 4, learner.seq_len, learner.replay_fields(), learner.state_dim).data)
    worker = ActingWorker(config, spec, 1, keys, env_seed=5, reset_seed=9)
    np.testing.assert_array_equal(worker.policy.epsilon(), epsilon_ladder(4)[2:4])
    block = worker.collect(None)
    assert block["fresh"] and block["version"] == -1
    assert set(block["rows"]) == set(keys) and block["rows"]["reward"].shape == (10, 2)
    local = make_vec_env(config.env, seed=5 + 2, num_envs=2)  # as the local runner seeds columns 2, 3
    first_obs, _ = local.reset(seed=[9 + 2, 9 + 3])
    np.testing.assert_array_equal(block["rows"]["obs"][0], first_obs)
    assert not worker.collect(None)["fresh"]
    assert worker.counters.env_steps == 2 * 10 * 4  # two blocks of 10 steps of all 4 envs
    # Weights sent when the learner had written one block: this worker has stepped two since, so
    # its count (which epsilon reads) must not go back.
    update = {"weights": worker.policy.net.network.get_weights(), "version": 3, "env_steps": 40}
    assert worker.collect(update)["version"] == 3 and worker.counters.env_steps == 3 * 10 * 4


def test_worker_reports_the_head_each_finished_episode_acted_with(tiny_config: Config) -> None:
    """With rdqn's head bandit each worker picks heads for its own envs and names, per finished
    episode, the head that acted, so the learner's bandit (greedy evaluation) hears of every one."""
    config = _ray_config(tiny_config)
    config.agent.reward_head, config.agent.acting_head = 1.0, "bandit"
    spec = describe_env(config.env)
    learner, _ = build_agent(with_training_envs(config), spec, Counters())
    keys = list(SequenceReplay(400, 4, learner.seq_len, learner.replay_fields(), learner.state_dim).data)
    worker = ActingWorker(config, spec, 0, keys, env_seed=5, reset_seed=9)
    heads, returns = [], []
    for _ in range(6):
        block = worker.collect(None)
        heads += block["heads"]
        returns += block["returns"]
    assert len(heads) == len(returns) > 0 and set(heads) <= {0, 1}
    np.testing.assert_array_equal(worker.policy.bandit.arm_history, heads)
    np.testing.assert_array_equal(worker.policy.bandit.return_history, returns)


@pytest.fixture(scope="module")
def local_ray():
    started = start_ray(RunnerConfig(kind="ray", num_cpus=2))
    yield
    if started:
        ray.shutdown()


def _ray_config(tiny_config: Config) -> Config:
    config = copy.deepcopy(tiny_config)
    config.env = EnvConfig(name="cartpole", id="CartPole-v1", num_envs=8)
    config.runner = RunnerConfig(kind="ray", num_actors=2, envs_per_actor=2, rows_per_block=10)
    config.runner.weight_sync_every = 4
    return config  # rounds of 2 workers x 2 envs x 10 rows = 40 env steps; 400 in all


def _capture_source(monkeypatch: pytest.MonkeyPatch) -> list:
    """The acting sources the loop makes while the test runs, in order."""
    made, original = [], agents.loop.make_source

    def make(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(agents.loop, "make_source", make)
    return made


def _tag_values(run: Path, tag: str) -> list[float]:
    return [value for _, value in tag_events(run, tag)]


def test_ray_run_layout_counters_checkpoint_and_resume(local_ray, tiny_config, monkeypatch) -> None:
    config, made = _ray_config(tiny_config), _capture_source(monkeypatch)
    summary = train(copy.deepcopy(config))
    run = Path(config.run_dir)
    assert summary["status"] == "finished" and summary["env_steps"] == 400 and summary["actor_restarts"] == 0
    rounds = range(40, 401, 40)  # updates come after each round written at or past learning_starts
    assert summary["updates"] == sum(40 * 0.25 for steps in rounds if steps >= 100)
    assert [e["env_steps"] for e in summary["evaluations"]] == [200, 400]
    assert sorted(p.name for p in (run / "ckpt").glob("ckpt-*.index")) == ["ckpt-200.index", "ckpt-400.index"]
    assert {"perf/actor_env_steps_per_s", "perf/queue_depth", "perf/policy_lag"} <= event_tags(run)
    assert max(_tag_values(run, "perf/policy_lag")) < summary["updates"] / 2  # weights reach the workers
    # 10 updates per round take longer than 2 workers' 10 CartPole steps: blocks wait for the learner.
    assert max(_tag_values(run, "perf/queue_depth")) > 0
    # Episodes are logged at the env step they ended, not all at the end of their 40-step round:
    # steps of 4 (every env steps once per row), none before its own length allows.
    ended = tag_events(run, "charts/episode_length")
    assert len(ended) == summary["episodes"] and all(s % 4 == 0 and s >= 4 * n for s, n in ended)
    assert any(s % 40 for s, _ in ended) and [s for s, _ in ended] == sorted(s for s, _ in ended)
    # Worker i's envs are replay columns [2i, 2i + 2), seeded as the local runner seeds those columns.
    local = make_vec_env(config.env, seed=config.seed, num_envs=4)
    first_obs, _ = local.reset(seed=[config.seed + c for c in range(4)])
    np.testing.assert_array_equal(made[0].replay.data["obs"][0], first_obs)
    with pytest.raises(ConfigError, match="runner.num_actors=3 cannot change a resumed run"):
        load_run_config(str(run), ["runner.num_actors=3"])
    with pytest.raises(ConfigError, match=r"runner=local cannot change a resumed run \(it was runner=ray\)"):
        load_run_config(str(run), ["runner=local"])
    resumed = train(load_run_config(str(run), ["train.total_env_steps=560", "runner.weight_sync_every=2"]))
    assert resumed["env_steps"] == 560 and resumed["status"] == "finished"
    assert [e["env_steps"] for e in resumed["evaluations"]] == [200, 400, 560]


def _episodes_end_before_each_start(data: dict[str, np.ndarray], cols: slice, stored: int) -> bool:
    """Every episode start (``first``) after row 0 follows a final-observation row (``valid = 0``)
    that follows a row ending its episode or another invalid row: no n-step target runs on into
    the next episode."""
    first, valid = data["first"][:stored, cols], data["valid"][:stored, cols]
    ended = np.maximum(data["terminated"], data["truncated"])[:stored, cols]
    for t, c in zip(*np.nonzero(first[2:] > 0), strict=True):
        if valid[t + 1, c] != 0 or (ended[t, c] != 1 and valid[t, c] != 0):
            return False
    return True


def test_killed_worker_is_restarted_and_no_target_crosses_the_restart(
    local_ray, tiny_config, monkeypatch
) -> None:
    config, made = _ray_config(tiny_config), _capture_source(monkeypatch)
    collect, calls = RaySource.collect, []

    def collect_and_kill(self: RaySource):
        calls.append(1)
        if len(calls) == 3:  # worker 0 is stepping its next block
            ray.kill(self.workers[0], no_restart=False)
        return collect(self)

    monkeypatch.setattr(RaySource, "collect", collect_and_kill)
    summary = train(config)
    assert summary["status"] == "finished" and summary["env_steps"] == 400
    assert summary["actor_restarts"] == 1
    replay = made[0].replay
    assert replay.pos == 100 and not replay.full  # 400 env steps over 4 columns, no wrap
    assert _episodes_end_before_each_start(replay.data, slice(0, 4), replay.pos)


def test_train_command_with_runner_ray(tmp_path: Path) -> None:
    args = [*TINY_TRAIN_OVERRIDES, "train.total_env_steps=320", "runner=ray", "runner.num_cpus=2"]
    args += ["runner.rows_per_block=8", "runner.envs_per_actor=2", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.train", *args], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] == 320 and summary["status"] == "finished"  # 10 rounds of 2 x 2 x 8
    assert json.loads((tmp_path / "config.json").read_text())["runner"]["kind"] == "ray"
    assert "2 workers x 2 envs = 4 replay env columns" in proc.stdout + proc.stderr
