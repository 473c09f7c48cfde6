"""Refitted energy offsets: the least-squares shift, exact on full-rank compositions; forces unchanged."""

from __future__ import annotations

import ase
import numpy as np
import pytest
import torch
from ase.calculators.singlepoint import SinglePointCalculator
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.data import TypeMap, atoms_to_graph
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.train.offsets import element_counts, refit_energy_offsets

TYPES = TypeMap.from_list([1, 6, 8])


def _graphs(n: int = 12, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    graphs = []
    for k in range(n):
        numbers = rng.choice([1, 6, 8], size=int(rng.integers(2, 6)))
        atoms = ase.Atoms(
            numbers=numbers,
            positions=np.arange(len(numbers))[:, None] * [1.1, 0.2, 0.0]
            + rng.normal(0, 0.05, (len(numbers), 3)),
        )
        atoms.calc = SinglePointCalculator(
            atoms, energy=float(rng.normal(-3.0 * len(numbers), 0.5))
        )
        graphs.append(
            atoms_to_graph(
                atoms, 3.0, TYPES, energy_key="energy", frame_index=k, dtype=torch.float64
            )
        )
    return graphs


def test_refit_is_the_least_squares_shift_and_keeps_forces():
    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=3, r_max=3.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = (
        BayesianPotential(backbone, TYPES.to_list(), 3.0, torch.zeros(3)).to(torch.float64).eval()
    )
    graphs = _graphs()
    counts = element_counts(model, graphs)
    assert counts.shape == (12, 3) and counts.sum() == sum(g.num_nodes for g in graphs)
    batch = Batch.from_data_list(graphs)
    before = model(batch)
    first = refit_energy_offsets(model, graphs)
    residual = (batch[keys.ENERGY] - before[keys.ENERGY]).detach().numpy()
    np.testing.assert_allclose(
        first, np.linalg.lstsq(counts, residual, rcond=None)[0], rtol=1e-8, atol=1e-10
    )
    after = model(batch)
    torch.testing.assert_close(
        after[keys.FORCES], before[keys.FORCES]
    )  # forces do not see the offsets
    # A known corruption of the offsets is undone exactly (the counts have full column rank).
    with torch.no_grad():
        model.atomic_energies += torch.tensor([0.3, -0.2, 0.05], dtype=torch.float64)
    np.testing.assert_allclose(refit_energy_offsets(model, graphs), [-0.3, 0.2, -0.05], atol=1e-8)
    assert refit_energy_offsets(model, graphs) == pytest.approx([0.0, 0.0, 0.0], abs=1e-9)


def test_refit_without_energies_returns_none():
    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=3, r_max=3.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(backbone, TYPES.to_list(), 3.0).to(torch.float64).eval()
    graphs = [
        atoms_to_graph(
            ase.Atoms("CO", positions=[[0, 0, 0], [1.1, 0, 0]]), 3.0, TYPES, dtype=torch.float64
        )
    ]
    assert refit_energy_offsets(model, graphs) is None
    assert torch.equal(model.atomic_energies, torch.zeros(3, dtype=torch.float64))
