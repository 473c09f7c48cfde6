"""benchmarks.speed.property_order: each case timed against E+F on a tiny model."""

from __future__ import annotations

import json

import numpy as np
import torch
from ase.build import bulk, molecule

from benchmarks.speed import property_order as po
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.potential import BayesianPotential


def tiny_checkpoint(path):
    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=1, r_max=4.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(backbone, [29], 4.0, torch.tensor([-3.0]), init_std=0.3).double()
    model.save(path)
    return str(path)


def test_box_of_copies_repeats_a_molecule_periodically():
    water = molecule("H2O")
    box = po.box_of_copies(water, 2, spacing=5.0)
    assert len(box) == 8 * len(water) and box.pbc.all()
    assert np.allclose(box.cell.lengths(), [10.0] * 3)


def test_every_case_is_a_positive_ratio_to_plain_forces(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")
    cu = bulk("Cu", "fcc", a=3.6, cubic=True)
    (row,) = po.measure(model, {"cu": (cu, 3)})
    assert row["atoms"] == 4 and row["ef_ms"] > 0
    assert set(po.CASES) <= set(row) and all(row[c] > 0 for c in po.CASES)
    json.dumps(row)  # a JSON record
