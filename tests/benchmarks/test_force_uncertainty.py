"""benchmarks/force_uncertainty.py: the row assembly (fast) and the --quick run's JSON layout."""

import json
import math

import numpy as np
import pytest

from benchmarks import force_uncertainty as bench
from benchmarks.common import force_frames as ff
from mlip_unc.uncertainty.calibration import spearman_corr

ROW_KEYS = {
    "auroc_ood",
    "spearman_frame_in_domain",
    "spearman_frame_pooled",
    "auroc_sigma_over_force",
    "partial_spearman_given_force",
    "std_over_rmse",
    "cost_ratio",
    "force_mae_meV_A",
}


def _values(score, error, force, std_over_rmse=None, mae=10.0):
    return {
        "score": list(score),
        "error": list(error),
        "force": list(force),
        "std_over_rmse": std_over_rmse,
        "force_mae_meV_A": mae,
    }


def test_row_metrics_known_values():
    ind = _values([1, 2, 3, 4, 5], [2, 1, 4, 3, 5], [1, 2, 3, 5, 4], std_over_rmse=0.8)
    ood = _values([6, 7, 0.5], [9, 9, 9], [1, 1, 1])
    row = ff.row_metrics(ind, ood, 1.5)
    assert set(row) == ROW_KEYS
    assert row["spearman_frame_in_domain"] == pytest.approx(0.8)
    expected = (0.8 - 0.9 * 0.6) / math.sqrt((1 - 0.81) * (1 - 0.36))  # partial given force
    assert row["partial_spearman_given_force"] == pytest.approx(expected)
    assert row["auroc_ood"] == pytest.approx(10 / 15)  # OOD 6, 7 beat all 5; 0.5 beats none
    # score/force: in-domain 1, 1, 1, 0.8, 1.25; OOD 6, 7, 0.5 -> 2 x 5 + 1 x 0 (0.5 < all) of 15
    assert row["auroc_sigma_over_force"] == pytest.approx(10 / 15)
    assert (
        row["std_over_rmse"] == 0.8 and row["cost_ratio"] == 1.5 and row["force_mae_meV_A"] == 10.0
    )
    pooled = spearman_corr([1, 2, 3, 4, 5, 6, 7, 0.5], [2, 1, 4, 3, 5, 9, 9, 9], nan_policy="omit")
    assert row["spearman_frame_pooled"] == pytest.approx(pooled)


def test_row_metrics_without_ood_and_nan_to_null():
    ind = _values([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4])  # score = force: partial undefined
    row = ff.row_metrics(ind, None, None)
    assert row["auroc_ood"] is None and row["auroc_sigma_over_force"] is None
    assert row["partial_spearman_given_force"] is None  # NaN -> null in the JSON
    assert row["spearman_frame_pooled"] == row["spearman_frame_in_domain"] == pytest.approx(1.0)
    json.dumps(row, allow_nan=False)


def test_acceptance_lines():
    entry = {
        "default": "lowrank",
        "lowrank": {
            "spearman_frame_in_domain": 0.40,
            "partial_spearman_given_force": 0.35,
            "auroc_ood": 0.80,
            "std_over_rmse": 2.5,
            "cost_ratio": 1.6,
        },
        "committee5": {
            "spearman_frame_in_domain": 0.50,
            "partial_spearman_given_force": 0.30,
            "auroc_ood": 0.82,
            "std_over_rmse": 0.4,
            "cost_ratio": 5.0,
        },
    }
    lines = dict(line[2:].split(" = ", 1) for line in bench.acceptance(entry))
    assert lines["spearman_frame_in_domain"].endswith("missed by 0.05")  # 0.40 vs 0.50 - 0.05
    assert lines["partial_spearman_given_force"].endswith("met")  # 0.35 >= max(0.3, 0.25)
    assert lines["auroc_ood"].endswith("met")  # 0.80 >= 0.79
    assert lines["std_over_rmse"] == "2.500, target [0.500, 2.000]: missed by 0.5"
    assert lines["cost_ratio"].endswith("met")


def test_paired_gap_known_cases():
    rng = np.random.default_rng(0)
    error = rng.random(200)
    force = rng.random(200)
    good = _values(
        error + 0.05 * rng.random(200), error, force
    )  # ranks its errors almost perfectly
    noise = _values(rng.random(200), error, force)  # ranks nothing
    same = ff.paired_gap(good, good, resamples=50)
    for key in ("spearman_frame_in_domain", "partial_spearman_given_force"):
        assert (
            same[key]["gap"] == 0.0
            and same[key]["std"] == 0.0
            and same[key]["p_within_slack"] == 1.0
        )
    up, down = (
        ff.paired_gap(good, noise, resamples=200),
        ff.paired_gap(noise, good, resamples=200),
    )
    assert up["spearman_frame_in_domain"]["gap"] == pytest.approx(
        spearman_corr(good["score"], error, nan_policy="omit")
        - spearman_corr(noise["score"], error, nan_policy="omit")
    )
    assert (
        up["spearman_frame_in_domain"]["gap"] > 0.8
        and up["spearman_frame_in_domain"]["p_within_slack"] == 1.0
    )
    assert down["spearman_frame_in_domain"]["p_within_slack"] == 0.0
    assert 0.0 < up["spearman_frame_in_domain"]["std"] < 0.2
    lines = bench.gap_lines(up)
    assert (
        len(lines) == 4
        and "paired bootstrap" in lines[1]
        and lines[2].startswith("- spearman_frame_in_domain: gap +")
    )


