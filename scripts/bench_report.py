"""Plain-text and Markdown tables of a ``scripts.benchmark`` result (the JSON written next to them)."""

from __future__ import annotations

from scripts.bench_variants import VARIANTS


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def format_learner(rows: list[dict], header: bool = True) -> str:
    head = (
        f"{'shapes':7} {'agent':6} {'cell':5} {'U':>4} {'B':>3} {'kernel':6} {'GFLOP':>6} {'upd/s':>6} "
        f"{'GEMM':>6} {'eff%':>5} {'cpu ms':>6} {'graph/s':>7} {'x graph':>7} {'ref/s':>6} {'x ref':>5} "
        f"{'ref ms':>6} {'keras/s':>7} {'x keras':>7} {'load':>4}"
    )
    lines = [head] if header else []
    for r in rows:
        lines.append(
            f"{r['shapes']:7} {r['agent']:6} {r['cell']:5} {r['units']:>4} {r['batch_size']:>3} "
            f"{r['kernel']:6} {r['flops_per_update'] / 1e9:>6.2f} {r['updates_per_s']:>6.1f} "
            f"{r['gemm_gflops']:>6.1f} {r['efficiency_pct']:>5.1f} {r['cpu_ms_per_update']:>6.1f} "
            f"{_fmt(r['graph_updates_per_s']):>7} {_fmt(r['speedup_vs_graph'], '.2f'):>7} "
            f"{_fmt(r['reference_updates_per_s']):>6} {_fmt(r['speedup_vs_reference'], '.2f'):>5} "
            f"{_fmt(r['reference_cpu_ms_per_update']):>6} {_fmt(r['keras_updates_per_s']):>7} "
            f"{_fmt(r['speedup_vs_keras'], '.2f'):>7} {r['load_1min']:>4.1f}"
        )
    for r in rows:
        if r.get("prioritized_vs_uniform") is not None:
            lines.append(
                f"  {r['agent']} {r['cell']}-{r['units']} B={r['batch_size']} from a full replay: uniform "
                f"{r['uniform_replay_updates_per_s']:.1f} upd/s, prioritized (sample + priority update) "
                f"{r['prioritized_updates_per_s']:.1f} upd/s = {r['prioritized_vs_uniform']:.3f}x"
            )
        for key, var in VARIANTS.items():
            if r.get(var.ratio_key) is not None:
                lines.append(
                    f"  {r['agent']} {r['cell']}-{r['units']} B={r['batch_size']} with {var.label} "
                    f"({var.override}): {r[f'{key}_updates_per_s']:.1f} upd/s = {r[var.ratio_key]:.3f}x "
                    f"{var.against}"
                )
    return "\n".join(lines)


def _threads(m: dict) -> str:
    return f"op threads intra {m['tf_intra_op_threads']}, inter {m['tf_inter_op_threads']}"


def format_table(result: dict) -> str:
    """The whole result as plain-text tables."""
    m, g = result["machine"], result["gemm"]
    load = f"load {m['load_start'][0]:.1f} -> {m['load_end'][0]:.1f}"
    out = [
        f"machine: {m['cpu']}, {m['cores']} cores, TF {m['tensorflow']} ({_threads(m)}), {load}; "
        f"GEMM {g['parallel_matmuls']} x {g['size']}^3 fp32: "
        f"{g['gflops_start']:.1f} -> {g['gflops_end']:.1f} GFLOP/s",
        "",
        "learner: upd/s; GEMM = same-run fp32 GFLOP/s; eff% = GFLOP x upd/s / GEMM; cpu ms = process CPU",
        "time per update; kernel = network.backend pick; graph = the TF-graph kernel",
        "(agents/sequence_kernels.py),",
        "ref = the tf.scan reference path, keras = stock Keras LSTM/GRU step (same run)",
        format_learner(result["learner"]),
        "",
    ]
    t = result["target_update"]
    out.append(
        f"target update ({t['variables']} variables): fused {t['fused_ms_per_call']:.3f} ms/call, "
        f"per-variable eager {t['eager_ms_per_call']:.3f} ms/call ({t['speedup']:.1f}x)"
    )
    out += [
        "",
        f"acting ({result['acting'][0]['cell']}-{result['acting'][0]['units']} numpy policy + replay)",
    ]
    out.append(
        f"{'envs':>4} {'raw steps/s':>12} {'actor steps/s':>13} {'% of raw':>8} {'BLAS dflt':>9} {'load':>5}"
    )
    for r in result["acting"]:
        out.append(
            f"{r['num_envs']:>4} {r['raw_env_steps_per_s']:>12.0f} {r['actor_env_steps_per_s']:>13.0f} "
            f"{r['pct_of_raw']:>8.1f} {r['actor_blas_default_env_steps_per_s']:>9.0f} {r['load_1min']:>5.1f}"
        )
    if result["learning"]:
        out += ["", "learning (median over seeds; unreached counts as infinite)"]
        for name, res in result["learning"].items():
            steps = _fmt(res["median_env_steps_to_threshold"], ".0f")
            wall = _fmt(res["median_wall_s_to_threshold"])
            out.append(
                f"{name}: {res['reached']}/{len(res['seeds'])} seeds reached {res['threshold']:g}; median "
                f"env steps {steps}, wall {wall} s; median final return {res['median_final_return']:.1f}"
            )
    out += [f"note: {n}" for n in result["notes"]]
    return "\n".join(out)


