"""The MACE backbone (``backbone: mace``) under the Bayesian head: shapes, symmetry, forces,
checkpoints and a short training run. Needs mace-torch (skipped without it)."""

from __future__ import annotations

import json
from pathlib import Path

import ase
import ase.io
import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from scipy.spatial.transform import Rotation
from torch_geometric.data import Batch
from typer.testing import CliRunner

pytest.importorskip("mace")

from mlip_unc import UncertaintyCalculator, keys  # noqa: E402
from mlip_unc.cli import app  # noqa: E402
from mlip_unc.config import load_potential_config  # noqa: E402
from mlip_unc.data import TypeMap, atoms_to_graph  # noqa: E402
from mlip_unc.models.backbones import BACKBONES, build_backbone  # noqa: E402
from mlip_unc.models.checkpoint import load_checkpoint  # noqa: E402
from mlip_unc.models.full_posterior import latent_jacobian, latent_probes  # noqa: E402
from mlip_unc.models.potential import BayesianPotential  # noqa: E402
from mlip_unc.nn.mace_backbone import MACEBackbone  # noqa: E402
from mlip_unc.testing import check_backbone  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
R_MAX = 3.0
TYPES = TypeMap.from_list([1, 6, 8])
KWARGS = {
    "latent_dim": 6,
    "channels": 4,
    "max_L": 1,
    "l_max": 2,
    "num_layers": 2,
    "correlation": 2,
    "num_basis": 4,
    "radial_mlp": [8],
    "readout_hidden": [8],
}


def _model(seed: int = 0) -> BayesianPotential:
    torch.manual_seed(seed)
    backbone = build_backbone("mace", num_types=len(TYPES), r_max=R_MAX, **KWARGS)
    offsets = torch.tensor([-13.6, -1029.5, -2041.8], dtype=torch.float64)
    return (
        BayesianPotential(backbone, TYPES.to_list(), R_MAX, offsets, init_std=0.3)
        .to(torch.float64)
        .eval()
    )


@pytest.fixture(scope="module")
def model() -> BayesianPotential:
    return _model()


def _molecule(seed: int = 0, n: int = 6) -> ase.Atoms:
    rng = np.random.default_rng(seed)
    positions: list[np.ndarray] = []
    while len(positions) < n:
        x = rng.uniform(0.0, 2.6, size=3)
        if all(np.linalg.norm(x - p) > 0.9 for p in positions):
            positions.append(x)
    return ase.Atoms(numbers=rng.choice([1, 6, 8], size=n), positions=np.array(positions))


def _crystal() -> ase.Atoms:
    cell = np.array([[2.6, 0.0, 0.0], [0.5, 2.4, 0.0], [0.3, -0.4, 2.8]])
    frac = np.array([[0.0, 0.0, 0.0], [0.45, 0.3, 0.55], [0.2, 0.7, 0.35]])
    return ase.Atoms(numbers=[6, 8, 1], scaled_positions=frac, cell=cell, pbc=True)


def _batch(*atoms_list: ase.Atoms) -> Batch:
    return Batch.from_data_list(
        [atoms_to_graph(a, R_MAX, TYPES, dtype=torch.float64) for a in atoms_list]
    )


@pytest.mark.parametrize("readout", ["mlp", "mace"])
def test_mace_keeps_the_backbone_contract(readout):
    """mlip_unc.testing's contract checks, the backbone built from its options as the trainer
    builds it."""
    options = {k: v for k, v in KWARGS.items() if k != "latent_dim"}
    latent_dim = KWARGS["latent_dim"]
    if readout == "mace":  # the latents are MACE's own: channels x (layers - 1) + readout width
        options = {**options, "readout": "mace", "readout_hidden": [8]}
        latent_dim = KWARGS["channels"] * (KWARGS["num_layers"] - 1) + 8
    checks = check_backbone("mace", options=options, latent_dim=latent_dim)
    assert checks[-1] == "checkpoint"


