"""Compiling the native op library: one compiler process per source, then one link."""

from __future__ import annotations

import logging
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

TIMEOUT_S = 600


class BuildFailed(RuntimeError):
    """The compiler or linker failed; the message is its last error line."""


def _run(cmds: list[list[str]], what: str) -> None:
    """Run the commands concurrently (each compile is mostly parsing TF's headers); log any
    warnings of a successful run, raise :class:`BuildFailed` with the last error line otherwise."""
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for cmd in cmds
    ]
    errors = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err += f"\ntimed out after {TIMEOUT_S} s"
        if proc.returncode != 0:
            errors.append((err.strip().splitlines() or [f"exit code {proc.returncode}, no output"])[-1])
        elif err.strip():
            log.warning("compiler output while %s:\n%s", what, err.strip())
    if errors:
        raise BuildFailed(f"{what} failed: {errors[0]}")


def compile_library(
    cxx: str, sources: list[Path], compile_flags: list[str], link_flags: list[str], out: Path
) -> None:
    """Compile ``sources`` and link them into the shared library ``out`` (in a temp dir beside it)."""
    names = " ".join(src.name for src in sources)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".recurrl-build-") as work:
        objects = [str(Path(work) / f"{src.stem}.o") for src in sources]
        _run(
            [
                [cxx, *compile_flags, "-c", str(src), "-o", obj]
                for src, obj in zip(sources, objects, strict=True)
            ],
            f"compiling {names}",
        )
        _run([[cxx, *compile_flags, *objects, "-o", str(out), *link_flags]], f"linking {names}")
