"""The full-covariance last-layer posterior: closed forms against Monte Carlo draws from the
same posterior, the low-rank evaluation, the diagonal special case, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.data import TypeMap, atoms_to_graph
from mlip_unc.models import full_posterior
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.full_posterior import latent_jacobian, latent_probes
from mlip_unc.models.potential import BayesianPotential

TYPES = TypeMap.from_list([13, 29])
R_MAX = 4.0


def _model(name: str = "gin", d: int = 8) -> BayesianPotential:
    torch.manual_seed(0)
    kwargs = {
        "gin": {"hidden": 12, "num_layers": 2},
        "equivariant": {"channels": 8, "num_layers": 2},
    }[name]
    backbone = build_backbone(name, num_types=len(TYPES), r_max=R_MAX, latent_dim=d, **kwargs)
    model = (
        BayesianPotential(backbone, TYPES.to_list(), R_MAX, init_std=0.2, posterior_rank=3)
        .double()
        .eval()
    )
    g = torch.Generator().manual_seed(1)
    factor = (
        torch.randn(d, d, generator=g, dtype=torch.float64)
        * torch.logspace(0, -2, d, dtype=torch.float64)[:, None]
    )
    model.set_full_posterior(factor, torch.tensor([2.0, 0.5, 1e-4, 4e-3], dtype=torch.float64))
    return model


def _graph(seed: int = 0, stretch: float = 1.0):
    atoms = bulk("Cu", "fcc", a=3.6 * stretch, cubic=True)
    atoms[1].symbol = "Al"
    atoms.rattle(0.08, seed=seed)
    return atoms_to_graph(atoms, R_MAX, TYPES, dtype=torch.float64)


def _draws(model, scale2: float, n: int = 40_000) -> torch.Tensor:
    """Weight draws ``w ~ N(mu, scale2 * Sigma)``, ``Sigma = L^T L``: ``(n, d)``."""
    mu, _ = model.posterior()
    eps = torch.randn(
        n, model.latent_dim, generator=torch.Generator().manual_seed(7), dtype=torch.float64
    )
    return mu.detach() + scale2**0.5 * eps @ model.posterior_factor


@pytest.mark.parametrize("name", ["gin", "equivariant"])
def test_closed_forms_match_draws_from_the_full_posterior(name):
    model = _model(name)
    batch = Batch.from_data_list([_graph(0), _graph(1)])
    out = model(batch, uncertainty="exact")
    _, _, jac = latent_jacobian(model, batch)  # (d, n_atoms, 3)
    post = model.full_posterior()
    # energies: w^T Phi under w ~ N(mu, alpha_E^2 Sigma)
    phi = out[keys.LATENT].detach()  # (n_graphs, d)
    energies = _draws(model, float(post.alpha2_energy)) @ phi.T  # (n, n_graphs)
    torch.testing.assert_close(out[keys.ENERGY_EPISTEMIC_VAR], energies.var(0), rtol=0.03, atol=0.0)
    # forces: -J^T w under w ~ N(mu, alpha_F^2 Sigma); per atom and component
    forces = -torch.einsum("nk,kac->nac", _draws(model, float(post.alpha2_forces)), jac)
    torch.testing.assert_close(out[keys.FORCES_VAR], forces.var(0), rtol=0.05, atol=1e-12)
    torch.testing.assert_close(
        out[keys.FORCES], forces.mean(0), rtol=0.0, atol=5 * float(forces.std(0).max()) / 200
    )


def test_lowrank_is_the_leading_directions_and_full_rank_is_exact():
    model = _model()
    graph = _graph(2)
    exact = model(graph, uncertainty="exact")
    low = model(graph, uncertainty="lowrank")
    assert (low[keys.FORCES_VAR] <= exact[keys.FORCES_VAR] + 1e-15).all()
    torch.testing.assert_close(low[keys.FORCES], exact[keys.FORCES])
    _, _, jac = latent_jacobian(model, graph)
    rows = model.posterior_factor[:3]  # posterior_rank = 3
    expected = model.full_posterior().alpha2_forces * torch.einsum(
        "rk,kac->rac", rows, jac
    ).square().sum(0)
    torch.testing.assert_close(low[keys.FORCES_VAR], expected)
    model.posterior_rank = model.latent_dim
    torch.testing.assert_close(
        model(graph, uncertainty="lowrank")[keys.FORCES_VAR], exact[keys.FORCES_VAR]
    )


def test_sketch_is_one_signed_combination_unbiased_over_the_signs(monkeypatch):
    """sketch = alpha_r^2 (d(eps . L_r Phi)/dr)^2 for the fixed signs; over all 2^r sign
    patterns its mean is exactly the lowrank variance (the cross terms cancel)."""
    from mlip_unc.models import full_posterior as fp

    model = _model()  # posterior_rank 3
    graph = _graph(2)
    _, _, jac = latent_jacobian(model, graph)
    proj = torch.einsum("rk,kac->rac", model.posterior_factor[:3], jac)  # (3, n_atoms, 3)
    alpha2 = model.full_posterior().alpha2_lowrank
    low = model(graph, uncertainty="lowrank")
    sketch = model(graph, uncertainty="sketch")
    torch.testing.assert_close(sketch[keys.FORCES], low[keys.FORCES])
    signs = (fp.sketch_rows(torch.eye(3, dtype=torch.float64))[0]).round()
    assert set(signs.tolist()) <= {-1.0, 1.0}
    expected = alpha2 * torch.einsum("r,rac->ac", signs, proj).square()
    torch.testing.assert_close(sketch[keys.FORCES_VAR], expected)
    patterns = torch.cartesian_prod(*[torch.tensor([-1.0, 1.0], dtype=torch.float64)] * 3)
    mean = torch.einsum("pr,rac->pac", patterns, proj).square().mean(0) * alpha2
    torch.testing.assert_close(mean, low[keys.FORCES_VAR])
    assert not torch.allclose(sketch[keys.FORCES_VAR], low[keys.FORCES_VAR])


def _count_backward(monkeypatch) -> list[int]:
    """Vector-Jacobian products per model call (rows of every torch.autograd.grad call)."""
    calls: list[int] = []
    real = torch.autograd.grad

    def counting(outputs, *args, **kwargs):
        batched = kwargs.get("is_grads_batched", False)
        calls.append(int(kwargs["grad_outputs"].shape[0]) if batched else 1)
        return real(outputs, *args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", counting)
    return calls


def test_auto_is_lowrank_on_small_structures_and_sketch_on_large_ones(monkeypatch):
    from mlip_unc.models import full_posterior as fp

    model = _model()  # rank 3, a 4-atom cell; the budget moves instead of the size
    graph = _graph(1)
    calls = _count_backward(monkeypatch)
    monkeypatch.setattr(fp, "LOWRANK_ATOM_DIRECTIONS", 12)  # 4 atoms x rank 3: lowrank
    auto = model(graph, uncertainty="auto")
    assert sum(calls) == 4  # mean forces + 3 directions
    torch.testing.assert_close(
        auto[keys.FORCES_VAR], model(graph, uncertainty="lowrank")[keys.FORCES_VAR]
    )
    monkeypatch.setattr(fp, "LOWRANK_ATOM_DIRECTIONS", 11)
    calls.clear()
    auto = model(graph, uncertainty="auto")
    assert sum(calls) == 2  # mean forces + one sketched direction
    torch.testing.assert_close(
        auto[keys.FORCES_VAR], model(graph, uncertainty="sketch")[keys.FORCES_VAR]
    )
    assert fp.default_uncertainty_mode(model) == "auto"


def test_diagonal_factor_reproduces_the_diagonal_posterior():
    model = _model()
    model.clear_full_posterior()
    graph = _graph(3)
    diagonal = model(graph, uncertainty="exact")
    _, s2 = model.posterior()
    model.set_full_posterior(torch.diag(s2.detach().sqrt()), torch.tensor([1.0, 1.0, 1e-4, 4e-3]))
    full = model(graph, uncertainty="exact")
    for key in (keys.ENERGY_EPISTEMIC_VAR, keys.LOCAL_ENERGY_VAR, keys.KAPPA, keys.FORCES_VAR):
        torch.testing.assert_close(full[key], diagonal[key], rtol=1e-10, atol=1e-14)


def test_noise_and_sampled_mode_use_the_calibration():
    model = _model()
    graph = _graph(4)
    noise = model.noise_variances(graph)
    assert torch.allclose(noise[keys.FORCES], torch.full_like(noise[keys.FORCES], 4e-3))
    assert torch.allclose(noise[keys.ENERGY], torch.tensor([4 * 1e-4], dtype=torch.float64))
    exact = model(graph, uncertainty="exact")[keys.FORCES_VAR]
    sampled = model(
        graph, uncertainty="sampled", n_samples=4000, generator=torch.Generator().manual_seed(0)
    )
    torch.testing.assert_close(sampled[keys.FORCES_VAR], exact, rtol=0.15, atol=1e-12)


def test_checkpoint_round_trip_and_clearing(tmp_path):
    model = _model()
    graph = _graph(5)
    model.save(tmp_path / "m.pt")
    again = BayesianPotential.from_checkpoint(tmp_path / "m.pt")
    assert again.has_full_posterior and again.posterior_rank == 3
    for mode in ("energy", "exact", "lowrank"):
        a, b = model(graph, uncertainty=mode), again(graph, uncertainty=mode)
        for key, value in a.items():
            torch.testing.assert_close(b[key], value)
    again.clear_full_posterior()
    assert not again.has_full_posterior and "posterior_factor" not in again.state_dict()
    assert not np.allclose(
        again(graph, uncertainty="exact")[keys.FORCES_VAR].detach().numpy(),
        model(graph, uncertainty="exact")[keys.FORCES_VAR].detach().numpy(),
    )


class _WithBaseEnergy(torch.nn.Module):
    """A backbone with its own per-atom energies (the ``latents_and_energies`` contract of
    models/backbones.py, as an attached MACE model has): a GIN's latents plus a pair energy."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.latent_dim, self.r_max = inner, inner.latent_dim, inner.r_max

    def forward(self, batch):
        return self.inner(batch)

    def latents_and_energies(self, batch):
        from mlip_unc.geometry import batch_edge_vectors

        length = batch_edge_vectors(batch).norm(dim=-1)  # (n_edges,)
        pair = 0.3 * torch.exp(-length)  # eV per edge, split between its two atoms
        energies = pair.new_zeros(batch.pos.shape[0]).index_add(0, batch.edge_index[1], 0.5 * pair)
        return self.inner(batch), energies


