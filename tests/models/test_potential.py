"""BayesianPotential physics and uncertainty checks on both backbones (float64, tiny models)."""

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
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.checkpoint import load_checkpoint
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.models.potential_uncertainty import UncertaintyMode

R_MAX = 3.0
TYPES = TypeMap.from_list([1, 6, 8])
OFFSETS = torch.tensor([-13.6, -1029.5, -2041.8], dtype=torch.float64)
BACKBONE_KWARGS = {
    "gin": {"hidden": 16, "latent_dim": 8, "num_layers": 2, "num_basis": 6},
    "equivariant": {"latent_dim": 4, "channels": 4, "l_max": 2, "num_layers": 2, "num_basis": 6},
}


def _model(name: str, seed: int = 0, **kwargs) -> BayesianPotential:
    torch.manual_seed(seed)
    backbone = build_backbone(name, num_types=len(TYPES), r_max=R_MAX, **BACKBONE_KWARGS[name])
    model = BayesianPotential(backbone, TYPES.to_list(), R_MAX, OFFSETS, init_std=0.3, **kwargs)
    with torch.no_grad():  # spread the posterior stds so no test relies on isotropy
        model.head.weight_rho.add_(0.5 * torch.randn_like(model.head.weight_rho))
    return model.to(torch.float64).eval()


@pytest.fixture(scope="module", params=["gin", "equivariant"])
def model(request) -> BayesianPotential:
    return _model(request.param)


def _molecule(seed: int = 0, n: int = 6) -> ase.Atoms:
    """Random non-periodic molecule, pair distances >= 0.9 A, most pairs inside R_MAX."""
    rng = np.random.default_rng(seed)
    positions: list[np.ndarray] = []
    while len(positions) < n:
        x = rng.uniform(0.0, 2.6, size=3)
        if all(np.linalg.norm(x - p) > 0.9 for p in positions):
            positions.append(x)
    numbers = rng.choice([1, 6, 8], size=n)
    return ase.Atoms(numbers=numbers, positions=np.array(positions))


def _crystal() -> ase.Atoms:
    """3 atoms in a small triclinic cell, smaller than the cutoff (atoms see their images)."""
    cell = np.array([[2.6, 0.0, 0.0], [0.5, 2.4, 0.0], [0.3, -0.4, 2.8]])
    frac = np.array([[0.0, 0.0, 0.0], [0.45, 0.3, 0.55], [0.2, 0.7, 0.35]])
    return ase.Atoms(numbers=[6, 8, 1], scaled_positions=frac, cell=cell, pbc=True)


def _batch(*atoms_list: ase.Atoms) -> Batch:
    return Batch.from_data_list([atoms_to_graph(a, R_MAX, TYPES) for a in atoms_list])


def _with(batch: Batch, **fields) -> Batch:
    new = copy.copy(batch)
    for key, value in fields.items():
        new[key] = value
    return new


def _rand_rotation(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)  # e3nn's rand_matrix takes no generator
    return o3.rand_matrix(dtype=torch.float64)


def _energy(model, batch) -> float:
    return model(batch, compute_forces=False)[keys.ENERGY].sum().item()


# ---------------------------------------------------------------- derivatives
def test_forces_equal_minus_energy_gradient(model):
    batch = _batch(_molecule(n=6))
    forces = model(batch)[keys.FORCES]
    h, pos = 1e-5, batch.pos
    numeric = torch.zeros_like(pos)
    for a in range(pos.shape[0]):
        for c in range(3):
            step = torch.zeros_like(pos)
            step[a, c] = h
            plus = _energy(model, _with(batch, pos=pos + step))
            minus = _energy(model, _with(batch, pos=pos - step))
            numeric[a, c] = -(plus - minus) / (2 * h)
    assert forces.abs().max() > 1e-3  # a non-trivial check
    torch.testing.assert_close(forces, numeric, rtol=1e-6, atol=1e-6 * forces.abs().max().item())


def test_stress_equals_strain_derivative(model):
    batch = _batch(_crystal())
    out = model(batch, compute_stress=True)
    stress = out[keys.STRESS][0]
    cell, pos = batch.cell[0], batch.pos
    volume = torch.linalg.det(cell).abs()
    h, numeric = 1e-5, torch.zeros(3, 3, dtype=torch.float64)
    for a in range(3):
        for b in range(3):
            sym = torch.zeros(3, 3, dtype=torch.float64)
            sym[a, b] += 0.5
            sym[b, a] += 0.5
            energies = []
            for sign in (1.0, -1.0):
                deform = torch.eye(3, dtype=torch.float64) + sign * h * sym
                strained = _with(batch, pos=pos @ deform, cell=(cell @ deform)[None])
                energies.append(_energy(model, strained))
            numeric[a, b] = (energies[0] - energies[1]) / (2 * h) / volume
    assert stress.abs().max() > 1e-3
    torch.testing.assert_close(stress, numeric, rtol=1e-6, atol=1e-6 * stress.abs().max().item())
    torch.testing.assert_close(stress, stress.T)


