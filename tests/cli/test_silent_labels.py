"""Nothing silently wrong: a model's predictions never pass as reference labels, and no command
writes onto its input or over an earlier run without ``--overwrite``."""

from __future__ import annotations

import csv
import json

import ase.io
import numpy as np
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from ase.io.trajectory import Trajectory
from typer.testing import CliRunner

from mlip_unc.active.candidates import visited_frames
from mlip_unc.cli import app
from mlip_unc.data.datasets import select_frames
from mlip_unc.data.errors import DataError
from mlip_unc.keys import PREDICTED_ENERGY

runner = CliRunner()

TRAIN_CONFIG = """\
seed: 0
data: {{train: {train}, valid_fraction: 0.34, r_max: 4.0}}
model:
  backbone: gin
  backbone_kwargs: {{hidden: 8, num_layers: 1, num_basis: 4}}
  latent_dim: 4
train: {{epochs: 1, batch_size: 2, progress: false}}
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained tiny Cu potential with calibrated uncertainty levels."""
    import torch

    from mlip_unc.models.potential import BayesianPotential, build_backbone

    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=1, r_max=4.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(backbone, [29], 4.0, torch.tensor([-0.01]), init_std=0.3).double()
    path = tmp_path_factory.mktemp("model") / "tiny.pt"
    model.save(
        path, metadata={"uncertainty_levels": {"max_force_std": 1e-3, "energy_std_per_atom": 1e-3}}
    )
    return path


def _md(checkpoint, structure, out, *extra):
    args = ["md", "-m", str(checkpoint), "-s", str(structure), "--ensemble", "nve"]
    args += ["--steps", "20", "--interval", "4", "--timestep", "0.5", "--out", str(out), *extra]
    return runner.invoke(app, args)


@pytest.fixture(scope="module")
def md_dir(tmp_path_factory, checkpoint):
    """``mlip-unc md`` of 20 steps: md.traj holds 6 frames of the model's predictions."""
    root = tmp_path_factory.mktemp("md")
    start = bulk("Cu", cubic=True, a=3.61)
    start.rattle(0.05, seed=1)
    ase.io.write(root / "start.xyz", start)
    result = _md(checkpoint, root / "start.xyz", root / "md")
    assert result.exit_code == 0, result.output
    assert len(ase.io.read(root / "md" / "md.traj", ":")) == 6
    return root / "md"


def _one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_eval_refuses_md_traj_labels_unless_accepted(md_dir, checkpoint, tmp_path):
    args = ["eval", "-m", str(checkpoint), "-d", str(md_dir / "md.traj")]
    line = _one_error_line(runner.invoke(app, args))
    assert f"'{md_dir / 'md.traj'}', frame 0" in line and "model's predictions" in line
    assert "--accept-predicted-labels" in line

    out = tmp_path / "m.json"
    result = runner.invoke(app, [*args, "--accept-predicted-labels", "--out", str(out)])
    assert result.exit_code == 0, result.output
    metrics = json.loads(out.read_text())
    assert metrics["n_frames"] == 6 and metrics["forces_mae_meV_A"] < 1e-6  # its own numbers


