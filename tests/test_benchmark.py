"""The benchmark command runs in its tiny mode and writes every field; its FLOP count is by hand.

Speed is never asserted here: only that each figure exists and is a finite positive number.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LEARNER_KEYS = {
    "shapes",
    "agent", "env", "cell", "units", "batch_size", "burn_in", "trace_length", "seq_len",
    "flops_per_update", "updates_per_s", "cpu_ms_per_update", "gemm_gflops", "achieved_gflops",
    "efficiency_pct", "compile_s", "reference_updates_per_s", "reference_cpu_ms_per_update",
    "speedup_vs_reference", "kernel", "graph_updates_per_s", "graph_cpu_ms_per_update", "speedup_vs_graph",
    "keras_updates_per_s", "keras_cpu_ms_per_update", "speedup_vs_keras", "load_1min",
    "uniform_replay_updates_per_s", "prioritized_updates_per_s", "prioritized_vs_uniform",
    "twin_q_updates_per_s", "twin_q_vs_single", "td_lambda_updates_per_s", "td_lambda_vs_n_step",
    "average_updates_per_s", "average_vs_none", "anchor_updates_per_s", "anchor_vs_none",
}  # fmt: skip
ACTING_KEYS = {
    "num_envs", "cell", "units", "raw_env_steps_per_s", "actor_env_steps_per_s",
    "actor_blas_default_env_steps_per_s", "blas_threads", "blas_threads_default", "pct_of_raw", "load_1min",
}  # fmt: skip
TARGET_KEYS = {
    "agent",
    "cell",
    "units",
    "variables",
    "fused_ms_per_call",
    "eager_ms_per_call",
    "speedup",
    "load_1min",
}
PRESET_KEYS = {
    "overrides", "threshold", "seeds", "reached", "median_env_steps_to_threshold",
    "median_wall_s_to_threshold", "median_final_return", "runs",
}  # fmt: skip


def _positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def _run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "scripts.benchmark", f"hydra.run.dir={tmp_path / 'run'}", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_tiny_benchmark_writes_every_field(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = _run(tmp_path, "bench.tiny=true", "bench.learning=true", f"bench.output={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "learner: upd/s" in proc.stdout and f"wrote {out}" in proc.stdout
    assert "| rdqn | lstm |" in out.with_suffix(".md").read_text()
    assert "| rdqn_cartpole_p_mlp | 475 | " in out.with_suffix(".md").read_text()
    result = json.loads(out.read_text())
    assert set(result) >= {
        "machine",
        "config",
        "notes",
        "gemm",
        "learner",
        "target_update",
        "acting",
        "learning",
    }
    assert _positive(result["gemm"]["gflops_start"]) and _positive(result["gemm"]["gflops_end"])
    assert {r["agent"] for r in result["learner"]} == {"rdqn", "rddpg"}
    for row in result["learner"]:
        assert set(row) == LEARNER_KEYS
        for key in (
            "flops_per_update",
            "updates_per_s",
            "gemm_gflops",
            "efficiency_pct",
            "speedup_vs_reference",
        ):
            assert _positive(row[key]), (key, row)
        assert (row["keras_updates_per_s"] is not None) == (row["agent"] == "rdqn")
        # rdqn rows also time updates fed from a full replay, uniform and prioritized.
        assert (row["prioritized_vs_uniform"] is not None) == (row["agent"] == "rdqn")
        if row["agent"] == "rdqn":
            assert _positive(row["prioritized_updates_per_s"]) and _positive(
                row["uniform_replay_updates_per_s"]
            )
        # ... and the same batch through clipped double Q (a second head).
        assert (row["twin_q_vs_single"] is not None) == (row["agent"] == "rdqn")
        if row["agent"] == "rdqn":
            assert _positive(row["twin_q_updates_per_s"]) and _positive(row["twin_q_vs_single"])
        # ... and (every agent) Peng's Q(lambda) targets instead of n-step ones.
        assert _positive(row["td_lambda_updates_per_s"]) and _positive(row["td_lambda_vs_n_step"])
        # ... and (every agent) with an average network kept beside the target.
        assert _positive(row["average_updates_per_s"]) and _positive(row["average_vs_none"])
        # ... and (rdqn) with the loss anchored to the target network.
        assert (row["anchor_vs_none"] is not None) == (row["agent"] == "rdqn")
        if row["agent"] == "rdqn":
            assert _positive(row["anchor_updates_per_s"]) and _positive(row["anchor_vs_none"])
        # lstm rows run the native kernel and are compared with the TF-graph kernel they replace.
        assert row["kernel"] == ("native" if row["cell"] == "lstm" else "graph")
        assert (row["speedup_vs_graph"] is not None) == (row["kernel"] == "native")
    assert set(result["target_update"]) == TARGET_KEYS
    assert _positive(result["target_update"]["fused_ms_per_call"])
    assert [r["num_envs"] for r in result["acting"]] == [1, 2]
    for row in result["acting"]:
        assert set(row) == ACTING_KEYS
        assert _positive(row["raw_env_steps_per_s"]) and _positive(row["actor_env_steps_per_s"])
    for name in ("rdqn_cartpole_p", "rdqn_cartpole_p_mlp", "rtd3_pendulum_p", "rtd3_pendulum_p_mlp"):
        preset = result["learning"][name]
        assert set(preset) == PRESET_KEYS and len(preset["runs"]) == 1
        assert preset["runs"][0]["curve"], preset
    assert Path(result["learning_curves"]["csv"]).is_file()


def test_typo_in_benchmark_config_fails_before_running(tmp_path: Path) -> None:
    proc = _run(tmp_path, "bench.learnr.rounds=1")
    assert proc.returncode != 0
    assert "learnr" in proc.stderr


def test_update_flops_match_a_hand_count() -> None:
    """rdqn, lstm 4 units, pre [3], 2 obs, 2 actions, B=2, burn_in 1, trace 2, n_step 1 (L = 4)."""
    from agents.networks import NetworkConfig
    from agents.rdqn import RDQNConfig, RDQNLearner
    from scripts.measure import update_flops

    network = NetworkConfig(cell="lstm", units=4, pre_layers=[3])
    learner = RDQNLearner(RDQNConfig(batch_size=2, n_step=1), network, 2, 2, burn_in=1, trace_length=2)
    per_step = 2 * 2 * 3 + 2 * (3 + 4) * 16 + 2 * 4 * 2  # pre, lstm core, head
    steps = 4 + 4 + 2 * 2  # target over L, online over L, backward (2x) over the 2 trace rows
    assert update_flops(learner, 2) == 2 * per_step * steps


def test_invalid_settings_are_one_line_errors() -> None:
    from scripts.benchmark import BenchConfig, invalid

    assert invalid(BenchConfig()) is None
    bad = BenchConfig()
    bad.learner.compare = "some"
    assert "bench.learner.compare" in invalid(bad)
    bad = BenchConfig()
    bad.learner.units = []
    assert "bench.learner.units" in invalid(bad)


def test_train_sets_tf_thread_pools_before_tf_starts() -> None:
    """A fresh process gets the configured pools; once TF runs, other values are refused, not half-set."""
    code = (
        "import tensorflow as tf\n"
        "from agents.config import TrainConfig\n"
        "from agents.loop import configure_tf_threads\n"
        "assert configure_tf_threads(TrainConfig(tf_intra_op_threads=1, tf_inter_op_threads=2))\n"
        "tf.constant(1.0) + 1\n"
        "assert configure_tf_threads(TrainConfig(tf_intra_op_threads=1, tf_inter_op_threads=2))\n"
        "assert not configure_tf_threads(TrainConfig(tf_intra_op_threads=2, tf_inter_op_threads=2))\n"
        "t = tf.config.threading\n"
        "print(t.get_intra_op_parallelism_threads(), t.get_inter_op_parallelism_threads())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1", "2"]
    assert "not applied" in proc.stderr
