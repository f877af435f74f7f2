"""Native (C++) TensorFlow ops for the learner's recurrences, built ahead and cached.

``lstm_op.cc`` runs a whole LSTM sequence (forward, or backward) in one op; ``dense_op.cc`` one
dense + LayerNorm + ReLU layer each way. TensorFlow has no fused CPU LSTM op with a state reset per
step, and its per-op dispatch cost is as large as one LSTM step's work at the learner's shapes.

The library is compiled with the system C++ compiler against the installed TensorFlow's headers
(``tf.sysconfig``; about 40 s on 2 cores) and cached under ``$RECURRL_CACHE_DIR`` (default
``~/.cache/recurrl``), keyed by the sources, TensorFlow version, flags and CPU, so a changed machine
or TF rebuilds instead of loading a stale library. A cached library loads without a compiler.

* Concurrent builders (Hydra multirun, containers sharing a cache) serialise on a file lock; each
  writes a private temp file and renames it into place, and one that waited loads what the other built.
* A sidecar ``<library>.sha256`` (hash and size) is written after a successful build and checked
  before every load: a truncated or corrupt library is rebuilt, never loaded.
* A failed build leaves ``<library>.failed`` with the compiler's last error line, so later processes
  do not spend another 40 s; ``python -m agents.native --rebuild`` clears it and builds again.
* The fallback ``$TMPDIR/recurrl-<uid>`` (used when the cache is read-only) must be a directory
  owned by this user and not group/world-writable, otherwise it is not used at all.
* The compiler is ``$RECURRL_CXX``, else ``$CXX``, else ``c++``/``g++`` (``RECURRL_CXX=/nonexistent``
  hides it). Where none exists, :func:`load` raises :class:`NativeUnavailable` and
  ``network.backend=auto`` uses the TF-graph kernels of :mod:`agents.sequence_kernels`
  (:mod:`agents.kernels` decides).
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from agents.native.build import BuildFailed, compile_library

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("lstm_op.cc", "dense_op.cc")]
HEADERS = [Path(__file__).with_name("common.h")]
# -march=native: the library is built on (and keyed to) the CPU it runs on.
CXXFLAGS = ["-O3", "-march=native", "-fPIC", "-shared"]
BUILD_NOTICE = "building native ops, about 40 s, once per machine"
REBUILD = "python -m agents.native --rebuild"


class NativeUnavailable(RuntimeError):
    """The native ops cannot be built or loaded here (no compiler, a failed build, ...)."""


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + "".join(lines)


def compiler() -> str:
    """Path of the C++ compiler: ``$RECURRL_CXX``, else ``$CXX``, else ``c++`` or ``g++`` on PATH."""
    for var in ("RECURRL_CXX", "CXX"):
        name = os.environ.get(var)
        if name:
            path = shutil.which(name)
            if path is None:
                raise NativeUnavailable(f"no C++ compiler: {var}={name} not found")
            return path
    path = shutil.which("c++") or shutil.which("g++")
    if path is None:
        raise NativeUnavailable("no C++ compiler (c++ or g++) on PATH; set RECURRL_CXX or CXX")
    return path


def _tf_flags() -> tuple[list[str], list[str]]:
    """TF's compile and link flags; its include dirs as ``-isystem``, so the compiler's warnings
    (logged, never silenced) are about our sources rather than TensorFlow's and Eigen's headers."""
    import tensorflow as tf

    compile_flags = [
        "-isystem" + f[2:] if f.startswith("-I") else f for f in tf.sysconfig.get_compile_flags()
    ]
    return compile_flags, tf.sysconfig.get_link_flags()


def library_name() -> str:
    """File name of the library for these sources, TF version, flags and CPU."""
    import tensorflow as tf

    compile_flags, link_flags = _tf_flags()
    parts = [
        *(src.read_text() for src in SOURCES + HEADERS),
        tf.__version__,
        *compile_flags,
        *link_flags,
        *CXXFLAGS,
        _cpu_signature(),
    ]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return f"recurrl_ops-tf{tf.__version__}-{key}.so"


def cache_dirs() -> list[tuple[Path, bool]]:
    """Where the library may be found or built, in order: ``(dir, private)``. The configured cache
    (``$RECURRL_CACHE_DIR``, ``$XDG_CACHE_HOME/recurrl`` or ``~/.cache/recurrl``), then the shared
    temp dir's ``recurrl-<uid>``, which must be private to this user."""
    root = os.environ.get("RECURRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "recurrl"
    )
    return [(Path(root), False), (Path(tempfile.gettempdir()) / f"recurrl-{os.getuid()}", True)]


def _unsafe(path: Path, private: bool) -> str | None:
    """Why a library must not be loaded from ``path`` (a dir or a file), or None if it may.

    Anything must be owned by this user (or root, outside the private fallback) and writable by no
    one else; the private fallback must also be a real directory, not a link planted in ``/tmp``.
    """
    try:
        st = path.lstat() if private else path.stat()
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} not used: it is a symbolic link"
    owners = {os.getuid()} if private else {os.getuid(), 0}
    if st.st_uid not in owners:
        return f"{path} not used: owned by uid {st.st_uid}, not {os.getuid()}"
    strict = private or stat.S_ISREG(st.st_mode)  # a shared cache dir may be group-writable
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH if strict else stat.S_IWOTH):
        who = "group/world" if strict else "world"
        return f"{path} not used: {who}-writable (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


