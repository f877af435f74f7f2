"""Checkpoints: networks, optimisers and counters (``tf.train.Checkpoint``), replay and RNG state
in a numpy file, and a sentinel that marks the pair complete.

A Keras network is saved as every one of its weights keyed by its path (``online_q/encoder/
pre_0/kernel``, the observation statistics included): TensorFlow's object-graph
checkpoint does not see layers Keras 3 keeps in lists or dicts (an encoder's dense stack, its conv
torsos), so tracking the model object would silently leave those out. Checkpoints written before
this layout (no ``layout`` in their sentinel) are read the old way, with a warning.

Every file is written to a temporary name, fsynced and renamed, and the sentinel
``complete-<step>.json`` comes last: a crash or kill while saving leaves no sentinel, so that step
is never used. Restoring walks back from the newest sentinel to the newest checkpoint that loads
completely, saying which it skipped and why. Only ``max_to_keep`` complete checkpoints are kept;
older and unfinished files are removed after each successful save.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from agents.rundir import atomic_write, fsync_dir
from envs.config import ConfigError

log = logging.getLogger("recurrl")

SENTINEL = "complete-{step}.json"
# Sentinel "layout": 2 = Keras models saved as {variable path: variable}; absent = the model objects.
LAYOUT = 2


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


class Checkpointer:
    """Saves and restores ``objects`` (trackables) and ``extra`` numpy state under ``run_dir/ckpt``."""

    def __init__(self, run_dir: str | os.PathLike, max_to_keep: int = 2, **objects) -> None:
        self.dir = Path(run_dir) / "ckpt"
        self.checkpoint = tf.train.Checkpoint(**{k: _by_path(v) for k, v in objects.items()})
        self.legacy = tf.train.Checkpoint(**objects)  # reads checkpoints without a layout
        self.max_to_keep = max_to_keep

    def _prefix(self, step: int) -> str:
        return str(self.dir / f"ckpt-{step}")

    def save(self, step: int, extra: dict[str, np.ndarray], info: dict) -> None:
        """Write weights (TF), ``extra`` arrays (npz) and, last, the completion sentinel; all fsynced."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / SENTINEL.format(step=step)).unlink(missing_ok=True)  # re-saving a step: void it first
        prefix = self.checkpoint.write(self._prefix(step))
        for path in self.dir.glob(f"{os.path.basename(prefix)}.*"):
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        tmp = self.dir / f".state-{step}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **extra)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.dir / f"state-{step}.npz")
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(self.dir)
        sentinel = {"step": step, "tf_prefix": os.path.basename(prefix), "layout": LAYOUT, **info}
        atomic_write(self.dir / SENTINEL.format(step=step), json.dumps(sentinel))
        self._prune(keep_newest=step)

    def _prune(self, keep_newest: int) -> None:
        """Keep the newest ``max_to_keep`` complete steps; remove every other step's files and temps."""
        keep = {s for s in self.complete_steps() if s <= keep_newest}
        keep = set(sorted(keep)[-self.max_to_keep :])
        for path in self.dir.iterdir():
            step = _step_of(path.name)
            if path.name.startswith(".") or (step is not None and step not in keep):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    def complete_steps(self) -> list[int]:
        """Steps that have a completion sentinel, oldest first (their files are checked on restore)."""
        if not self.dir.is_dir():
            return []
        steps = []
        for path in self.dir.glob("complete-*.json"):
            step = _step_of(path.name)
            if step is not None:
                steps.append(step)
        return sorted(steps)

    def latest(self) -> int | None:
        """The newest step with a sentinel, or None."""
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def load(
        self, step: int, keys: Callable[[str], bool] | None = None
    ) -> tuple[dict[str, np.ndarray], dict]:
        """Restore trackables at ``step``; return its numpy state (the arrays whose names ``keys``
        accepts; default all) and sentinel info. Raises if any part read is missing or damaged."""
        info = json.loads((self.dir / SENTINEL.format(step=step)).read_text())
        with np.load(self.dir / f"state-{step}.npz") as f:
            # reads every array asked for: a truncated file fails here
            extra = {k: f[k] for k in f.files if keys is None or keys(k)}
        if info.get("layout") == LAYOUT:
            self.checkpoint.read(self._prefix(step)).assert_existing_objects_matched()
        else:
            log.warning(
                "checkpoint at env step %d has the older layout, which did not save the layers Keras "
                "keeps in lists (dense stacks, conv torsos) nor the observation statistics: those "
                "keep the values the networks were built with, and the statistics come from the "
                "run state",
                step,
            )
            self.legacy.read(self._prefix(step)).assert_existing_objects_matched()
        return extra, info

    def restore_latest(
        self, apply: Callable[[dict[str, np.ndarray], dict], None], keys: Callable[[str], bool] | None = None
    ) -> int:
        """Restore the newest checkpoint that loads completely and that ``apply(extra, info)`` accepts
        (``keys``: which numpy arrays to read, as in :meth:`load`).

        Damaged checkpoints are skipped with a warning naming the step and the reason. Returns the
        restored step; raises :class:`ConfigError` (one line) if none can be used.
        """
        skipped = []
        for step in reversed(self.complete_steps()):
            try:
                extra, info = self.load(step, keys)
                apply(extra, info)
            except MemoryError:
                raise  # the machine, not the checkpoint: skipping it would lose the newest progress
            except Exception as exc:  # noqa: BLE001 - any failure means: try the previous checkpoint
                reason = first_line(exc)
                log.warning("checkpoint at env step %d skipped: %s", step, reason)
                skipped.append(f"step {step}: {reason}")
                continue
            if skipped:
                log.warning("restored the checkpoint at env step %d instead", step)
            return step
        detail = "; ".join(skipped) if skipped else "no complete checkpoint"
        raise ConfigError(f"run directory {str(self.dir.parent)!r} has no usable checkpoint ({detail})")


def _by_path(obj: object) -> object:
    """A Keras layer or model as ``{variable path: variable}`` over its weights, trainable or not;
    anything else as it is. Raises ``ValueError`` if two weights share a path. (The seed states of
    Keras' recurrent cells are not weights: they feed dropout only, which no network here uses.)"""
    if not isinstance(obj, keras.layers.Layer):
        return obj
    out: dict[str, tf.Variable] = {}
    for var in obj.weights:
        if var.path in out:
            raise ValueError(f"{obj.name}: two variables share the path {var.path!r}")
        out[var.path] = var
    return out


def _step_of(name: str) -> int | None:
    """The env step in a checkpoint file name (``ckpt-4000.index``, ``state-4000.npz``, ...)."""
    for head in ("ckpt-", "state-", "complete-"):
        if name.startswith(head):
            digits = name[len(head) :].split(".", 1)[0].split("_", 1)[0]
            return int(digits) if digits.isdigit() else None
    return None


def is_run_dir(path: str | os.PathLike) -> bool:
    """True if ``path`` holds a run with at least one checkpoint sentinel."""
    d = Path(path) / "ckpt"
    return d.is_dir() and any(d.glob("complete-*.json"))
