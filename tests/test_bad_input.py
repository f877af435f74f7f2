"""Bad input on the command line: one line naming the key and what it allows, exit code 2, nothing
written, and an existing run left exactly as it was."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.config import load_run_config
from agents.loop import train
from agents.rundir import LOCK
from scripts.train import cli
from tests.helpers import TINY_TRAIN_OVERRIDES, run_cli

ROOT = Path(__file__).resolve().parents[1]

# (command line, text the error line must contain: the key, and what it allows where there is a list)
CASES = [
    ("agent.lr=abc", "agent.lr=abc is invalid"),
    (
        "agent.learnin_rate=1",
        "agent.learnin_rate is not a key: allowed acting_head|adam_epsilon|advantage_learning|average_tau|",
    ),
    ("agent=foo", "agent=foo is invalid: allowed r2d2|r2d2_bandit|rddpg|rdqn|rdqn_lambda|rtd3"),
    ("env=nope", "env=nope is invalid: allowed atari_pong|cartpole|cartpole_p|"),
    ("+foo=1", "foo is not a key: allowed agent|env|"),
    ("+agent.foo=1", "agent.foo is not a key: allowed"),
    ("seed=1.5", "seed=1.5 is invalid"),
    ("network.pre_layers=[a]", "network.pre_layers[0]"),
    ("agent.lr", "'agent.lr'"),
    ("agent.tau=1.5", "agent.tau=1.5 is invalid: allowed (0, 1]"),
    ("agent.gamma=-0.1", "agent.gamma=-0.1 is invalid: allowed [0, 1]"),
    ("agent.n_step=0", "agent.n_step=0 is invalid"),
    ("replay.trace_length=0", "replay.trace_length"),
    ("replay.capacity=10", "replay.capacity=10 is invalid: allowed >="),
    ("network.cell=transformer", "network.cell='transformer' is invalid: allowed"),
    ("network.units=0", "network.units=0 is invalid"),
    ("eval.network=best", "eval.network='best' is invalid: allowed online|target|average"),
    ("eval.episodes=0", "eval.episodes=0 is invalid"),
    ("train.updates_per_step=0", "train.updates_per_step=0.0 is invalid: allowed > 0"),
    ("env.num_envs=0", "env.num_envs=0 is invalid"),
    ("env.flicker=1.0", "env.flicker=1.0 is invalid: allowed [0, 1)"),
    ("env.id=Nope-v9", "env.id='Nope-v9' cannot be made"),
    ("env.mask_obs=[9]", "env.mask_obs=[9] has index 9 outside [0, 3]"),
    ("env.mask_obs=[0,1,2,3]", "env.mask_obs=[0, 1, 2, 3] masks every observation index"),
    ("env=pendulum_p", "agent=rdqn needs a discrete action space"),
    ("agent=rddpg env=cartpole_p", "agent=rddpg/rtd3 needs a continuous (Box) action space"),
    ("resume=/nonexistent/run", "resume='/nonexistent/run' holds no run"),
    ("replay.capacity=100000000000", "replay.capacity=100000000000 is invalid: allowed at most"),
    ("env.drop_keys=[a]", "env.drop_keys=['a'] needs a Dict observation"),
    ("env.preprocessing=foo", "env.preprocessing='foo' is invalid: allowed none|atari|minigrid_onehot"),
    ("network.encoder=cnn", "network.encoder='cnn' is invalid: allowed auto|flat"),
    ("network.cnn=resnet", "network.cnn='resnet' is invalid: allowed minigrid|nature"),
    ("network.cnn_kernels=[3]", "network.cnn_channels=[] is invalid: allowed 1 integers >= 1"),
    ("network.cnn_strides=[0,1,1]", "network.cnn_strides=[0, 1, 1] is invalid: allowed 3 integers >= 1"),
]
RESUME_CASES = [
    ("network.units=32", "network.units=32 cannot change a resumed run (it was 16)"),
    ("agent=rddpg", "agent=rddpg cannot change a resumed run (it was agent=rdqn)"),
    ("env.num_envs=2", "env.num_envs=2 cannot change a resumed run"),
    ("agent.lr=-1", "agent.lr=-1.0 is invalid: allowed > 0"),
    (
        "agent.lr_end=0.001",
        "agent.lr_end=0.001 cannot switch a resumed run between a constant and a decaying learning rate "
        "(it was None): allowed null",
    ),
]


def _error_line(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        cli(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(("args", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_value_is_one_line_and_writes_nothing(
    args: str, expected: str, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    line = _error_line(capsys, [*args.split(), f"hydra.run.dir={run}"])
    assert expected in line, line
    assert not run.exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import tiny_config

    config = copy.deepcopy(tiny_config.__wrapped__(tmp_path_factory.mktemp("bad_input")))
    train(config)
    return Path(config.run_dir)


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("args", "expected"), RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_bad_resume_override_is_one_line_and_keeps_the_run(
    args: str, expected: str, capsys: pytest.CaptureFixture, finished_run: Path
) -> None:
    before = _snapshot(finished_run)
    line = _error_line(capsys, [f"resume={finished_run}", *args.split()])
    assert expected in line, line
    assert _snapshot(finished_run) == before


def test_a_full_disk_is_one_line_and_the_last_complete_checkpoint_resumes(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import errno

    from agents.checkpoint import Checkpointer

    real_save, saves = Checkpointer.save, []

    def save(self, step, *args, **kwargs):  # the disk fills up after the first checkpoint
        saves.append(step)
        if len(saves) > 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.dir))
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "save", save)
    run = tmp_path / "run"
    code, err = run_cli(capsys, [*TINY_TRAIN_OVERRIDES, "train.total_env_steps=400"], run)
    err = [ln for ln in err.strip().splitlines() if ln]
    assert code == 4 and len(err) == 1, err
    assert err[0].startswith("error: cannot write the run (") and "No space left on device" in err[0]
    assert err[0].endswith(f"continue with: python -m scripts.train resume={run}")
    monkeypatch.setattr(Checkpointer, "save", real_save)  # room again: the run continues from 200
    summary = train(load_run_config(str(run), []))
    assert summary["status"] == "finished" and [e["env_steps"] for e in summary["evaluations"]] == [200, 400]


def test_unreadable_run_config_is_one_line(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text('{"agent": ')
    line = _error_line(capsys, [f"resume={tmp_path / 'run'}"])
    assert "config.json is unreadable" in line and "resume=" in line


def _cli_subprocess(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "scripts.train", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _only_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ") or "Traceback" in ln]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


def test_resume_of_a_run_held_by_a_live_process_is_refused(finished_run: Path) -> None:
    run = finished_run.parent / "held"
    run.mkdir(exist_ok=True)
    for p in finished_run.rglob("*"):
        if p.is_file():
            (run / p.relative_to(finished_run)).parent.mkdir(parents=True, exist_ok=True)
            (run / p.relative_to(finished_run)).write_bytes(p.read_bytes())
    (run / LOCK).write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    before = _snapshot(run)
    proc = _cli_subprocess(f"resume={run}", "train.total_env_steps=800")
    assert f"is in use by pid {os.getpid()}" in _only_error_line(proc)
    after = _snapshot(run)
    log = after.pop("train.log", b"")
    assert after == before and b"Traceback" not in log


def test_resume_with_every_checkpoint_damaged_is_one_line(finished_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "damaged"
    for p in finished_run.rglob("*"):
        if p.is_file() and p.name != LOCK:
            (run / p.relative_to(finished_run)).parent.mkdir(parents=True, exist_ok=True)
            (run / p.relative_to(finished_run)).write_bytes(p.read_bytes())
    for state in (run / "ckpt").glob("state-*.npz"):
        state.write_bytes(state.read_bytes()[:100])
    before = _snapshot(run)
    proc = _cli_subprocess(f"resume={run}", "train.total_env_steps=800")
    line = _only_error_line(proc)
    assert "has no usable checkpoint (step 400:" in line and "step 200:" in line
    after = _snapshot(run)
    after.pop("train.log", None)
    assert after == before