class CachedLibrary:
    """The library ``name`` in one cache dir, with its sidecar, failure marker and build lock."""

    def __init__(self, cache: Path, name: str, private: bool) -> None:
        self.cache, self.private = cache, private
        self.path = cache / name
        self.sidecar = cache / f"{name}.sha256"
        self.failed = cache / f"{name}.failed"
        self.lock = cache / f"{name}.lock"

    def verified(self) -> bool:
        """Whether the library exists, is safe to load and matches the sidecar written after its build."""
        if not self.path.exists() or _unsafe(self.path, self.private) or not self.sidecar.exists():
            return False
        try:
            digest, size = self.sidecar.read_text().split()
            return self.path.stat().st_size == int(size) and _sha256(self.path) == digest
        except (OSError, ValueError):
            return False

    def build(self, rebuild: bool = False) -> Path:
        """Build under the lock unless a process that held it first left a verified library."""
        with open(self.lock, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("waiting for another process building %s", self.path.name)
                fcntl.flock(lock, fcntl.LOCK_EX)
            if rebuild:
                for stale in (self.failed, self.sidecar, self.path):
                    stale.unlink(missing_ok=True)
            if self.verified():
                return self.path
            if self.failed.exists():
                raise NativeUnavailable(
                    f"an earlier build failed ({self.failed.read_text().strip()}); "
                    f"fix that, then retry with `{REBUILD}`"
                )
            self._compile()
        return self.path

    def _compile(self) -> None:
        cxx = compiler()  # no compiler is not a failed build: installing one is enough to retry
        log.info("%s (%s)", BUILD_NOTICE, self.path)
        start = time.perf_counter()
        fd, tmp = tempfile.mkstemp(dir=self.cache, prefix=f".{self.path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            compile_flags, link_flags = _tf_flags()
            compile_library(cxx, SOURCES, [*CXXFLAGS, *compile_flags], link_flags, Path(tmp))
            os.chmod(tmp, 0o755)
            size, digest = os.path.getsize(tmp), _sha256(Path(tmp))
            os.replace(tmp, self.path)  # atomic: a reader sees the old state or the whole library
        except BuildFailed as exc:
            _write_atomic(self.failed, f"{exc}\n")
            raise NativeUnavailable(f"{exc}; recorded in {self.failed}: retry with `{REBUILD}`") from exc
        finally:
            Path(tmp).unlink(missing_ok=True)
        _write_atomic(self.sidecar, f"{digest} {size}\n")
        names = " ".join(src.name for src in SOURCES)
        log.info("built %s in %.1f s: %s", names, time.perf_counter() - start, self.path)


def _prepare(cache: Path, private: bool) -> str | None:
    """Create ``cache`` if missing (private: mode 700); why it must not be used, or None."""
    try:
        cache.mkdir(mode=0o700 if private else 0o777, parents=True, exist_ok=True)
    except OSError as exc:  # e.g. a read-only cache in a container: try the next place
        return f"{cache}: {exc.strerror or exc}"
    return _unsafe(cache, private)


def ensure_library(rebuild: bool = False) -> Path:
    """Path of a verified library, building it if needed (``rebuild``: discard what is cached).

    Raises:
        NativeUnavailable: with the reason (every place tried), if there is none and none can be built.
    """
    name, reasons = library_name(), []
    for cache, private in cache_dirs():
        problem = _prepare(cache, private)
        if problem:
            reasons.append(problem)
            continue
        if reasons:  # say once why the earlier places were passed over
            log.info("native ops: using %s (%s)", cache, "; ".join(reasons))
        lib = CachedLibrary(cache, name, private)
        if not rebuild and lib.verified():
            return lib.path
        if not os.access(cache, os.W_OK):
            reasons.append(f"{cache}: not writable and holds no verified {name}")
            continue
        return lib.build(rebuild)
    raise NativeUnavailable("; ".join(reasons))


@functools.cache
def load() -> ModuleType:
    """The loaded op library (``recurrl_lstm_forward``/``_backward``, ``recurrl_dense_ln_forward``/
    ``_backward``); builds it if needed.

    Raises:
        NativeUnavailable: with the reason, if it cannot be built or loaded.
    """
    import tensorflow as tf

    path = ensure_library()
    try:
        return tf.load_op_library(str(path))
    except (tf.errors.NotFoundError, OSError) as exc:
        raise NativeUnavailable(f"loading {path} failed: {exc}; retry with `{REBUILD}`") from exc


def available() -> tuple[bool, str]:
    """``(True, "")`` if the native ops load here (building them if needed), else ``(False, reason)``."""
    try:
        load()
    except NativeUnavailable as exc:
        return False, str(exc)
    return True, ""


def main(argv: list[str] | None = None) -> int:
    """``python -m agents.native [--rebuild]``: build (or find) the library; exit 1 with the reason."""
    parser = argparse.ArgumentParser(prog="python -m agents.native", description=main.__doc__)
    parser.add_argument("--rebuild", action="store_true", help="discard a cached or failed build first")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.rebuild:
            ensure_library(rebuild=True)
        load()
    except NativeUnavailable as exc:
        print(f"native kernels unavailable: {exc}", file=sys.stderr)
        return 1
    print("native kernels ready")
    return 0
