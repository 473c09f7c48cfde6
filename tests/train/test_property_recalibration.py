"""Recalibration by default: `property train` fits one std factor on validation and stores it;
`property predict` applies it (``--no-recalibrate``: raw); old checkpoints without one still load."""

import csv
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mlip_unc.cli import app
from mlip_unc.config import PropertyConfig
from mlip_unc.data.molecules import TOY_SMILES
from mlip_unc.models.checkpoint import load_checkpoint, save_checkpoint
from mlip_unc.models.factory import PropertyPredictor
from mlip_unc.uncertainty.calibration import nll
from mlip_unc.uncertainty.recalibration import ZScaling

SMILES = list(TOY_SMILES)
SMALL = [
    "--set",
    "model.hidden=16",
    "--set",
    "model.layers=2",
    "--set",
    "model.latent_dim=8",
    "--set",
    "batch_size=8",
    "--no-progress",
    "--epochs",
    "3",
]
runner = CliRunner()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One default `property train` run (no --calibration flag) on a tiny CSV: 120 rows, so
    the 10 % validation split reaches the minimum the recalibration is fitted on."""
    tmp = tmp_path_factory.mktemp("recal")
    data = tmp / "tiny.csv"
    with data.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["smiles", "y"])
        for k, smi in enumerate(SMILES * 3):
            writer.writerow([smi, f"{0.3 * len(smi) - (k % 3) * 0.2:.3f}"])
    out = tmp / "run"
    result = runner.invoke(
        app,
        [
            "property",
            "train",
            "--data",
            str(data),
            "--target-column",
            "y",
            "--seed",
            "2",
            "--out",
            str(out),
            *SMALL,
        ],
    )
    assert result.exit_code == 0, result.output
    return data, out, result.output


def _predict(model, data, out, *flags):
    result = runner.invoke(
        app,
        [
            "property",
            "predict",
            "--model",
            str(model),
            "--data",
            str(data),
            "--out",
            str(out),
            *flags,
        ],
    )
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    cols = {
        k: np.array([float(r[k]) for r in rows])
        for k in ("mean", "std", "epistemic_std", "aleatoric_std")
    }
    return cols, result.output


def test_default_config_recalibrates_with_zscaling():
    assert PropertyConfig().train.calibration.value == "zscaling"


def test_train_stores_the_factor_and_reports_raw_and_recalibrated(trained):
    _, out, output = trained
    raw = torch.load(
        out / "model.pt", weights_only=True
    )  # the round trip of a weights-only checkpoint
    assert raw["config"]["train"]["calibration"] == "zscaling"
    (state,) = raw["calibration"]
    assert state["kind"] == "zscaling" and np.isfinite(state["scale"]) and state["scale"] > 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recalibration"] == {
        "kind": "zscaling",
        "scale": [state["scale"]],
        "fitted_on": "val",
    }
    # validation NLL: recalibrated <= raw (the factor is the NLL minimiser; factor 1 is the raw model)
    assert metrics["val"]["nll"] <= metrics["val_uncalibrated"]["nll"] + 1e-9
    # a std factor leaves the accuracy and the ranking as they were
    for key in ("rmse", "mae", "spearman"):
        assert metrics[key] == pytest.approx(metrics["uncalibrated"][key], rel=1e-9, abs=1e-12), key
    assert metrics["sharpness"] == pytest.approx(
        state["scale"] * metrics["uncalibrated"]["sharpness"], rel=1e-9
    )
    assert "raw" in output and "recalibrated" in output and "std factor" in output
    loaded = PropertyPredictor.load(out)
    assert loaded.calibrators[0].scale == state["scale"]


def test_factor_is_the_validation_nll_minimiser(trained):
    """The stored factor is ZScaling's fit on the raw validation predictions, and no factor on a grid does better."""
    data, out, _ = trained
    payload = torch.load(out / "model.pt", weights_only=True)
    val_rows = payload["metadata"]["split"]["val"]
    predictor = PropertyPredictor.load(out)
    predictor.calibrators = None
    from mlip_unc.data.molecules import load_csv

    graphs = {int(g.row_id): g for g in load_csv(data, "smiles", "y")}
    val = [graphs[r] for r in val_rows]
    pred = predictor.predict(val)
    y = np.array([float(g.y[0, 0]) for g in val])
    scale = payload["calibration"][0]["scale"]
    assert ZScaling().fit(pred["mean"][:, 0], pred["std"][:, 0], y).scale == pytest.approx(
        scale, rel=1e-6
    )
    best = nll(pred["mean"][:, 0], scale * pred["std"][:, 0], y)
    for c in np.geomspace(0.05, 20.0, 61):
        assert best <= nll(pred["mean"][:, 0], c * pred["std"][:, 0], y) + 1e-9


def test_predict_with_and_without_the_flag_differ_by_the_stored_factor(trained, tmp_path):
    data, out, _ = trained
    scale = torch.load(out / "model.pt", weights_only=True)["calibration"][0]["scale"]
    recal, said = _predict(out, data, tmp_path / "recal.csv")
    raw, said_raw = _predict(out, data, tmp_path / "raw.csv", "--no-recalibrate")
    assert "recalibrated" in said and "--no-recalibrate" in said_raw
    np.testing.assert_array_equal(recal["mean"], raw["mean"])
    for key in (
        "std",
        "epistemic_std",
        "aleatoric_std",
    ):  # the CSV keeps 6 significant digits (each side)
        np.testing.assert_allclose(recal[key], scale * raw[key], rtol=1.1e-5)
    # in memory (no CSV rounding) the two differ by exactly the factor
    from mlip_unc.data.molecules import load_csv

    graphs = load_csv(data, "smiles", "y")
    predictor = PropertyPredictor.load(out)
    with_factor = predictor.predict(graphs)
    predictor.calibrators = None
    without = predictor.predict(graphs)
    np.testing.assert_array_equal(with_factor["mean"], without["mean"])
    for key in ("std", "epistemic_std", "aleatoric_std"):
        np.testing.assert_allclose(with_factor[key], scale * without[key], rtol=1e-13)


@pytest.mark.parametrize("old_style", ["calibration_none", "no_calibration_key"])
def test_checkpoint_without_recalibrator_still_loads(trained, tmp_path, old_style):
    """A model saved before recalibration was the default (config calibration none, payload None or absent)."""
    data, out, _ = trained
    payload = load_checkpoint(out / "model.pt")
    for key in ("format", "version", "digest", "sha256"):
        payload.pop(key, None)
    payload["config"]["train"]["calibration"] = "none"
    if old_style == "calibration_none":
        payload["calibration"] = None
    else:
        payload.pop("calibration")
    old = tmp_path / "old" / "model.pt"
    old.parent.mkdir()
    save_checkpoint(old, payload)
    assert torch.load(old, weights_only=True)["config"]["train"]["calibration"] == "none"
    plain, said = _predict(old, data, tmp_path / "old.csv")
    assert "not recalibrated" in said
    raw, _ = _predict(out, data, tmp_path / "raw.csv", "--no-recalibrate")
    np.testing.assert_array_equal(plain["std"], raw["std"])
    flagged, said_flag = _predict(old, data, tmp_path / "old2.csv", "--no-recalibrate")
    assert "not recalibrated" in said_flag
    np.testing.assert_array_equal(flagged["std"], plain["std"])
