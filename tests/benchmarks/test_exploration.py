"""The exploration suite: the per-round summary and the page from hand-made rows (fast), and
``python -m benchmarks.exploration --quick`` with its ``--report-only`` (slow tier)."""

from __future__ import annotations

import pytest

from benchmarks import exploration


def _row(bias: str, seed: int, rnd: int, mae: float, sigma: float | None = None) -> dict:
    return {
        "bias": bias,
        "seed": seed,
        "round": rnd,
        "oracle_calls": 16 + 4 * rnd,
        "force_mae_meV_A": mae,
        "mean_sigma_E_visited": sigma,
        "max_label_force_eV_A": None if sigma is None else 2.0,
    }


ROWS = [
    _row("none", 0, 0, 280.0),
    _row("none", 1, 0, 260.0),
    _row("none", 0, 1, 240.0, 0.5),
    _row("none", 1, 1, 250.0, 0.3),
]


def test_summary_is_mean_and_spread_over_seeds():
    first, second = exploration.summary(ROWS)
    assert (first["round"], first["n_seeds"], first["force_mae_meV_A_mean"]) == (0, 2, 270.0)
    assert first["force_mae_meV_A_std"] == pytest.approx(14.142, abs=1e-3)
    assert first["mean_sigma_E_visited_mean"] is None
    assert second["mean_sigma_E_visited_mean"] == pytest.approx(0.4)


def test_page_shows_the_table_first():
    result = {
        "command": "python -m benchmarks.exploration --threads 1",
        "description": "d.",
        "summary": exploration.summary(ROWS),
        "rows": ROWS,
        "seeds": [0, 1],
        "settings": {"rounds": 1},
        "seconds": 12.0,
        "torch": "2.x",
    }
    md = exploration.markdown(result)
    assert "| none | 0 | 16 | 270.0 ± 14.1 | – | – |" in md
    assert "| none | 1 | 20 | 245.0 ± 7.1 | 400.00 | 2.0 |" in md
    assert "- none, seed 1: 260.0, 250.0" in md
    assert md.index("| none | 0 |") < md.index("## Run") < md.index("- Command: `python -m")


@pytest.mark.slow
def test_quick_run_and_report_only(tmp_path):
    result = exploration.main(["--quick", "--out", str(tmp_path)])
    assert result["complete"] and {r["bias"] for r in result["rows"]} == set(exploration.BIASES)
    page = (tmp_path / "exploration.md").read_text()
    assert exploration.main(["--report-only", "--out", str(tmp_path)]) == result
    assert (tmp_path / "exploration.md").read_text() == page
