"""Speed (and optional learning) figures of this machine: ``python -m scripts.benchmark [bench.key=value]``.

Prints a table and writes JSON (``bench.output``, default ``bench/benchmark.json``) plus the same
tables in Markdown beside it (``.md``):

* learner updates/s at the canonical shapes (rdqn on cartpole_p, rddpg on pendulum_p; B, cell and
  units from ``bench.learner.*``), each next to the same-run fp32 GEMM rate, giving the FLOP
  efficiency, and (``bench.learner.compare``) next to the reference ``tf.scan`` path and a stock
  Keras LSTM/GRU step of the same shape; rdqn rows compared also time updates fed from a full
  replay (uniform against prioritized) and with clipped double Q (``agent.twin_q=true``); every
  compared row also times Peng's Q(lambda) targets (``agent.td_lambda=0.5``) and an average
  network kept beside the target (``agent.average_tau``) on the same batch;
* target-update time per call, fused against per-variable eager assigns;
* acting env steps/s (numpy recurrent policy + replay writes) next to raw SyncVectorEnv stepping;
* with ``bench.learning=true``: time-to-threshold runs over seeds and a learning-curve PNG;
* with ``bench.scaling.enabled=true``: ``runner=ray`` acting env steps/s against worker counts
  (scripts/measure_scaling.py).

``bench.tiny=true`` shrinks every shape and count so the whole thing runs in seconds (tests).
Methods and formulas: scripts/measure.py (learner, target update), scripts/measure_acting.py,
scripts/learning_curves.py; tables: scripts/bench_report.py; this machine's figures:
docs/performance.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from scripts.tf_logs import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TF's start-up lines off the console (RECURRL_TF_LOGS=1 keeps them)

import hydra  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

import scripts.train  # noqa: E402, F401  (registers the run-config schemas that compose() needs)
from scripts.bench_report import format_learner, format_markdown, format_table  # noqa: E402
from scripts.measure_scaling import ScalingBench  # noqa: E402


@dataclass
class LearnerBench:
    """Learner rows: the product of agents x cells x units x batch_sizes."""

    # Agents to time; rddpg rows are skipped (with a note) if agents.rddpg is not importable.
    agents: list[str] = field(default_factory=lambda: ["rdqn", "rddpg"])
    # Env preset (conf/env) whose observation/action sizes each agent's rows use.
    envs: dict[str, str] = field(default_factory=lambda: {"rdqn": "cartpole_p", "rddpg": "pendulum_p"})
    cells: list[str] = field(default_factory=lambda: ["lstm", "gru"])
    units: list[int] = field(default_factory=lambda: [128, 256])
    batch_sizes: list[int] = field(default_factory=lambda: [32, 64])
    burn_in: int = 10
    trace_length: int = 40
    # Interleaved timing rounds per row (medians reported) and updates per round.
    rounds: int = 5
    updates_per_round: int = 5
    # Also time the reference tf.scan path and a stock Keras step (rdqn: uniform and prioritized
    # replay, clipped double Q): all | canonical (units 128, B 32) | none.
    compare: str = "canonical"
    # First, one row at the default training shapes (conf/config.yaml as is), compared like canonical.
    default_row: bool = True


@dataclass
class ActingBench:
    """Acting rows: one per env count, the recurrent numpy policy against raw env stepping."""

    env: str = "cartpole_p"
    cell: str = "lstm"
    units: int = 128
    num_envs: list[int] = field(default_factory=lambda: [1, 8, 32])
    # Env steps (summed over envs) per timing round, and rounds.
    env_steps: int = 4000
    rounds: int = 5
    # Threads of numpy's OpenBLAS while the actor runs (0: leave as found).
    blas_threads: int = 1


@dataclass
class LearningBench:
    """Time-to-threshold runs (``bench.learning=true``)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    # name -> {overrides: [...] of conf/config.yaml, threshold: eval return to reach}.
    presets: dict[str, dict] = field(default_factory=dict)


