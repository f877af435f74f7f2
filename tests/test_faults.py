"""Faults from outside: SIGTERM/SIGINT stop cleanly; SIGKILL at random moments never loses a run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from agents.checkpoint import Checkpointer
from agents.metrics import read_progress
from tests.helpers import ROOT, TINY_TRAIN_OVERRIDES, event_steps


def _start(run: Path, *extra: str, total: int = 1200) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "scripts.train",
        *TINY_TRAIN_OVERRIDES,
        f"train.total_env_steps={total}",
        *extra,
    ]
    cmd += [f"resume={run}"] if (run / "config.json").exists() else [f"hydra.run.dir={run}"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait_for(path_check, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    end = time.monotonic() + timeout
    while not path_check():
        assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def _assert_nothing_corrupt(run: Path) -> None:
    """Every checkpoint that claims completeness loads whole; the text files parse."""
    ckpt = Checkpointer(run)
    for step in ckpt.complete_steps():
        info = json.loads((run / "ckpt" / f"complete-{step}.json").read_text())
        assert info["counters"]["env_steps"] == step
        with np.load(run / "ckpt" / f"state-{step}.npz") as state:
            assert all(state[k].size >= 0 for k in state.files)
        reader = tf.train.load_checkpoint(str(run / "ckpt" / f"ckpt-{step}"))
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    json.loads((run / "config.json").read_text())
    if (run / "summary.json").exists():
        json.loads((run / "summary.json").read_text())
    text = (run / "progress.csv").read_text() if (run / "progress.csv").exists() else ""
    assert len(read_progress(run / "progress.csv")) == max(len(text.splitlines()) - 1, 0)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_checkpoints_and_exits_zero_then_resumes(tmp_path: Path, sig: signal.Signals) -> None:
    run = tmp_path / "run"
    proc = _start(run)
    _wait_for(lambda: (run / "progress.csv").exists(), proc)
    proc.send_signal(sig)
    out = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 0, out[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == f"stopped by {sig.name}" and summary["env_steps"] < 1200
    assert Checkpointer(run).latest() == summary["env_steps"]
    assert f"resume with: python -m scripts.train resume={run}" in out
    proc = _start(run)
    out = proc.communicate(timeout=240)[0].decode()
    assert proc.returncode == 0, out[-2000:]
    assert [r["env_steps"] for r in read_progress(run / "progress.csv")] == list(range(200, 1201, 200))


def _kill_and_resume(tmp_path: Path, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    ref = tmp_path / "ref"
    start = time.monotonic()
    proc = _start(ref)
    assert proc.wait(timeout=300) == 0
    wall = time.monotonic() - start
    expected = json.loads((ref / "summary.json").read_text())
    run = tmp_path / "run"
    for _ in range(kills):
        proc = _start(run)
        if not (run / "ckpt").is_dir():  # the first kill comes after the first checkpoint
            _wait_for(lambda: Checkpointer(run).latest() is not None, proc)
        time.sleep(rng.uniform(0.0, wall / 3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _assert_nothing_corrupt(run)
    proc = _start(run)
    out = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode == 0, out[-2000:]
    _assert_nothing_corrupt(run)
    summary = json.loads((run / "summary.json").read_text())
    for key in ("env_steps", "updates", "status"):
        assert summary[key] == expected[key], key
    assert [e["env_steps"] for e in summary["evaluations"]] == list(range(200, 1201, 200))
    assert [r["env_steps"] for r in read_progress(run / "progress.csv")] == list(range(200, 1201, 200))
    assert event_steps(run, "eval/return_mean") == list(range(200, 1201, 200))
    assert not (run / "run.lock").exists()


def test_sigkill_at_random_moments_never_loses_the_run(tmp_path: Path) -> None:
    _kill_and_resume(tmp_path, kills=3, seed=int(os.environ.get("RECURRL_FAULT_SEED", "0")))


@pytest.mark.slow
def test_sigkill_many_times(tmp_path: Path) -> None:
    _kill_and_resume(tmp_path, kills=12, seed=1)
