"""Radial bases, cutoff envelopes and the two backbones (GeometricGIN, EquivariantBackbone)."""

from __future__ import annotations

import copy

import ase
import numpy as np
import pytest
import torch
from e3nn import o3
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.data import TypeMap, atoms_to_graph
from mlip_unc.models.backbones import BACKBONES, build_backbone
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.models.potential_checkpoint import potential_payload
from mlip_unc.nn.equivariant import EquivariantInteraction
from mlip_unc.nn.geometric_gin import GeometricGINLayer
from mlip_unc.nn.power_spectrum import edge_spherical_harmonics
from mlip_unc.nn.radial import (
    BesselBasis,
    CosineCutoff,
    GaussianBasis,
    PolynomialCutoff,
    RadialEmbedding,
    checkpoint_backbone_kwargs,
)
from mlip_unc.testing import check_backbone

R_MAX = 3.0
TYPES = TypeMap.from_list([1, 6, 8])
OFFSETS = torch.tensor([-13.6, -1029.5, -2041.8], dtype=torch.float64)
KWARGS = {
    "gin": {"hidden": 16, "latent_dim": 8, "num_layers": 2, "num_basis": 6},
    "equivariant": {"latent_dim": 4, "channels": 4, "l_max": 2, "num_layers": 2, "num_basis": 6},
}
RICH = {"concat_layers": True, "readout_hidden": [64]}
# (id, backbone name, kwargs): today's architecture and the rich readout (method.md 3b)
VARIANTS = {
    "gin": ("gin", KWARGS["gin"]),
    "equivariant": ("equivariant", KWARGS["equivariant"]),
    "gin-rich": ("gin", {**KWARGS["gin"], **RICH, "latent_dim": 16}),
    "equivariant-rich": ("equivariant", {**KWARGS["equivariant"], **RICH, "latent_dim": 16}),
    "gin-angular": ("gin", {**KWARGS["gin"], "angular_l_max": 2, "angular_channels": 4}),
    "equivariant-angular": (
        "equivariant",
        {
            **KWARGS["equivariant"],
            **RICH,
            "latent_dim": 16,
            "l_max": 1,
            "angular_l_max": 2,
            "angular_channels": 4,
        },
    ),
}


def _backbone(variant: str, seed: int = 0):
    name, kwargs = VARIANTS[variant]
    torch.manual_seed(seed)
    return build_backbone(name, num_types=len(TYPES), r_max=R_MAX, **kwargs).double()


def _graph(seed: int = 0, n: int = 6) -> Batch:
    rng = np.random.default_rng(seed)
    atoms = ase.Atoms(numbers=rng.choice([1, 6, 8], size=n), positions=rng.uniform(0, 2.5, (n, 3)))
    return Batch.from_data_list([atoms_to_graph(atoms, R_MAX, TYPES)])


# ---------------------------------------------------------------- radial
@pytest.mark.parametrize("envelope", [PolynomialCutoff(R_MAX, p=6), CosineCutoff(R_MAX)])
def test_envelopes_vanish_smoothly_at_cutoff(envelope):
    r = torch.tensor(
        [1e-3, R_MAX - 1e-9, R_MAX, R_MAX + 0.5], dtype=torch.float64, requires_grad=True
    )
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
    assert (
        features.shape == (3, 4) and torch.all(features[1:] == 0) and torch.all(envelope[1:] == 0)
    )
    with pytest.raises(ValueError):
        RadialEmbedding(R_MAX, 4, basis="chebyshev")


# ---------------------------------------------------------------- backbones
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_backbone_keeps_the_contract(variant):
    """mlip_unc.testing's contract checks: shapes, dtypes, invariances, periodic images,
    finite-difference forces and stress, batch = singles, smooth cutoff, free atoms,
    reset_parameters and the checkpoint round trip, on a potential built on each variant."""
    name, kwargs = VARIANTS[variant]
    options = {k: v for k, v in kwargs.items() if k != "latent_dim"}
    checks = check_backbone(name, options=options, latent_dim=kwargs["latent_dim"])
    assert {"finite_difference_forces", "energy_invariance", "checkpoint"} <= set(checks)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_reset_parameters_redraws_every_weight(variant):
    backbone = _backbone(variant, seed=0)
    before = [p.detach().clone() for p in backbone.parameters()]
    backbone.reset_parameters()
    assert all(
        not torch.equal(a, b)
        for a, b in zip(before, backbone.parameters(), strict=True)
        if a.numel() > 1
    )


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
    torch.set_default_dtype(
        torch.float64
    )  # e3nn builds its D-matrix generators in the default dtype
    try:
        d_matrix = layer.irreps_out.D_from_matrix(rot)
    finally:
        torch.set_default_dtype(previous)
    assert layer.irreps_out.lmax == 2
    torch.testing.assert_close(captured[1], captured[0] @ d_matrix.T, rtol=1e-9, atol=1e-11)


