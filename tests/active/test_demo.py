"""``mlip-unc demo --quick`` end to end (tiny settings: checks the plumbing, not the numbers)."""

import json

from typer.testing import CliRunner

from mlip_unc.calculator import UncertaintyCalculator
from mlip_unc.cli import app


def test_demo_quick(tmp_path):
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Held-out hot test set" in result.output and str(out) in result.output
    for name in (
        "report.md",
        "demo.png",
        "model.pt",
        "numbers.json",
        "data/train_300K.xyz",
        "data/test_hot.xyz",
        "md_hot/md.csv",
        "md_hot/md.png",
    ):
        assert (out / name).is_file(), name
    numbers = json.loads((out / "numbers.json").read_text())
    assert set(numbers["checks"]) >= {
        "hot_uncertainty_above_training_level_before",
        "hot_force_error_lower_after",
    }
    calc = UncertaintyCalculator(out / "model.pt")
    assert calc.uncertainty_levels["max_force_std"] > 0
    report = (out / "report.md").read_text()
    assert (
        "| held-out test, 1200 K | first model |" in report
        and "| after active learning |" in report
    )
