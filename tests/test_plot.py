"""scripts.plot: runs found, grouped by the keys that differ, mean and bootstrap band over seeds."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.metrics import PROGRESS_COLUMNS
from scripts.plot import find_runs, group_runs, main

ROOT = Path(__file__).resolve().parents[1]


def _run(root: Path, name: str, cell: str, seed: int, returns: list[float], every: int = 100) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(
        json.dumps({"seed": seed, "network": {"cell": cell}, "env": {"id": "X"}})
    )
    with open(run / "progress.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PROGRESS_COLUMNS)
        for i, r in enumerate(returns):
            w.writerow([(i + 1) * every, i, i, r, 0, r])
    return run


def test_groups_by_differing_keys_and_averages_over_seeds(tmp_path: Path) -> None:
    sweep = tmp_path / "multirun"
    for seed, returns in enumerate([[10, 20, 30], [20, 40, 60], [30, 60, 90]]):
        _run(sweep, f"{seed}_lstm", "lstm", seed, returns)
    _run(sweep, "0_mlp", "mlp", 0, [5, 5])
    _run(sweep, "1_mlp", "mlp", 1, [7, 9, 11, 13])  # a longer run: alone beyond step 300
    (tmp_path / "not_a_run").mkdir()
    runs = find_runs([str(sweep), str(tmp_path / "not_a_run")])
    assert len(runs) == 5
    groups = group_runs(runs, None)
    assert sorted(groups) == ["network.cell=lstm", "network.cell=mlp"]
    out = tmp_path / "plots" / "curves"
    assert main([str(sweep), "threshold=50", f"out={out}"]) == 0
    rows = list(csv.DictReader(open(out.with_suffix(".csv"))))
    lstm = {int(r["env_steps"]): r for r in rows if r["group"] == "network.cell=lstm"}
    assert float(lstm[200]["mean"]) == pytest.approx(40.0) and int(lstm[200]["runs"]) == 3
    assert float(lstm[200]["ci95_lo"]) <= 40.0 <= float(lstm[200]["ci95_hi"])
    # Seeds at 20, 40 and 60: a bootstrap of three runs spreads well beyond +-5 of the mean.
    assert float(lstm[200]["ci95_lo"]) < 35.0 and float(lstm[200]["ci95_hi"]) > 45.0
    assert float(lstm[300]["ci95_lo"]) >= 30.0 and float(lstm[300]["ci95_hi"]) <= 90.0
    mlp = {int(r["env_steps"]): r for r in rows if r["group"] == "network.cell=mlp"}
    assert int(mlp[400]["runs"]) == 1 and float(mlp[400]["mean"]) == pytest.approx(13.0)
    assert float(mlp[200]["mean"]) == pytest.approx(7.0)
    assert out.with_suffix(".png").stat().st_size > 1000


def test_bad_arguments_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _run(tmp_path, "a", "lstm", 0, [1, 2])
    assert main([str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("error: no runs")
    assert main([str(tmp_path), "group_by=network.nope"]) == 2
    assert "group_by=network.nope is not a config key" in capsys.readouterr().err
    assert main([str(tmp_path), "colour=red"]) == 2
    assert "colour is not an option" in capsys.readouterr().err


def test_plotting_runs_does_not_start_tensorflow(tmp_path: Path) -> None:
    _run(tmp_path, "a", "lstm", 0, [1.0, 2.0])
    code = (
        "import sys; from scripts.plot import main; main([sys.argv[1], 'out=' + sys.argv[2]]); "
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), str(tmp_path / "curves")],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "curves.csv").exists()