def test_unknown_backbone_name():
    with pytest.raises(ValueError, match="unknown backbone"):
        build_backbone("schnet")


# ---------------------------------------------------------------- readout options
def test_default_readout_is_the_linear_map_of_old_checkpoints():
    for variant in ("gin", "equivariant"):
        names = {k for k, _ in _backbone(variant).named_parameters() if k.startswith("readout")}
        assert names == {"readout.weight", "readout.bias"}
    rich = _backbone("equivariant-rich")
    assert rich.readout[0].in_features == 4 * 2 and rich.readout[0].out_features == 64
    assert _backbone("gin-rich").readout[0].in_features == 16 * 2


@pytest.mark.parametrize(
    ("name", "kwargs", "width"),
    [
        ("gin", {"hidden": 8, "latent_dim": 9, "num_layers": 2}, "8"),
        ("gin", {"hidden": 8, "latent_dim": 17, "num_layers": 2, "concat_layers": True}, "16"),
        ("equivariant", {"channels": 4, "latent_dim": 5, "num_layers": 2}, "4"),
        (
            "equivariant",
            {"channels": 4, "latent_dim": 9, "num_layers": 2, "concat_layers": True},
            "8",
        ),
        ("equivariant", {"channels": 4, "latent_dim": 8, "readout_hidden": [6]}, "6"),
    ],
)
def test_latent_dim_beyond_the_readout_width_is_an_error(name, kwargs, width):
    with pytest.raises(
        ValueError, match=rf"latent_dim = {kwargs['latent_dim']} exceeds .*\b{width}\b"
    ):
        build_backbone(name, num_types=2, r_max=R_MAX, **kwargs)
    fixed = {**kwargs, "concat_layers": True, "readout_hidden": [32]}
    assert (
        build_backbone(name, num_types=2, r_max=R_MAX, **fixed).latent_dim == kwargs["latent_dim"]
    )


def test_old_checkpoint_configs_rebuild_without_the_span_check():
    old = {
        "num_types": 2,
        "r_max": R_MAX,
        "latent_dim": 32,
        "channels": 16,
        "l_max": 1,
        "num_layers": 2,
    }
    with pytest.raises(ValueError, match="latent_dim"):
        build_backbone("equivariant", **old)
    cls = BACKBONES["equivariant"]
    backbone = build_backbone("equivariant", **checkpoint_backbone_kwargs(cls, old))
    config = backbone.config()  # re-saved: says it was built unchecked, and rebuilds
    assert config["check_latent_span"] is False and not config["concat_layers"]
    assert build_backbone("equivariant", **checkpoint_backbone_kwargs(cls, config)).latent_dim == 32
    assert checkpoint_backbone_kwargs(None, old) == old  # unregistered: untouched


# ---------------------------------------------------------------- physics of every variant
def _potential(variant: str) -> BayesianPotential:
    model = BayesianPotential(_backbone(variant), TYPES.to_list(), R_MAX, OFFSETS, init_std=0.3)
    return model.to(torch.float64).eval()


def _molecule(seed: int = 0, n: int = 6) -> ase.Atoms:
    rng = np.random.default_rng(seed)
    positions: list[np.ndarray] = []
    while len(positions) < n:
        x = rng.uniform(0.0, 2.6, size=3)
        if all(np.linalg.norm(x - q) > 0.9 for q in positions):
            positions.append(x)
    return ase.Atoms(numbers=rng.choice([1, 6, 8], size=n), positions=np.array(positions))


def _batch(*atoms_list: ase.Atoms) -> Batch:
    return Batch.from_data_list([atoms_to_graph(a, R_MAX, TYPES) for a in atoms_list])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_force_uncertainty_is_invariant_and_per_structure(variant):
    """The exact force variances of the potential built on each variant: invariant under
    rotation, translation and permutation, and a batch of two gives each structure's own (the
    energies and forces themselves: test_backbone_keeps_the_contract)."""
    model = _potential(variant)
    atoms = _molecule(n=5)
    ref = model(_batch(atoms), uncertainty="exact")
    torch.manual_seed(3)
    rot = o3.rand_matrix(dtype=torch.float64)
    perm = np.random.default_rng(0).permutation(len(atoms))
    moved = atoms.copy()
    moved.positions = atoms.positions @ rot.numpy().T + np.array([0.3, -1.2, 2.0])
    out = model(_batch(moved[perm]), uncertainty="exact")
    torch.testing.assert_close(
        out[keys.FORCES_VAR].sum(), ref[keys.FORCES_VAR].sum(), rtol=1e-8, atol=1e-14
    )
    torch.testing.assert_close(out[keys.ENERGY_VAR], ref[keys.ENERGY_VAR], rtol=1e-8, atol=1e-14)
    other = _molecule(seed=4, n=4)
    both = model(_batch(atoms, other), uncertainty="exact")
    single = model(_batch(other), uncertainty="exact")
    torch.testing.assert_close(
        both[keys.FORCES_VAR], torch.cat([ref[keys.FORCES_VAR], single[keys.FORCES_VAR]])
    )