# ---------------------------------------------------------------- symmetries
def test_rotation_translation_permutation(model):
    atoms = _molecule(seed=1, n=6)
    ref = model(_batch(atoms), uncertainty="energy")
    rot = _rand_rotation(0)
    moved = atoms.copy()
    moved.positions = atoms.positions @ rot.numpy().T + np.array([0.3, -1.2, 2.0])
    perm = np.random.default_rng(0).permutation(len(atoms))
    moved = moved[perm]
    out = model(_batch(moved), uncertainty="energy")
    perm_t = torch.as_tensor(perm)
    torch.testing.assert_close(out[keys.ENERGY], ref[keys.ENERGY], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(
        out[keys.FORCES], ref[keys.FORCES][perm_t] @ rot.T, rtol=1e-8, atol=1e-10
    )
    torch.testing.assert_close(
        out[keys.NODE_LATENT], ref[keys.NODE_LATENT][perm_t], rtol=1e-8, atol=1e-10
    )
    for key in (keys.ENERGY_VAR, keys.KAPPA):
        torch.testing.assert_close(out[key], ref[key], rtol=1e-8, atol=1e-12)


def test_periodic_rotation_rotates_stress(model):
    batch = _batch(_crystal())
    ref = model(batch, compute_stress=True)
    rot = _rand_rotation(1)
    out = model(_with(batch, pos=batch.pos @ rot.T, cell=batch.cell @ rot.T), compute_stress=True)
    torch.testing.assert_close(out[keys.ENERGY], ref[keys.ENERGY], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out[keys.FORCES], ref[keys.FORCES] @ rot.T, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(
        out[keys.STRESS][0], rot @ ref[keys.STRESS][0] @ rot.T, rtol=1e-8, atol=1e-10
    )


# ---------------------------------------------------------------- batching, cutoff, isolated atoms
@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_batch_of_two_equals_singles(model, mode):
    mol, crystal = _molecule(seed=2, n=5), _crystal()
    kwargs = {"compute_stress": True, "uncertainty": mode, "n_samples": 3}
    both = model(_batch(mol, crystal), generator=torch.Generator().manual_seed(5), **kwargs)
    singles = [
        model(_batch(a), generator=torch.Generator().manual_seed(5), **kwargs)
        for a in (mol, crystal)
    ]
    n_mol = len(mol)
    for key, value in both.items():
        if value.shape[0] == 2:  # per graph
            parts = (value[:1], value[1:])
        else:  # per atom
            parts = (value[:n_mol], value[n_mol:])
        for part, single in zip(parts, singles, strict=False):
            torch.testing.assert_close(part, single[key], rtol=1e-10, atol=1e-12, msg=key)
    assert torch.all(both[keys.STRESS][0] == 0) and torch.all(both[keys.STRESS_VAR][0] == 0)


def test_energy_continuous_across_cutoff(model):
    dimers = [ase.Atoms("CO", positions=[[0, 0, 0], [0, 0, R_MAX + d]]) for d in (-1e-6, 1e-6)]
    inside, outside = (model(_batch(a), uncertainty="exact") for a in dimers)
    assert _batch(dimers[0]).edge_index.shape[1] == 2 and _batch(dimers[1]).edge_index.shape[1] == 0
    torch.testing.assert_close(inside[keys.ENERGY], outside[keys.ENERGY], rtol=0, atol=1e-8)
    assert inside[keys.FORCES].abs().max() < 1e-8
    assert inside[keys.FORCES_VAR].max() < 1e-16 and inside[keys.ENERGY_EPISTEMIC_VAR].max() < 1e-16


def test_isolated_atoms_get_their_offsets(model):
    atoms = ase.Atoms("HCO", positions=[[0, 0, 0], [10, 0, 0], [0, 10, 0]])
    expected = OFFSETS.sum()
    for module_mode in ("eval", "train"):
        getattr(model, module_mode)()
        out = model(_batch(atoms), uncertainty="exact")
        torch.testing.assert_close(out[keys.ENERGY][0], expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(out[keys.ATOMIC_ENERGIES], OFFSETS, rtol=0, atol=1e-12)
        assert out[keys.ENERGY_EPISTEMIC_VAR].item() == 0 and out[keys.FORCES].abs().max() == 0
        sample = model(_batch(atoms), training=True)
        torch.testing.assert_close(sample[keys.ENERGY][0], expected, rtol=0, atol=1e-12)
    model.eval()


# ---------------------------------------------------------------- uncertainty
def _latent_jacobian(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi (d,) and dPhi/dpos (d, n_atoms, 3) by an independent autograd loop."""
    pos = batch.pos.clone().requires_grad_(True)
    phi = model(_with(batch, pos=pos), compute_forces=False)[keys.LATENT][0]
    jac = torch.stack(
        [torch.autograd.grad(phi[k], pos, retain_graph=True)[0] for k in range(phi.shape[0])]
    )
    return phi.detach(), jac


def test_closed_form_variances_match_posterior_draws(model):
    batch = _batch(_molecule(seed=3, n=6))
    out = model(batch, uncertainty="exact")
    phi, jac = _latent_jacobian(model, batch)
    w, _ = model.head.sample_weights(40_000, generator=torch.Generator().manual_seed(0))
    w = w[:, 0, :].detach()  # (S, d)
    energies = w @ phi  # (S,)
    forces = -torch.einsum("sk,kac->sac", w, jac)  # (S, n_atoms, 3)
    torch.testing.assert_close(
        energies.var(0), out[keys.ENERGY_EPISTEMIC_VAR][0].detach(), rtol=0.03, atol=0
    )
    torch.testing.assert_close(forces.var(0), out[keys.FORCES_VAR].detach(), rtol=0.03, atol=0)
    scale = out[keys.FORCES_VAR].sqrt().max().item()
    torch.testing.assert_close(forces.mean(0), out[keys.FORCES].detach(), rtol=0, atol=0.05 * scale)
    energy = out[keys.ENERGY][0] - OFFSETS[batch[keys.ATOM_TYPE]].sum()
    torch.testing.assert_close(
        energies.mean(), energy.detach(), rtol=0, atol=0.05 * energies.std().item()
    )


def test_energy_mode_outputs(model):
    batch = _batch(_molecule(seed=4, n=5), _crystal())
    out = model(batch, compute_forces=False, uncertainty=UncertaintyMode.ENERGY)
    mu, s2 = model.posterior()
    phi, z = out[keys.LATENT], out[keys.NODE_LATENT]
    torch.testing.assert_close(out[keys.ENERGY_EPISTEMIC_VAR], (phi**2) @ s2)
    torch.testing.assert_close(out[keys.LOCAL_ENERGY_VAR], (z**2) @ s2)
    noise = model.noise_variances(batch)
    n_atoms = torch.tensor([5.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(out[keys.ENERGY_ALEATORIC_VAR], n_atoms * model.energy_noise**2)
    torch.testing.assert_close(noise[keys.ENERGY], out[keys.ENERGY_ALEATORIC_VAR])
    assert noise[keys.FORCES].shape == (8, 3)
    total = out[keys.ENERGY_EPISTEMIC_VAR] + out[keys.ENERGY_ALEATORIC_VAR]
    torch.testing.assert_close(out[keys.ENERGY_VAR], total)
    u = phi / phi.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(out[keys.KAPPA], (u**2) @ s2 / s2.mean())
    assert keys.FORCES not in out


def test_sampled_mode_replays_draws_and_agrees_with_exact(model):
    batch = _batch(_crystal())
    exact = model(batch, compute_stress=True, uncertainty="exact")
    # (a) the sampled variance is the sample variance of J^T w_k for the very draws it used
    kwargs = {"compute_stress": True, "uncertainty": "sampled"}
    small = model(batch, n_samples=5, generator=torch.Generator().manual_seed(3), **kwargs)
    w, _ = model.head.sample_weights(5, generator=torch.Generator().manual_seed(3))
    phi, jac = _latent_jacobian(model, batch)
    draws = -torch.einsum("sk,kac->sac", w[:, 0, :].detach(), jac)
    torch.testing.assert_close(small[keys.FORCES_VAR], draws.var(0), rtol=1e-9, atol=1e-14)
    torch.testing.assert_close(small[keys.FORCES], exact[keys.FORCES], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(small[keys.STRESS], exact[keys.STRESS], rtol=1e-10, atol=1e-12)
    # (b) many draws agree with the exact variance within sampling error (rel. std sqrt(2/K))
    big_model = copy.deepcopy(model)
    big_model.gradient_method = "batched"
    k = 2000
    big = big_model(batch, n_samples=k, generator=torch.Generator().manual_seed(4), **kwargs)
    for key in (keys.FORCES_VAR, keys.STRESS_VAR):  # relative std sqrt(2/K) = 3 %
        torch.testing.assert_close(big[key], exact[key], rtol=0.10, atol=0, msg=key)
        assert abs(big[key].sum() / exact[key].sum() - 1) < 0.05, key


def test_gradient_methods_agree(model):
    batch = _batch(_molecule(seed=9, n=5), _crystal())
    loop_model = copy.deepcopy(model)
    loop_model.gradient_method = "loop"
    kwargs = {"compute_stress": True, "uncertainty": "exact"}
    ref, out = model(batch, **kwargs), loop_model(batch, **kwargs)
    for key in (keys.FORCES, keys.FORCES_VAR, keys.STRESS, keys.STRESS_VAR):
        torch.testing.assert_close(out[key], ref[key], rtol=1e-10, atol=1e-14, msg=key)


# ---------------------------------------------------------------- cost contract
def test_energy_only_calls_run_no_backward(model, monkeypatch):
    batch = _batch(_molecule(seed=5, n=5))
    seen = []
    handle = model.backbone.register_forward_pre_hook(
        lambda mod, args: seen.append(args[0].pos.requires_grad)
    )

    def forbidden(*args, **kwargs):
        raise AssertionError("a backward pass ran during an energy-only call")

    monkeypatch.setattr(torch.autograd, "grad", forbidden)
    monkeypatch.setattr(torch.autograd, "backward", forbidden)
    try:
        out = model(batch, compute_forces=False, uncertainty="energy")
    finally:
        handle.remove()
    assert not any(seen) and not batch.pos.requires_grad and keys.FORCES not in out
    with torch.no_grad():
        assert model(batch, compute_forces=False)[keys.ENERGY].grad_fn is None


def test_training_forward_trains_force_uncertainty(model):
    batch = _batch(_molecule(seed=6, n=5), _crystal())
    model.train()
    try:
        out = model(
            batch, training=True, compute_stress=True, generator=torch.Generator().manual_seed(0)
        )
        again = model.sample_forward(
            batch, compute_stress=True, generator=torch.Generator().manual_seed(0)
        )
        mean = model(batch, compute_stress=True)
        torch.testing.assert_close(out[keys.FORCES], again[keys.FORCES])
        assert not torch.allclose(out[keys.FORCES], mean[keys.FORCES])
        loss = out[keys.FORCES].square().sum() + out[keys.STRESS].square().sum() + model.kl()
        loss.backward()
        for param in (
            model.head.weight_mu,
            model.head.weight_rho,
            next(model.backbone.parameters()),
        ):
            assert param.grad is not None and param.grad.abs().sum() > 0
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


# ---------------------------------------------------------------- checkpoints and dtypes
def test_checkpoint_round_trip(model, tmp_path):
    batch = _batch(_molecule(seed=7, n=5), _crystal())
    path = tmp_path / "potential.pt"
    model.save(path, epoch=3)
    assert load_checkpoint(path, kind="potential")["epoch"] == 3  # weights_only=True load
    torch.load(path, weights_only=True)
    loaded = BayesianPotential.from_checkpoint(path).eval()
    assert loaded.dtype == torch.float64
    kwargs = {"compute_stress": True, "uncertainty": "exact"}
    ref, out = model(batch, **kwargs), loaded(batch, **kwargs)
    assert ref.keys() == out.keys()
    for key in ref:
        assert torch.equal(ref[key], out[key]), key
    from_payload = BayesianPotential.from_checkpoint(model.to_checkpoint())
    assert torch.equal(from_payload(batch)[keys.ENERGY], ref[keys.ENERGY])


def test_float32_model():
    model = _model("gin").to(torch.float32)
    batch = _batch(_molecule(seed=8, n=5))  # float64 graph: cast to the model's dtype
    out = model(batch, compute_stress=True, uncertainty="exact")
    assert out[keys.ENERGY].dtype == torch.float32 and out[keys.FORCES_VAR].dtype == torch.float32
    ref = _model("gin")(batch, uncertainty="exact")
    torch.testing.assert_close(out[keys.FORCES].double(), ref[keys.FORCES], rtol=1e-4, atol=1e-5)


def test_single_graph_and_type_map_checks(model):
    atoms = _molecule(seed=10, n=5)
    graph = atoms_to_graph(atoms, R_MAX, TYPES)
    ref = model(_batch(atoms), uncertainty="exact")
    out = model(graph, uncertainty="exact")  # a plain Data, not a Batch
    for key in ref:
        torch.testing.assert_close(out[key], ref[key], msg=key)
    other_map = atoms_to_graph(atoms, R_MAX, TypeMap.from_list([1, 6, 7, 8]))  # other indices
    torch.testing.assert_close(model(other_map)[keys.ENERGY], ref[keys.ENERGY])
    hf = ase.Atoms("HF", positions=[[0, 0, 0], [0, 0, 1]])
    fluorine = atoms_to_graph(hf, R_MAX, TypeMap.from_list([1, 9]))
    with pytest.raises(ValueError, match="not in the type map"):
        model(fluorine)


def test_backbone_cutoff_must_fit_graph_cutoff():
    backbone = build_backbone("gin", num_types=3, r_max=4.0)
    with pytest.raises(ValueError, match="exceeds"):
        BayesianPotential(backbone, [1, 6, 8], 3.0)