def test_train_and_convert_refuse_md_traj_labels_unless_accepted(md_dir, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(TRAIN_CONFIG.format(train=md_dir / "md.traj"))
    train = ["train", "--config", str(config), "--out", str(tmp_path / "run")]
    line = _one_error_line(runner.invoke(app, train))
    assert "md.traj', frame 0: its energy, forces" in line
    assert "data.accept_predicted_labels=true" in line
    result = runner.invoke(app, [*train, "--set", "data.accept_predicted_labels=true"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "model.pt").is_file()

    convert = ["convert", "-d", str(md_dir / "md.traj"), "--r-max", "4"]
    line = _one_error_line(runner.invoke(app, [*convert, "-o", str(tmp_path / "a.mlipdb")]))
    assert "md.traj', frame 0" in line and not (tmp_path / "a.mlipdb").exists()
    out = tmp_path / "b.mlipdb"
    result = runner.invoke(app, [*convert, "-o", str(out), "--accept-predicted-labels"])
    assert result.exit_code == 0, result.output


def test_predictions_stay_marked_in_copies_and_old_trajectories(md_dir, checkpoint, tmp_path):
    from mlip_unc import UncertaintyCalculator

    frames = ase.io.read(md_dir / "md.traj", ":")
    copy = tmp_path / "copy.xyz"  # e.g. `ase convert md.traj copy.xyz`: the mark survives
    ase.io.write(copy, frames)
    with pytest.raises(DataError, match=r"copy.xyz', frame 0: its energy, forces, stress are"):
        select_frames(copy, r_max=4.0)

    old = tmp_path / "old.traj"  # written from Python (or by md before the mark): no mark
    atoms = frames[0].copy()
    del atoms.info[PREDICTED_ENERGY]
    atoms.calc = UncertaintyCalculator(checkpoint)
    atoms.get_forces()  # the results the trajectory stores
    with Trajectory(old, "w") as traj:
        traj.write(atoms)
    assert PREDICTED_ENERGY not in ase.io.read(old).info
    with pytest.raises(DataError, match=r"old.traj', frame 0"):
        select_frames(old, r_max=4.0)

    # recomputed by the reference method (the mark kept): the labels are references
    for atoms in frames:
        atoms.calc = EMT()
        atoms.calc = SinglePointCalculator(
            atoms, energy=atoms.get_potential_energy(), forces=atoms.get_forces()
        )
    ase.io.write(tmp_path / "relabelled.xyz", frames)
    assert all(PREDICTED_ENERGY in a.info for a in ase.io.read(tmp_path / "relabelled.xyz", ":"))
    chosen = select_frames(tmp_path / "relabelled.xyz", r_max=4.0, required={"energy": True})
    assert len(chosen) == 6

    # the active-learning candidates of md.traj: structures only, for the oracle to label
    visited = visited_frames([md_dir])
    assert len(visited) == 6
    assert all(a.calc is None and PREDICTED_ENERGY not in a.info for a in visited)


def test_flag_writes_md_traj_predictions_under_prediction_names(md_dir, checkpoint, tmp_path):
    out = tmp_path / "to_label.xyz"
    args = ["flag", "-m", str(checkpoint), "-d", str(md_dir / "md.traj"), "--top-k", "2"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    predicted = {round(a.get_potential_energy(), 8) for a in ase.io.read(md_dir / "md.traj", ":")}
    chosen = ase.io.read(out, ":")
    assert len(chosen) == 2
    for atoms in chosen:
        assert atoms.calc is None or not atoms.calc.results  # no energy=, forces, stress=
        assert {"energy", "stress", PREDICTED_ENERGY}.isdisjoint(atoms.info)
        assert "forces" not in atoms.arrays and atoms.arrays["mlip_forces"].shape == (4, 3)
        assert round(atoms.info["mlip_energy"], 8) in predicted
        assert len(atoms.info["mlip_stress"]) == 6
    with pytest.raises(DataError, match="no energy under key 'energy'"):
        select_frames(out, r_max=4.0, required={"energy": True})


def test_flag_never_writes_onto_its_input_and_keeps_earlier_output(checkpoint, tmp_path):
    frames = []
    for k in range(6):
        atoms = bulk("Cu", cubic=True, a=3.61)
        atoms.rattle(0.02 * (k + 1), seed=k)
        frames.append(atoms)
    cand = tmp_path / "cand.xyz"
    ase.io.write(cand, frames)
    args = ["flag", "-m", str(checkpoint), "-d", str(cand), "--top-k", "2"]
    for extra in ([], ["--overwrite"]):
        line = _one_error_line(runner.invoke(app, [*args, "--out", str(cand), *extra]))
        assert f"--out '{cand}' is the input" in line and "--overwrite does not allow" in line
        assert len(ase.io.read(cand, ":")) == 6

    out = tmp_path / "sel.xyz"
    assert runner.invoke(app, [*args, "--out", str(out)]).exit_code == 0
    before = out.read_text()
    line = _one_error_line(runner.invoke(app, [*args, "--top-k", "3", "--out", str(out)]))
    assert f"--out '{out}' already exists" in line and "--overwrite" in line
    assert out.read_text() == before
    result = runner.invoke(app, [*args, "--top-k", "3", "--out", str(out), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert len(ase.io.read(out, ":")) == 3


def test_eval_never_writes_onto_its_input(checkpoint, tmp_path):
    atoms = bulk("Cu", cubic=True, a=3.61)
    atoms.calc = EMT()
    atoms.calc = SinglePointCalculator(
        atoms, energy=atoms.get_potential_energy(), forces=atoms.get_forces()
    )
    data = tmp_path / "test.xyz"
    ase.io.write(data, atoms)
    before = data.read_text()
    args = ["eval", "-m", str(checkpoint), "-d", str(data), "--predictions", str(data)]
    line = _one_error_line(runner.invoke(app, args))
    assert f"--predictions '{data}' is the input" in line and data.read_text() == before


def test_md_keeps_an_earlier_run_unless_overwrite(md_dir, checkpoint, tmp_path):
    start = tmp_path / "start.xyz"
    ase.io.write(start, bulk("Cu", cubic=True, a=3.61))
    out = tmp_path / "md"
    assert _md(checkpoint, start, out).exit_code == 0
    before = (out / "md.traj").read_bytes()
    line = _one_error_line(_md(checkpoint, start, out, "--temperature", "900"))
    assert f"--out '{out}' already holds an MD run (md.traj, md.csv" in line
    assert "--overwrite" in line and (out / "md.traj").read_bytes() == before

    (out / "failed.xyz").write_text("from an earlier run")
    result = _md(checkpoint, start, out, "--temperature", "900", "--overwrite")
    assert result.exit_code == 0, result.output
    assert (out / "md.traj").read_bytes() != before and not (out / "failed.xyz").exists()

    # restarting from the run's own trajectory: md.traj would be rewritten while read
    line = _one_error_line(_md(checkpoint, out / "md.traj", out, "--overwrite"))
    assert "is a file that md writes into --out" in line
    result = _md(checkpoint, out / "md.traj", tmp_path / "md2")  # elsewhere: a fine start
    assert result.exit_code == 0, result.output


def _tiny_property_model(tmp_path):
    from mlip_unc.data.molecules import TOY_SMILES

    data = tmp_path / "mols.csv"
    with data.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["smiles", "logS"])
        writer.writerows([smi, f"{0.3 * len(smi):.3f}"] for smi in TOY_SMILES)
    small = ["--set", "model.hidden=8", "--set", "model.layers=1", "--set", "model.latent_dim=4"]
    args = ["property", "train", "--data", str(data), "--target-column", "logS"]
    args += ["--out", str(tmp_path / "run"), "--epochs", "1", "--no-progress", *small]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return data, tmp_path / "run"


def test_property_predict_never_writes_onto_its_input(tmp_path):
    data, model = _tiny_property_model(tmp_path)
    before = data.read_text()
    args = ["property", "predict", "--model", str(model), "--data", str(data)]
    for extra in ([], ["--overwrite"]):
        line = _one_error_line(runner.invoke(app, [*args, "--out", str(data), *extra]))
        assert f"--out '{data}' is the input" in line and data.read_text() == before

    out = tmp_path / "pred.csv"
    out.write_text("an earlier prediction\n")
    line = _one_error_line(runner.invoke(app, [*args, "--out", str(out)]))
    assert f"--out '{out}' already exists" in line and out.read_text() == "an earlier prediction\n"
    result = runner.invoke(app, [*args, "--out", str(out), "--overwrite"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == len(before.splitlines()) - 1 and np.isfinite(float(rows[0]["mean"]))
