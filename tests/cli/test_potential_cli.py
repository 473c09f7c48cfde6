"""``mlip-unc train`` and ``mlip-unc eval`` end to end on tiny EMT data (CliRunner)."""

import json

import ase.io
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from typer.testing import CliRunner

from mlip_unc.cli import app
from mlip_unc.models.potential import BayesianPotential

runner = CliRunner()

CONFIG = """\
seed: 0
data:
  train: {root}/train.xyz
  valid_fraction: 0.25
  r_max: 4.0
model:
  backbone: gin
  backbone_kwargs: {{hidden: 8, num_layers: 1}}
  latent_dim: 4
train:
  epochs: 5
  batch_size: 2
  progress: false
"""


def _write_data(root):
    frames = []
    for k in range(10):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms.rattle(0.1, seed=k)
        atoms.calc = EMT()
        atoms.calc = SinglePointCalculator(
            atoms, energy=atoms.get_potential_energy(), forces=atoms.get_forces()
        )
        frames.append(atoms)
    ase.io.write(root / "train.xyz", frames[:8])
    ase.io.write(root / "test.xyz", frames[8:])


def test_train_then_eval(tmp_path):
    _write_data(tmp_path)
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.format(root=tmp_path))
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["train", "--config", str(config), "--set", "epochs=2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    history = json.loads((out / "history.json").read_text())
    assert len(history["epochs"]) == 2
    BayesianPotential.from_checkpoint(out / "model.pt")

    metrics, frames = tmp_path / "m.json", tmp_path / "frames.csv"
    result = runner.invoke(
        app,
        [
            "eval",
            "--model",
            str(out / "model.pt"),
            "--data",
            str(tmp_path / "test.xyz"),
            "--uncertainty",
            "sampled",
            "--out",
            str(metrics),
            "--per-frame",
            str(frames),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "force MAE (meV/A)" in result.output
    values = json.loads(metrics.read_text())
    assert values["n_frames"] == 2 and values["forces_mae_meV_A"] > 0 and "forces_nll" in values
    assert len(frames.read_text().splitlines()) == 3


def test_bad_key_is_reported(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(CONFIG.format(root=tmp_path).replace("latent_dim", "latent_dims"))
    result = runner.invoke(app, ["train", "--config", str(config)])
    assert result.exit_code == 1
    assert "model.latent_dims: unknown key" in result.output


def test_eval_missing_checkpoint(tmp_path):
    result = runner.invoke(
        app, ["eval", "--model", str(tmp_path / "no.pt"), "--data", str(tmp_path / "x.xyz")]
    )
    assert result.exit_code == 1 and "does not exist" in result.output
