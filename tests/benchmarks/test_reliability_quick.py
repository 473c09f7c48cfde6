"""benchmarks/reliability.py: the report's failures line is computed, a kill point is really
hit by SIGKILL (fast), and the --quick run finds no failure (slow tier)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("reliability_bench", BENCH / "reliability.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


META = {
    "command": "python benchmarks/reliability.py --out x",
    "mode": "full",
    "minutes": 1.0,
    "jobs": 2,
    "date": "2025-01-01 00:00",
}


def test_the_failures_line_is_the_sum_of_the_lost_column(bench):
    ok = [bench.record("g", "a", ok=True), bench.record("g", "b", ok=3, tried=3)]
    text = bench.render(ok, META)
    assert text.rstrip().splitlines()[-3:] == [
        "failures: 0",
        "",
        f"`{META['command']}`, {META['date']}",
    ]
    assert "| g (2 faults) | 4 | 4 | 0 |" in text
    bad = [*ok, bench.record("h", "c", ok=8, tried=10, detail="x | y")]
    text = bench.render(bad, META)
    assert "failures: 2" in text and "failures: 0" not in text
    assert "| c | 10 | 8 | 2 | x / y |" in text  # a '|' in a detail does not break the table


def test_a_kill_point_is_hit_and_killed(bench, tmp_path):
    """The harness pauses the real CLI at the named call (here the root command's logging set-up)
    and the parent kills it with SIGKILL; a point the command never reaches is reported."""
    harness = sys.modules["reliability_harness"]
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
def test_quick_run_has_no_failures(bench, tmp_path):
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
    assert md.rstrip().splitlines()[-3] == "failures: 0" and meta["command"] in md
