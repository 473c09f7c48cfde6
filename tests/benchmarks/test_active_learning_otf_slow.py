"""The on-the-fly active-learning benchmark end to end with the real xTB oracle (slow tier):
``--quick`` runs of ``ours`` and ``random`` with a reference model, two or more model updates
each; no broken frame labelled; fine-tuned energies never drift from the seed model's; the
final refit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.active_learning import onthefly as otf
from benchmarks.active_learning import reference_sets as rs
from benchmarks.common.records import read_jsonl

pytestmark = pytest.mark.slow
ROOT = Path(os.environ.get("MLIP_UNC_DATA", Path(__file__).resolve().parents[3] / "shared/data"))
needs_data = pytest.mark.skipif(
    not (ROOT / "structures" / "3BPA" / "train_300K.xyz").is_file(),
    reason="the 3BPA data set (MLIP_UNC_DATA) is not here",
)


@needs_data
def test_quick_on_the_fly_benchmark_with_xtb(tmp_path, monkeypatch):
    pytest.importorskip("tblite")
    monkeypatch.setenv("MLIP_UNC_DATA", str(ROOT))
    references = tmp_path / "references"
    rs.main(["--quick", "--out", str(references), "--data-root", str(ROOT)])
    results, work = tmp_path / "results", tmp_path / "work"
    otf.main(
        [
            "--quick",
            "--arms",
            "ours,reference,random",
            "--seeds",
            "1",
            "--work",
            str(work),
            "--results",
            str(results),
            "--reference-sets",
            str(references),
            "--reference-frames",
            "8",
        ]
    )
    runs = read_jsonl(results / otf.RUNS)
    assert {r["arm"] for r in runs} == {"ours", "random"}
    for run in runs:
        assert run["calls"] <= 11 and run["broken_labelled"] == 0
        assert run["updates"] >= 2, run["arm"]
        curve = run["curve"]
        # the free-atom offsets are fixed: fine-tuning never moves the energies by eV
        seed_model = work / f"{run['arm']}_s0" / "updates.jsonl"
        rows = read_jsonl(seed_model)
        tuned = [r for r in rows if not r.get("refit")]
        assert all(r["valid_energy_mae"] <= 2 * rows[0]["valid_energy_mae"] for r in tuned)
        # then the final refit from scratch (3 epochs here: its errors mean nothing), no call
        assert rows[-1]["refit"] and rows[-1]["calls"] == tuned[-1]["calls"] == run["calls"]
        assert run["errors_before_refit"] is not None
        assert len(curve) == run["updates"] + 1
    assert read_jsonl(results / otf.REFERENCE)[0]["frames"] == 8
    page = (results / "active_learning.md").read_text().splitlines()
    assert len(page) <= 150 and any(line.startswith("| ours |") for line in page)
    # the stability part: one short 600 K trajectory per final model and the reference
    otf.main(
        [
            "--quick",
            "--stability",
            "--stability-temperatures",
            "600",
            "--work",
            str(work),
            "--results",
            str(results),
        ]
    )
    rows = read_jsonl(results / "active_learning_otf_stability.jsonl")
    assert sorted(r["arm"] for r in rows) == ["ours", "random", "reference"]
    assert all(r["length_ps"] == 0.05 and 0 < r["survived_ps"] <= 0.05 for r in rows)
