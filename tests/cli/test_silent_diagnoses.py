"""Mistakes the package used to misname or say nothing about: each is one line that names its
cause (CUDA missing, an oracle's element, an empty file, the data root, an optional extra), or a
word where a user wants one (unseen elements, a large cutoff, an undefined rank correlation)."""

from __future__ import annotations

import csv
import importlib.util
import logging

import ase.io
import numpy as np
import pytest
import torch
import yaml
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from typer.testing import CliRunner

from mlip_unc import UncertaintyCalculator
from mlip_unc.cli import app
from mlip_unc.models.checkpoint import load_checkpoint, save_checkpoint

runner = CliRunner()
NO_CUDA = not torch.cuda.is_available()
HAS_MACE = importlib.util.find_spec("mace") is not None


def _error_line(result) -> str:
    """The command's output when it is exactly one ``error:`` line (else the test fails)."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) >= 1 and lines[-1].startswith("error: "), result.output
    assert sum(line.startswith("error") for line in lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[-1]


def _cells(n: int, *, forces: bool = True, a: float = 3.6) -> list[ase.Atoms]:
    frames = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=a, cubic=True)
        atoms.rattle(0.05, seed=k)
        atoms.calc = EMT()
        labels = {"energy": atoms.get_potential_energy()}
        if forces:
            labels["forces"] = atoms.get_forces()
        atoms.calc = SinglePointCalculator(atoms, **labels)
        frames.append(atoms)
    return frames


def _train_config(tmp_path, train, **changes) -> str:
    config = {
        "seed": 0,
        "out": str(tmp_path / "run"),
        "data": {"train": str(train), "valid_fraction": 0.25, "r_max": 4.0},
        "model": {
            "backbone": "gin",
            "backbone_kwargs": {"hidden": 8, "num_layers": 1},
            "latent_dim": 4,
        },
        "train": {"epochs": 1, "batch_size": 2, "progress": False},
    }
    for key, value in changes.items():
        section, name = key.split(".")
        config[section][name] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


# ---------------------------------------------------------------- CUDA missing
@pytest.mark.skipif(not NO_CUDA, reason="CUDA is available here")
def test_flag_and_md_on_cuda_without_it_say_so_in_one_line(tmp_path, tiny_checkpoint):
    ase.io.write(tmp_path / "cells.xyz", _cells(3))
    for command in (
        ["flag", "-m", str(tiny_checkpoint), "-d", str(tmp_path / "cells.xyz")],
        ["md", "-m", str(tiny_checkpoint), "-s", str(tmp_path / "cells.xyz"), "--steps", "2"],
    ):
        result = runner.invoke(app, [*command, "--device", "cuda", "-o", str(tmp_path / "o")])
        line = _error_line(result)
        assert "--device 'cuda': CUDA is not available" in line
        assert "corrupted" not in line


@pytest.mark.skipif(not NO_CUDA, reason="CUDA is available here")
def test_calculator_on_cuda_without_it_names_cuda_not_a_corrupted_file(tiny_checkpoint):
    with pytest.raises(ValueError, match="CUDA is not available") as caught:
        UncertaintyCalculator(str(tiny_checkpoint), device="cuda")
    assert "corrupted" not in str(caught.value)
    with pytest.raises(ValueError, match="map_location 'cuda:0': CUDA is not available"):
        load_checkpoint(tiny_checkpoint, map_location="cuda:0")


# ---------------------------------------------------------------- the EMT oracle on Si
def test_emt_oracle_on_silicon_fails_in_one_line_before_any_work(tmp_path):
    config = {
        "out": str(tmp_path / "al"),
        "oracle": "emt",
        "structures": {"bulk": "Si", "crystalstructure": "diamond", "a": 5.43, "cubic": True},
        "bootstrap": {"temperature": 300, "frames": 4, "valid_frames": 2},
        "training": {"data": {"r_max": 4.0}},
    }
    path = tmp_path / "al.yaml"
    path.write_text(yaml.safe_dump(config))
    line = _error_line(runner.invoke(app, ["active-learn", "--config", str(path)]))
    assert "emt oracle has no parameters for Si" in line
    assert not (tmp_path / "al").exists()  # nothing was started


# ---------------------------------------------------------------- empty files, the data root
def test_an_empty_structure_file_is_named_as_such(tmp_path, tiny_checkpoint):
    empty = tmp_path / "empty.xyz"
    empty.write_text("")
    line = _error_line(runner.invoke(app, ["train", "--config", _train_config(tmp_path, empty)]))
    assert line == f"error: file '{empty}' holds no frames"
    for command in (
        ["eval", "-m", str(tiny_checkpoint), "-d", str(empty)],
        ["md", "-m", str(tiny_checkpoint), "-s", str(empty), "-o", str(tmp_path / "md")],
    ):
        assert _error_line(runner.invoke(app, command)).endswith("holds no frames")


def test_a_missing_data_root_names_mlip_unc_data(tmp_path, monkeypatch):
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv("MLIP_UNC_DATA", str(root))
    config = tmp_path / "shipped.yaml"
    config.write_text(
        "data_root: null\n"
        "data: {train: '${data_root}/structures/ethanol/train.xyz', r_max: 4.0}\n"
        f"out: {tmp_path / 'run'}\n"
    )
    line = _error_line(runner.invoke(app, ["train", "--config", str(config)]))
    assert "structure file not found" in line
    assert f"the data root '{root}' ($MLIP_UNC_DATA) does not hold it" in line
    assert "set MLIP_UNC_DATA" in line
    monkeypatch.setenv("MLIP_UNC_DATA", str(tmp_path / "absent"))
    line = _error_line(runner.invoke(app, ["train", "--config", str(config)]))
    assert "does not exist: set MLIP_UNC_DATA" in line


# ---------------------------------------------------------------- mace-torch missing
@pytest.mark.skipif(HAS_MACE, reason="mace-torch is installed")
def test_eval_of_an_attached_mace_model_without_mace_is_one_line_with_this_installs_hint(
    tmp_path, tiny_checkpoint, monkeypatch
):
    payload = load_checkpoint(tiny_checkpoint)
    payload["config"]["backbone"] = {
        "name": "mace_model",
        "kwargs": {"mace_class": "ScaleShiftMACE", "mace_config": {"r_max": 4.0}},
    }
    kept = {k: v for k, v in payload.items() if k not in ("format", "version", "sha256", "digest")}
    attached = save_checkpoint(tmp_path / "attached.pt", kept)
    ase.io.write(tmp_path / "cells.xyz", _cells(2))
    monkeypatch.chdir(tmp_path)  # outside the checkout: the hint names its path
    result = runner.invoke(app, ["eval", "-m", str(attached), "-d", str(tmp_path / "cells.xyz")])
    line = _error_line(result)
    assert "need mace-torch" in line
    assert 'pip install -e "' in line and '[mace]"' in line  # this is a source checkout
    assert "mlip-unc[mace]" not in line


# ---------------------------------------------------------------- unseen elements
def test_property_predict_flags_molecules_with_elements_absent_from_training(tmp_path):
    smiles = [c * n + end for n in range(1, 7) for c, end in (("C", ""), ("C", "O"), ("C", "OC"))]
    with (tmp_path / "train.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["smiles", "y"])
        writer.writerows([s, 0.1 * len(s)] for s in smiles)
    new = ["CCCCO", "C[Si](C)(C)C", "CCCl", "CC(F)(F)F"]
    (tmp_path / "new.csv").write_text("smiles\n" + "\n".join(new) + "\n")
    run = tmp_path / "model"
    trained = runner.invoke(
        app,
        [
            "property",
            "train",
            "--data",
            str(tmp_path / "train.csv"),
            "--target-column",
            "y",
            "--epochs",
            "1",
            "--out",
            str(run),
            "--no-progress",
        ],
    )
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "pred.csv"
    args = ["property", "predict", "--model", str(run), "--data", str(tmp_path / "new.csv")]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert [row["unseen_elements"] for row in rows] == ["", "Si", "Cl", "F"]
    assert "3 of 4 molecules hold elements absent from the training set (Cl, F, Si)" in (
        result.output
    )

    from mlip_unc.data.molecules import smiles_to_graph
    from mlip_unc.models.factory import PropertyPredictor

    predictor = PropertyPredictor.load(run)
    assert predictor.unseen_elements([smiles_to_graph(s) for s in new]) == [
        [],
        ["Si"],
        ["Cl"],
        ["F"],
    ]


# ---------------------------------------------------------------- a large cutoff, energy-only data
def test_a_cutoff_large_for_the_cell_is_said_with_its_neighbour_count(tmp_path, caplog):
    from mlip_unc.data.neighbours import crowded_cutoff

    cells = _cells(2)
    assert crowded_cutoff(cells, 5.0) is None
    assert crowded_cutoff([bulk("Cu", "fcc", a=3.6, cubic=True).copy()], 5.0) is None
    message = crowded_cutoff(cells, 50.0)
    assert message is not None and "about 44,8" in message and "neighbours per atom" in message
    molecule = ase.Atoms("H2O", positions=[[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]])
    assert crowded_cutoff([molecule], 50.0) is None

    ase.io.write(tmp_path / "cells.xyz", _cells(4))
    from mlip_unc.config import load_potential_config
    from mlip_unc.train.potential_data import prepare_data

    config = load_potential_config(
        _train_config(tmp_path, tmp_path / "cells.xyz", **{"data.r_max": 12.0})
    )
    with caplog.at_level(logging.WARNING, logger="mlip_unc"):
        prepare_data(config)
    assert any("neighbours per atom" in r.getMessage() for r in caplog.records)


def test_energy_only_data_trains_with_forces_weight_zero(tmp_path):
    ase.io.write(tmp_path / "energies.xyz", _cells(8, forces=False))
    config = _train_config(tmp_path, tmp_path / "energies.xyz")
    refused = runner.invoke(app, ["train", "--config", config])
    assert "no forces" in _error_line(refused)
    result = runner.invoke(app, ["train", "--config", config, "--set", "loss.forces_weight=0"])
    assert result.exit_code == 0, result.output
    posterior = load_checkpoint(tmp_path / "run" / "model.pt")["metadata"]["posterior"]
    assert np.isfinite(posterior["alpha2_forces"]) and np.isfinite(posterior["lambda"])
    calc = UncertaintyCalculator(str(tmp_path / "run" / "model.pt"))
    assert np.isfinite(calc.get_property("max_force_std", _cells(1)[0]))


# ---------------------------------------------------------------- words where a user wants one
def test_eval_says_why_a_frame_rank_correlation_has_no_value(tmp_path, tiny_checkpoint):
    ase.io.write(tmp_path / "two.xyz", _cells(2))
    result = runner.invoke(
        app, ["eval", "-m", str(tiny_checkpoint), "-d", str(tmp_path / "two.xyz")]
    )
    assert result.exit_code == 0, result.output
    energy_row = next(line for line in result.output.splitlines() if "energy Spearman" in line)
    assert energy_row.endswith("n/a (fewer than 3 structures)")
    assert " nan" not in result.output


def test_relative_force_std_is_over_the_force_rms_of_the_set(tiny_checkpoint):
    from mlip_unc.active.evaluation import evaluate_structures

    frames = _cells(3)
    calc = UncertaintyCalculator(str(tiny_checkpoint))
    metrics = evaluate_structures(calc, frames)
    rms = float(np.sqrt(np.mean([np.mean(f.get_forces() ** 2) for f in frames])))
    assert metrics["force_rms"] == pytest.approx(rms)
    assert metrics["relative_force_std"] == pytest.approx(metrics["mean_max_force_std"] / rms)


def test_help_shows_no_bool_type_and_every_option_has_help():
    import typer

    for command in ([], ["train"], ["md"], ["property"], ["property", "predict"]):
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.output, command
    group = typer.main.get_command(app)

    def options(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from options(sub, [*path, name])
        else:
            for param in cmd.params:
                yield " ".join(path), param

    bare = [
        f"{p} {param.opts}"
        for p, param in options(group, [])
        if not param.hidden and not param.help
    ]
    assert bare == []
