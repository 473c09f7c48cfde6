"""``mlip-unc property train|predict`` end to end on a tiny CSV (typer's CliRunner)."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mlip_unc.cli import app
from mlip_unc.data.molecules import TOY_SMILES

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
]
runner = CliRunner()


@pytest.fixture()
def tiny_csv(tmp_path):
    path = tmp_path / "tiny.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["name", "mol", "logS"])
        for k, smi in enumerate(SMILES):
            writer.writerow([f"m{k}", smi, f"{0.3 * len(smi) - (k % 3) * 0.2:.3f}"])
    return path


def _train(csv_path, out, *extra):
    args = [
        "property",
        "train",
        "--data",
        str(csv_path),
        "--smiles-column",
        "mol",
        "--target-column",
        "logS",
        "--out",
        str(out),
        "--epochs",
        "3",
        *SMALL,
        *extra,
    ]
    return runner.invoke(app, args)


def test_train_then_predict(tiny_csv, tmp_path):
    out = tmp_path / "run"
    result = _train(tiny_csv, out, "--method", "bgnn", "--seed", "1", "--calibration", "zscaling")
    assert result.exit_code == 0, result.output
    assert "miscalibration_area" in result.output and "rmse" in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    for key in (
        "rmse",
        "mae",
        "nll",
        "spearman",
        "miscalibration_area",
        "ence",
        "coverage_95",
        "crps",
        "sharpness",
        "mean_std",
        "mean_epistemic_std",
        "train_seconds",
        "command",
        "seed",
    ):
        assert key in metrics, key
    assert metrics["seed"] == 1 and metrics["n_test"] == 4 and metrics["n_val"] == 4
    assert (out / "history.json").is_file()
    raw = torch.load(out / "model.pt", weights_only=True)
    # 4 validation molecules are too few to fit the factor on: the raw stds are kept, said so
    assert raw["calibration"] is None and "uncalibrated" not in metrics
    assert "4 validation molecules" in raw["metadata"]["recalibration_warning"]
    assert metrics["recalibration"]["kind"] == "none" and raw["metadata"]["smiles_column"] == "mol"
    # the targets are standardised by the training rows' mean and population std
    logs = [float(r["logS"]) for r in csv.DictReader(tiny_csv.open())]
    y_train = np.array([logs[i] for i in raw["metadata"]["split"]["train"]])
    assert len(y_train) == len(SMILES) - 8 and np.std(y_train) > 0.1
    assert raw["normalization"]["mean"][0] == pytest.approx(np.mean(y_train), rel=1e-6)
    assert raw["normalization"]["std"][0] == pytest.approx(np.std(y_train), rel=1e-6)

    preds = tmp_path / "preds.csv"
    result = runner.invoke(
        app,
        ["property", "predict", "--model", str(out), "--data", str(tiny_csv), "--out", str(preds)],
    )
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(preds.open()))
    assert len(rows) == len(SMILES)
    assert list(rows[0]) == [
        "smiles",
        "mean",
        "std",
        "epistemic_std",
        "aleatoric_std",
        "unseen_elements",
    ]
    assert [r["smiles"] for r in rows] == SMILES
    for row in rows:
        std, epi, alea = float(row["std"]), float(row["epistemic_std"]), float(row["aleatoric_std"])
        assert std > 0 and epi > 0 and alea > 0
        assert std**2 == pytest.approx(epi**2 + alea**2, rel=1e-3)

    # the test metrics of `train` are those of `predict`'s numbers on the recorded test rows
    test_rows = raw["metadata"]["split"]["test"]
    assert len(test_rows) == 4 and set(test_rows).isdisjoint(raw["metadata"]["split"]["train"])
    targets = {r["mol"]: float(r["logS"]) for r in csv.DictReader(tiny_csv.open())}
    y = np.array([targets[rows[i]["smiles"]] for i in test_rows])
    mean = np.array([float(rows[i]["mean"]) for i in test_rows])
    std = np.array([float(rows[i]["std"]) for i in test_rows])
    err = mean - y
    expected = {
        "rmse": np.sqrt(np.mean(err**2)),
        "mae": np.mean(np.abs(err)),
        "nll": np.mean(0.5 * np.log(2 * np.pi * std**2) + err**2 / (2 * std**2)),
        "coverage_95": np.mean(np.abs(err) <= 1.959964 * std),
        "sharpness": np.sqrt(np.mean(std**2)),
        "mean_std": np.mean(std),
    }
    for key, value in expected.items():  # the CSV keeps 6 significant digits
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_split_file_train_fraction_and_resume(tiny_csv, tmp_path):
    split = tmp_path / "split.json"
    split.write_text(
        json.dumps(
            {"train": list(range(30)), "val": list(range(30, 35)), "test": list(range(35, 40))}
        )
    )
    out = tmp_path / "run"
    args = ("--split-file", str(split), "--method", "mve", "--train-fraction", "0.5")
    first = _train(tiny_csv, out, *args, "--stop-after", "1")
    assert first.exit_code == 0, first.output
    assert "--resume" in first.output and not (out / "metrics.json").exists()
    second = _train(tiny_csv, out, *args, "--resume")
    assert second.exit_code == 0, second.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_train"] == 15 and metrics["n_test"] == 5 and metrics["epochs_run"] == 3
    assert len(json.loads((out / "history.json").read_text())["epochs"]) == 3


def test_damaged_model_gives_a_clear_error(tiny_csv, tmp_path):
    out = tmp_path / "run"
    assert _train(tiny_csv, out, "--method", "mve", "--epochs", "1").exit_code == 0
    model = out / "model.pt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 3])
    result = runner.invoke(
        app,
        [
            "property",
            "predict",
            "--model",
            str(out),
            "--data",
            str(tiny_csv),
            "--out",
            str(tmp_path / "p.csv"),
        ],
    )
    assert result.exit_code != 0
    assert "truncated or corrupted" in result.output
    assert "Traceback" not in result.output and "pickle" not in result.output.lower().split("(")[0]


def test_bad_inputs_exit_non_zero(tiny_csv, tmp_path):
    result = _train(tiny_csv, tmp_path / "x", "--target-column", "nope")
    assert result.exit_code != 0 and "no column" in result.output
    result = runner.invoke(
        app,
        [
            "property",
            "predict",
            "--model",
            str(tmp_path / "missing"),
            "--data",
            str(tiny_csv),
            "--out",
            str(tmp_path / "p.csv"),
        ],
    )
    assert result.exit_code != 0 and "does not exist" in result.output


@pytest.mark.data
def test_known_dataset_with_shared_split(tmp_path):
    root = Path(__file__).resolve().parents[3] / "shared" / "data"
    if not (root / "moleculenet" / "esol").is_dir():
        pytest.skip("shared data not present")
    out = tmp_path / "esol"
    result = runner.invoke(
        app,
        [
            "property",
            "train",
            "--dataset",
            "esol",
            "--data-root",
            str(root),
            "--split-file",
            str(root / "splits" / "esol.json"),
            "--epochs",
            "1",
            "--out",
            str(out),
            *SMALL,
        ],
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_train"] == 902 and metrics["n_test"] == 113


def test_header_only_csv_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("mol,logS\n")
    result = _train(path, tmp_path / "run")
    assert result.exit_code == 1 and "no valid data rows" in result.output
    result = runner.invoke(
        app,
        [
            "property",
            "predict",
            "--model",
            str(tmp_path / "run"),
            "--data",
            str(path),
            "--out",
            str(tmp_path / "p.csv"),
        ],
    )
    assert result.exit_code == 1 and "error:" in result.output and "Traceback" not in result.output
