"""benchmarks/molecular.py: metric and aggregation helpers, the acceptance lines, and a --quick run
(generated SMILES) with its JSON/markdown layout and its resume."""

import json
import math

import numpy as np
import pytest

from benchmarks import molecular as bench
from benchmarks.common.tables import read_csv


# ---------------------------------------------------------------- helpers
def test_mean_std_uses_ddof_one_and_drops_non_finite():
    assert bench.mean_std([1.0, 2.0, 3.0]) == {"mean": 2.0, "std": 1.0, "n": 3}
    assert bench.mean_std([4.0]) == {"mean": 4.0, "std": 0.0, "n": 1}
    assert bench.mean_std([1.0, float("nan"), None, 3.0]) == {
        "mean": 2.0,
        "std": math.sqrt(2.0),
        "n": 2,
    }
    empty = bench.mean_std([])
    assert empty["n"] == 0 and math.isnan(empty["mean"])


def test_mixture_moments_match_samples():
    """Monte Carlo: the equal-weight Gaussian mixture's mean and std (chemprop's MVE ensemble)."""
    rng = np.random.default_rng(0)
    means, variances = rng.normal(size=(5, 3)), rng.uniform(0.1, 2.0, size=(5, 3))
    mean, std = bench.mixture(means, variances)
    member = rng.integers(0, 5, size=400_000)
    draws = means[member] + np.sqrt(variances[member]) * rng.normal(size=(400_000, 3))
    np.testing.assert_allclose(mean, draws.mean(0), atol=0.01)
    np.testing.assert_allclose(std, draws.std(0), rtol=0.01)


def _gauss(n, shrink, seed):
    rng = np.random.default_rng(seed)
    mean, true_std = rng.normal(size=n), rng.uniform(0.5, 2.0, size=n)
    return {"mean": mean, "std": shrink * true_std, "y": mean + true_std * rng.normal(size=n)}


def test_evaluate_recalibrates_on_validation_only():
    val, test = _gauss(4000, 0.5, 1), _gauss(3000, 0.5, 2)
    out = bench.evaluate(val, test)
    assert out["recal_scale"] == pytest.approx(2.0, rel=0.05)
    assert out["val_nll_recal"] <= out["val_nll_raw"]
    assert out["recal"]["nll"] < out["raw"]["nll"] and out["recal"]["miscalibration_area"] < 0.02
    assert out["recal"]["coverage_95"] == pytest.approx(0.95, abs=0.02)
    for key in ("rmse", "mae", "spearman"):
        assert out["recal"][key] == out["raw"][key] == out["recal_isotonic"][key]
    # fitted on val: a different test set does not move the factor
    assert bench.evaluate(val, _gauss(100, 3.0, 5))["recal_scale"] == out["recal_scale"]


def _record(dataset, split, method, seed, rmse, nll, area):
    metrics = {k: 0.5 for k in ("mae", "spearman", "ence", "coverage_95", "crps", "sharpness")}
    raw = {**metrics, "rmse": rmse, "nll": nll + 0.5, "miscalibration_area": area + 0.1}
    recal = {**metrics, "rmse": rmse, "nll": nll, "miscalibration_area": area}
    return {
        "dataset": dataset,
        "split": split,
        "method": method,
        "seed": seed,
        "raw": raw,
        "recal": recal,
        "recal_isotonic": recal,
        "struct_cal_tanimoto": 0.2,
        "struct_cal_knn": None,
        "train_seconds": 1.0,
        "epochs_run": 3,
        "recal_scale": 1.5,
    }


def test_aggregate_keeps_repeats_and_orders_methods():
    recs = [
        _record("esol", "random", "chemprop_mve", 0, 1.0, 1.0, 0.1),
        _record("esol", "random", "bgnn", 0, 0.6, 1.0, 0.1),
        _record("esol", "random", "bgnn", 0, 0.8, 1.0, 0.1),  # a repeat of the same key: kept
        _record("esol", "random", "bgnn", 1, 1.0, 1.0, 0.1),
    ]
    rows = bench.aggregate(recs)
    assert [r["method"] for r in rows] == ["bgnn", "chemprop_mve"]
    bgnn = rows[0]
    assert bgnn["n"] == 3 and bgnn["seeds"] == [0, 0, 1]
    assert bgnn["raw"]["rmse"] == {"mean": pytest.approx(0.8), "std": pytest.approx(0.2), "n": 3}
    assert bgnn["struct_cal_knn"]["n"] == 0 and bgnn["struct_cal_tanimoto"][
        "mean"
    ] == pytest.approx(0.2)


