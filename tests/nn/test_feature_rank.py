"""Rank of the latents' position Jacobian (method.md 3b): the features under the Bayesian layer
must move in many independent directions, or sigma_F is |F_pred| times a constant.

J = dPhi/dr (d x 3N), Phi = sum_a z_a, on a random 12-atom molecule-like structure (float64).
The checker (``jacobian_effective_rank``) is first shown to fail on a rank-one readout
``z_a = a g_a``; then both backbones with concatenated per-layer invariants and a 64-wide
readout MLP (latent_dim 64, random init) must pass it.

Measured here (random init, 10 init seeds x 2 molecules, max rank 3N - 6 = 30):
entropy effective rank gin (hidden 64, 3 layers) 9.6-13.2, equivariant (16 channels, l_max 1,
2 layers) 8.9-12.9; singular values > 1e-3 max: 27-30 for both. Rank-one readout: 1.0 and 1.
"""

from __future__ import annotations

import copy

import ase
import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch_geometric.data import Batch

from mlip_unc.data import TypeMap, atoms_to_graph
from mlip_unc.models.backbones import build_backbone
from mlip_unc.uncertainty.diagnostics import jacobian_effective_rank

R_MAX = 5.0
TYPES = TypeMap.from_list([1, 6, 8])
RICH = {"concat_layers": True, "readout_hidden": [64], "latent_dim": 64}
SHIPPED_WIDTHS = {  # the widths of configs/*_gin.yaml and configs/*_equivariant.yaml
    "gin": {"hidden": 64, "num_layers": 3, "num_basis": 8},
    "equivariant": {
        "channels": 16,
        "l_max": 1,
        "num_layers": 2,
        "num_basis": 8,
        "radial_hidden": 32,
    },
}
MIN_EFFECTIVE_RANK = 8.0  # measured >= 8.9 (see the module docstring)
MIN_RANK_COUNT = 20  # measured >= 27 of at most 30


def _molecule(seed: int = 0, n: int = 12) -> ase.Atoms:
    """A random branched 'molecule': each atom 1.0-1.5 A from an earlier one, pairs >= 0.95 A."""
    rng = np.random.default_rng(seed)
    positions = [np.zeros(3)]
    while len(positions) < n:
        step = rng.normal(size=3)
        x = positions[rng.integers(len(positions))] + step / np.linalg.norm(step) * rng.uniform(
            1.0, 1.5
        )
        if all(np.linalg.norm(x - q) > 0.95 for q in positions):
            positions.append(x)
    numbers = rng.choice([1, 6, 8], size=n, p=[0.5, 0.35, 0.15])
    return ase.Atoms(numbers=numbers, positions=np.array(positions))


def latent_jacobian(backbone: nn.Module, atoms: ase.Atoms) -> Tensor:
    """``dPhi/dr`` ``(d, 3N)`` of ``Phi = sum_a z_a`` (float64)."""
    batch = Batch.from_data_list([atoms_to_graph(atoms, R_MAX, TYPES, dtype=torch.float64)])

    def phi(pos: Tensor) -> Tensor:  # (n_atoms, 3) -> (d,)
        moved = copy.copy(batch)
        moved.pos = pos
        return backbone(moved).sum(0)

    jac = torch.autograd.functional.jacobian(phi, batch.pos)  # (d, n_atoms, 3)
    return jac.reshape(jac.shape[0], -1)


def assert_rich_features(backbone: nn.Module, atoms: ase.Atoms) -> tuple[float, float]:
    """The check itself: the latents' Jacobian spans many directions."""
    jac = latent_jacobian(backbone, atoms)
    effective, count = jacobian_effective_rank(jac), jacobian_effective_rank(jac, rel_tol=1e-3)
    assert effective >= MIN_EFFECTIVE_RANK, f"effective rank {effective:.2f} < {MIN_EFFECTIVE_RANK}"
    assert count >= MIN_RANK_COUNT, f"{count:.0f} singular values > 1e-3 max, < {MIN_RANK_COUNT}"
    return effective, count


class RankOneReadout(nn.Module):
    """``z_a = a * g_a``: a backbone's single latent ``g`` spread along one fixed ``a (d,)``."""

    def __init__(self, inner: nn.Module, latent_dim: int = 16) -> None:
        super().__init__()
        self.inner = inner
        self.latent_dim = latent_dim
        self.register_buffer(
            "direction", torch.linspace(-1.0, 2.0, latent_dim, dtype=torch.float64)
        )

    def forward(self, batch) -> Tensor:
        return self.inner(batch)[:, :1] * self.direction  # (n_atoms, latent_dim)


def _backbone(name: str, seed: int = 0, **kwargs) -> nn.Module:
    torch.manual_seed(seed)
    kwargs = {**SHIPPED_WIDTHS[name], **kwargs}
    return build_backbone(
        name, num_types=len(TYPES), r_max=R_MAX, avg_num_neighbors=10.0, **kwargs
    ).double()


def test_effective_rank_of_known_matrices():
    a, g = torch.randn(16, 1, dtype=torch.float64), torch.randn(1, 36, dtype=torch.float64)
    assert jacobian_effective_rank(a @ g) == pytest.approx(1.0, abs=1e-6)
    assert jacobian_effective_rank(torch.diag(torch.tensor([2.0, 2.0, 2.0, 0.0]))) == pytest.approx(
        3.0
    )
    assert jacobian_effective_rank(torch.randn(8, 4, 3), rel_tol=1e-3) == 8
    assert jacobian_effective_rank(torch.zeros(3, 6)) == 0.0


@pytest.mark.parametrize("name", ["gin", "equivariant"])
def test_checker_fails_for_a_rank_one_readout(name):
    bad = RankOneReadout(_backbone(name, **RICH))
    jac = latent_jacobian(bad, _molecule())
    assert jac.abs().max() > 1e-6  # the latents do move, along one direction
    assert jacobian_effective_rank(jac) < 2 and jacobian_effective_rank(jac, rel_tol=1e-3) == 1
    with pytest.raises(AssertionError, match="effective rank"):
        assert_rich_features(bad, _molecule())


def test_linear_readout_cannot_exceed_its_input_width():
    """Why latent_dim > channels is rejected: such latents span only ``channels`` directions."""
    capped = _backbone("equivariant", channels=4, latent_dim=32, check_latent_span=False)
    assert jacobian_effective_rank(latent_jacobian(capped, _molecule()), rel_tol=1e-3) <= 4


@pytest.mark.parametrize("name", ["gin", "equivariant"])
def test_rich_backbones_span_many_directions(name):
    _, count = assert_rich_features(_backbone(name, **RICH), _molecule())
    assert count <= 3 * 12 - 6 + 1e-9  # E(3)-invariant latents: 6 zero modes
