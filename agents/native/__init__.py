"""Native (C++) TensorFlow ops for the learner's recurrences, compiled on first use and cached.

TensorFlow has no fused CPU LSTM op with a state reset per step, and its per-op cost (about 5 us
here) is as large as the work of one LSTM step at the learner's shapes. ``lstm_op.cc`` runs a whole
sequence (forward, or backward) in one op; ``dense_op.cc`` one dense + LayerNorm + ReLU layer
(forward, or backward), which is about 15 TF ops each way. They are compiled with the system C++
compiler against the installed TensorFlow's headers (``tf.sysconfig``), about 40 s once on 2
cores, and cached under ``$RECURRL_CACHE_DIR`` (default ``~/.cache/recurrl``; a temp dir if that
is not writable) keyed by the sources, TensorFlow version, flags and CPU, so a changed machine or
TF rebuilds instead of loading a stale library. A cached library loads without a compiler.

``python -m agents.native`` builds (or finds) the library and says whether it loads: the Docker image runs
it at build time. Where no compiler exists, :func:`load` raises :class:`NativeUnavailable` and
``network.kernel=auto`` falls back to the TF-graph kernels of :mod:`agents.fastrnn`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("lstm_op.cc", "dense_op.cc")]
HEADERS = [Path(__file__).with_name("common.h")]
# -march=native: the library is built on (and keyed to) the CPU it runs on.
CXXFLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-w"]


class NativeUnavailable(RuntimeError):
    """The native ops cannot be built or loaded here (no compiler, a failed build, ...)."""


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + "".join(lines)


def _compiler() -> str:
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx) or shutil.which("g++")
    if path is None:
        raise NativeUnavailable(f"no C++ compiler ({cxx} or g++) on PATH")
    return path


def _cache_dirs() -> list[Path]:
    """Where a built library may be found or written: the configured cache, then a temp dir."""
    root = os.environ.get("RECURRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "recurrl"
    )
    return [Path(root), Path(tempfile.gettempdir()) / f"recurrl-{os.getuid()}"]


def _names() -> str:
    return " ".join(src.name for src in SOURCES)


def _run(cmds: list[list[str]]) -> None:
    """Run the commands concurrently (one per source: each takes ~30 s, mostly TF's headers)."""
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for cmd in cmds
    ]
    errors = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err += "\ntimed out after 600 s"
        if proc.returncode != 0:
            errors.append((err.strip().splitlines() or ["(no output)"])[-1])
    if errors:
        raise NativeUnavailable(f"compiling {_names()} failed: {errors[0]}")


def _build(cxx: str, compile_flags: list[str], link_flags: list[str], out: Path) -> None:
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        objects = [os.path.join(work, src.stem + ".o") for src in SOURCES]
        flags = [*CXXFLAGS, *compile_flags]
        try:
            _run(
                [[cxx, *flags, "-c", str(src), "-o", obj] for src, obj in zip(SOURCES, objects, strict=True)]
            )
            _run([[cxx, *flags, *objects, "-o", str(tmp), *link_flags]])
            os.replace(tmp, out)  # atomic: concurrent builders never load a half-written file
        finally:
            tmp.unlink(missing_ok=True)
    log.info("built %s in %.1f s: %s", _names(), time.perf_counter() - start, out)


@functools.cache
def load() -> ModuleType:
    """The loaded op library (``recurrl_lstm_forward``/``_backward``, ``recurrl_dense_ln_forward``/
    ``_backward``); builds it if needed.

    Raises:
        NativeUnavailable: with the reason, if it cannot be built or loaded.
    """
    import tensorflow as tf

    compile_flags, link_flags = tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()
    parts = [
        *(src.read_text() for src in SOURCES + HEADERS),
        tf.__version__,
        *compile_flags,
        *link_flags,
        *CXXFLAGS,
        _cpu_signature(),
    ]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    name = f"recurrl_ops-tf{tf.__version__}-{key}.so"
    errors = []
    for cache in _cache_dirs():
        path = cache / name
        if not path.exists():
            try:
                cache.mkdir(parents=True, exist_ok=True)
                if not os.access(cache, os.W_OK):
                    raise PermissionError("not writable")
            except OSError as exc:  # e.g. a read-only cache in a container: try the next place
                errors.append(f"{cache}: {exc}")
                continue
            _build(_compiler(), compile_flags, link_flags, path)
        try:
            return tf.load_op_library(str(path))
        except (tf.errors.NotFoundError, OSError) as exc:
            raise NativeUnavailable(f"loading {path} failed: {exc}") from exc
    raise NativeUnavailable("no writable cache directory: " + "; ".join(errors))


def available() -> tuple[bool, str]:
    """``(True, "")`` if the native ops load here (building them if needed), else ``(False, reason)``."""
    try:
        load()
    except NativeUnavailable as exc:
        return False, str(exc)
    return True, ""


def main() -> int:
    """``python -m agents.native``: build (or find) the library; exit 1 with the reason if impossible."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ok, reason = available()
    if not ok:
        print(f"native kernels unavailable: {reason}", file=sys.stderr)
        return 1
    print("native kernels ready")
    return 0
