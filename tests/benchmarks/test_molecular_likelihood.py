"""The default-likelihood comparison of the molecular benchmark, on hand-made rows."""

from __future__ import annotations

from benchmark_scripts import load_benchmark

ml = load_benchmark("molecular_likelihood")


def _row(dataset, method, nll, miscal, rho, rmse, n=3):
    cell = lambda v: {"mean": v}  # noqa: E731
    return {
        "dataset": dataset,
        "split": "random",
        "method": method,
        "n": n,
        "raw": {"rmse": cell(rmse), "spearman": cell(rho)},
        "recal": {"nll": cell(nll), "miscalibration_area": cell(miscal)},
    }


def test_compare_counts_each_criterion_in_its_own_direction():
    rows = [
        _row("a", "bgnn", 1.0, 0.05, 0.1, 0.5),
        _row("a", "bgnn_hetero", 0.9, 0.06, 0.3, 0.6),
        _row("b", "bgnn", 2.0, 0.05, 0.2, 1.0),
        _row("b", "bgnn_hetero", 2.0, 0.04, 0.1, 0.9),
        _row("c", "bgnn", 1.0, 0.05, 0.1, 0.5),  # no hetero run: not compared
        _row("a", "mve", 0.1, 0.01, 0.9, 0.1),  # other methods ignored
    ]
    out = ml.compare(rows)
    assert [c["dataset"] for c in out["cells"]] == ["a", "b"]
    wins = out["wins"]
    assert wins["nll"] == {"bgnn": 0, "bgnn_hetero": 1, "of": 2}  # b: a tie counts for neither
    assert wins["miscalibration_area"] == {"bgnn": 1, "bgnn_hetero": 1, "of": 2}
    assert wins["spearman"] == {"bgnn": 1, "bgnn_hetero": 1, "of": 2}  # higher is better
    assert wins["rmse"] == {"bgnn": 1, "bgnn_hetero": 1, "of": 2}
    text = "\n".join(ml.render(out, "bgnn_hetero"))
    assert "| a | random | 3 / 3 | 1.000 / **0.900** |" in text and "**bgnn_hetero** row" in text
    assert ml.render(ml.compare(rows[-2:]), "bgnn")[0].startswith("No (dataset, split)")