@dataclass
class BenchConfig:
    """Everything ``python -m scripts.benchmark`` measures."""

    # JSON result path (relative to the working directory).
    output: str = "bench/benchmark.json"
    # Shrink every shape and count to run in seconds (the test suite uses it).
    tiny: bool = False
    # Also run the time-to-threshold learning runs (minutes per seed).
    learning: bool = False
    # Side of the square fp32 matmul used as the GEMM reference, and matmuls per sample.
    gemm_size: int = 1024
    gemm_repeats: int = 3
    learner: LearnerBench = field(default_factory=LearnerBench)
    acting: ActingBench = field(default_factory=ActingBench)
    # Calls per round for the target-update timing (rounds: learner.rounds).
    target_update_calls: int = 200
    curves: LearningBench = field(default_factory=LearningBench)
    scaling: ScalingBench = field(default_factory=ScalingBench)


@dataclass
class BenchmarkRoot:
    bench: BenchConfig = field(default_factory=BenchConfig)


def shrink(b: BenchConfig) -> list[str]:
    """Tiny mode: small shapes and counts in place; returns overrides for every composed run config."""
    b.gemm_size, b.gemm_repeats, b.target_update_calls = 64, 2, 5
    lb = b.learner
    lb.cells, lb.units, lb.batch_sizes = lb.cells[:1], [8], [4]
    lb.burn_in, lb.trace_length, lb.rounds, lb.updates_per_round, lb.compare = 2, 4, 2, 2, "all"
    a = b.acting
    a.units, a.num_envs, a.env_steps, a.rounds = 8, [1, 2], 40, 2
    b.curves.seeds = b.curves.seeds[:1]
    b.scaling.actors, b.scaling.window_s, b.scaling.warmup_s = [1, 2], 1.0, 0.5
    return ["network.pre_layers=[8]", "replay.capacity=2000", *TINY_SHAPES]


TINY_SHAPES = ["agent.batch_size=4", "network.units=8", "replay.burn_in=2", "replay.trace_length=4"]
TINY_TRAIN = [
    "train.total_env_steps=200",
    "train.learning_starts=50",
    "eval.every_env_steps=100",
    "eval.episodes=2",
    *TINY_SHAPES,
]


def run_benchmark(b: BenchConfig, compose, run_dir: Path) -> dict:
    """Every measurement of ``b``; returns the JSON-ready result."""
    from agents.loop import configure_tf_threads
    from scripts import measure
    from scripts.measure_acting import acting_rows

    base = shrink(b) if b.tiny else []
    # TF's thread pools as `python -m scripts.train` sets them (before TF's first op here).
    configure_tf_threads(compose(base).train)
    result: dict = {"machine": machine_info(), "config": dataclasses.asdict(b), "notes": []}
    gemm = measure.Gemm(b.gemm_size, b.gemm_repeats)
    result["gemm"] = {
        "size": b.gemm_size,
        "parallel_matmuls": gemm.parallel,
        "gflops_start": measure.median([gemm.sample() for _ in range(3)]),
    }
    result["learner"] = learner_rows(b, compose, base, gemm, result["notes"])
    lb = b.learner
    canonical = [*base, f"replay.burn_in={lb.burn_in}", f"replay.trace_length={lb.trace_length}"]
    canonical += [f"network.units={lb.units[0]}", f"agent.batch_size={lb.batch_sizes[0]}"]
    result["target_update"] = measure.target_update_times(
        compose, [f"env={lb.envs['rdqn']}", *canonical], lb.rounds, b.target_update_calls
    )
    a = b.acting
    acting = [*base, f"env={a.env}", f"network.cell={a.cell}", f"network.units={a.units}"]
    result["acting"] = acting_rows(compose, acting, a.num_envs, a.env_steps, a.rounds, a.blas_threads)
    result["gemm"]["gflops_end"] = measure.median([gemm.sample() for _ in range(3)])
    result["learning"] = None
    if b.learning:
        from scripts.learning_curves import run_learning, write_curves

        extra = TINY_TRAIN if b.tiny else []
        result["learning"] = run_learning(
            b.curves.presets, b.curves.seeds, compose, run_dir / "learning", extra
        )
        out = Path(b.output)
        png = write_curves(result["learning"], out.with_suffix(".curves.csv"), out.with_suffix(".curves.png"))
        result["learning_curves"] = {"csv": str(out.with_suffix(".curves.csv")), "png": png}
        if png is None:
            result["notes"].append(
                "learning-curve PNG skipped: matplotlib is not installed (pip install -e .[bench])"
            )
    result["scaling"] = None
    if b.scaling.enabled:
        from scripts.measure_scaling import scaling_rows

        s = b.scaling
        result["scaling"] = scaling_rows(compose, s.presets, s.actors, s.window_s, s.warmup_s, base)
    result["machine"]["load_end"] = os.getloadavg()
    return result


