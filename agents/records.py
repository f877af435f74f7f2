"""What a run writes, read back without TensorFlow: ``progress.csv`` rows and flattened configs.

Commands that only read runs (``scripts.plot``) import this rather than the agents, so they start in
well under a second, without TensorFlow's start-up.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

PROGRESS_COLUMNS = (
    "env_steps",
    "updates",
    "wall_time_s",
    "eval_return_mean",
    "eval_return_std",
    "train_return_mean",
    "eval_success_rate",  # fraction of evaluation episodes with return >= env.success_return (else nan)
)
# Columns only some runs fill (nan in progress.csv otherwise, and in files written before they
# existed): a row read back has them only where they hold a value.
OPTIONAL_COLUMNS = ("eval_success_rate",)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``{"a.b.c": value}`` (an empty dict stays a value)."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: data}


def read_progress(path: str | os.PathLike) -> list[dict[str, float]]:
    """The rows of a ``progress.csv`` as floats (``env_steps``/``updates`` as int); a torn last line
    (a kill while appending) is left out."""
    rows = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return rows
    for raw in csv.DictReader(io.StringIO(text)):
        try:
            row = {k: float(raw[k]) for k in PROGRESS_COLUMNS if k not in OPTIONAL_COLUMNS}
            for k in OPTIONAL_COLUMNS:
                if raw.get(k) not in (None, "", "nan"):
                    row[k] = float(raw[k])
        except (KeyError, TypeError, ValueError):
            continue
        row["env_steps"], row["updates"] = int(row["env_steps"]), int(row["updates"])
        rows.append(row)
    return rows
