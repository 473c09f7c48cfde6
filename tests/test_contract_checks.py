"""mlip_unc.testing catches what it is for: each broken backbone or oracle below fails the check
that names its fault, and the sound one passes every check."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from ase.calculators.calculator import Calculator, all_changes
from ase.calculators.emt import EMT
from pydantic import Field
from torch import nn

from mlip_unc.config.backbones import BackboneOptions
from mlip_unc.geometry import batch_edge_vectors
from mlip_unc.nn.radial import RadialEmbedding
from mlip_unc.registry import BACKBONE_REGISTRY, register_backbone
from mlip_unc.testing import ContractError, check_backbone, check_oracle, oracle_test_structures


class Toy(nn.Module):
    """Species embedding plus a radial neighbour density: keeps the contract."""

    def __init__(
        self,
        num_types: int,
        *,
        r_max: float = 3.0,
        latent_dim: int = 4,
        avg_num_neighbors: float = 1.0,
        width: int = 8,
    ) -> None:
        super().__init__()
        self._config = {
            "num_types": num_types,
            "r_max": r_max,
            "latent_dim": latent_dim,
            "avg_num_neighbors": avg_num_neighbors,
            "width": width,
        }
        self.latent_dim, self.r_max = latent_dim, r_max
        self.embedding = nn.Embedding(num_types, width)
        self.radial = RadialEmbedding(r_max, 6)
        self.mix = nn.Linear(6, width, bias=False)
        self.readout = nn.Sequential(
            nn.Linear(2 * width, width), nn.SiLU(), nn.Linear(width, latent_dim)
        )

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def vectors(self, batch: Any) -> torch.Tensor:
        return batch_edge_vectors(batch)

    def features(self, batch: Any) -> torch.Tensor:
        return self.mix(self.radial(torch.linalg.vector_norm(self.vectors(batch), dim=-1))[0])

    def forward(self, batch: Any) -> torch.Tensor:
        sender, receiver = batch.edge_index
        h = self.embedding(batch.atom_type)
        density = torch.zeros_like(h).index_add_(0, receiver, self.features(batch) * h[sender])
        return self.readout(torch.cat([h, density], dim=-1))


class Detached(Toy):
    def vectors(self, batch: Any) -> torch.Tensor:
        return batch_edge_vectors(batch).detach()  # precomputed: no gradient reaches pos


class NoCell(Toy):
    def vectors(self, batch: Any) -> torch.Tensor:
        return batch.pos[batch.edge_index[0]] - batch.pos[batch.edge_index[1]]  # no cell shift


class Absolute(Toy):
    def forward(self, batch: Any) -> torch.Tensor:
        return super().forward(batch) + 0.1 * batch.pos.sum(dim=-1, keepdim=True)


class Biased(Toy):
    def features(self, batch: Any) -> torch.Tensor:
        return super().features(batch) + 0.3  # does not vanish at r_max


class Leaky(Toy):
    def forward(self, batch: Any) -> torch.Tensor:
        z = super().forward(batch)
        return z - 0.2 * z.mean(dim=0)  # mixes the structures of a batch


class Unplain(Toy):
    def config(self) -> dict[str, Any]:
        return {**super().config(), "width": torch.tensor(8)}


class Unnamed(Toy):
    pass


def _named(cls: type[Toy]) -> type[Toy]:
    cls.backbone_name = "toy_contract"  # type: ignore[attr-defined]
    return cls


@pytest.mark.parametrize(
    ("cls", "check", "message"),
    [
        (Detached, "finite_difference_forces", "forces are all zero"),
        (NoCell, "periodic_images", "shifted and wrapped cell"),
        (Absolute, "latent_invariance", "rotated, translated, permuted"),
        (Biased, "smooth_cutoff", "just inside and just outside r_max"),
        (Leaky, "batch_equals_singles", "batch of two"),
        (Unplain, "checkpoint", r"config\(\)\['width'\] is a Tensor"),
        (Unnamed, "checkpoint", "needs backbone_name"),
    ],
)
def test_a_broken_backbone_fails_the_check_that_names_its_fault(cls, check, message):
    if cls is not Unnamed:
        _named(cls)
    with pytest.raises(ContractError, match=rf"^{check}: .*{message}"):
        check_backbone(lambda: cls(3))


def test_the_sound_toy_passes_every_check():
    register_backbone("toy_contract", Toy, options=None)
    try:
        checks = check_backbone(lambda: Toy(3))
    finally:
        BACKBONE_REGISTRY.remove("toy_contract")
        del Toy.backbone_name
    assert checks == [
        "contract",
        "latent_invariance",
        "periodic_images",
        "finite_difference_forces",
        "finite_difference_stress",
        "energy_invariance",
        "batch_equals_singles",
        "smooth_cutoff",
        "isolated_atoms",
        "checkpoint",  # no reset_parameters: not checked
    ]


def test_options_must_default_as_the_constructor():
    class Options(BackboneOptions):
        width: int = Field(12, gt=0)  # the constructor says 8

    register_backbone("toy_options", Toy, options=Options)
    try:
        with pytest.raises(ContractError, match=r"^options: Options\.width defaults to 12"):
            check_backbone("toy_options")
        with pytest.raises(ContractError, match=r"^options: .*widht: unknown key"):
            check_backbone("toy_options", options={"widht": 4})
    finally:
        BACKBONE_REGISTRY.remove("toy_options")
        del Toy.backbone_name


def test_the_global_random_state_is_left_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    check_backbone(lambda: Toy(3), checkpoint=False)
    assert torch.equal(torch.rand(3), expected)


# ---------------------------------------------------------------- oracles
class WrongSign(EMT):
    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        self.results["forces"] = -self.results["forces"]


class Stale(Calculator):
    """Computes once, then answers the same whatever the structure."""

    implemented_properties = ["energy", "forces"]

    first: dict[str, Any] = {}

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        if not self.first:
            emt = EMT()
            self.first = {
                "energy": emt.get_potential_energy(atoms),
                "forces": emt.get_forces(atoms),
            }
        self.results = dict(self.first)


class Flat(EMT):
    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        self.results["forces"] = self.results["forces"].ravel()


@pytest.mark.parametrize(
    ("calc", "check", "message"),
    [
        (WrongSign, "finite_difference_forces", "forces and -dE/dx"),
        (Stale, "consistency", "moving an atom leaves the energy as it was"),
        (Flat, "shapes", r"forces of shape \(12,\)"),
    ],
)
def test_a_broken_oracle_fails_the_check_that_names_its_fault(calc, check, message):
    with pytest.raises(ContractError, match=rf"^{check}: .*{message}"):
        check_oracle(calc())


def test_oracle_test_structures():
    cluster, cell = oracle_test_structures(("Ar", "Kr"), bond=3.0)
    assert cluster.get_chemical_formula() == "Ar2Kr2" and not cluster.pbc.any()
    assert cell.pbc.all() and len(cell) == 4
    distances = cell.get_all_distances(mic=True)[np.triu_indices(4, 1)]
    assert distances.min() == pytest.approx(3.0, abs=0.5)