def _two_bonds(width: int, l_max: int):
    """Centre atom 0 with two neighbours 1.4 A away, 60 or 150 degrees apart, only their edges to it:
    (h, edge_index, edge_attr, envelope, {angle: (bond vectors, power-spectrum harmonics or None)})."""
    torch.manual_seed(0)
    edge_attr, weight = RadialEmbedding(R_MAX, 6).double()(
        torch.full((2,), 1.4, dtype=torch.float64)
    )
    bonds = {}
    for angle in (60.0, 150.0):
        t = np.radians(angle)
        vec = 1.4 * torch.tensor(
            [[1.0, 0.0, 0.0], [np.cos(t), np.sin(t), 0.0]], dtype=torch.float64
        )
        bonds[angle] = (vec, edge_spherical_harmonics(vec, l_max) if l_max else None)
    return (
        torch.randn(3, width, dtype=torch.float64),
        torch.tensor([[1, 2], [0, 0]]),
        edge_attr,
        weight,
        bonds,
    )


@pytest.mark.parametrize("l_max", [0, 2])
def test_the_angular_gin_layer_sees_the_bond_angle_the_radial_one_cannot(l_max):
    """A distances-only layer gives the centre the same update at both angles, the power spectrum
    (l_max 2) does not."""
    h, edge_index, edge_attr, weight, bonds = _two_bonds(8, l_max)
    layer = GeometricGINLayer(8, 6, angular_l_max=l_max, angular_channels=4).double()
    centre = [
        layer(h, edge_index, edge_attr=edge_attr, edge_weight=weight, edge_sh=sh)[0]
        for _, sh in bonds.values()
    ]
    if l_max == 0:
        torch.testing.assert_close(centre[0], centre[1], rtol=0, atol=0)
    else:
        assert (centre[0] - centre[1]).abs().max() > 1e-3


@pytest.mark.parametrize("l_max", [0, 2])
def test_the_angular_equivariant_block_gives_the_centre_scalars_the_bond_angle(l_max):
    """The same two bonds through a first equivariant block (scalars in, 0e + 1o out): its scalar
    outputs at the centre see the angle only with the power spectrum."""
    h, edge_index, edge_attr, weight, bonds = _two_bonds(4, l_max)
    irreps_sh = o3.Irreps.spherical_harmonics(1)
    block = EquivariantInteraction(
        o3.Irreps("4x0e"),
        irreps_sh,
        o3.Irreps("4x0e + 4x1o"),
        num_basis=6,
        angular_l_max=l_max,
        angular_channels=4,
    ).double()
    block.reset_parameters()
    centre = []
    for vec, angular in bonds.values():
        sh = o3.spherical_harmonics(irreps_sh, vec, normalize=True, normalization="component")
        out = block(
            h, edge_index, sh=sh, edge_attr=edge_attr, edge_weight=weight, edge_sh_angular=angular
        )
        centre.append(out[0, :4])  # the 0e channels
    if l_max == 0:
        torch.testing.assert_close(centre[0], centre[1], rtol=0, atol=1e-12)
    else:  # small at initialisation (squared small density weights), far above rounding
        assert (centre[0] - centre[1]).abs().max() > 1e-6


@pytest.mark.parametrize(
    "variant", ["gin-rich", "equivariant-rich", "gin-angular", "equivariant-angular"]
)
def test_rich_potential_checkpoint_round_trip(variant):
    model = _potential(variant)
    again = BayesianPotential.from_checkpoint(potential_payload(model)).to(torch.float64).eval()
    batch = _batch(_molecule(seed=5, n=5))
    torch.testing.assert_close(again(batch)[keys.ENERGY], model(batch)[keys.ENERGY], rtol=0, atol=0)


POTENTIAL_CONFIGS = (
    "3bpa_equivariant",
    "3bpa_gin",
    "ethanol_equivariant",
    "ethanol_gin",
    "ethanol_gin_agl",
    "ethanol_committee",
    "tiny_emt",
    "mlearn_equivariant",
    "mlearn_gin",
)


@pytest.mark.parametrize("name", POTENTIAL_CONFIGS)
def test_shipped_configs_build_a_spanning_backbone(name):
    """Each shipped potential config passes the latent-span check (latent_dim <= readout width)."""
    from pathlib import Path

    from mlip_unc.config import load_potential_config

    path = Path(__file__).resolve().parents[2] / "configs" / f"{name}.yaml"
    model = load_potential_config(path, ["data_root=/nowhere"]).model
    backbone = build_backbone(
        model.backbone.value,
        num_types=2,
        r_max=R_MAX,
        latent_dim=model.latent_dim,
        **model.backbone_kwargs,
    )
    assert backbone.latent_dim == model.latent_dim
