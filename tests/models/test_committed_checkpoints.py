"""The committed benchmark checkpoints still load, with the same numbers (state_dict names are API)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ase.build import molecule
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.data import TypeMap, atoms_to_graph
from mlip_unc.models.committee import Committee, load_potential
from mlip_unc.models.potential import BayesianPotential

CHECKPOINTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "checkpoints"

# Ethanol with each float32 checkpoint run in float64 (exact mode): energy (eV), forces on
# atom 0 (eV/A) and the sum of the epistemic force variances (eV^2/A^2).
REFERENCE = {
    "3bpa_equivariant": (
        -4226.125008730098,
        [-0.12817625514390166, 1.0577726554595914, 0.0],
        0.0012104825654197574,
    ),
    "3bpa_gin": (
        -4218.989573893891,
        [2.399622165690775, -0.285823126721793, 0.0],
        0.0013238406675529569,
    ),
    "ethanol_equivariant": (
        -4210.18351603742,
        [-0.21392685223619343, 0.40161369680478515, 0.0],
        6.39808557626162e-06,
    ),
    "ethanol_gin": (
        -4210.128999953697,
        [-0.07980686994737791, 0.48102414785425845, 0.0],
        7.511596399193667e-05,
    ),
}


def _ethanol(model: BayesianPotential) -> Batch:
    types = TypeMap.from_list(model.type_map)
    graph = atoms_to_graph(molecule("CH3CH2OH"), model.r_max, types, dtype=model.dtype)
    return Batch.from_data_list([graph])


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_committed_checkpoint_gives_its_reference_numbers(name: str) -> None:
    path = CHECKPOINTS / name / "model.pt"
    if not path.is_file():
        pytest.skip(f"{path} is not in this checkout")
    model = BayesianPotential.from_checkpoint(path).double().eval()  # strict state_dict load
    out = model(_ethanol(model), uncertainty="exact")
    energy, force0, force_var = REFERENCE[name]
    f64 = torch.float64
    torch.testing.assert_close(
        out[keys.ENERGY], torch.tensor([energy], dtype=f64), rtol=0, atol=1e-7
    )
    torch.testing.assert_close(
        out[keys.FORCES][0], torch.tensor(force0, dtype=f64), rtol=0, atol=1e-9
    )
    torch.testing.assert_close(
        out[keys.FORCES_VAR].sum(), torch.tensor(force_var, dtype=f64), rtol=1e-9, atol=0
    )


@pytest.mark.parametrize("name", ["3bpa_equivariant_ensemble5", "3bpa_gin_ensemble5"])
def test_committed_ensembles_load_as_committees(name: str) -> None:
    folder = CHECKPOINTS / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is not in this checkout")
    committee = load_potential(folder)
    assert isinstance(committee, Committee) and len(committee.members) == 5