@pytest.mark.parametrize("mode", ["energy", "exact", "lowrank", "sketch", "auto", "sampled"])
def test_base_energy_forces_and_stress_in_every_mode(mode):
    """Forces and stress include the backbone's own energies whichever mode computes them."""
    model = _model()
    model.backbone = _WithBaseEnergy(model.backbone)
    graph = _graph(6)
    plain = model(graph, compute_stress=True, uncertainty="none")
    out = model(
        graph,
        compute_stress=True,
        uncertainty=mode,
        n_samples=4,
        generator=torch.Generator().manual_seed(0),
    )
    torch.testing.assert_close(out[keys.FORCES], plain[keys.FORCES])
    torch.testing.assert_close(out[keys.STRESS], plain[keys.STRESS])
    # and the plain forces are -dE/dr of the total energy, base energy included (finite differences)
    pos, h = graph.pos.clone(), 1e-5
    for atom, comp in ((0, 0), (2, 1)):
        energies = []
        for sign in (1, -1):
            graph.pos = pos.clone()
            graph.pos[atom, comp] += sign * h
            energies.append(float(model(graph, compute_forces=False)[keys.ENERGY]))
        graph.pos = pos
        assert (
            abs((energies[1] - energies[0]) / (2 * h) - float(plain[keys.FORCES][atom, comp]))
            < 1e-6
        )


