"""Time-to-threshold runs for ``python -m scripts.benchmark bench.learning=true`` (no Hydra here).

Each preset is a list of overrides of ``conf/config.yaml`` plus a return threshold; every seed is a
full :func:`agents.loop.train` run. A run reaches the threshold at its first greedy evaluation
whose mean return is at least the threshold; we report the env steps and wall time of that
evaluation, the medians over the seeds that reached it, and the curves (CSV always; a PNG when
matplotlib is installed: ``pip install -e .[bench]``).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable
from pathlib import Path

from agents.config import Config


def first_reach(evaluations: list[dict], threshold: float) -> dict | None:
    """The first evaluation row with ``eval_return_mean >= threshold`` (None if never)."""
    for row in evaluations:
        if row["eval_return_mean"] >= threshold:
            return row
    return None


def run_learning(
    presets: dict[str, dict],
    seeds: list[int],
    compose: Callable[[list[str]], Config],
    out_dir: Path,
    extra_overrides: list[str],
) -> dict:
    """Train every preset for every seed; returns per-run and per-preset results."""
    from agents.loop import train

    results: dict[str, dict] = {}
    for name, preset in presets.items():
        runs = []
        for seed in seeds:
            config = compose([*preset["overrides"], *extra_overrides, f"seed={seed}"])
            config.train.progress_bar = False
            config.run_dir = str(out_dir / name / f"seed{seed}")
            summary = train(config)
            hit = first_reach(summary["evaluations"], preset["threshold"])
            runs.append(
                {
                    "seed": seed,
                    "reached": hit is not None,
                    "env_steps_to_threshold": hit["env_steps"] if hit else None,
                    "wall_s_to_threshold": hit["wall_time_s"] if hit else None,
                    "final_eval_return_mean": summary["final_eval_return_mean"],
                    "wall_time_s": summary["wall_time_s"],
                    "env_steps": summary["env_steps"],
                    "curve": [
                        [e["env_steps"], e["wall_time_s"], e["eval_return_mean"]]
                        for e in summary["evaluations"]
                    ],
                }
            )
        reached = [r for r in runs if r["reached"]]
        results[name] = {
            "overrides": list(preset["overrides"]),
            "threshold": preset["threshold"],
            "seeds": list(seeds),
            "reached": len(reached),
            "median_env_steps_to_threshold": _median([r["env_steps_to_threshold"] for r in reached]),
            "median_wall_s_to_threshold": _median([r["wall_s_to_threshold"] for r in reached]),
            "runs": runs,
        }
    return results


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def write_curves(results: dict, csv_path: Path, png_path: Path) -> str | None:
    """Curves to CSV (always) and PNG (if matplotlib imports); returns the PNG path or None."""
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["preset", "seed", "env_steps", "wall_time_s", "eval_return_mean"])
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
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, res) in enumerate(results.items()):
        color = f"C{i}"
        for j, run in enumerate(res["runs"]):
            steps = [p[0] for p in run["curve"]]
            returns = [p[2] for p in run["curve"]]
            ax.plot(steps, returns, color=color, alpha=0.6, lw=1.2, label=name if j == 0 else None)
        ax.axhline(res["threshold"], color=color, ls=":", lw=1)
    ax.set_xlabel("env steps")
    ax.set_ylabel("greedy eval return (mean over episodes)")
    ax.set_title("learning curves, one line per seed; dotted: threshold")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return str(png_path)
