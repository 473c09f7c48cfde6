"""benchmarks/member_llpr.py: the shipped last-layer posterior fitted on MAP committee members."""

import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("member_llpr")


def test_quick_members_scored_against_the_committee_and_resumed(bench, tmp_path):
    summary = bench.main(["--quick", "--members", "0,1", "--out", str(tmp_path)])
    run = tmp_path / "run"
    (r,) = summary["runs"]
    assert summary["status"] == "partial"  # 2 of the 5 members
    assert sorted(r["members"]) == [0, 1]
    entry = json.loads((run / "force_uncertainty.json").read_text())["cu_emt"]
    assert (
        r["default"] == entry[entry["default"]]
        and r["references"]["committee5"] == entry["committee5"]
    )
    for k, m in r["members"].items():
        assert m["posterior"]["lowrank_rank"] == 4 and m["row"]["std_over_rmse"] is not None, k
        assert 0.0 < m["row"]["cost_ratio"] < 10.0
        got = m["lines"]["committee5"]
        assert got["all"] == all(got[key]["met"] for key in bench.cf.LINES)
    rows = [m["row"]["force_mae_meV_A"] for m in r["members"].values()]
    assert rows[0] != rows[1]  # two different models
    steps = [json.loads(x)["step"] for x in (run / "member_llpr.jsonl").read_text().splitlines()]
    assert steps.count("eval:cu_emt:a:0") == 1
    bench.main(
        ["--quick", "--members", "0,1", "--out", str(tmp_path)]
    )  # again: nothing fitted a second time
    again = [json.loads(x)["step"] for x in (run / "member_llpr.jsonl").read_text().splitlines()]
    assert [s for s in again if not s.startswith("invocation:")] == [
        s for s in steps if not s.startswith("invocation:")
    ]
    md = (tmp_path / "member_llpr.md").read_text()
    assert "| member 1 |" in md and "default (BBB)" in md