def test_acceptance_counts_datasets_and_rmse_tolerance():
    recs, ours = [], bench.DEFAULT_METHOD
    for seed in (0, 1):
        # esol: ours better everywhere; freesolv: better calibration but RMSE clearly worse;
        # lipo: RMSE a little worse but within the standard error of the difference; bace: worse NLL
        recs += [
            _record("esol", "random", ours, seed, 0.6, 0.5, 0.02),
            _record("esol", "random", "chemprop_mve", seed, 0.7, 1.0, 0.05),
            _record("freesolv", "random", ours, seed, 2.0, 0.5, 0.02),
            _record("freesolv", "random", "chemprop_mve", seed, 1.0, 1.0, 0.05),
            _record("lipo", "random", ours, seed, 0.68 + 0.1 * seed, 0.5, 0.02),  # mean 0.73
            _record("lipo", "random", "chemprop_mve", seed, 0.70, 1.0, 0.05),
            _record("bace", "random", ours, seed, 0.6, 2.0, 0.02),
            _record("bace", "random", "chemprop_mve", seed, 0.7, 1.0, 0.05),
        ]
    acc = bench.acceptance(bench.aggregate(recs), ref_variant="raw")
    per = acc["per_dataset"]
    assert per["esol"]["beats"] and not per["freesolv"]["beats"] and not per["bace"]["beats"]
    assert per["lipo"]["beats"] and per["lipo"]["rmse_tolerance"] == pytest.approx(0.05, rel=1e-6)
    assert not per["freesolv"]["rmse_equal_or_better"] and per["bace"]["nll"][
        "diff"
    ] == pytest.approx(2.0 - 1.5)
    assert not per["qm7"]["measured"] and not per["cep"]["measured"]
    assert (acc["wins"], acc["measured"], acc["verdict"]) == (2, 4, "undetermined")
    # against chemprop recalibrated the same way the NLL gap shrinks by the 0.5 of the synthetic raw records
    assert (
        bench.acceptance(bench.aggregate(recs), ref_variant="recal")["per_dataset"]["esol"]["nll"][
            "diff"
        ]
        == -0.5
    )
    (head, rule, row) = bench.render_acceptance_table([acc])
    assert head.startswith("| split | ours | reference |") and rule.startswith("|---|")
    assert "| 2 of 4 (esol, lipo) |" in row and row.endswith("| **undetermined** |")


# ---------------------------------------------------------------- the --quick run
def test_quick_run_layout_and_resume(tmp_path, capsys):
    args = ["--quick", "--methods", "bgnn", "laplace", "--seeds", "0", "1", "--out", str(tmp_path)]
    summary = bench.main(args)
    jsonl = tmp_path / "molecular.jsonl"
    lines = jsonl.read_text().splitlines()
    assert len(lines) == 2 * 2 * 2  # splits x methods x seeds
    rec = json.loads(lines[0])
    for key in (
        "dataset",
        "split",
        "method",
        "seed",
        "raw",
        "recal",
        "recal_isotonic",
        "recal_scale",
        "recal_scale_stored",
        "struct_cal_tanimoto",
        "struct_cal_knn",
        "train_seconds",
        "settings",
        "command",
        "n_train",
        "n_val",
        "n_test",
        "points",
    ):
        assert key in rec, key
    assert rec["recal_scale"] == pytest.approx(
        rec["recal_scale_stored"], rel=1e-6
    )  # the one `train` stores
    assert rec["n_val"] > 0 and rec["n_test"] > 0 and rec["settings"]["quick"] is True
    assert set(rec["raw"]) >= {
        "rmse",
        "mae",
        "nll",
        "spearman",
        "miscalibration_area",
        "ence",
        "coverage_95",
    }

    data = json.loads((tmp_path / "molecular.json").read_text())
    assert data == json.loads(json.dumps(summary)) or data["n_runs"] == summary["n_runs"]
    assert data["n_runs"] == 8 and data["partial"] is False and data["missing"] == []
    assert {(r["split"], r["method"], r["n"]) for r in data["rows"]} == {
        (sp, m, 2) for sp in ("random", "scaffold") for m in ("bgnn", "laplace")
    }
    row = data["rows"][0]
    assert set(row["raw"]["rmse"]) == {"mean", "std", "n"} and row["raw"]["rmse"]["n"] == 2
    assert (
        len(data["acceptance"]) == 4
        and data["acceptance"][0]["per_dataset"]["tiny"]["measured"] is False
    )
    md = (tmp_path / "molecular.md").read_text()
    assert md.index("## Acceptance") < md.index("## Run") and "Partial" not in md
    assert "| tiny | random |" in md  # the overview tables: one row per (dataset, split)
    tables = (tmp_path / "molecular_tables.md").read_text()
    assert tables.splitlines()[2].startswith("| dataset | split |")  # the table first
    assert [line.split(" | ")[:2] for line in tables.splitlines()[4:6]] == [
        ["| tiny", "random"],
        ["| tiny", "scaffold"],
    ]
    every = read_csv(tmp_path / "molecular_tables.csv")  # every metric: beside the page
    assert {(r["split"], r["method"], r["n"]) for r in every} == {
        (sp, f"{m} ({v})", "2")
        for sp in ("random", "scaffold")
        for m in ("bgnn", "laplace")
        for v in ("raw", "recal.")
    }
    rmse = row["raw"]["rmse"]
    first = every[0]
    assert first["RMSE"] == f"{rmse['mean']:.3f} ± {rmse['std']:.3f}"
    assert (tmp_path / "molecular_calibration_tiny_random.png").stat().st_size > 0

    # resume: nothing is redone; a wider plan adds only the new runs
    capsys.readouterr()
    bench.main(args)
    assert "0 run(s) to do" in capsys.readouterr().out
    assert jsonl.read_text().splitlines() == lines
    bench.main(
        [
            "--quick",
            "--methods",
            "bgnn",
            "laplace",
            "mve",
            "--seeds",
            "0",
            "--splits",
            "random",
            "--out",
            str(tmp_path),
        ]
    )
    new = jsonl.read_text().splitlines()
    assert new[:8] == lines and [json.loads(x)["method"] for x in new[8:]] == ["mve"]

    # a plan larger than what is recorded: the report says partial and what is missing
    bench.main(
        [
            "--quick",
            "--methods",
            "bgnn",
            "agl",
            "--seeds",
            "0",
            "--report-only",
            "--out",
            str(tmp_path),
        ]
    )
    summary = json.loads((tmp_path / "molecular.json").read_text())
    assert summary["partial"] is True
    assert sorted(map(tuple, summary["missing"])) == [
        ("tiny", "random", "agl", 0),
        ("tiny", "scaffold", "agl", 0),
    ]
    md = (tmp_path / "molecular.md").read_text().splitlines()
    listed = next(line for line in md if line.startswith("  - tiny agl: "))  # on the page too
    assert set(listed.split(": ", 1)[1].split(", ")) == {"random/0", "scaffold/0"}
    # other settings cannot be mixed into the same records
    with pytest.raises(SystemExit, match="other settings"):
        bench.main(["--quick", "--methods", "bgnn", "--knn-k", "3", "--out", str(tmp_path)])


