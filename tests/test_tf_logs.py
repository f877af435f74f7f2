"""TF's native log lines: dropped below the level in force, everything else written back, and a
training run's console free of them unless RECURRL_TF_LOGS=1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.tf_logs import BEFORE_INIT, native_lines_filtered, quiet_tensorflow
from tests.helpers import ROOT, TINY_TRAIN_OVERRIDES

# What TF's C++ side prints: absl's line prefix (I0000 00:00:..., W1204 ...) or its known topics.
TF_NATIVE = re.compile(r"^[IWEF]\d{4} |oneDNN|cpu_feature_guard|cuInit|absl::InitializeLog|\[absl\]", re.M)

NATIVE = {  # TF_CPP_MIN_LOG_LEVEL that still shows the line -> line
    0: b"I0000 00:00:1796368243.945255   20931 port.cc:153] oneDNN custom operations are on.\n",
    1: b"W1204 07:10:53.388000    123 cuda_executor.cc:1] no GPU\n",
    2: b"E1204 07:10:53.388112    123 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n",
}
OTHER = [b"Traceback (most recent call last):\n", b"I0 is not a log line\n", b"WARNING: from Python\n"]


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_native_lines_below_the_level_are_dropped_and_others_kept(capfd, level: int) -> None:
    capfd.readouterr()
    with native_lines_filtered(level):
        os.write(2, BEFORE_INIT + b"\n")
        for i, other in enumerate(OTHER):
            os.write(2, NATIVE[i] + other)
    want = [BEFORE_INIT + b"\n"] if level == 0 else []
    for i, other in enumerate(OTHER):
        want += [NATIVE[i]] if i >= level else []
        want.append(other)
    assert capfd.readouterr().err == b"".join(want).decode()


def test_lines_written_before_an_exception_still_reach_stderr(capfd) -> None:
    capfd.readouterr()
    with pytest.raises(ImportError), native_lines_filtered(3):
        os.write(2, NATIVE[2] + b"why the import failed\n")
        raise ImportError("broken")
    os.write(2, b"after\n")  # fd 2 is the real stderr again
    assert capfd.readouterr().err == "why the import failed\nafter\n"


def test_default_level_a_user_level_and_the_opt_out() -> None:
    environ: dict[str, str] = {}
    quiet_tensorflow(environ)
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": "3"}
    environ = {"TF_CPP_MIN_LOG_LEVEL": "1"}
    quiet_tensorflow(environ)
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": "1"}
    environ = {"RECURRL_TF_LOGS": "1"}
    quiet_tensorflow(environ)
    assert environ == {"RECURRL_TF_LOGS": "1"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "RECURRL_TF_LOGS")}
    return {**env, **extra}


def test_importing_the_cli_shows_tf_lines_only_when_asked() -> None:
    """The control run shows that TF prints such lines here, so the quiet run's silence means something."""
    cmd = [sys.executable, "-c", "import scripts.train"]
    loud = subprocess.run(cmd, cwd=ROOT, env=_env(RECURRL_TF_LOGS="1"), capture_output=True, text=True)
    quiet = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert loud.returncode == 0 and quiet.returncode == 0, quiet.stderr
    assert TF_NATIVE.search(loud.stderr), loud.stderr
    assert not TF_NATIVE.search(quiet.stderr), quiet.stderr


def test_training_run_console_has_no_tf_native_lines(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "scripts.train", *TINY_TRAIN_OVERRIDES, "train.total_env_steps=200"]
    proc = subprocess.run(
        [*cmd, f"hydra.run.dir={run}"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "finished: 200 env steps" in proc.stdout + proc.stderr
    assert not TF_NATIVE.search(proc.stderr), proc.stderr
    assert not TF_NATIVE.search(proc.stdout), proc.stdout
