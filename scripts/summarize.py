"""Summarise finished runs: time to a return threshold per run, and the median across runs.

    python -m scripts.summarize runs/multirun/2026-12-02_17-00-00 --threshold 475

Reads every ``progress.csv`` below the given directories (one per run, e.g. a Hydra multirun over
seeds) and prints, per run, the first evaluation at or above the threshold (env steps and wall
time), the best and final evaluation and the whole learning curve; then the median over runs.
A run that never reaches the threshold counts as infinitely slow for the median.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path


def summarize_run(progress: Path, threshold: float) -> dict:
    """Time-to-threshold and curve of one run from its ``progress.csv``."""
    rows = list(csv.DictReader(open(progress)))
    curve = [(int(r["env_steps"]), float(r["wall_time_s"]), float(r["eval_return_mean"])) for r in rows]
    hit = next(((s, w) for s, w, r in curve if r >= threshold), None)
    config = json.loads((progress.parent / "config.json").read_text())
    return {
        "run": str(progress.parent),
        "seed": config.get("seed"),
        "cell": config["network"]["cell"],
        "steps_to_threshold": hit[0] if hit else None,
        "wall_to_threshold_s": hit[1] if hit else None,
        "best": max(r for _, _, r in curve),
        "final": curve[-1][2],
        "wall_total_s": curve[-1][1],
        "curve": [[s, r] for s, _, r in curve],
    }


def median_or_none(xs: list[float | None]) -> float | None:
    """Median where ``None`` (never reached) counts as infinitely slow; ``None`` if that median is
    infinite or there is nothing to take it over."""
    m = statistics.median(math.inf if x is None else x for x in xs) if xs else math.inf
    return None if math.isinf(m) else float(m)


def main(argv: list[str] | None = None) -> dict:
    """Print the summary table; returns it as a dict (also written with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--threshold", type=float, required=True)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    runs = [summarize_run(p, args.threshold) for d in args.dirs for p in sorted(d.rglob("progress.csv"))]
    if not runs:
        parser.error(f"no progress.csv under {', '.join(map(str, args.dirs))}")
    for r in runs:
        print(
            f"seed={r['seed']} cell={r['cell']} steps_to_{args.threshold:g}={r['steps_to_threshold']} "
            f"wall_to_threshold_s={r['wall_to_threshold_s']} best={r['best']:.1f} final={r['final']:.1f} "
            f"wall_total_s={r['wall_total_s']:.0f}\n  curve: "
            + " ".join(f"{s}:{v:.0f}" for s, v in r["curve"])
        )
    steps = [r["steps_to_threshold"] if r["steps_to_threshold"] is not None else math.inf for r in runs]
    walls = [r["wall_to_threshold_s"] if r["wall_to_threshold_s"] is not None else math.inf for r in runs]
    out = {
        "threshold": args.threshold,
        "runs": runs,
        "median_steps_to_threshold": statistics.median(steps),
        "median_wall_to_threshold_s": statistics.median(walls),
        "median_final": statistics.median(r["final"] for r in runs),
        "median_best": statistics.median(r["best"] for r in runs),
    }
    print(
        f"median over {len(runs)} runs: steps_to_threshold={out['median_steps_to_threshold']} "
        f"wall_to_threshold_s={out['median_wall_to_threshold_s']} final={out['median_final']:.1f} "
        f"best={out['median_best']:.1f}"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return out


if __name__ == "__main__":
    main()
