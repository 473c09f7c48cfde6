"""benchmarks/mlearn_groups.py on tiny mlearn-layout files made here (EMT Cu) and an untrained model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ase.build
import numpy as np
import torch
from ase.calculators.emt import EMT
from pymatgen.io.ase import AseAtomsAdaptor

from mlip_unc.data import StructureDataset, TypeMap
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.train.predictions import predict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import mlearn_groups  # noqa: E402


def _entry(atoms, group: str) -> dict:
    atoms.calc = EMT()
    return {
        "structure": AseAtomsAdaptor.get_structure(atoms).as_dict(),
        "group": group,
        "outputs": {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces().tolist()},
    }


def _files(root: Path) -> Path:
    folder = root / "structures" / "mlearn" / "Si"
    folder.mkdir(parents=True)
    for part, n in (("training", 4), ("test", 6)):
        entries = []
        for k in range(n):
            atoms = ase.build.bulk("Cu", "fcc", a=3.55 + 0.02 * k, cubic=True)
            if k % 3 == 2:  # a slab: vacuum along z
                atoms = ase.build.fcc111("Cu", size=(1, 2, 3), vacuum=4.0, a=3.6)
            atoms.rattle(0.03, seed=k)
            entries.append(_entry(atoms, "Surface" if k % 3 == 2 else "Elastic"))
        (folder / f"{part}.json").write_text(json.dumps(entries, default=lambda o: o.tolist()))
    return folder


def test_errors_by_group_match_a_direct_evaluation(tmp_path):
    data = _files(tmp_path / "data")
    torch.manual_seed(0)
    backbone = build_backbone("gin", num_types=1, r_max=3.0, latent_dim=4, hidden=8, num_layers=1)
    model = (
        BayesianPotential(backbone, [29], 3.0, torch.tensor([-0.1], dtype=torch.float64))
        .double()
        .eval()
    )
    acc = tmp_path / "acc"
    (acc / "checkpoints" / "run0").mkdir(parents=True)
    model.save(acc / "checkpoints" / "run0" / "model.pt")
    records = [
        {"kind": "settings"},
        {"kind": "run", "dataset": "Si", "row": "gin", "seed": 0, "checkpoint": "checkpoints/run0"},
        {"kind": "run", "dataset": "Si", "row": "mace_torch", "seed": 0},
        {"kind": "run", "dataset": "ethanol", "row": "gin", "seed": 0},
    ]
    (acc / "accuracy.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    out = mlearn_groups.main(
        [
            "--data-root",
            str(tmp_path / "data"),
            "--accuracy-dir",
            str(acc),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    test = out["Si"]["gin seed 0"]["test"]
    pred = predict(
        model,
        StructureDataset.from_files(
            data / "test.json",
            3.0,
            TypeMap.from_list([29]),
            energy_key="energy",
            forces_key="forces",
            dtype=torch.float64,
        ),
    )
    err = 1000 * (pred.energy_pred - pred.energy_true) / pred.num_atoms
    surface = np.arange(6) % 3 == 2
    assert test["Surface"]["frames"] == 2 and test["Elastic"]["frames"] == 4
    assert np.isclose(test["Surface"]["energy_mae_meV_atom"], np.abs(err[surface]).mean())
    assert np.isclose(test["Elastic"]["energy_mean_error_meV_atom"], err[~surface].mean())
    assert np.isclose(test["without_surface"]["energy_mae_meV_atom"], np.abs(err[~surface]).mean())
    assert np.isclose(test["all"]["energy_mae_meV_atom"], np.abs(err).mean())
    assert out["Si"]["gin seed 0"]["training"]["all"]["frames"] == 4
    assert any("mace_torch" in s for s in out["meta"]["skipped"]) and "ethanol" not in out
    text = (tmp_path / "out" / "mlearn_groups.md").read_text()
    assert "## Si test" in text and "Surface (n=2)" in text
