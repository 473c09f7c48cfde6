"""mlearn-layout JSON through ``mlip-unc train`` and ``mlip-unc eval``: stress metrics in GPa,
energy per atom beside the total, and the extxyz of predictions (CliRunner, tiny EMT data)."""

import json

import ase.io
import numpy as np
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.stress import voigt_6_to_full_3x3_stress
from ase.units import GPa
from pymatgen.io.ase import AseAtomsAdaptor
from typer.testing import CliRunner

from mlip_unc.calculator import UncertaintyCalculator
from mlip_unc.cli import app

runner = CliRunner()

CONFIG = """\
seed: 0
data:
  train: {root}/training.json
  valid_fraction: 0.25
  stress_key: stress
  r_max: 4.0
model:
  backbone: gin
  backbone_kwargs: {{hidden: 8, num_layers: 1}}
  latent_dim: 4
loss:
  stress_weight: 1.0
train:
  epochs: 2
  batch_size: 2
  progress: false
"""


def _entry(atoms):
    """mlearn's layout: virial_stress in kbar, VASP order xx yy zz xy yz zx, positive = compressive."""
    kbar = -voigt_6_to_full_3x3_stress(atoms.get_stress()) / (0.1 * GPa)
    return {
        "structure": AseAtomsAdaptor.get_structure(atoms).as_dict(),
        "outputs": {
            "energy": atoms.get_potential_energy(),
            "forces": atoms.get_forces().tolist(),
            "virial_stress": [
                kbar[0, 0],
                kbar[1, 1],
                kbar[2, 2],
                kbar[0, 1],
                kbar[1, 2],
                kbar[2, 0],
            ],
        },
        "num_atoms": len(atoms),
    }


def _write_json(root):
    frames = []
    for k in range(10):
        atoms = bulk("Cu", "fcc", a=3.5 + 0.02 * k, cubic=True)
        atoms.rattle(0.1, seed=k)
        atoms.calc = EMT()
        frames.append(atoms)
    (root / "training.json").write_text(json.dumps([_entry(a) for a in frames[:8]]))
    (root / "test.json").write_text(json.dumps([_entry(a) for a in frames[8:]]))
    return frames[8:]


def test_train_and_eval_on_mlearn_json(tmp_path):
    test_frames = _write_json(tmp_path)
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.format(root=tmp_path))
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "--config", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output

    metrics, xyz = tmp_path / "m.json", tmp_path / "pred.xyz"
    result = runner.invoke(
        app,
        [
            "eval",
            "--model",
            str(out / "model.pt"),
            "--data",
            str(tmp_path / "test.json"),
            "--uncertainty",
            "exact",
            "--out",
            str(metrics),
            "--predictions",
            str(xyz),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (
        "stress MAE (GPa, periodic frames)" in result.output
        and "energy MAE (meV/atom)" in result.output
    )
    values = json.loads(metrics.read_text())
    assert values["stress_n_frames"] == 2 and values["stress_mae_GPa"] > 0

    back = ase.io.read(xyz, ":")
    calc = UncertaintyCalculator(out / "model.pt", uncertainty="exact", domain=False)
    e_err, s_err = [], []
    for read, ref in zip(back, test_frames, strict=False):
        # the file holds the reference labels (converted from kbar) and the model's predictions
        np.testing.assert_allclose(read.get_stress(), ref.get_stress(), atol=1e-9)
        atoms = ref.copy()
        atoms.calc = calc
        assert read.info["mlip_unc_energy"] == pytest.approx(atoms.get_potential_energy(), abs=1e-6)
        np.testing.assert_allclose(read.arrays["mlip_unc_forces"], atoms.get_forces(), atol=1e-6)
        np.testing.assert_allclose(read.info["mlip_unc_stress"], atoms.get_stress(), atol=1e-7)
        assert read.arrays["mlip_unc_forces_var"].shape == (len(ref), 3)
        e_err.append((read.info["mlip_unc_energy"] - read.get_potential_energy()) / len(read))
        s_err.append(np.abs(read.info["mlip_unc_stress"] - read.get_stress()) / GPa)
    assert values["energy_mae_meV_atom"] == pytest.approx(1000 * np.mean(np.abs(e_err)), rel=1e-6)
    assert values["stress_mae_GPa"] == pytest.approx(np.mean(s_err), rel=1e-6)