def test_registered_and_shapes(model):
    assert BACKBONES["mace"] is MACEBackbone
    backbone = model.backbone
    assert backbone.latent_dim == 6 and backbone.r_max == R_MAX
    batch = _batch(_molecule(0), _molecule(1, n=4), _crystal())
    z = backbone(batch)
    assert z.shape == (13, 6) and z.dtype == torch.float64 and torch.isfinite(z).all()
    out = model(batch, compute_stress=True, uncertainty="exact")
    assert out[keys.ENERGY].shape == (3,) and out[keys.FORCES].shape == (13, 3)
    assert out[keys.STRESS].shape == (3, 3, 3) and out[keys.FORCES_VAR].shape == (13, 3)
    assert (out[keys.FORCES_VAR] >= 0).all() and (out[keys.ENERGY_VAR] > 0).all()
    assert model.isolated_latents().shape == (3, 6)  # runs on edge-less graphs


@pytest.mark.parametrize("make", [_molecule, _crystal])
def test_energy_is_invariant_and_forces_rotate(model, make):
    atoms = make()
    ref = model(_batch(atoms))
    rot = Rotation.from_euler("xyz", [0.3, -1.1, 2.0]).as_matrix()
    moved = atoms.copy()
    moved.positions = atoms.positions @ rot.T + np.array([0.7, -2.1, 3.3])
    if atoms.pbc.any():
        moved.cell = atoms.cell.array @ rot.T
    out = model(_batch(moved))
    torch.testing.assert_close(out[keys.ENERGY], ref[keys.ENERGY], rtol=0, atol=1e-9)
    forces = torch.as_tensor(ref[keys.FORCES].detach().numpy() @ rot.T)
    torch.testing.assert_close(out[keys.FORCES].detach(), forces, rtol=0, atol=1e-9)
    perm = np.random.default_rng(3).permutation(len(atoms))
    permuted = model(_batch(atoms[perm]))
    torch.testing.assert_close(permuted[keys.ENERGY], ref[keys.ENERGY], rtol=0, atol=1e-9)
    torch.testing.assert_close(
        permuted[keys.ATOMIC_ENERGIES], ref[keys.ATOMIC_ENERGIES][perm], rtol=0, atol=1e-9
    )


def test_forces_and_stress_match_finite_differences(model):
    for atoms in (_molecule(2), _crystal()):
        out = model(_batch(atoms), compute_stress=bool(atoms.pbc.any()))
        h = 1e-5
        for a in range(len(atoms)):
            for c in range(3):
                plus, minus = atoms.copy(), atoms.copy()
                plus.positions[a, c] += h
                minus.positions[a, c] -= h
                e_p = float(model(_batch(plus), compute_forces=False)[keys.ENERGY])
                e_m = float(model(_batch(minus), compute_forces=False)[keys.ENERGY])
                assert abs(-(e_p - e_m) / (2 * h) - float(out[keys.FORCES][a, c])) < 1e-6
        if atoms.pbc.any():  # stress = (1/V) dE/d(strain), symmetric strain
            volume = atoms.get_volume()
            for i, j in ((0, 0), (1, 2), (0, 1)):
                strain = np.zeros((3, 3))
                strain[i, j] = strain[j, i] = h
                energies = []
                for sign in (1, -1):
                    deformed = atoms.copy()
                    deformed.set_cell(
                        atoms.cell.array @ (np.eye(3) + sign * strain), scale_atoms=True
                    )
                    energies.append(
                        float(model(_batch(deformed), compute_forces=False)[keys.ENERGY])
                    )
                expected = (energies[0] - energies[1]) / (2 * h) / volume / (2 if i != j else 1)
                assert abs(expected - float(out[keys.STRESS][0, i, j])) < 1e-7


