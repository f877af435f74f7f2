"""Keep TensorFlow's native log lines off a run's console unless the user asks for them.

TF's C++ libraries log through absl. The lines they write while loading (the oneDNN notice, CUDA
stub probing) come before absl's logging is initialised, so ``TF_CPP_MIN_LOG_LEVEL`` does not reach
them: they go straight to file descriptor 2. :func:`quiet_tensorflow` therefore imports TF with fd 2
pointed at a temporary file, then writes back every captured line except TF's native log lines below
the level in force, so a Python warning or traceback printed meanwhile still reaches the user.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator, MutableMapping

# absl's native line: severity letter, MMDD, time (before absl is initialised the seconds field
# holds the whole Unix time), thread id, file:line]. Severities I, W, E, F are
# TF_CPP_MIN_LOG_LEVEL 0-3.
NATIVE_LINE = re.compile(rb"^([IWEF])\d{4} [\d:.]+ +\d+ [^\]\n]+\] ")
BEFORE_INIT = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
SEVERITIES = b"IWEF"


def min_log_level(environ: MutableMapping[str, str] = os.environ) -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as TF reads it: 0 (everything) when unset or not a number."""
    try:
        return int(environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def dropped(line: bytes, min_level: int) -> bool:
    """Whether ``line`` is one of TF's native log lines below ``min_level`` (0-3)."""
    if line.rstrip(b"\r\n") == BEFORE_INIT:  # absl's own warning that such lines follow
        return min_level >= 1
    match = NATIVE_LINE.match(line)
    return bool(match) and SEVERITIES.index(match.group(1)) < min_level


@contextlib.contextmanager
def native_lines_filtered(min_level: int) -> Iterator[None]:
    """Inside the block fd 2 goes to a temporary file; on leaving (also by an exception) every line
    written there, except TF's native log lines below ``min_level``, goes to the real fd 2."""
    if sys.stderr is not None:
        sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = b"".join(
                line for line in captured.read().splitlines(keepends=True) if not dropped(line, min_level)
            )
            view = memoryview(kept)
            while view:
                view = view[os.write(2, view) :]


def quiet_tensorflow(environ: MutableMapping[str, str] = os.environ) -> None:
    """Import TensorFlow without its native start-up lines and absl's Python INFO lines.

    ``TF_CPP_MIN_LOG_LEVEL`` defaults to 3 here: on a machine without a GPU the only error line TF
    writes is its CUDA probe, and TF's real errors reach Python as exceptions. A level the user set
    is kept and also applied to the lines TF writes while loading. ``RECURRL_TF_LOGS=1`` leaves TF's
    logging untouched. Call it before anything imports TF.
    """
    if environ.get("RECURRL_TF_LOGS") == "1":
        return
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.getLogger("absl").setLevel(logging.WARNING)
    with native_lines_filtered(min_log_level(environ)):
        import tensorflow  # noqa: F401