def format_markdown(result: dict) -> str:
    """Markdown tables of the result (written next to the JSON, pasted into docs/performance.md)."""
    m, g = result["machine"], result["gemm"]
    lines = [
        f"{m['date']}, {m['cpu']}, {m['cores']} cores, TF {m['tensorflow']} ({_threads(m)}); 1-min load "
        f"{m['load_start'][0]:.1f} at start, {m['load_end'][0]:.1f} at end; GEMM "
        f"{g['parallel_matmuls']} x {g['size']}^3 fp32 "
        f"{g['gflops_start']:.0f} -> {g['gflops_end']:.0f} GFLOP/s.",
        "",
        "| shapes | agent | cell | U | B | L | kernel | GFLOP/update | updates/s | CPU ms/update "
        "| GEMM GFLOP/s | eff. % | graph kernel updates/s (x) | tf.scan updates/s (CPU ms) "
        "| x tf.scan wall / CPU | Keras updates/s (CPU ms) | load |",
        "|---|---|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in result["learner"]:
        ref = keras = ratio = graph = "-"
        if r["graph_updates_per_s"] is not None:
            graph = f"{r['graph_updates_per_s']:.1f} ({r['speedup_vs_graph']:.2f}x)"
        if r["reference_updates_per_s"] is not None:
            ref = f"{r['reference_updates_per_s']:.1f} ({r['reference_cpu_ms_per_update']:.1f})"
            cpu_ratio = r["reference_cpu_ms_per_update"] / r["cpu_ms_per_update"]
            ratio = f"{r['speedup_vs_reference']:.2f} / {cpu_ratio:.2f}"
        if r["keras_updates_per_s"] is not None:
            keras = f"{r['keras_updates_per_s']:.1f} ({r['keras_cpu_ms_per_update']:.1f})"
        lines.append(
            f"| {r['shapes']} | {r['agent']} | {r['cell']} | {r['units']} | {r['batch_size']} "
            f"| {r['seq_len']} | {r['kernel']} "
            f"| {r['flops_per_update'] / 1e9:.2f} | {r['updates_per_s']:.1f} | {r['cpu_ms_per_update']:.1f} "
            f"| {r['gemm_gflops']:.0f} "
            f"| {r['efficiency_pct']:.0f} | {graph} | {ref} | {ratio} | {keras} | {r['load_1min']:.1f} |"
        )
    t = result["target_update"]
    lines += [
        "",
        f"Target update ({t['agent']} {t['cell']}-{t['units']}, {t['variables']} variables): fused "
        f"{t['fused_ms_per_call']:.2f} ms/call, per-variable eager {t['eager_ms_per_call']:.2f} ms/call "
        f"({t['speedup']:.1f}x).",
        "",
        "| envs | raw SyncVectorEnv steps/s | actor steps/s (BLAS pinned) | % of raw | actor, BLAS default "
        "| load |",
        "|--:|--:|--:|--:|--:|--:|",
    ]
    for r in result["acting"]:
        lines.append(
            f"| {r['num_envs']} | {r['raw_env_steps_per_s']:.0f} | {r['actor_env_steps_per_s']:.0f} "
            f"| {r['pct_of_raw']:.0f} | {r['actor_blas_default_env_steps_per_s']:.0f} "
            f"| {r['load_1min']:.1f} |"
        )
    if result["learning"]:
        lines += ["", *format_learning_markdown(result["learning"])]
    return "\n".join(lines) + "\n"


def format_learning_markdown(learning: dict) -> list[str]:
    """One row per preset: seeds reaching the threshold, medians, and the per-seed figures."""

    def per_seed(runs: list[dict], key: str, spec: str) -> str:
        return ", ".join(_fmt(r[key], spec) for r in runs)

    lines = [
        "| preset | threshold | seeds reaching it | median env steps to it | median wall s to it "
        "| env steps to it per seed | best eval per seed | eval at the end per seed | wall per run (s) |",
        "|---|--:|--:|--:|--:|---|---|---|--:|",
    ]
    for name, res in learning.items():
        runs = res["runs"]
        walls = [r["wall_total_s"] for r in runs]
        lines.append(
            f"| {name} | {res['threshold']:g} | {res['reached']} / {len(runs)} "
            f"| {_fmt(res['median_env_steps_to_threshold'], '.0f')} "
            f"| {_fmt(res['median_wall_s_to_threshold'])} "
            f"| {per_seed(runs, 'steps_to_threshold', '.0f')} | {per_seed(runs, 'best', '.0f')} "
            f"| {per_seed(runs, 'final', '.0f')} | {min(walls):.0f}-{max(walls):.0f} |"
        )
    return lines