def test_posterior_probes_run_in_forward_mode_through_mace(model):
    """The sketched fit (``model.posterior_probes`` of the shipped MACE configs) needs
    forward-mode AD through MACE's blocks: each probe equals ``J z`` of the reverse Jacobian."""
    batch = _batch(_molecule(0), _crystal())
    _, y = latent_probes(model, batch, 1, 3, generator=torch.Generator().manual_seed(2))
    _, _, jac = latent_jacobian(model, batch, 1, method="reverse")  # (d, n_atoms, 3)
    signs = torch.randint(0, 2, (3, batch.num_nodes, 3), generator=torch.Generator().manual_seed(2))
    per_atom = torch.einsum("dac,pac->pad", jac, (2.0 * signs - 1).double())
    expected = torch.zeros(3, 2, 6, dtype=torch.float64).index_add(1, batch.batch, per_atom)
    torch.testing.assert_close(y, expected, rtol=1e-8, atol=1e-10)


def test_checkpoint_round_trip_is_plain_data(model, tmp_path):
    path = tmp_path / "mace.pt"
    model.save(path)
    payload = load_checkpoint(path, kind="potential")  # weights_only=True
    assert payload["config"]["backbone"]["name"] == "mace"
    again = BayesianPotential.from_checkpoint(path).eval()
    batch = _batch(_molecule(4), _crystal())
    for key in (keys.ENERGY, keys.FORCES):
        torch.testing.assert_close(again(batch)[key], model(batch)[key], rtol=0, atol=0)


def test_reset_parameters_draws_new_weights():
    model = _model(seed=1)
    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    model.backbone.reset_parameters()
    after = model.backbone.state_dict()
    assert set(before) == set(after)
    assert any(
        not torch.equal(before[k], after[k]) for k in before if before[k].is_floating_point()
    )


def test_shipped_config_builds_a_spanning_backbone():
    cfg = load_potential_config(
        ROOT / "configs" / "ethanol_mace.yaml", ["data_root=/nowhere"]
    ).model
    backbone = build_backbone(
        cfg.backbone.value, num_types=3, r_max=5.0, latent_dim=cfg.latent_dim, **cfg.backbone_kwargs
    )
    assert backbone.latent_dim == cfg.latent_dim == 48 and backbone.readout_kind == "mace"
    with pytest.raises(ValueError, match="latent_dim"):
        build_backbone(
            "mace", num_types=3, latent_dim=9, channels=2, num_layers=2
        )  # 2 x 2 scalars < 9


