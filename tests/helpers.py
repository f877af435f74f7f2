"""Small builders shared by several test modules."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hydra.core.global_hydra import GlobalHydra
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

ROOT = Path(__file__).resolve().parents[1]
# ``python -m scripts.train`` overrides for a run of seconds on the cue memory task.
TINY_TRAIN_OVERRIDES = [
    "env=cue_memory", "env.num_envs=4", "train.progress_bar=false", "train.learning_starts=100",
    "train.updates_per_step=0.25", "train.checkpoint_every_env_steps=200", "eval.every_env_steps=200",
    "eval.episodes=4", "network.units=16", "network.pre_layers=[16]", "replay.capacity=4000",
    "replay.burn_in=2", "replay.trace_length=4", "agent.batch_size=8", "agent.n_step=2",
]  # fmt: skip


def _accumulator(run_dir: Path) -> event_accumulator.EventAccumulator:
    """Every TensorBoard event under ``run_dir/tb``, loaded (all tensors kept)."""
    acc = event_accumulator.EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


def event_tags(run_dir: Path) -> set[str]:
    """Every TensorBoard tag written under ``run_dir/tb``."""
    return set(_accumulator(run_dir).Tags()["tensors"])


def rdqn_batch(learner, batch_size: int, obs_dim: int, num_actions: int, seed: int) -> dict[str, np.ndarray]:
    """A random rdqn replay batch of ``[B, L]`` rows: no episode ends, every row valid, zero state."""
    rng = np.random.default_rng(seed)
    b, length = batch_size, learner.seq_len
    return {
        "obs": rng.normal(size=(b, length, obs_dim)).astype(np.float32),
        "action": rng.integers(0, num_actions, size=(b, length)).astype(np.int32),
        "reward": rng.normal(size=(b, length)).astype(np.float32),
        "terminated": np.zeros((b, length), np.float32),
        "truncated": np.zeros((b, length), np.float32),
        "first": np.zeros((b, length), np.float32),
        "valid": np.ones((b, length), np.float32),
        "state": np.zeros((b, learner.state_dim), np.float32),
    }


def tag_events(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every scalar TensorBoard event of ``tag`` under ``run_dir/tb``, in file order."""
    return [
        (e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in _accumulator(run_dir).Tensors(tag)
    ]


def event_steps(run_dir: Path, tag: str) -> list[int]:
    """The steps of every TensorBoard event of ``tag`` under ``run_dir/tb``, in file order."""
    return [e.step for e in _accumulator(run_dir).Tensors(tag)]


def run_cli(capsys, args: list[str], run_dir: Path) -> tuple[int, str]:
    """Run ``scripts.train`` in-process (no TF re-import); return its exit code and stderr."""
    import scripts.train as cli

    sys_argv = sys.argv
    # No Hydra logging config: dictConfig would close pytest's own capture handlers.
    quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    sys.argv = ["train", f"hydra.run.dir={run_dir}", *quiet, *args]
    capsys.readouterr()
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = sys_argv
        GlobalHydra.instance().clear()
    return code, capsys.readouterr().err
