"""agents/metrics.py: TD summaries by hand, progress.csv rows, summary.json atomic, histograms."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from agents.metrics import PROGRESS_COLUMNS, MetricsWriter, read_progress, td_summary
from tests.helpers import event_tags

# [B=2, T=5]; the two masked entries (100 and -50) are larger than every valid one, so any use of
# them shows in the mean and the max.
TD = np.array([[1.0, -2.0, 3.0, 0.5, 100.0], [-1.0, -50.0, -3.0, 2.0, 8.0]], np.float32)
MASK = np.array([[1, 1, 1, 1, 0], [1, 0, 1, 1, 1]], np.float32)


def test_td_summary_by_hand_over_valid_steps_in_two_bins() -> None:
    got = td_summary(TD, MASK, bins=2)
    # Valid: 1, -2, 3, 0.5 | -1, -3, 2, 8.  Sum 8.5, |sum| 20.5, over 8 steps.
    # Bins: edges round(linspace(0, 5, 3)) = 0, 2, 5 -> positions 0-1 and 2-4.
    # t00-01: |1|, |-2|, |-1| -> 4 / 3.  t02-04: |3|, |0.5|, |-3|, |2|, |8| -> 16.5 / 5.
    want = {
        "mean": 8.5 / 8,
        "abs_mean": 20.5 / 8,
        "abs_max": 8.0,
        "by_position/t00-01": 4 / 3,
        "by_position/t02-04": 16.5 / 5,
    }
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6), key


def test_td_summary_more_bins_than_steps_and_a_position_without_valid_steps() -> None:
    mask = MASK.copy()
    mask[:, 1] = 0.0  # position 1 has no valid step in either row
    got = td_summary(TD, mask, bins=8)  # at most T = 5 bins: one per position
    by_position = {k: v for k, v in got.items() if k.startswith("by_position/")}
    want = {"t00-00": 1.0, "t01-01": 0.0, "t02-02": 3.0, "t03-03": 1.25, "t04-04": 8.0}
    assert by_position == pytest.approx({f"by_position/{k}": v for k, v in want.items()})
    nothing = td_summary(TD, np.zeros_like(MASK), bins=2)
    assert nothing["mean"] == nothing["abs_mean"] == nothing["abs_max"] == 0.0
    assert all(np.isfinite(v) for v in nothing.values())


def _row(step: int) -> dict[str, float]:
    return {
        "env_steps": step,
        "updates": step // 4,
        "wall_time_s": step / 100,
        "eval_return_mean": step / 10,
        "eval_return_std": 1.5,
        "train_return_mean": -step / 10,
        "eval_success_rate": step / 1000,
        "not_a_column": 7.0,
    }


def test_progress_csv_has_one_header_and_a_row_per_call_across_writers(tmp_path: Path) -> None:
    first = MetricsWriter(tmp_path)
    first.progress(_row(100))
    first.progress(_row(200))
    first.close()
    second = MetricsWriter(tmp_path)  # a resumed run appends to the same file
    second.progress(_row(300))
    second.close()
    lines = (tmp_path / "progress.csv").read_text().splitlines()
    assert lines[0] == ",".join(PROGRESS_COLUMNS)
    assert len(lines) == 4 and lines.count(lines[0]) == 1
    rows = read_progress(tmp_path / "progress.csv")
    assert rows == [{k: _row(s)[k] for k in PROGRESS_COLUMNS} for s in (100, 200, 300)]
    assert all(isinstance(r["env_steps"], int) and isinstance(r["updates"], int) for r in rows)


def test_progress_without_the_success_column_reads_it_as_nan(tmp_path: Path) -> None:
    """A progress.csv written before eval_success_rate existed; a row without it is written as nan."""
    old = [c for c in PROGRESS_COLUMNS if c != "eval_success_rate"]
    (tmp_path / "progress.csv").write_text(",".join(old) + "\n" + "100,25,1.0,10.0,1.5,-10.0\n")
    (row,) = read_progress(tmp_path / "progress.csv")
    assert row["eval_return_mean"] == 10.0 and np.isnan(row["eval_success_rate"])
    writer = MetricsWriter(tmp_path / "new")
    writer.progress({k: v for k, v in _row(100).items() if k != "eval_success_rate"})
    writer.close()
    assert np.isnan(read_progress(tmp_path / "new" / "progress.csv")[0]["eval_success_rate"])


def test_read_progress_leaves_out_a_torn_last_line(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path)
    writer.progress(_row(100))
    writer.close()
    with open(tmp_path / "progress.csv", "a") as f:
        f.write("200,50,2.0")  # killed while appending
    assert [r["env_steps"] for r in read_progress(tmp_path / "progress.csv")] == [100]
    assert read_progress(tmp_path / "missing.csv") == []


def test_summary_json_is_replaced_whole_or_not_at_all(tmp_path: Path, monkeypatch) -> None:
    writer = MetricsWriter(tmp_path)
    writer.summary({"env_steps": 100, "status": "running"})
    writer.summary({"env_steps": 200, "status": "finished"})
    path = tmp_path / "summary.json"
    assert json.loads(path.read_text()) == {"env_steps": 200, "status": "finished"}
    with pytest.raises(TypeError):  # not JSON: nothing is written
        writer.summary({"env_steps": 300, "bad": object()})

    def no_rename(src, dst) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError, match="disk full"):
        writer.summary({"env_steps": 400, "status": "finished"})
    monkeypatch.undo()
    writer.close()
    assert json.loads(path.read_text()) == {"env_steps": 200, "status": "finished"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "tb"]  # no temp file left


def test_histogram_of_nothing_is_skipped(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path)
    writer.histogram(1, "charts/empty", np.zeros((4, 0)))
    writer.histogram(1, "charts/full", np.ones((2, 3)))
    # Every step masked: TD scalars are written, the TD histogram is not.
    writer.learner(2, {"td_error": TD, "mask": np.zeros_like(MASK)}, prefix="td")
    writer.close()
    tags = event_tags(tmp_path)
    assert "charts/full" in tags and "charts/empty" not in tags
    assert {"td/mean", "td/abs_max", "td/by_position/t00-00"} <= tags
    assert "td/histogram" not in tags
