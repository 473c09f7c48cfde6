"""Committee of potentials (mean, population variance) and loading potentials from checkpoints."""

from __future__ import annotations

import pytest
import torch
from ase.build import molecule
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.data import TypeMap, atoms_to_graph
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.committee import Committee
from mlip_unc.models.loading import load_potential
from mlip_unc.models.potential import BayesianPotential

TYPES = [1, 6, 8]


def _member(seed: int) -> BayesianPotential:
    torch.manual_seed(seed)
    kwargs = {"hidden": 8, "latent_dim": 4, "num_layers": 1, "num_basis": 4}
    backbone = build_backbone("gin", num_types=3, r_max=3.0, **kwargs)
    return BayesianPotential(backbone, TYPES, 3.0, torch.tensor([-1.0, -2.0, -3.0])).double().eval()


def _batch() -> Batch:
    graphs = [
        atoms_to_graph(molecule(name), 3.0, TypeMap.from_list(TYPES), dtype=torch.float64)
        for name in ("CH3CH2OH", "H2O")
    ]
    return Batch.from_data_list(graphs)


def test_committee_mean_and_population_variance() -> None:
    members = [_member(0), _member(1), _member(2)]
    batch = _batch()
    out = Committee(members)(batch, uncertainty="energy")
    energies = torch.stack([m(batch)[keys.ENERGY] for m in members])  # (M, n_graphs)
    forces = torch.stack([m(batch)[keys.FORCES] for m in members])  # (M, n_atoms, 3)
    torch.testing.assert_close(out[keys.ENERGY], energies.mean(0))
    torch.testing.assert_close(out[keys.FORCES], forces.mean(0))
    torch.testing.assert_close(out[keys.ENERGY_EPISTEMIC_VAR], energies.var(0, unbiased=False))
    torch.testing.assert_close(out[keys.FORCES_VAR], forces.var(0, unbiased=False))
    noise = torch.stack([m.noise_variances(batch)[keys.ENERGY] for m in members]).mean(0)
    torch.testing.assert_close(out[keys.ENERGY_VAR], out[keys.ENERGY_EPISTEMIC_VAR] + noise)
    assert keys.ENERGY_VAR not in Committee(members)(batch)


def test_committee_needs_two_members() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        Committee([_member(0)])


def test_load_potential_single_and_ensemble_folder(tmp_path) -> None:
    batch = _batch()
    for k in range(2):
        _member(k).save(tmp_path / "ens" / f"member_{k}" / "model.pt")
    _member(5).save(tmp_path / "single" / "model.pt")
    single = load_potential(tmp_path / "single")
    assert isinstance(single, BayesianPotential) and not single.training
    assert torch.equal(single(batch)[keys.ENERGY], _member(5)(batch)[keys.ENERGY])
    committee = load_potential(tmp_path / "ens")
    assert isinstance(committee, Committee) and len(committee.members) == 2
    from_files = load_potential([tmp_path / "ens" / f"member_{k}" / "model.pt" for k in range(2)])
    assert torch.equal(committee(batch)[keys.ENERGY], from_files(batch)[keys.ENERGY])
