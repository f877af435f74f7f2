"""Learning curves of several runs: ``python -m scripts.plot RUNS... [group_by=KEY[,KEY]]
[threshold=X] [out=PATH]``.

RUNS are run directories, directories that hold runs (a Hydra multirun), or glob patterns. Runs are
grouped by ``group_by`` (config keys such as ``network.cell``; default: those of ``agent.name``,
``env.name`` and ``network.cell`` that differ between the runs, else every key that differs except
``seed``); each group is drawn as the mean evaluation return over
its runs with a 95 % bootstrap band over runs. Writes ``<out>.png`` (needs
``pip install -e '.[plot]'``) and ``<out>.csv`` (the numbers behind it).
"""

from __future__ import annotations

import csv
import glob
import json
import sys
import warnings
from pathlib import Path

import numpy as np

from agents.records import flatten, read_progress

IGNORED = ("seed", "run_dir", "resume")
# Keys that name what a run is: the default grouping uses those that differ, else every key that does.
PREFERRED = ("agent.name", "env.name", "network.cell")


def find_runs(patterns: list[str]) -> list[Path]:
    """Run directories (those holding ``progress.csv`` and ``config.json``) under ``patterns``."""
    runs: set[Path] = set()
    for pattern in patterns:
        for root in [Path(p) for p in glob.glob(pattern)] or [Path(pattern)]:
            for progress in [root / "progress.csv", *root.rglob("*/progress.csv")]:
                if progress.is_file() and (progress.parent / "config.json").is_file():
                    runs.add(progress.parent)
    return sorted(runs)


def _label_values(config: dict) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in flatten(config).items()}


def group_runs(runs: list[Path], group_by: list[str] | None) -> dict[str, list[Path]]:
    """``label -> runs``; the label joins the ``group_by`` keys' values (``key=value``)."""
    configs = {run: _label_values(json.loads((run / "config.json").read_text())) for run in runs}
    if group_by is None:
        keys = sorted({k for c in configs.values() for k in c})
        differ = [
            k for k in keys if not k.startswith(IGNORED) and len({c.get(k) for c in configs.values()}) > 1
        ]
        group_by = [k for k in PREFERRED if k in differ] or differ
    unknown = [k for k in group_by if all(k not in c for c in configs.values())]
    if unknown:
        raise ValueError(f"group_by={unknown[0]} is not a config key of these runs")
    groups: dict[str, list[Path]] = {}
    for run, config in configs.items():
        label = " ".join(f"{k}={config.get(k)}" for k in group_by) or "all runs"
        groups.setdefault(label, []).append(run)
    return groups


def curve_band(runs: list[Path], rng: np.random.Generator, resamples: int = 1000) -> dict[str, np.ndarray]:
    """Mean and 95 % bootstrap band over runs on the union of their evaluation steps: each run's
    curve is interpolated linearly within its own range and left out beyond it."""
    curves = [read_progress(run / "progress.csv") for run in runs]
    curves = [c for c in curves if c]
    steps = np.array(sorted({r["env_steps"] for c in curves for r in c}), np.float64)
    values = np.full((len(curves), len(steps)), np.nan)
    for i, c in enumerate(curves):
        x = np.array([r["env_steps"] for r in c], np.float64)
        y = np.array([r["eval_return_mean"] for r in c], np.float64)
        inside = (steps >= x[0]) & (steps <= x[-1])
        values[i, inside] = np.interp(steps[inside], x, y)
    count = (~np.isnan(values)).sum(axis=0)
    mean = np.nanmean(values, axis=0)
    pick = rng.integers(0, len(curves), size=(resamples, len(curves)))
    with warnings.catch_warnings():  # a resample may hold no run that reaches a late step
        warnings.simplefilter("ignore", RuntimeWarning)
        boot = np.nanmean(values[pick], axis=1)  # [resamples, steps]
        lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0)
    return {"env_steps": steps, "mean": mean, "lo": lo, "hi": hi, "runs": count}


def plot(groups: dict[str, list[Path]], out: Path, threshold: float | None) -> tuple[Path, Path]:
    """Write ``out.csv`` and ``out.png``; returns both paths."""
    rng = np.random.default_rng(0)
    bands = {label: curve_band(runs, rng) for label, runs in groups.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out.with_suffix(".csv"), out.with_suffix(".png")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["group", "env_steps", "mean", "ci95_lo", "ci95_hi", "runs"])
        for label, b in bands.items():
            for row in zip(b["env_steps"], b["mean"], b["lo"], b["hi"], b["runs"], strict=True):
                w.writerow([label, int(row[0]), *(f"{v:.6g}" for v in row[1:4]), int(row[4])])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, b in bands.items():
        n = int(b["runs"].max())
        ax.plot(b["env_steps"], b["mean"], label=f"{label} ({n} runs)")
        ax.fill_between(b["env_steps"], b["lo"], b["hi"], alpha=0.2)
    if threshold is not None:
        ax.axhline(threshold, color="k", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("evaluation return (mean, 95 % CI)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path, csv_path


def main(argv: list[str]) -> int:
    """Parse ``RUNS... key=value`` arguments and plot; returns the exit code."""
    options = dict(a.split("=", 1) for a in argv if "=" in a and not Path(a).exists())
    patterns = [a for a in argv if a not in {f"{k}={v}" for k, v in options.items()}]
    allowed = ("group_by", "threshold", "out")
    try:
        bad = [k for k in options if k not in allowed]
        if bad:
            raise ValueError(f"{bad[0]} is not an option: allowed {'|'.join(allowed)}")
        runs = find_runs(patterns)
        if not runs:
            raise ValueError(f"no runs (progress.csv and config.json) under {patterns or 'the arguments'}")
        group_by = options["group_by"].split(",") if options.get("group_by") else None
        threshold = float(options["threshold"]) if "threshold" in options else None
        groups = group_runs(runs, group_by)
        try:
            png, table = plot(groups, Path(options.get("out", "curves")), threshold)
        except ModuleNotFoundError as exc:
            raise ValueError(f"plotting needs matplotlib: pip install -e '.[plot]' ({exc})") from None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(runs)} runs in {len(groups)} groups -> {png}, {table}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