def test_merge_appends_only_missing_runs_with_the_same_settings(tmp_path):
    """A second process on other datasets writes its own --out; --merge brings its runs in once."""
    a, b = tmp_path / "a", tmp_path / "b"
    bench.main(
        ["--quick", "--methods", "bgnn", "--seeds", "0", "--splits", "random", "--out", str(a)]
    )
    bench.main(
        [
            "--quick",
            "--methods",
            "bgnn",
            "mve",
            "--seeds",
            "0",
            "--splits",
            "random",
            "--out",
            str(b),
        ]
    )
    before = (a / "molecular.jsonl").read_text().splitlines()
    summary = bench.main(
        [
            "--quick",
            "--methods",
            "bgnn",
            "mve",
            "--seeds",
            "0",
            "--splits",
            "random",
            "--out",
            str(a),
            "--merge",
            str(b / "molecular.jsonl"),
        ]
    )
    after = (a / "molecular.jsonl").read_text().splitlines()
    assert after[:1] == before and [json.loads(x)["method"] for x in after[1:]] == [
        "mve"
    ]  # bgnn was already there
    assert summary["n_runs"] == 2 and not (a / ".molecular.lock").exists()
    bench.main(
        ["--quick", "--out", str(a), "--merge", str(b / "molecular.jsonl")]
    )  # twice: nothing new
    assert (a / "molecular.jsonl").read_text().splitlines() == after
    c = tmp_path / "c"
    bench.main(
        [
            "--quick",
            "--methods",
            "bgnn",
            "--seeds",
            "0",
            "--splits",
            "random",
            "--knn-k",
            "3",
            "--out",
            str(c),
        ]
    )
    with pytest.raises(SystemExit, match="other settings"):
        bench.main(["--quick", "--out", str(a), "--merge", str(c / "molecular.jsonl")])


def test_repeated_splits_names_datasets_whose_scaffold_test_set_is_the_random_one():
    """CEP's scaffold split is its random one (every molecule its own scaffold): the report must say so."""

    def rec(d: str, sp: str, seed: int, y: list[float]) -> dict:
        return {"dataset": d, "split": sp, "method": "bgnn", "seed": seed, "points": {"y": y}}

    records = [
        rec("cep", "random", 0, [1.0, 2.0]),
        rec("cep", "scaffold", 0, [1.0, 2.0]),
        rec("esol", "random", 0, [1.0, 2.0]),
        rec("esol", "scaffold", 0, [2.0, 1.0]),
        rec("qm7", "scaffold", 0, [1.0]),
        {"dataset": "bace", "split": "scaffold", "method": "bgnn", "seed": 0},
    ]
    assert bench.repeated_splits(records) == ["cep"]
