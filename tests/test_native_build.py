"""Building the native ops: concurrent builders, corrupt caches, failed builds, unsafe temp dirs.

A fake compiler (a script that logs its calls and writes a few bytes where the library goes) stands
in for g++, so these run in seconds and need no compiler; its "library" never loads.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agents import native

ROOT = Path(__file__).resolve().parents[1]

FAKE_CXX = """\
import os, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_CXX_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
time.sleep(float(os.environ.get("FAKE_CXX_SLEEP", "0")))
if os.environ.get("FAKE_CXX_FAIL"):
    print("lstm_op.cc:1:1: note: context", file=sys.stderr)
    print("lstm_op.cc:2:5: error: boom", file=sys.stderr)
    sys.exit(1)
if os.environ.get("FAKE_CXX_WARN"):
    print("lstm_op.cc:3:7: warning: unused variable", file=sys.stderr)
with open(args[args.index("-o") + 1], "w") as out:
    out.write("not a library %d" % os.getpid())
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Env for a fresh cache, private temp dir and the fake compiler; cleans ``load``'s cache."""
    script = tmp_path / "fake-cxx"
    script.write_text(f"#!{sys.executable}\n{FAKE_CXX}")
    script.chmod(0o755)
    paths = {"cache": tmp_path / "cache", "tmp": tmp_path / "tmp", "log": tmp_path / "calls.log"}
    paths["tmp"].mkdir()
    paths["log"].touch()
    monkeypatch.setenv("RECURRL_CXX", str(script))
    monkeypatch.setenv("RECURRL_CACHE_DIR", str(paths["cache"]))
    monkeypatch.setenv("TMPDIR", str(paths["tmp"]))
    monkeypatch.setenv("FAKE_CXX_LOG", str(paths["log"]))
    monkeypatch.setattr(tempfile, "tempdir", str(paths["tmp"]))
    native.load.cache_clear()
    yield paths
    native.load.cache_clear()


def _calls(paths: dict[str, Path]) -> int:
    return len(paths["log"].read_text().splitlines())


def _available() -> tuple[bool, str]:
    native.load.cache_clear()  # each call stands for a new process
    return native.available()


def test_concurrent_builds_compile_once(fake: dict[str, Path]) -> None:
    """Two processes needing the library at once: one compiles (2 sources + 1 link), the other waits
    on the lock and takes the same file instead of compiling again."""
    code = "from agents import native; print('RESULT', native.available())"
    env = {**os.environ, "FAKE_CXX_SLEEP": "3", "TF_CPP_MIN_LOG_LEVEL": "2"}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert _calls(fake) == 3, fake["log"].read_text()
    (lib,) = fake["cache"].glob("*.so")
    assert all(f"loading {lib} failed" in out for out in outs), outs  # both took the one file
    assert not list(fake["cache"].glob("*.tmp")) and not list(fake["cache"].glob(".recurrl-build-*"))


def test_a_truncated_library_is_rebuilt_not_loaded(fake: dict[str, Path]) -> None:
    assert not _available()[0] and _calls(fake) == 3  # built (the fake library does not load)
    (first,) = fake["cache"].glob("*.so")
    assert not _available()[0] and _calls(fake) == 3  # verified: reused
    first.write_bytes(first.read_bytes()[:5])
    ok, _ = _available()
    assert not ok and _calls(fake) == 6
    sidecar = first.with_name(first.name + ".sha256").read_text().split()
    assert int(sidecar[1]) == first.stat().st_size > 5


def test_a_failed_build_is_recorded_and_retried_on_request(
    fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CXX_FAIL", "1")
    ok, reason = _available()
    assert not ok and "error: boom" in reason and "python -m agents.native --rebuild" in reason
    assert _calls(fake) == 2  # both sources compiled concurrently; no link after a failure
    ok, reason = _available()
    assert not ok and _calls(fake) == 2  # the next process does not spend another build on it
    assert "an earlier build failed" in reason and "boom" in reason and "--rebuild" in reason
    monkeypatch.delenv("FAKE_CXX_FAIL")
    assert native.main(["--rebuild"]) == 1  # builds again; the fake library then fails to load
    assert _calls(fake) == 5 and not list(fake["cache"].glob("*.failed"))


def test_a_missing_compiler_is_not_recorded_as_a_failed_build(
    fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECURRL_CXX", "/nonexistent")
    ok, reason = _available()
    assert not ok and reason == "no C++ compiler: RECURRL_CXX=/nonexistent not found"
    assert not list(fake["cache"].glob("*.failed"))


@pytest.mark.parametrize("problem", ["world-writable", "symlink"])
def test_an_unsafe_temp_dir_is_never_used(fake: dict[str, Path], problem: str) -> None:
    """With the cache unusable, the temp-dir fallback must be this user's own private directory:
    a library planted in a shared or linked one (even with a matching sidecar) is not loaded."""
    fake["cache"].write_text("a file where the cache dir should be")
    fallback = fake["tmp"] / f"recurrl-{os.getuid()}"
    planted = fake["tmp"] / "elsewhere" if problem == "symlink" else fallback
    planted.mkdir()
    if problem == "symlink":
        fallback.symlink_to(planted)
    else:
        planted.chmod(0o777)
    lib = planted / native.library_name()
    lib.write_text("planted")
    lib.chmod(0o755)
    lib.with_name(lib.name + ".sha256").write_text(f"{native._sha256(lib)} {lib.stat().st_size}\n")
    ok, reason = _available()
    assert not ok and "loading" not in reason and _calls(fake) == 0
    why = "group/world-writable (mode 777)" if problem == "world-writable" else "it is a symbolic link"
    assert f"{fallback} not used: {why}" in reason


def test_compiler_warnings_are_logged(fake: dict[str, Path], monkeypatch, caplog) -> None:
    monkeypatch.setenv("FAKE_CXX_WARN", "1")
    with caplog.at_level(logging.INFO):
        native.ensure_library()
    assert "-w" not in native.CXXFLAGS
    text = caplog.text
    assert "building native ops, about 40 s, once per machine" in text
    assert "lstm_op.cc:3:7: warning: unused variable" in text


def test_the_rebuild_command_is_documented() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agents.native", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "--rebuild" in proc.stdout
