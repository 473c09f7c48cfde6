"""Radial bases, cutoff envelopes and the two backbones (GeometricGIN, EquivariantBackbone)."""

from __future__ import annotations

import copy

import ase
import numpy as np
import pytest
import torch
from e3nn import o3
from torch_geometric.data import Batch

from mlip_unc.data import TypeMap, atoms_to_graph
from mlip_unc.models.backbones import BACKBONES, Backbone, build_backbone
from mlip_unc.nn.radial import (
    BesselBasis,
    CosineCutoff,
    GaussianBasis,
    PolynomialCutoff,
    RadialEmbedding,
)

R_MAX = 3.0
TYPES = TypeMap.from_list([1, 6, 8])
KWARGS = {
    "gin": {"hidden": 16, "latent_dim": 8, "num_layers": 2, "num_basis": 6},
    "equivariant": {"latent_dim": 8, "channels": 4, "l_max": 2, "num_layers": 2, "num_basis": 6},
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: intra-op threads only add contention on a busy machine (100x slower here)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _backbone(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_backbone(name, num_types=len(TYPES), r_max=R_MAX, **KWARGS[name]).double()


def _graph(seed: int = 0, n: int = 6) -> Batch:
    rng = np.random.default_rng(seed)
    atoms = ase.Atoms(numbers=rng.choice([1, 6, 8], size=n), positions=rng.uniform(0, 2.5, (n, 3)))
    return Batch.from_data_list([atoms_to_graph(atoms, R_MAX, TYPES)])


# ---------------------------------------------------------------- radial
@pytest.mark.parametrize("envelope", [PolynomialCutoff(R_MAX, p=6), CosineCutoff(R_MAX)])
def test_envelopes_vanish_smoothly_at_cutoff(envelope):
    r = torch.tensor([1e-3, R_MAX - 1e-9, R_MAX, R_MAX + 0.5], dtype=torch.float64, requires_grad=True)
    f = envelope(r)
    (df,) = torch.autograd.grad(f.sum(), r)
    assert abs(f[0].item() - 1) < 1e-5 and f[1:].abs().max() < 1e-12
    assert df[1:].abs().max() < 1e-8


def test_polynomial_cutoff_is_monotone_between_one_and_zero():
    r = torch.linspace(0, R_MAX, 200, dtype=torch.float64)
    f = PolynomialCutoff(R_MAX)(r)
    assert f[0] == 1 and f[-1] == 0 and torch.all(f[1:] <= f[:-1] + 1e-15)


@pytest.mark.parametrize("basis", [BesselBasis(R_MAX, 5), GaussianBasis(R_MAX, 5)])
def test_bases_shapes_and_dtype(basis):
    r = torch.linspace(0.5, R_MAX, 7, dtype=torch.float64)
    out = basis(r)
    assert out.shape == (7, 5) and out.dtype == torch.float64 and torch.isfinite(out).all()


def test_radial_embedding_is_zero_beyond_cutoff():
    features, envelope = RadialEmbedding(R_MAX, 4)(torch.tensor([1.0, R_MAX, 4.0]))
    assert features.shape == (3, 4) and torch.all(features[1:] == 0) and torch.all(envelope[1:] == 0)
    with pytest.raises(ValueError):
        RadialEmbedding(R_MAX, 4, basis="chebyshev")


# ---------------------------------------------------------------- backbones
@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_backbone_contract_and_invariance(name):
    backbone = _backbone(name)
    assert isinstance(backbone, Backbone) and backbone.latent_dim == 8
    batch = _graph()
    z = backbone(batch)
    assert z.shape == (6, 8) and z.dtype == torch.float64
    rot = o3.rand_matrix(dtype=torch.float64)
    moved = copy.copy(batch)
    moved.pos = batch.pos @ rot.T + torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(backbone(moved), z, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_config_rebuilds_the_backbone(name):
    backbone = _backbone(name, seed=0)
    other = build_backbone(name, **backbone.config()).double()
    assert other.config() == backbone.config()
    other.load_state_dict(backbone.state_dict())
    batch = _graph(seed=1)
    torch.testing.assert_close(other(batch), backbone(batch), rtol=0, atol=0)
    before = [p.detach().clone() for p in other.parameters()]
    other.reset_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, other.parameters()))


def test_equivariant_hidden_features_rotate_with_their_irreps():
    backbone = _backbone("equivariant")
    layer = backbone.layers[0]
    captured = []
    handle = layer.register_forward_hook(lambda mod, args, out: captured.append(out))
    batch = _graph(seed=2)
    rot = o3.rand_matrix(dtype=torch.float64)
    moved = copy.copy(batch)
    moved.pos = batch.pos @ rot.T
    backbone(batch)
    backbone(moved)
    handle.remove()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # e3nn builds its D-matrix generators in the default dtype
    try:
        d_matrix = layer.irreps_out.D_from_matrix(rot)
    finally:
        torch.set_default_dtype(previous)
    assert layer.irreps_out.lmax == 2
    torch.testing.assert_close(captured[1], captured[0] @ d_matrix.T, rtol=1e-9, atol=1e-11)


def test_unknown_backbone_name():
    with pytest.raises(ValueError, match="unknown backbone"):
        build_backbone("schnet")
