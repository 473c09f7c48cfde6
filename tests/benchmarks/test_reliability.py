"""benchmarks/reliability/suite.py: the report's failures line is computed, a kill point is really
hit by SIGKILL (fast), and the --quick run finds no failure (slow tier)."""

from __future__ import annotations

import json

import pytest

from benchmarks.reliability import harness
from benchmarks.reliability import suite as bench

META = {
    "command": "python -m benchmarks.reliability --out x",
    "mode": "full",
    "minutes": 1.0,
    "jobs": 2,
    "date": "2025-01-01 00:00",
}


def test_the_failures_line_is_the_sum_of_the_lost_column():
    ok = [bench.record("g", "a", ok=True), bench.record("g", "b", ok=3, tried=3)]
    text = bench.render(ok, META)
    lines = text.rstrip().splitlines()
    assert "failures: 0" in lines and lines.index("failures: 0") < lines.index("## Run")
    assert f"- Command: `{META['command']}`" in lines and f"- Date: {META['date']}" in lines
    assert "| g (2 faults) | 4 | 4 | 0 |" in text
    bad = [*ok, bench.record("h", "c", ok=8, tried=10, detail="x | y")]
    text = bench.render(bad, META)
    assert "failures: 2" in text and "failures: 0" not in text
    assert "| c | 10 | 8 | 2 | x / y |" in text  # a '|' in a detail does not break the table


def test_a_kill_point_is_hit_and_killed(tmp_path):
    """The harness pauses the real CLI at the named call (here the root command's logging set-up)
    and the parent kills it with SIGKILL; a point the command never reaches is reported."""
    spec = {"kind": "call", "target": "logging:basicConfig", "n": 1}
    args = ["eval", "--help"]
    assert harness.kill_at(args, spec, tmp_path, {}, timeout=120) is None
    assert json.loads((tmp_path / "paused").read_text()) == spec
    assert (
        "Usage" not in (tmp_path / "killed.log").read_text()
    )  # killed before the help was printed
    missed = harness.kill_at(args, {**spec, "n": 2}, tmp_path, {}, timeout=120)  # called once only
    assert missed == "point not reached: the command ended with code 0"
    assert "Usage" in (tmp_path / "killed.log").read_text()


@pytest.mark.slow
def test_quick_run_has_no_failures(tmp_path):
    results = bench.main(
        ["--quick", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    )
    meta = results["meta"]
    on_disk = json.loads((tmp_path / "out" / "reliability.json").read_text())
    assert on_disk["meta"]["failures"] == meta["failures"] == 0, [
        r for r in results["records"] if r["lost"]
    ]
    groups = {r["group"] for r in on_disk["records"]}
    assert {
        "train: kill -9, then --resume",
        "active-learn: kill -9, then --resume",
        "corrupted checkpoint -> calculator",
        "bad input -> clear outcome",
    } <= groups
    kills = [r for r in on_disk["records"] if "kill -9" in r["group"]]
    assert len(kills) == 4 and all(r["recovered"] == r["tried"] == 1 for r in kills)
    assert "1 partial temporary file(s)" in " ".join(
        r["detail"] for r in kills
    )  # a write was really cut
    fuzzed = [r for r in on_disk["records"] if r["group"].startswith("fuzzed")]
    assert [r["tried"] for r in fuzzed] == [60, 60]
    md = (tmp_path / "out" / "reliability.md").read_text()
    assert "failures: 0" in md.splitlines() and meta["command"] in md