@pytest.mark.parametrize("mode", ["lowrank", "sketch", "sampled"])
def test_base_energy_joins_the_mean_row_pass(monkeypatch, mode):
    """The gradient modes take a backbone's own energies in their mean row's backward pass:
    as many passes as without them (counted), and the same variances."""
    model = _model()
    model.gradient_method = "loop"
    graph, calls = _graph(6), []
    real_grad = torch.autograd.grad

    def counting_grad(*args, **kwargs):
        calls.append(1)
        return real_grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", counting_grad)
    kw = {"n_samples": 3, "compute_stress": True}
    plain = model(graph, uncertainty=mode, generator=torch.Generator().manual_seed(0), **kw)
    n_plain, calls[:] = len(calls), []
    model.backbone = _WithBaseEnergy(model.backbone)
    based = model(graph, uncertainty=mode, generator=torch.Generator().manual_seed(0), **kw)
    assert len(calls) == n_plain == {"lowrank": model.posterior_rank + 1, "sketch": 2}.get(mode, 4)
    for key in (keys.FORCES_VAR, keys.STRESS_VAR):
        torch.testing.assert_close(based[key], plain[key])
    assert not torch.allclose(based[keys.FORCES], plain[keys.FORCES])


# ---------------------------------------------------------------- per-element basis
def _per_element_model(d: int = 6) -> BayesianPotential:
    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=len(TYPES), r_max=R_MAX, latent_dim=d, hidden=12, num_layers=2
    )
    model = (
        BayesianPotential(
            backbone,
            TYPES.to_list(),
            R_MAX,
            init_std=0.2,
            posterior_rank=3,
            posterior_basis="per_element",
        )
        .double()
        .eval()
    )
    width = model.posterior_width
    assert width == len(TYPES) * d
    g = torch.Generator().manual_seed(2)
    factor = (
        torch.randn(width, width, generator=g, dtype=torch.float64)
        * torch.logspace(0, -2, width, dtype=torch.float64)[:, None]
    )
    model.set_full_posterior(factor, torch.tensor([2.0, 0.5, 1e-4, 4e-3], dtype=torch.float64))
    return model


