"""Time-to-threshold runs for ``python -m scripts.benchmark bench.learning=true`` (no Hydra here).

Each preset is a list of overrides of ``conf/config.yaml`` plus a return threshold; every seed is a
full :func:`agents.loop.train` run. A run reaches the threshold at its first greedy evaluation
whose mean return is at least the threshold (:func:`scripts.summarize.summarize_run`); we report
the env steps and wall time of that evaluation per run, their medians over seeds, and the curves
(CSV always; a PNG when matplotlib is installed: ``pip install -e .[bench]``).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable
from pathlib import Path

from agents.config import Config
from scripts.summarize import median_or_none, summarize_run


def run_learning(
    presets: dict[str, dict],
    seeds: list[int],
    compose: Callable[[list[str]], Config],
    out_dir: Path,
    extra_overrides: list[str],
) -> dict:
    """Train every preset for every seed; per-run results (scripts.summarize) and medians per preset.

    As in :mod:`scripts.summarize`, a run that never reaches the threshold counts as infinitely
    slow for the median; a median that is infinite is reported as ``None``.
    """
    from agents.loop import train

    results: dict[str, dict] = {}
    for name, preset in presets.items():
        runs = []
        for seed in seeds:
            config = compose([*preset["overrides"], *extra_overrides, f"seed={seed}"])
            config.train.progress_bar = False
            config.run_dir = str(out_dir / name / f"seed{seed}")
            train(config)
            runs.append(summarize_run(Path(config.run_dir) / "progress.csv", preset["threshold"]))
        results[name] = {
            "overrides": list(preset["overrides"]),
            "threshold": preset["threshold"],
            "seeds": list(seeds),
            "reached": sum(r["steps_to_threshold"] is not None for r in runs),
            "median_env_steps_to_threshold": median_or_none([r["steps_to_threshold"] for r in runs]),
            "median_wall_s_to_threshold": median_or_none([r["wall_to_threshold_s"] for r in runs]),
            "median_final_return": statistics.median(r["final"] for r in runs),
            "runs": runs,
        }
    return results


def write_curves(results: dict, csv_path: Path, png_path: Path) -> str | None:
    """Curves to CSV (always) and PNG (if matplotlib imports); returns the PNG path or None."""
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["preset", "seed", "env_steps", "eval_return_mean"])
        for name, res in results.items():
            for run in res["runs"]:
                for point in run["curve"]:
                    writer.writerow([name, run["seed"], *point])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    # One panel per threshold: presets of one task (e.g. lstm and mlp on cartpole_p) share axes.
    thresholds = list(dict.fromkeys(res["threshold"] for res in results.values()))
    fig, axes = plt.subplots(1, len(thresholds), figsize=(6.5 * len(thresholds), 4.5), squeeze=False)
    for i, (name, res) in enumerate(results.items()):
        ax = axes[0, thresholds.index(res["threshold"])]
        color = f"C{i}"
        for j, run in enumerate(res["runs"]):
            steps = [p[0] for p in run["curve"]]
            returns = [p[1] for p in run["curve"]]
            ax.plot(steps, returns, color=color, alpha=0.6, lw=1.2, label=name if j == 0 else None)
        ax.axhline(res["threshold"], color="k", ls=":", lw=1)
    for ax in axes[0]:
        ax.set_xlabel("env steps")
        ax.set_ylabel("greedy eval return (mean over episodes)")
        ax.legend(loc="best", fontsize=8)
    fig.suptitle("learning curves, one line per seed; dotted: threshold")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return str(png_path)
