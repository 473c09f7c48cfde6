"""``mlip-unc property train|predict`` end to end on a tiny CSV (typer's CliRunner)."""

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from mlip_unc.cli import app
from mlip_unc.config import (
    ConfigError,
    PropertyConfig,
    apply_values,
    load_property_config,
    validate,
)
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


# ------------------------------------------------------------------ the config's data section
TINY = {"hidden": 16, "layers": 2, "latent_dim": 8}


def _config_file(path: Path, data: dict, **train) -> Path:
    train = {"batch_size": 8, "progress": False, **train}
    path.write_text(yaml.safe_dump({"data": data, "model": TINY, "train": train}))
    return path


def _checkpoint(out: Path) -> dict:
    return torch.load(out / "model.pt", weights_only=True)


def test_a_config_with_a_data_section_trains_as_the_flags_do(tiny_csv, tmp_path):
    flags = ("--split", "scaffold", "--train-fraction", "0.5", "--seed", "1", "--epochs", "2")
    assert _train(tiny_csv, tmp_path / "flags", *flags).exit_code == 0
    data = {
        "csv": str(tiny_csv),
        "smiles_column": "mol",
        "target_columns": ["logS"],
        "split": "scaffold",
        "train_fraction": 0.5,
    }
    config = _config_file(tmp_path / "prop.yaml", data, seed=1, epochs=2)
    args = ["property", "train", "--config", str(config), "--out", str(tmp_path / "config")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    by_flags, by_config = _checkpoint(tmp_path / "flags"), _checkpoint(tmp_path / "config")
    assert by_config["config"] == by_flags["config"]
    assert by_config["config"]["data"] == {**data, "dataset": None, "split_file": None}
    assert by_config["metadata"]["split"] == by_flags["metadata"]["split"]
    for name, value in by_flags["model_state"].items():
        assert torch.equal(by_config["model_state"][name], value), name
    metrics = [
        json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("flags", "config")
    ]
    assert metrics[1]["train_fraction"] == 0.5 and metrics[1]["n_train"] == metrics[0]["n_train"]
    assert metrics[1]["rmse"] == metrics[0]["rmse"] and metrics[1]["nll"] == metrics[0]["nll"]


def test_flags_override_the_configs_data_section(tiny_csv, tmp_path):
    data = {
        "dataset": "esol",  # --data replaces the source, whatever the config names
        "smiles_column": "smiles",
        "target_columns": ["nope"],
        "split": "scaffold",
        "train_fraction": 0.5,
    }
    config = _config_file(tmp_path / "prop.yaml", data, epochs=1)
    result = runner.invoke(
        app,
        ["property", "train", "--config", str(config), "--set", "data.smiles_column=name"]
        + ["--data", str(tiny_csv), "--smiles-column", "mol", "--target-column", "logS"]
        + ["--split", "random", "--train-fraction", "1", "--out", str(tmp_path / "run")],
    )
    assert result.exit_code == 0, result.output
    assert _checkpoint(tmp_path / "run")["config"]["data"] == {
        "csv": str(tiny_csv),
        "dataset": None,
        "smiles_column": "mol",
        "target_columns": ["logS"],
        "split": "random",
        "split_file": None,
        "train_fraction": 1.0,
    }
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["n_train"] == len(SMILES) - 8


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"csv": "x.csv", "target_column": ["y"]}, "data.target_column: unknown key"),
        ({"csv": "x.csv", "datset": "esol"}, "data.datset: unknown key (did you mean 'dataset'?)"),
        ({"csv": "x.csv", "dataset": "esol"}, "give data.csv or data.dataset, not both"),
        ({"split": "by_size"}, "data.split: Input should be 'random' or 'scaffold'"),
        ({"train_fraction": 0}, "data.train_fraction: Input should be greater than 0"),
    ],
)
def test_a_bad_data_section_is_named_before_anything_runs(tmp_path, data, message):
    config = _config_file(tmp_path / "prop.yaml", data)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_property_config(str(config))
    args = ["property", "train", "--config", str(config), "--out", str(tmp_path / "run")]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and message in result.output, result.output
    assert not (tmp_path / "run").exists()


def test_a_config_without_data_or_targets_names_the_flag_and_the_key(tiny_csv, tmp_path):
    config = _config_file(tmp_path / "prop.yaml", {"smiles_column": "mol"})
    out = ["--out", str(tmp_path / "run")]
    result = runner.invoke(app, ["property", "train", "--config", str(config), *out])
    assert result.exit_code == 1
    assert "give exactly one of --data FILE.csv and --dataset NAME" in result.output
    assert "data.csv or data.dataset" in result.output
    both = ["--data", str(tiny_csv), "--dataset", "esol"]
    result = runner.invoke(app, ["property", "train", "--config", str(config), *both, *out])
    assert result.exit_code == 1 and "give exactly one of --data" in result.output
    result = runner.invoke(app, ["property", "train", "--config", str(config), *both[:2], *out])
    assert result.exit_code == 1
    assert "--data needs at least one --target-column (data.target_columns)" in result.output


def test_shortcut_values_are_set_as_given_not_read_as_yaml():
    raw = apply_values({}, {"data.target_columns": ["2020", "null"], "data.csv": "a: b.csv"})
    data = validate(PropertyConfig, raw).data
    assert data.target_columns == ("2020", "null") and data.csv == "a: b.csv"