def test_mace_readout_keeps_layer_scalars_and_is_symmetric_with_exact_forces(tmp_path):
    """readout='mace': latents = layer-1 scalars, then SiLU(Linear(layer-2 scalars)); the potential
    stays invariant, its forces are the energy's derivatives, and the checkpoint rebuilds it."""
    kwargs = {**KWARGS, "readout": "mace", "readout_hidden": [3], "latent_dim": 4 + 3}
    with pytest.raises(ValueError, match="latent_dim must be 7"):
        build_backbone("mace", num_types=3, r_max=R_MAX, **{**kwargs, "latent_dim": 6})
    with pytest.raises(ValueError, match="one MLP width"):
        build_backbone("mace", num_types=3, r_max=R_MAX, **{**kwargs, "readout_hidden": [3, 3]})
    torch.manual_seed(0)
    backbone = build_backbone("mace", num_types=3, r_max=R_MAX, **kwargs)
    offsets = torch.tensor([-13.6, -1029.5, -2041.8], dtype=torch.float64)
    model = (
        BayesianPotential(backbone, TYPES.to_list(), R_MAX, offsets, init_std=0.3)
        .to(torch.float64)
        .eval()
    )
    atoms = _molecule(5)
    batch = _batch(atoms)
    z = model.backbone(batch)
    from mlip_unc.nn.mace_backbone import mace_inputs, mace_layer_features

    layers = mace_layer_features(model.backbone.mace, *mace_inputs(batch, 3))
    torch.testing.assert_close(
        z[:, :4], layers[0][:, :4], rtol=0, atol=0
    )  # layer-1 0e block, as is
    assert z.shape == (len(atoms), 7) and (z[:, 4:] > -0.28).all()  # SiLU >= -0.2785
    ref = model(batch)
    rot = Rotation.from_euler("xyz", [0.9, 0.2, -1.4]).as_matrix()
    moved = atoms.copy()
    moved.positions = atoms.positions @ rot.T + np.array([1.0, 0.5, -0.3])
    out = model(_batch(moved))
    torch.testing.assert_close(out[keys.ENERGY], ref[keys.ENERGY], rtol=0, atol=1e-9)
    torch.testing.assert_close(
        out[keys.FORCES].detach(),
        torch.as_tensor(ref[keys.FORCES].detach().numpy() @ rot.T),
        rtol=0,
        atol=1e-9,
    )
    h, a, c = 1e-5, 2, 1
    plus, minus = atoms.copy(), atoms.copy()
    plus.positions[a, c] += h
    minus.positions[a, c] -= h
    energy = [float(model(_batch(x), compute_forces=False)[keys.ENERGY]) for x in (plus, minus)]
    fd = -(energy[0] - energy[1]) / (2 * h)
    assert abs(fd - float(ref[keys.FORCES][a, c])) < 1e-6
    model.save(tmp_path / "m.pt")
    again = BayesianPotential.from_checkpoint(tmp_path / "m.pt").eval()
    torch.testing.assert_close(again(batch)[keys.FORCES], ref[keys.FORCES], rtol=0, atol=0)
    normed = build_backbone("mace", num_types=3, r_max=R_MAX, **kwargs, latent_norm=True).to(
        torch.float64
    )
    normed.load_state_dict(model.backbone.state_dict())  # the same weights, latents / sqrt(7)
    torch.testing.assert_close(normed(batch), z / 7**0.5, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="latent_norm"):
        build_backbone("mace", num_types=3, r_max=R_MAX, **KWARGS, latent_norm=True)  # readout mlp


def test_twenty_training_steps_with_this_projects_trainer(tmp_path):
    """`mlip-unc train` on the shipped MACE config (smaller widths): 5 epochs x 4 batches."""
    frames = []
    for k in range(10):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms.numbers[0] = 79
        atoms.rattle(0.1, seed=k)
        atoms.calc = EMT()
        atoms.calc = SinglePointCalculator(
            atoms, energy=atoms.get_potential_energy(), forces=atoms.get_forces()
        )
        frames.append(atoms)
    ase.io.write(tmp_path / "train.xyz", frames)
    out = tmp_path / "run"
    overrides = [
        f"data.train={tmp_path / 'train.xyz'}",
        "data.test=null",
        "data.isolated_atoms=null",
        "data.r_max=4.0",
        "data.valid_fraction=0.2",
        "train.epochs=5",
        "train.batch_size=2",
        "train.max_minutes=null",
        "train.progress=false",
        "model.latent_dim=8",
        "dtype=float64",
        (
            "model.backbone_kwargs={channels: 4, max_L: 1, l_max: 2, num_layers: 2, correlation: 2, num_basis: 4, "
            "radial_mlp: [8], readout_hidden: [8]}"
        ),
    ]
    args = ["train", "--config", str(ROOT / "configs" / "ethanol_mace.yaml"), "--out", str(out)]
    result = CliRunner().invoke(app, args + [a for o in overrides for a in ("--set", o)])
    assert result.exit_code == 0, result.output
    history = json.loads((out / "history.json").read_text())
    assert len(history["epochs"]) == 5
    assert history["epochs"][-1]["valid_loss"] < history["initial"]["valid_loss"]
    calc = UncertaintyCalculator(out / "model.pt")
    atoms = frames[0].copy()
    atoms.calc = calc
    assert np.isfinite(atoms.get_forces()).all() and calc.get_property("max_force_std") > 0