def _per_element_jacobian(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``Phi_e (n_graphs, n_types d)`` and ``dPhi_e / dr (n_types d, n_atoms, 3)`` by autograd, one
    component at a time (independent of the model's batched products)."""
    pos = batch.pos.detach().clone().requires_grad_(True)
    batch = batch.clone()
    batch.pos = pos
    state = model._state(batch, forces=False, stress=False)
    n_types, d = len(TYPES), model.latent_dim
    phi = torch.zeros(state.n_graphs, n_types * d, dtype=torch.float64)
    for e in range(n_types):
        sel = (state.atom_type == e).double()[:, None]
        phi[:, e * d : (e + 1) * d] = torch.zeros(state.n_graphs, d, dtype=torch.float64).index_add(
            0, state.graph, sel * state.z
        )
    rows = [
        torch.autograd.grad(
            phi[:, k].sum(), pos, retain_graph=True, allow_unused=True, materialize_grads=True
        )[0]
        for k in range(n_types * d)
    ]
    return phi.detach(), torch.stack(rows)


def test_per_element_closed_forms_match_draws_and_keep_the_predictions():
    model = _per_element_model()
    batch = Batch.from_data_list([_graph(0), _graph(1)])
    out = model(batch, uncertainty="exact")
    phi, jac = _per_element_jacobian(model, batch)
    post = model.full_posterior()
    assert post.n_blocks == len(TYPES)
    mu = model.posterior()[0].detach().repeat(len(TYPES))  # the head's weights on every element

    def draws(scale2: float, n: int = 40_000) -> torch.Tensor:
        eps = torch.randn(
            n,
            model.posterior_width,
            generator=torch.Generator().manual_seed(7),
            dtype=torch.float64,
        )
        return mu + scale2**0.5 * eps @ model.posterior_factor

    energies = draws(float(post.alpha2_energy)) @ phi.T  # (n, n_graphs)
    torch.testing.assert_close(out[keys.ENERGY_EPISTEMIC_VAR], energies.var(0), rtol=0.03, atol=0.0)
    forces = -torch.einsum("nk,kac->nac", draws(float(post.alpha2_forces)), jac)
    torch.testing.assert_close(out[keys.FORCES_VAR], forces.var(0), rtol=0.05, atol=1e-12)
    plain = model(
        batch, uncertainty="none"
    )  # the per-element mean is the shared head: same E and F
    torch.testing.assert_close(out[keys.ENERGY], plain[keys.ENERGY])
    torch.testing.assert_close(out[keys.FORCES], plain[keys.FORCES])
    low = model(batch, uncertainty="lowrank")
    expected = post.alpha2_lowrank * torch.einsum(
        "rk,kac->rac", model.posterior_factor[:3], jac
    ).square().sum(0)
    torch.testing.assert_close(low[keys.FORCES_VAR], expected)


def test_per_element_differs_from_shared_and_round_trips(tmp_path):
    model = _per_element_model()
    graph = _graph(5)
    d = model.latent_dim
    shared = BayesianPotential.from_checkpoint(model.to_checkpoint())
    shared.posterior_basis = "shared"
    stack = torch.cat(
        [torch.eye(d, dtype=torch.float64)] * len(TYPES)
    )  # B (D, d): w_e = w on every element
    sigma = (
        stack.T @ model.full_posterior().covariance @ stack
    )  # the shared weights' covariance, B^T Sigma B
    evals, evecs = torch.linalg.eigh(sigma)
    shared.set_full_posterior(
        evals.clamp_min(0).sqrt()[:, None] * evecs.T, model.posterior_calibration
    )
    assert shared.full_posterior().n_blocks == 1
    # the per-element covariance differs from its projection on a two-element structure
    assert not torch.allclose(
        shared(graph, uncertainty="exact")[keys.FORCES_VAR],
        model(graph, uncertainty="exact")[keys.FORCES_VAR],
        rtol=1e-3,
    )
    model.save(tmp_path / "m.pt")
    again = BayesianPotential.from_checkpoint(tmp_path / "m.pt")
    assert again.posterior_basis == "per_element" and again.full_posterior().n_blocks == len(TYPES)
    for mode in ("energy", "exact", "lowrank"):
        a, b = model(graph, uncertainty=mode), again(graph, uncertainty=mode)
        for key, value in a.items():
            torch.testing.assert_close(b[key], value)
    with pytest.raises(ValueError, match="posterior_basis"):
        BayesianPotential(model.backbone, TYPES.to_list(), R_MAX, posterior_basis="per_atom")


@pytest.mark.parametrize("name", ["gin", "equivariant"])
@pytest.mark.parametrize("n_blocks", [1, 2])
def test_forward_mode_jacobian_equals_the_reverse_one(name, n_blocks):
    """Frames of different sizes in one batch: forward mode reads each frame's columns from
    the shared atom-slot tangents; finite differences of Phi check the reverse one."""
    model = _model(name)
    small = atoms_to_graph(bulk("Cu", "fcc", a=3.6), R_MAX, TYPES, dtype=torch.float64)
    batch = Batch.from_data_list([_graph(0), small, _graph(3)])
    state, out, rev = latent_jacobian(model, batch, n_blocks, method="reverse")
    _, out_fwd, fwd = latent_jacobian(model, batch, n_blocks, method="forward")
    assert rev.shape == (n_blocks * model.latent_dim, batch.num_nodes, 3)
    torch.testing.assert_close(fwd, rev, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(out_fwd[keys.FORCES], out[keys.FORCES])
    a, c, h = 6, 1, 1e-5  # an atom of the third frame
    assert int(batch.batch[a]) == 2
    moved = [batch.clone(), batch.clone()]
    moved[0].pos[a, c] += h
    moved[1].pos[a, c] -= h
    phis = [latent_jacobian(model, m, n_blocks, method="reverse")[0].phi for m in moved]
    torch.testing.assert_close(rev[:, a, c], (phis[0] - phis[1])[2] / (2 * h), rtol=1e-5, atol=1e-8)


def test_large_batches_take_fewer_tangents_at_once_and_the_same_jacobian(monkeypatch):
    assert full_posterior.jvp_chunk(27) == 64 and full_posterior.jvp_chunk(32 * 27) == 4
    assert full_posterior.jvp_chunk(10**6) == 1 and full_posterior.jvp_chunk(0) == 64
    model = _model("equivariant")
    batch = Batch.from_data_list([_graph(0), _graph(3)])
    _, _, whole = latent_jacobian(model, batch, 2, method="forward")
    monkeypatch.setattr(full_posterior, "JVP_ATOMS", 2 * batch.num_nodes)  # chunks of 2 tangents
    assert full_posterior.jvp_chunk(batch.num_nodes) == 2
    _, _, chunked = latent_jacobian(model, batch, 2, method="forward")
    torch.testing.assert_close(chunked, whole, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["gin", "equivariant"])
@pytest.mark.parametrize("n_blocks", [1, 2])
def test_latent_probes_are_jacobian_products_along_their_signs(name, n_blocks):
    """Each probe is ``J_g z_g`` for every frame of the batch, with the +-1 signs ``z`` drawn
    from the generator and zero on the atoms outside the mask."""
    model = _model(name)
    small = atoms_to_graph(bulk("Cu", "fcc", a=3.6), R_MAX, TYPES, dtype=torch.float64)
    batch = Batch.from_data_list([_graph(0), small, _graph(3)])
    mask = torch.ones(batch.num_nodes, dtype=torch.bool)
    mask[4] = False  # an unlabelled atom (the small frame)
    state, y = latent_probes(
        model, batch, n_blocks, 5, mask=mask, generator=torch.Generator().manual_seed(7)
    )
    _, _, jac = latent_jacobian(model, batch, n_blocks, method="reverse")  # (D, n_atoms, 3)
    signs = torch.randint(0, 2, (5, batch.num_nodes, 3), generator=torch.Generator().manual_seed(7))
    z = (2.0 * signs - 1).double() * mask[None, :, None]  # (5, n_atoms, 3)
    per_atom = torch.einsum("dac,pac->pad", jac, z)  # (5, n_atoms, D)
    expected = torch.zeros(5, 3, jac.shape[0], dtype=torch.float64).index_add(
        1, batch.batch, per_atom
    )
    assert y.shape == (5, 3, n_blocks * model.latent_dim)
    torch.testing.assert_close(y, expected, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(state.phi, latent_jacobian(model, batch, n_blocks)[0].phi)
    with pytest.raises(ValueError, match="probes"):
        latent_probes(model, batch, n_blocks, 0)
