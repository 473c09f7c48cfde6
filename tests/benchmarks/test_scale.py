"""The scale suite: the page (tables first, the sub-results read from their JSON files) and, in
the slow tier, ``python -m benchmarks.scale --quick`` and a one-process ``benchmarks.scale.train``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.scale import suite

ROOT = Path(__file__).resolve().parents[2]


def _result(frames: int, workers: int, seconds: float) -> dict:
    return {
        "frames": frames,
        "workers": workers,
        "finished": True,
        "seconds": seconds,
        "frames_per_s": frames / seconds,
        "peak_rss_MiB": 400.0,
        "parent_rss_MiB": 400.0,
        "worker_rss_MiB": None,
    }


RESULT = {
    "command": "python -m benchmarks.scale",
    "seed": 0,
    "setup": "tiny model.",
    "memory_measure": "peak RSS.",
    "machine": "x86_64, 2 CPUs",
    "rows": [_result(100, 1, 2.0), _result(300, 2, 3.0)],
}


def test_page_shows_the_tables_first_and_reads_the_sub_results(tmp_path):
    md = suite.render(RESULT, tmp_path)
    assert md.index("| 100 | 1 | True | 2 | 50 | 400 | 400 |") < md.index("## Run")
    assert "- Command: `python -m benchmarks.scale` (seed 0)" in md
    assert "Training throughput" not in md and "Exploration" not in md  # no JSON, no section
    (tmp_path / "scale_train.json").write_text(
        json.dumps(
            {
                "command": "python -m benchmarks.scale.train --processes 1",
                "seed": 0,
                "rows": [{"processes": 1, "mode": "allreduce", "structures_per_s": 12.5}],
            }
        )
    )
    (tmp_path / "exploration.json").write_text(
        json.dumps({"command": "python -m benchmarks.exploration", "rows": [{"bias": "udd"}]})
    )
    md = suite.render(RESULT, tmp_path)
    assert "| 1 | allreduce |  | 12.5 |" in md and "| udd |" in md
    assert md.index("| udd |") < md.index("## Run") < md.index("- Exploration: `python -m")
    assert "- Training throughput: `python -m benchmarks.scale.train --processes 1` (seed 0)" in md


def _run(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.slow
def test_quick_run_and_report_only(tmp_path):
    _run("benchmarks.scale", "--quick", "--out", str(tmp_path))
    result = json.loads((tmp_path / "scale.json").read_text())
    assert {r["frames"] for r in result["rows"]} == {100, 300}
    assert all(r["finished"] for r in result["rows"])
    for r in result[
        "rows"
    ]:  # frames / seconds, rounded to 0.1 from seconds before rounding to 0.01
        n, s = r["frames"], r["seconds"]
        assert n / (s + 0.005) - 0.05 <= r["frames_per_s"] <= n / max(s - 0.005, 1e-9) + 0.05, r
        assert r["peak_rss_MiB"] == max(r["parent_rss_MiB"], r["worker_rss_MiB"] or 0.0) > 0, r
    page = (tmp_path / "scale.md").read_text()
    (tmp_path / "scale.md").unlink()
    _run("benchmarks.scale", "--report-only", "--out", str(tmp_path))
    assert (tmp_path / "scale.md").read_text() == page  # the page is a function of the JSON


@pytest.mark.slow
def test_training_throughput_one_process(tmp_path):
    out = tmp_path / "scale_train.json"
    _run("benchmarks.scale.train", "--processes", "1", "--structures", "16", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [(r["processes"], r["mode"]) for r in rows] == [(1, "allreduce")]
    row = rows[0]  # 16 structures (no validation split) in steps of the default global batch 8
    assert (row["structures"], row["global_batch"], row["batch_per_process"]) == (16, 8, 8)
    assert row["steps"] == 2 and row["speedup"] == 1.0  # the one-process row is the baseline
    assert row["structures_per_s"] == pytest.approx(16 / row["seconds"], rel=1e-12)
    assert row["seconds"] > 0 and math.isfinite(row["train_loss"])
