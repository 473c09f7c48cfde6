"""benchmarks/force_uncertainty.py --no-committee: the single model's rows only, no committee
trained, timed or reported (the --quick Cu data)."""

import json

from benchmarks import force_uncertainty as bench


def test_no_committee_flag_parses():
    assert bench.parse_args(["--quick", "--out", "x", "--no-committee"]).no_committee is True
    assert bench.parse_args(["--quick", "--out", "x"]).no_committee is False


def test_quick_run_without_committee(tmp_path):
    argv = ["--quick", "--out", str(tmp_path), "--set", "train.epochs=3", "--timing-frames", "3"]
    results = bench.main([*argv, "--no-committee"])
    entry, meta = results["cu_emt"], results["meta"]
    assert "committee5" not in entry and {"force_magnitude", "exact"} <= set(entry)
    assert entry["default"] != "committee5"
    assert meta["train_minutes"]["cu_emt"].keys() == {"single"}
    assert "committee5" not in meta["cost_ms"]["cu_emt"]
    assert meta["committee_budget_minutes_per_member"] is None and meta["notes"]
    steps = [json.loads(x) for x in (tmp_path / "force_uncertainty.jsonl").read_text().splitlines()]
    assert not [s for s in steps if "committee" in s["step"]]
    assert steps[0]["step"] == "settings" and steps[0]["committee"] is False
    md = (tmp_path / "force_uncertainty.md").read_text()
    assert "--no-committee" in md and "| committee5 |" not in md