def test_quick_run_layout_and_resume(tmp_path):
    argv = ["--quick", "--out", str(tmp_path), "--set", "train.epochs=3", "--timing-frames", "3"]
    results = bench.main(argv)
    on_disk = json.loads((tmp_path / "force_uncertainty.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    meta = on_disk["meta"]
    assert meta["status"] == "complete" and meta["seed"] == 0 and meta["quick"] is True
    assert meta["command"].startswith("python -m benchmarks.force_uncertainty --quick")
    entry = on_disk["cu_emt"]
    names = set(entry) - {"default"}
    assert {
        "committee5",
        "force_magnitude",
        "exact",
        "latent_distance",
        "descriptor_distance",
    } <= names
    assert entry["default"] in names
    for name in names:
        assert set(entry[name]) == ROW_KEYS, name
    assert entry["force_magnitude"]["std_over_rmse"] is None
    assert entry["force_magnitude"]["cost_ratio"] == 1.0
    assert entry["force_magnitude"]["auroc_sigma_over_force"] == pytest.approx(0.5)
    assert (
        entry["committee5"]["std_over_rmse"] is not None and entry["committee5"]["cost_ratio"] > 1.0
    )
    assert np.isfinite(entry["exact"]["auroc_ood"])
    for row in (
        "latent_distance",
        "descriptor_distance",
    ):  # distance to the training set: no sigma, not timed
        assert entry[row]["std_over_rmse"] is None and entry[row]["cost_ratio"] is None
        assert (
            np.isfinite(entry[row]["auroc_ood"])
            and entry[row]["force_mae_meV_A"] == entry["force_magnitude"]["force_mae_meV_A"]
        )
    records = [
        json.loads(line) for line in (tmp_path / "force_uncertainty.jsonl").read_text().splitlines()
    ]
    latent = next(r for r in records if r["step"] == "eval:cu_emt:latent_distance")
    assert np.all(np.asarray(latent["ood"]["score"]) > 0) and len(latent["in"]["score"]) == 6
    md = (tmp_path / "force_uncertainty.md").read_text()
    assert meta["command"] in md and "frame error = mean over atoms" in md
    assert (tmp_path / "force_uncertainty.png").stat().st_size > 0
    # resumable: a second run finds every step done and changes nothing but the dates
    steps = (tmp_path / "force_uncertainty.jsonl").read_text()
    again = bench.main(argv)
    assert (tmp_path / "force_uncertainty.jsonl").read_text() == steps
    assert {k: v for k, v in again.items() if k != "meta"} == {
        k: v for k, v in results.items() if k != "meta"
    }
    # --refit: the single model's posterior is fitted again, its mode rows evaluated again and the
    # costs timed again (a refit may change the modes); the committee's scores, the training steps
    # and the earlier records stay (the file only grows)
    with pytest.raises(SystemExit):  # only datasets of the command can be refitted
        bench.main([*argv, "--refit", "3bpa"])
    refit = bench.main([*argv, "--refit"])
    records = [
        json.loads(line) for line in (tmp_path / "force_uncertainty.jsonl").read_text().splitlines()
    ]
    assert (tmp_path / "force_uncertainty.jsonl").read_text().startswith(steps)
    new = [r["step"] for r in records[len(steps.splitlines()) :]]
    assert (
        new[:2] == ["invocation:1", "refit:cu_emt"] and "eval:cu_emt:exact" in new
    )  # the new command kept
    assert (
        not any(step.startswith(("train:", "eval:cu_emt:committee5")) for step in new)
        and new[-1] == "cost:cu_emt"
    )
    assert refit["meta"]["refitted"]["cu_emt"] == records[len(steps.splitlines()) + 1]["time"]
    assert refit["meta"]["commands"] == [meta["command"], meta["command"] + " --refit"]
    md = (tmp_path / "force_uncertainty.md").read_text()
    first, last = refit["meta"]["commands"][0], refit["meta"]["commands"][-1]
    assert "(`--refit`)" in md and f"- Commands: 2, first `{first}`, last `{last}`" in md
    assert {k: v for k, v in refit["cu_emt"]["committee5"].items() if k != "cost_ratio"} == {
        k: v for k, v in results["cu_emt"]["committee5"].items() if k != "cost_ratio"
    }
    assert bench.main(argv)["cu_emt"] == refit["cu_emt"]  # without --refit: nothing evaluated again
