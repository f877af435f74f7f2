"""Run directories: claimed by one live process at a time, and files written so a crash never
leaves a half-written one.

A run directory is claimed by creating ``run.lock`` (holding the owner's PID and host) with
``O_EXCL``, an atomic test-and-create on every POSIX filesystem. Two launches that pick the same
directory (a shell loop or job array started within one second) therefore never share it: the
second takes ``<dir>_1``, ``<dir>_2``, ... A lock left by a process that died (SIGKILL, power loss)
is recognised by its PID no longer running on this host and taken over. The owner also holds an
advisory ``flock`` on the lock file for its lifetime, which the kernel drops when it dies however it
dies: that tells a lock left by another host's process (a killed container, whose host name the next
container does not share) from a live one, where the filesystem supports locks. A lock file with no
owner written yet belongs to a launch that has just created it, and is respected for a few seconds.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from envs.config import ConfigError

log = logging.getLogger("recurrl")

LOCK = "run.lock"
# A lock file without an owner may be one another launch has just created and not yet written; for
# this long it is respected, after that it is a torn lock whose writer died.
UNWRITTEN_GRACE_S = 10.0


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` via a temp file, fsync and rename: readers see old or new, never half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    raw = data.encode() if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make renames and creations inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _owner(lock: Path) -> dict | None:
    try:
        return json.loads(lock.read_text())
    except (OSError, ValueError):
        return None


def _flock_held(lock: Path) -> bool | None:
    """True while a process holds ``lock``'s flock, False if none does, None if the filesystem
    cannot tell (no lock support) or the file is gone."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: needs only read access (NFS too)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # also drops the probe's own lock
    return False


def _alive(owner: dict | None, lock: Path) -> bool:
    """True unless the lock's owner is known to be gone: on this host its PID is not running; from
    another host no process holds the lock file's flock (where the filesystem can tell). A lock with
    no owner yet is being written (its flock held, or younger than ``UNWRITTEN_GRACE_S``) or was left
    by a writer that died before finishing it."""
    if owner is None:
        if _flock_held(lock):
            return True
        try:
            age = time.time() - lock.stat().st_mtime
        except OSError:
            return False  # gone: nothing to respect
        return age < UNWRITTEN_GRACE_S
    if owner.get("host") != socket.gethostname():
        held = _flock_held(lock)
        return held is None or held  # cannot tell: assume it runs
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, ValueError, TypeError):
        return True
    return True


class RunLock:
    """The claim on one run directory; :meth:`release` (or process exit) gives it up."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK
        self.fd: int | None = None  # held open (with its flock) while this process owns the run

    def _try_create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        # Before the owner is written, so a reader that finds an owner also finds the flock. Blocking:
        # a prober holds its shared lock for an instant and must not make the owner go without one.
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # no lock support here: the PID and host still identify the owner
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        os.fsync(fd)
        self.fd = fd
        return True

    def acquire(self, take_stale: bool = True) -> bool:
        """Claim the directory; a stale lock is taken over when ``take_stale``. False if held."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self._try_create():
            return True
        owner = _owner(self.path)
        if not take_stale or _alive(owner, self.path):
            return False
        # Stale: move it aside atomically (only one contender wins the rename), then claim afresh.
        stale = self.path.with_name(f".{LOCK}.stale.{os.getpid()}")
        try:
            os.replace(self.path, stale)
        except FileNotFoundError:
            pass
        else:
            stale.unlink(missing_ok=True)
            log.warning("run dir %s: took over the lock of a process that is gone (%s)", self.run_dir, owner)
        return self._try_create()

    def release(self) -> None:
        """Remove the lock if this process still owns it."""
        owner = _owner(self.path)
        if owner and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
            self.path.unlink(missing_ok=True)
        if self.fd is not None:
            os.close(self.fd)  # drops the flock
            self.fd = None

    def holder(self) -> str:
        """Who holds the lock, for messages."""
        owner = _owner(self.path) or {}
        return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}"


def holds_run(path: Path) -> bool:
    """True if ``path`` already holds a run's files (config or checkpoints)."""
    return (path / "config.json").exists() or (path / "ckpt").is_dir()


def claim_new(run_dir: Path, max_tries: int = 1000) -> RunLock:
    """Claim ``run_dir`` for a new run, or ``run_dir_1``, ``_2``, ... if another process holds it.

    A directory that holds a finished or crashed run (no live lock) is refused with a
    :class:`ConfigError`, so nothing of an earlier run is ever overwritten.
    """
    candidate = run_dir
    for i in range(1, max_tries + 1):
        lock = RunLock(candidate)
        if holds_run(candidate):
            if candidate == run_dir and not _alive(_owner(lock.path), lock.path):
                raise ConfigError(
                    f"run_dir={str(run_dir)!r} already holds a run; pass resume={run_dir} to continue it "
                    "or choose another hydra.run.dir"
                )
        elif lock.acquire():
            if candidate != run_dir:
                log.warning("run dir %s is in use by another process; writing to %s", run_dir, candidate)
            return lock
        candidate = run_dir.with_name(f"{run_dir.name}_{i}")
    raise ConfigError(f"run_dir={str(run_dir)!r}: no free directory among {max_tries} suffixes")


def claim_resume(run_dir: Path) -> RunLock:
    """Claim an existing run for resuming; refused while another live process holds it."""
    lock = RunLock(run_dir)
    if not lock.acquire(take_stale=True):
        raise ConfigError(
            f"resume={str(run_dir)!r} is in use by {lock.holder()} ({lock.path}); wait for it to end, "
            "or delete the lock file if that process is gone"
        )
    return lock


def redirect_file_logs(old_dir: str | os.PathLike, new_dir: str | os.PathLike) -> None:
    """Point logging file handlers that write under ``old_dir`` at the same file name in ``new_dir``.

    The launcher may open its log file in a directory before the run claims one; a run that moved
    to a suffixed directory takes its log with it.
    """
    old, new = Path(old_dir).resolve(), Path(new_dir)
    if old == new.resolve():
        return
    for logger in (logging.getLogger(), log):
        for handler in list(logger.handlers):
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == old:
                handler.acquire()
                try:
                    handler.close()
                    handler.baseFilename = str((new / Path(handler.baseFilename).name).resolve())
                    handler.stream = handler._open()
                finally:
                    handler.release()
