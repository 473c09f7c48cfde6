"""benchmarks/committee_floor.py: a second committee on a finished run, its lines against the first."""

import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("committee_floor")


def test_lines_against_a_reference(bench):
    ref = {
        "spearman_frame_in_domain": 0.50,
        "partial_spearman_given_force": 0.32,
        "auroc_ood": 0.80,
    }
    row = {
        "spearman_frame_in_domain": 0.46,
        "partial_spearman_given_force": 0.29,
        "auroc_ood": 0.769,
    }
    out = bench.lines_met(row, ref)
    assert out["spearman_frame_in_domain"]["met"]  # 0.46 >= 0.50 - 0.05
    assert out["partial_spearman_given_force"]["target"] == pytest.approx(
        0.30
    )  # the floor above 0.32 - 0.05
    assert not out["partial_spearman_given_force"]["met"]
    assert not out["auroc_ood"]["met"]  # 0.769 < 0.80 - 0.03
    assert not out["all"]
    assert bench.lines_met({**row, "partial_spearman_given_force": 0.31, "auroc_ood": 0.771}, ref)[
        "all"
    ]


def test_auroc_of_the_rows_own_error(bench):
    record = {"in": {"error": [0.1, 0.2]}, "ood": {"error": [0.3, 0.15]}}
    assert bench.error_auroc(record) == pytest.approx(
        0.75
    )  # 3 of the 4 (OOD, in-domain) pairs ordered
    assert bench.error_auroc({"in": {"error": [0.1]}}) is None


def test_members_split_over_two_commands_then_summary(bench, tmp_path):
    # --members: this command trains members 0 and 1 of committee B only and writes no summary
    assert bench.main(["--quick", "--members", "0,1", "--out", str(tmp_path)]) is None
    run = tmp_path / "run"
    steps = [
        json.loads(x)["step"] for x in (run / "committee_floor.jsonl").read_text().splitlines()
    ]
    assert [s for s in steps if s.startswith("member:")] == ["member:cu_emt:0", "member:cu_emt:1"]
    assert not (tmp_path / "committee_floor.json").exists()
    # the full command trains the other three, evaluates committee B on the run's frames, summarises
    summary = bench.main(["--quick", "--out", str(tmp_path)])
    steps = [
        json.loads(x)["step"] for x in (run / "committee_floor.jsonl").read_text().splitlines()
    ]
    assert sorted(s for s in steps if s.startswith("member:")) == [
        f"member:cu_emt:{k}" for k in range(5)
    ]
    assert steps.count("eval:cu_emt:committee5_b") == 1
    (r,) = summary["runs"]
    assert r["member_seeds_b"] == [100, 101, 102, 103, 104]  # the run's seed 0 + offset 100 + k
    assert summary["status"] == "complete"
    assert set(r["rows"]) == {"default", "committee5", "committee5_b"}
    committee_a = json.loads((run / "force_uncertainty.json").read_text())["cu_emt"]["committee5"]
    assert r["rows"]["committee5"] == committee_a
    records = {
        json.loads(x)["step"]: json.loads(x)
        for x in (run / "force_uncertainty.jsonl").read_text().splitlines()
    }
    b = next(
        json.loads(x)
        for x in (run / "committee_floor.jsonl").read_text().splitlines()
        if "committee5_b" in x
    )
    a = records["eval:cu_emt:committee5"]
    assert b["in"]["error"] != a["in"]["error"] and len(b["in"]["score"]) == len(
        a["in"]["score"]
    )  # same frames
    assert set(r["auroc_ood_of_error"]) == {"default", "committee5", "committee5_b"}
    for check in ("b_vs_a", "a_vs_b", "default_vs_a", "default_vs_b"):
        assert r[check]["all"] == all(r[check][k]["met"] for k in bench.LINES)
    md = (tmp_path / "committee_floor.md").read_text()
    assert "committee B against committee A:" in md and f"| {run} | 0 |" in md
    # run again: nothing is trained or evaluated a second time
    bench.main(["--quick", "--out", str(tmp_path)])
    again = [
        json.loads(x)["step"] for x in (run / "committee_floor.jsonl").read_text().splitlines()
    ]
    assert [s for s in again if not s.startswith("invocation:")] == [
        s for s in steps if not s.startswith("invocation:")
    ]
    with pytest.raises(
        SystemExit, match="keep its offset"
    ):  # members of another offset are not mixed in
        bench.main(["--quick", "--offset", "7", "--out", str(tmp_path)])