def learner_rows(b: BenchConfig, compose, base: list[str], gemm, notes: list[str]) -> list[dict]:
    from scripts import measure

    lb, rows = b.learner, []
    kinds = list(lb.agents)
    if "rddpg" in kinds:
        try:
            from agents.rddpg import build_rddpg  # noqa: F401
        except ImportError as exc:
            kinds.remove("rddpg")
            notes.append(f"rddpg rows skipped: agents.rddpg not importable ({exc})")
    grid = []
    if lb.default_row:
        grid.append(("default", [*base], lb.compare != "none"))
    for agent in kinds:
        for cell in lb.cells:
            for units in lb.units:
                for batch in lb.batch_sizes:
                    overrides = [
                        *base,
                        f"agent={agent}",
                        f"env={lb.envs[agent]}",
                        f"network.cell={cell}",
                        f"network.units={units}",
                        f"agent.batch_size={batch}",
                        f"replay.burn_in={lb.burn_in}",
                        f"replay.trace_length={lb.trace_length}",
                    ]
                    compare = lb.compare == "all" or (
                        lb.compare == "canonical" and units == lb.units[0] and batch == lb.batch_sizes[0]
                    )
                    grid.append(("grid", overrides, compare))
    for label, overrides, compare in grid:
        row = measure.learner_row(compose, overrides, gemm, lb.rounds, lb.updates_per_round, compare, seed=0)
        rows.append({"shapes": label, **row})
        print(format_learner(rows[-1:], header=len(rows) == 1), flush=True)
    return rows


def machine_info() -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on)"),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_start": os.getloadavg(),
        "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
    }


def invalid(b: BenchConfig) -> str | None:
    """A one-line description of the first invalid setting, or None."""
    lb = b.learner
    if lb.compare not in ("all", "canonical", "none"):
        return f"bench.learner.compare={lb.compare!r} is invalid: allowed all|canonical|none"
    for key in ("cells", "units", "batch_sizes"):
        if not getattr(lb, key):
            return f"bench.learner.{key}=[] is invalid: give at least one value"
    unknown = [a for a in lb.agents if a not in lb.envs]
    if unknown:
        return f"bench.learner.agents has {unknown[0]!r} without an env preset in bench.learner.envs"
    if not b.acting.num_envs or min(b.acting.num_envs) < 1:
        return f"bench.acting.num_envs={list(b.acting.num_envs)} is invalid: env counts >= 1"
    if not b.scaling.actors or min(b.scaling.actors) < 1:
        return f"bench.scaling.actors={list(b.scaling.actors)} is invalid: worker counts >= 1"
    return None


def compose_run_config(overrides: list[str]):
    """A typed run Config from conf/config.yaml plus overrides (inside the running Hydra app)."""
    from hydra import compose

    return OmegaConf.to_object(compose(config_name="config", overrides=list(overrides)))


ConfigStore.instance().store(name="bench_schema", node=BenchmarkRoot)


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark")
def main(cfg: DictConfig) -> None:
    root = OmegaConf.to_object(cfg)
    assert isinstance(root, BenchmarkRoot)
    b = root.bench
    problem = invalid(b)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    result = run_benchmark(b, compose_run_config, Path(HydraConfig.get().runtime.output_dir))
    out = Path(b.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(format_markdown(result))
    print()
    print(format_table(result))
    print(f"\nwrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
