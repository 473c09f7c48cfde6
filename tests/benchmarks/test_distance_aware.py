"""benchmarks/distance_aware.py: a latent-distance term added to the lowrank force variance."""

import json

import numpy as np
import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("distance_aware")


def test_scale_fit_finds_a_distance_term_and_refuses_a_useless_one(bench):
    rng = np.random.default_rng(0)
    n = 4000
    var, noise = np.full((n, 3), 0.01), np.full((n, 3), 0.001)
    d2 = rng.uniform(0.0, 4.0, n)
    err = rng.normal(size=(n, 3)) * np.sqrt(var + noise + 0.02 * d2[:, None])  # drawn with c = 0.02
    fit = bench.fit_scale(err, var, noise, d2)
    assert fit["c"] == pytest.approx(0.02, rel=0.35) and fit["valid_nll"] < fit["valid_nll_c0"]
    plain = rng.normal(size=(n, 3)) * np.sqrt(var + noise)  # no distance dependence at all
    fit = bench.fit_scale(plain, var, noise, d2)
    assert fit["c"] * d2.max() <= 0.05 * 0.011  # the term adds at most 5 % of the variance anywhere
    assert fit["valid_nll"] <= fit["valid_nll_c0"]


def test_quick_run_recomputes_the_default_row_and_resumes(bench, tmp_path):
    summary = bench.main(["--quick", "--out", str(tmp_path)])
    run = tmp_path / "run"
    (r,) = summary["runs"]
    entry = json.loads((run / "force_uncertainty.json").read_text())["cu_emt"]
    for key in bench.cf.LINES:  # the lowrank row here is the run's default row, on the same frames
        assert r["rows"]["lowrank"][key] == pytest.approx(entry[entry["default"]][key])
    assert r["fit"]["c"] >= 0.0 and set(r["cost_ms"]) == {"plain", "lowrank", "distance_aware"}
    assert r["rows"]["distance_aware"]["cost_ratio"] == pytest.approx(
        r["cost_ms"]["distance_aware"] / r["cost_ms"]["plain"]
    )
    for key, lines in r["lines"].items():
        assert lines["all"] == all(lines[k]["met"] for k in bench.cf.LINES), key
    steps = [json.loads(x)["step"] for x in (run / "distance_aware.jsonl").read_text().splitlines()]
    bench.main(["--quick", "--out", str(tmp_path)])
    again = [json.loads(x)["step"] for x in (run / "distance_aware.jsonl").read_text().splitlines()]
    assert [s for s in again if not s.startswith("invocation:")] == [
        s for s in steps if not s.startswith("invocation:")
    ]
    assert "| distance_aware |" in (tmp_path / "distance_aware.md").read_text()
