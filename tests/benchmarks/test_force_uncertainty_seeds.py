"""benchmarks/force_uncertainty_seeds.py: runs read from their JSON, means, gaps and targets met."""

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("force_uncertainty_seeds")


def _run(folder: Path, seed: int, default: dict, committee: dict) -> Path:
    folder.mkdir(parents=True)
    entry = {
        "default": "lowrank",
        "lowrank": default,
        "committee5": committee,
        "force_magnitude": {"auroc_ood": 0.83, "spearman_frame_in_domain": 0.1, "cost_ratio": 1.0},
    }
    meta = {
        "seed": seed,
        "overrides": [],
        "status": "complete",
        "paired_bootstrap": {
            "3bpa": {"spearman_frame_in_domain": {"gap": 0.1, "std": 0.05, "p_within_slack": 0.9}}
        },
    }
    (folder / "force_uncertainty.json").write_text(json.dumps({"3bpa": entry, "meta": meta}))
    return folder


def test_summary_of_two_runs(bench, tmp_path):
    base = {
        "spearman_frame_in_domain": 0.50,
        "partial_spearman_given_force": 0.45,
        "auroc_ood": 0.78,
        "std_over_rmse": 0.7,
        "cost_ratio": 1.9,
    }
    committee = {**base, "spearman_frame_in_domain": 0.40, "auroc_ood": 0.82, "cost_ratio": 5.0}
    a = _run(tmp_path / "a", 0, base, committee)  # AUROC 0.78 < 0.82 - 0.03: missed
    b = _run(
        tmp_path / "b",
        1,
        {**base, "spearman_frame_in_domain": 0.30, "auroc_ood": 0.80},
        {**committee, "spearman_frame_in_domain": 0.60},
    )  # Spearman 0.30 < 0.55: missed; AUROC met
    out = bench.main(
        ["--dataset", "3bpa", "--runs", str(a), str(b), "--out", str(tmp_path / "out")]
    )
    s = out["summary"]
    assert s["n_runs"] == 2
    assert s["stats"]["default"]["spearman_frame_in_domain"]["mean"] == pytest.approx(0.40)
    assert s["gaps"]["spearman_frame_in_domain"]["per_run"] == pytest.approx([0.10, -0.30])
    assert s["gaps"]["auroc_ood"]["mean"] == pytest.approx(-0.03)
    assert s["targets_met"] == {
        "spearman_frame_in_domain": 1,
        "partial_spearman_given_force": 2,
        "auroc_ood": 1,
        "std_over_rmse": 2,
        "cost_ratio": 2,
    }
    # the means: default 0.40 vs committee 0.50 - 0.05 -> missed by 0.05
    assert any(
        line.startswith("- spearman_frame_in_domain = 0.400") and line.endswith("missed by 0.05")
        for line in s["acceptance_of_means"]
    )
    md = (tmp_path / "out" / "force_uncertainty_seeds.md").read_text()
    assert "| 0 | lowrank | 0.500 / 0.400 |" in md and "runs meeting the target: 1 of 2" in md
    assert (tmp_path / "out" / "force_uncertainty_seeds.png").stat().st_size > 1000
    with pytest.raises(FileNotFoundError, match="no results"):
        bench.load_run(tmp_path / "missing", "3bpa")
    with pytest.raises(KeyError, match="no data set 'ethanol'"):
        bench.load_run(a, "ethanol")


def test_subspace_study_is_counted_per_run(bench, tmp_path):
    base = {
        "spearman_frame_in_domain": 0.50,
        "partial_spearman_given_force": 0.45,
        "auroc_ood": 0.80,
        "std_over_rmse": 0.7,
        "cost_ratio": 1.9,
    }
    committee = {**base, "auroc_ood": 0.82, "cost_ratio": 5.0}
    folders = [_run(tmp_path / name, seed, base, committee) for seed, name in enumerate("ab")]
    study = [  # run a: both choices meet the three lines; run b: "valid_variance" misses the OOD AUROC
        [
            {"subspace": "least_constrained", "rank": 4, **base},
            {"subspace": "valid_variance", "rank": 4, **base},
        ],
        [
            {"subspace": "least_constrained", "rank": 4, **base},
            {"subspace": "valid_variance", "rank": 4, **base, "auroc_ood": 0.70},
        ],
    ]
    for folder, rows in zip(folders, study, strict=False):
        (folder / "posterior_variants.json").write_text(
            json.dumps({"3bpa": {"subspaces": {"rows": rows}}})
        )
    out = bench.main(
        ["--dataset", "3bpa", "--runs", *map(str, folders), "--out", str(tmp_path / "out")]
    )
    sub = {(r["subspace"], r["rank"]): r for r in out["subspaces"]}
    assert sub[("least_constrained", 4)]["runs_meeting_all_three"] == 2
    assert sub[("valid_variance", 4)]["runs_meeting_all_three"] == 1
    assert sub[("valid_variance", 4)]["mean"]["auroc_ood"] == pytest.approx(0.75)
    md = (tmp_path / "out" / "force_uncertainty_seeds.md").read_text()
    assert "| valid_variance | 4 | 0.500, 0.500; 0.500 |" in md and "| 1 of 2 |" in md
