"""Run directories: one live process per directory, atomic writes, log files follow a moved run."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agents import rundir
from agents.rundir import (
    LOCK,
    UNWRITTEN_GRACE_S,
    RunLock,
    atomic_write,
    claim_new,
    claim_resume,
    redirect_file_logs,
)
from envs.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    return int(proc.stdout)


def test_second_claim_of_a_live_directory_gets_a_suffix(tmp_path: Path) -> None:
    first = claim_new(tmp_path / "run")
    second = claim_new(tmp_path / "run")
    third = claim_new(tmp_path / "run")
    assert first.run_dir == tmp_path / "run"
    assert second.run_dir == tmp_path / "run_1" and third.run_dir == tmp_path / "run_2"
    assert json.loads((tmp_path / "run" / LOCK).read_text())["pid"] == os.getpid()
    first.release()
    assert not (tmp_path / "run" / LOCK).exists() and (tmp_path / "run_1" / LOCK).exists()


def test_existing_run_is_refused_and_a_stale_lock_is_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="already holds a run; pass resume="):
        claim_new(run)
    (run / LOCK).write_text(json.dumps({"pid": _dead_pid(), "host": os.uname().nodename}))
    lock = claim_resume(run)  # its owner is gone: resume may take it
    assert json.loads((run / LOCK).read_text())["pid"] == os.getpid()
    with pytest.raises(ConfigError, match=r"is in use by pid \d+ on .*run\.lock"):
        claim_resume(run)  # held by this live process now
    lock.release()


def test_a_lock_not_yet_written_is_respected_and_a_torn_one_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).write_text("")  # another launch created it an instant ago and writes it next
    assert claim_new(run).run_dir == tmp_path / "run_1"
    with pytest.raises(ConfigError, match="is in use by pid"):
        claim_resume(run)
    old = time.time() - 2 * UNWRITTEN_GRACE_S
    os.utime(run / LOCK, (old, old))  # still empty long after: its writer died before finishing it
    lock = claim_new(run)
    assert lock.run_dir == run and json.loads((run / LOCK).read_text())["pid"] == os.getpid()
    lock.release()


def test_the_owner_takes_its_flock_even_while_another_launch_probes_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    real_flock, timers = fcntl.flock, []

    def probed_then_flock(fd: int, op: int) -> None:
        if op & fcntl.LOCK_EX and not timers:  # another launch probes the new file right now
            probe = os.open(run / LOCK, os.O_RDONLY)
            real_flock(probe, fcntl.LOCK_SH)
            timers.append(threading.Timer(0.2, os.close, [probe]))
            timers[0].start()
        real_flock(fd, op)

    monkeypatch.setattr(rundir.fcntl, "flock", probed_then_flock)
    lock = RunLock(run)
    try:
        assert lock.acquire(take_stale=False) and timers
        monkeypatch.setattr(rundir.fcntl, "flock", real_flock)
        assert rundir._flock_held(run / LOCK)  # the owner's exclusive flock is there
    finally:
        for timer in timers:
            timer.join()
        lock.release()


def test_lock_of_another_host_is_respected_while_its_owner_lives_and_taken_over_after(tmp_path: Path) -> None:
    # As a container's run seen from the next container: another host name, a PID that says nothing
    # here; the owner's flock on the lock file is what tells whether it still runs.
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(run / LOCK)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not RunLock(run).acquire()
        with pytest.raises(ConfigError, match="is in use by pid 1 on elsewhere"):
            claim_resume(run)
    finally:
        holder.kill()
        holder.wait()
    lock = claim_resume(run)  # killed: the kernel dropped its flock, so the lock is stale
    assert json.loads((run / LOCK).read_text())["pid"] == os.getpid()
    other = RunLock(run)
    assert not other.acquire()  # this process's own flock now marks the run as live
    lock.release()
    assert not (run / LOCK).exists() and other.acquire()
    other.release()


def test_atomic_write_replaces_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic_write(path, "old")
    atomic_write(path, b"new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_file_logs_follow_the_run_to_its_suffixed_directory(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    handler = logging.FileHandler(tmp_path / "a" / "train.log")
    logging.getLogger().addHandler(handler)
    try:
        redirect_file_logs(tmp_path / "a", tmp_path / "b")
        logging.getLogger("recurrl").warning("hello from b")
        handler.flush()
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert "hello from b" in (tmp_path / "b" / "train.log").read_text()
    assert "hello from b" not in (tmp_path / "a" / "train.log").read_text()


@pytest.mark.slow
def test_two_launches_into_one_directory_write_two_runs(tmp_path: Path) -> None:
    """Two ``scripts.train`` processes started together with the same run dir (as a shell loop or a
    job array does within one second) end in two complete, separate runs."""
    cmd = [
        sys.executable, "-m", "scripts.train", "env=cue_memory", "train.progress_bar=false",
        "train.total_env_steps=240", "train.learning_starts=80", "eval.every_env_steps=120",
        "eval.episodes=2", "network.units=8", "replay.capacity=2000", f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    procs = [
        subprocess.Popen([*cmd, f"seed={s}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for s in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    runs = sorted(p.name for p in tmp_path.iterdir())
    assert runs == ["run", "run_1"], (runs, outs)
    seeds = {json.loads((tmp_path / r / "config.json").read_text())["seed"] for r in runs}
    assert seeds == {0, 1}
    for r in runs:
        rows = (tmp_path / r / "progress.csv").read_text().splitlines()
        assert [line.split(",")[0] for line in rows[1:]] == ["120", "240"]
        assert len(list((tmp_path / r / "tb").glob("*tfevents*"))) == 1
        assert not (tmp_path / r / LOCK).exists()


def test_a_sweep_with_a_long_command_line_gets_a_directory_name_that_fits(tmp_path: Path) -> None:
    long = [
        "env=cue_memory", "train.progress_bar=false", "train.total_env_steps=120", "train.learning_starts=60",
        "eval.every_env_steps=120", "eval.episodes=2", "network.units=8", "network.pre_layers=[8]",
        "replay.capacity=2000", "replay.burn_in=2", "replay.trace_length=4", "agent.batch_size=8",
        "agent.n_step=2", "agent.epsilon_decay_steps=100", "train.checkpoint_every_env_steps=120",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "scripts.train", "-m", "seed=0", *long, f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert run.name.startswith("0_") and len(run.name) <= 202 < len(",".join(long))
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_joblib_sweep_runs_seeds_in_parallel_processes_into_their_own_directories(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="needs the sweep extra")
    cmd = [
        sys.executable, "-m", "scripts.train", "-m", "seed=0,1", "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2", "env=cue_memory", "train.progress_bar=false", "train.total_env_steps=240",
        "train.learning_starts=80", "eval.every_env_steps=120", "eval.episodes=2", "network.units=8",
        "replay.capacity=2000", f"hydra.sweep.dir={tmp_path}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(runs) == 2
    summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
    assert sorted(s["seed"] for s in summaries) == [0, 1]
    assert all(s["status"] == "finished" and s["env_steps"] == 240 for s in summaries)
