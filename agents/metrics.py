"""MetricsWriter: TensorBoard scalars and histograms, ``progress.csv`` and ``summary.json``.

Learners return plain metric dicts; only this class touches a writer. TensorBoard tags are grouped
like CleanRL's: ``td/...``, ``losses/...``, ``charts/...``, ``eval/...``, ``perf/...``.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import tensorflow as tf

from agents.records import OPTIONAL_COLUMNS, PROGRESS_COLUMNS, flatten, read_progress
from agents.rundir import atomic_write

log = logging.getLogger("recurrl")


def td_summary(td_error: np.ndarray, mask: np.ndarray, bins: int = 8) -> dict[str, float]:
    """Scalars of TD errors ``[B, T]`` over valid steps: mean, mean |d|, max |d|, |d| by position.

    Position ``t`` is the step index inside the trace (0 = right after burn-in); the view shows
    whether early steps, with less context, carry larger errors. Positions are grouped into at most
    ``bins`` equal ranges.
    """
    valid = mask > 0
    d = td_error[valid]
    out = {
        "mean": float(d.mean()) if d.size else 0.0,
        "abs_mean": float(np.abs(d).mean()) if d.size else 0.0,
        "abs_max": float(np.abs(d).max()) if d.size else 0.0,
    }
    trace = td_error.shape[1]
    edges = np.linspace(0, trace, min(bins, trace) + 1).round().astype(int)
    abs_sum = (np.abs(td_error) * valid).sum(axis=0)
    count = valid.sum(axis=0)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        n = count[lo:hi].sum()
        out[f"by_position/t{lo:02d}-{hi - 1:02d}"] = float(abs_sum[lo:hi].sum() / max(n, 1))
    return out


class MetricsWriter:
    """Writes one run's metrics under ``run_dir`` (``tb/`` events, ``progress.csv``)."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.writer = tf.summary.create_file_writer(str(self.run_dir / "tb"))
        self.progress_path = self.run_dir / "progress.csv"

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Scalars at ``step`` (env steps), tags as given."""
        with self.writer.as_default(step=int(step)):
            for tag, value in values.items():
                tf.summary.scalar(tag, float(value))

    def text(self, step: int, tag: str, value: str) -> None:
        """A text entry (TensorBoard's Text tab) at ``step``."""
        with self.writer.as_default(step=int(step)):
            tf.summary.text(tag, value)

    def histogram(self, step: int, tag: str, values: np.ndarray) -> None:
        """A histogram of ``values`` (any shape, flattened) at ``step``."""
        if np.size(values):
            with self.writer.as_default(step=int(step)):
                tf.summary.histogram(tag, np.asarray(values, np.float32).reshape(-1))

    def learner(self, step: int, metrics: Mapping[str, np.ndarray], prefix: str = "td") -> None:
        """TD error scalars, histogram and by-position view from ``td_error``/``mask`` ``[B, T]``."""
        td, mask = metrics["td_error"], metrics["mask"]
        self.scalars(step, {f"{prefix}/{k}": v for k, v in td_summary(td, mask).items()})
        self.histogram(step, f"{prefix}/histogram", td[mask > 0])

    def hparams(self, config: Mapping[str, object], trial: str) -> None:
        """The run's flattened config as TensorBoard hparams (the HParams tab compares a sweep by
        them against the ``hparams/*`` metrics :meth:`final_metrics` writes)."""
        from tensorboard.plugins.hparams import api as hp

        values = {}
        for key, value in flatten(config).items():
            ok = isinstance(value, bool | int | float | str)
            values[key] = value if ok else json.dumps(value)
        with self.writer.as_default():
            hp.hparams(values, trial_id=trial)

    def final_metrics(self, step: int, summary: Mapping[str, object]) -> None:
        """Final and best evaluation return as ``hparams/*`` scalars (skipped while there is none)."""
        values = {
            f"hparams/{key}": summary[key]
            for key in ("final_eval_return_mean", "best_eval_return_mean")
            if summary.get(key) is not None
        }
        self.scalars(step, values)

    def progress(self, row: Mapping[str, float]) -> None:
        """Append one evaluation row to ``progress.csv`` (header written once), fsynced."""
        new = not self.progress_path.exists()
        with open(self.progress_path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=PROGRESS_COLUMNS)
            if new:
                w.writeheader()
            w.writerow(
                {k: row[k] if k in row or k not in OPTIONAL_COLUMNS else "nan" for k in PROGRESS_COLUMNS}
            )
            f.flush()
            os.fsync(f.fileno())

    def summary(self, values: Mapping[str, object]) -> None:
        """Write ``summary.json`` atomically."""
        atomic_write(self.run_dir / "summary.json", json.dumps(values, indent=2, sort_keys=True))

    def flush(self) -> None:
        """Flush TensorBoard events to disk."""
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def nonfinite_metrics(metrics: dict[str, np.ndarray]) -> str | None:
    """One line naming the first NaN/Inf scalar of a learner step's metrics (loss, grad_norm, ...)."""
    for key, value in metrics.items():
        if np.ndim(value) == 0 and not np.isfinite(value):
            return f"non-finite learner {key} ({float(value)})"
    return None


class LearnerLog:
    """Averages a learner's scalar metrics and pools its TD errors ``[B, T]`` between writes."""

    def __init__(self) -> None:
        self.scalars: dict[str, list[float]] = {}
        self.td: dict[str, list[np.ndarray]] = {}
        self.hist: dict[str, list[np.ndarray]] = {}

    def add(self, metrics: dict[str, np.ndarray]) -> None:
        for k, v in metrics.items():
            if np.ndim(v) == 0:
                self.scalars.setdefault(k, []).append(float(v))
            elif k.startswith("histogram/"):  # e.g. histogram/policy_action -> charts/policy_action
                self.hist.setdefault(k[len("histogram/") :], []).append(np.ravel(v))
        for prefix in [k[: -len("td_error")] for k in metrics if k.endswith("td_error")]:
            self.td.setdefault(prefix, []).append(
                np.stack([metrics[prefix + "td_error"], metrics[prefix + "mask"]])
            )

    def __bool__(self) -> bool:
        """True while some metrics wait to be written."""
        return bool(self.scalars or self.td or self.hist)

    def write(self, writer: MetricsWriter, step: int) -> None:
        # Keys with a group of their own (charts/...) keep it; the rest are losses.
        writer.scalars(
            step, {(k if "/" in k else f"losses/{k}"): np.mean(v) for k, v in self.scalars.items()}
        )
        for prefix, arrays in self.td.items():
            pooled = np.concatenate(arrays, axis=1)  # [2, n*B, T]
            tag = "td" if not prefix else f"td_{prefix.rstrip('_')}"
            writer.learner(step, {"td_error": pooled[0], "mask": pooled[1]}, prefix=tag)
        for name, arrays in self.hist.items():
            writer.histogram(step, f"charts/{name}", np.concatenate(arrays))
        self.scalars, self.td, self.hist = {}, {}, {}


def rewind(run_dir: str | os.PathLike, step: int) -> list[dict[str, float]]:
    """Forget what a run wrote after env step ``step`` (the checkpoint it resumes from).

    ``progress.csv`` keeps its rows up to ``step`` and TensorBoard's event files their events up to
    ``step``, so a run killed after its last checkpoint and resumed holds each env step once and
    TensorBoard draws one unbroken curve. Each file is rewritten atomically. Returns the kept rows.
    """
    run_dir = Path(run_dir)
    rows = [r for r in read_progress(run_dir / "progress.csv") if r["env_steps"] <= step]
    if (run_dir / "progress.csv").exists():
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=PROGRESS_COLUMNS, lineterminator="\r\n", restval="nan")
        w.writeheader()
        for row in rows:
            w.writerow(row)
        atomic_write(run_dir / "progress.csv", out.getvalue())
    tb = run_dir / "tb"
    if tb.is_dir():
        for path in sorted(tb.glob("*tfevents*")):
            _rewind_events(path, step)
    return rows


def _rewind_events(path: Path, step: int) -> None:
    """Rewrite one TensorBoard event file without its events after ``step`` (a torn tail is dropped)."""
    kept, dropped = [], 0
    try:
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            if event.step <= step:
                kept.append(record.numpy())
            else:
                dropped += 1
    except tf.errors.DataLossError:
        dropped += 1
    if not dropped:
        return
    tmp = path.with_name(f".rewind-{os.getpid()}.tmp")  # no "tfevents" in the name: TB ignores it
    try:
        with tf.io.TFRecordWriter(str(tmp)) as w:
            for record in kept:
                w.write(record)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
