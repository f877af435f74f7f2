"""Checkpoints: networks, optimisers and counters via ``tf.train.CheckpointManager``, plus replay
and RNG state in a numpy file, and a sentinel that marks the pair complete.

A crash while saving leaves no sentinel, so :meth:`Checkpointer.latest` skips that half-written step
and resume starts from the previous complete one (the pattern Dopamine uses).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

SENTINEL = "complete-{step}.json"


class Checkpointer:
    """Saves and restores ``objects`` (trackables) and ``extra`` numpy state under ``run_dir/ckpt``."""

    def __init__(self, run_dir: str | os.PathLike, max_to_keep: int = 2, **objects) -> None:
        self.dir = Path(run_dir) / "ckpt"
        self.checkpoint = tf.train.Checkpoint(**objects)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, str(self.dir), max_to_keep=max_to_keep, checkpoint_name="ckpt"
        )
        self.max_to_keep = max_to_keep

    def save(self, step: int, extra: dict[str, np.ndarray], info: dict) -> None:
        """Write weights (TF), ``extra`` arrays (npz) and, last, the completion sentinel."""
        self.dir.mkdir(parents=True, exist_ok=True)
        prefix = self.manager.save(checkpoint_number=step)
        tmp = self.dir / f"state-{step}.tmp.npz"
        np.savez(tmp, **extra)
        os.replace(tmp, self.dir / f"state-{step}.npz")
        sentinel = {"step": step, "tf_prefix": os.path.basename(prefix), **info}
        (self.dir / SENTINEL.format(step=step)).write_text(json.dumps(sentinel))
        self._prune()

    def _prune(self) -> None:
        steps = sorted(self.complete_steps())
        for step in steps[: -self.max_to_keep]:
            for name in (SENTINEL.format(step=step), f"state-{step}.npz"):
                (self.dir / name).unlink(missing_ok=True)

    def complete_steps(self) -> list[int]:
        """Steps with a completion sentinel whose files all exist."""
        steps = []
        for path in self.dir.glob("complete-*.json"):
            step = int(path.stem.split("-")[1])
            index = self.dir / f"ckpt-{step}.index"
            if index.exists() and (self.dir / f"state-{step}.npz").exists():
                steps.append(step)
        return sorted(steps)

    def latest(self) -> int | None:
        """The newest complete step, or None."""
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def restore(self, step: int) -> tuple[dict[str, np.ndarray], dict]:
        """Restore trackables at ``step``; return its numpy state and sentinel info."""
        self.checkpoint.restore(str(self.dir / f"ckpt-{step}")).assert_existing_objects_matched()
        with np.load(self.dir / f"state-{step}.npz") as f:
            extra = {k: f[k] for k in f.files}
        info = json.loads((self.dir / SENTINEL.format(step=step)).read_text())
        return extra, info


def is_run_dir(path: str | os.PathLike) -> bool:
    """True if ``path`` holds a run with at least one complete checkpoint."""
    d = Path(path) / "ckpt"
    return d.is_dir() and any(d.glob("complete-*.json"))
