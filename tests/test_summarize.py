"""scripts.summarize: time to threshold per run and the median over runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from scripts.summarize import main


def _run(root: Path, seed: int, returns: list[float]) -> None:
    run = root / f"seed={seed}"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"seed": seed, "network": {"cell": "lstm"}}))
    lines = ["env_steps,updates,wall_time_s,eval_return_mean,eval_return_std,train_return_mean"]
    lines += [f"{1000 * (i + 1)},0,{10.0 * (i + 1)},{r},0,0" for i, r in enumerate(returns)]
    (run / "progress.csv").write_text("\n".join(lines) + "\n")


def test_time_to_threshold_and_median(tmp_path: Path, capsys) -> None:
    _run(tmp_path, 0, [10, 480, 300])
    _run(tmp_path, 1, [10, 100, 490])
    _run(tmp_path, 2, [10, 100, 200])
    out = main([str(tmp_path), "--threshold", "475", "--json", str(tmp_path / "s.json")])
    steps = {r["seed"]: r["steps_to_threshold"] for r in out["runs"]}
    assert steps == {0: 2000, 1: 3000, 2: None}
    assert out["median_steps_to_threshold"] == 3000 and out["median_wall_to_threshold_s"] == 30.0
    assert out["median_final"] == 300 and json.loads((tmp_path / "s.json").read_text())["threshold"] == 475
    assert "median over 3 runs" in capsys.readouterr().out
    _run(tmp_path / "b", 3, [1, 2])
    assert math.isinf(main([str(tmp_path / "b"), "--threshold", "475"])["median_steps_to_threshold"])
