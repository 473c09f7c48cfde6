"""Closed-form moments of the Bayesian energy head against Monte Carlo over posterior draws."""

from __future__ import annotations

import pytest
import torch

from mlip_unc.uncertainty import moments

D = 5


def _posterior(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mu = torch.randn(D, generator=gen, dtype=torch.float64)
    s2 = torch.rand(D, generator=gen, dtype=torch.float64) * 0.5 + 0.05
    return mu, s2


def _draws(mu, s2, n: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return mu + s2.sqrt() * torch.randn(n, D, generator=gen, dtype=torch.float64)  # (n, D)


def _toy_phi(pos: torch.Tensor) -> torch.Tensor:
    """A smooth nonlinear Phi(pos) for two graphs: atoms 0-2 and atoms 3-4."""
    proj = torch.linspace(-1, 1, 3 * D, dtype=pos.dtype).reshape(3, D)
    z = torch.tanh(pos @ proj) + 0.1 * (pos**2).sum(-1, keepdim=True)  # (n_atoms, D)
    graph = torch.tensor([0, 0, 0, 1, 1])
    return z.new_zeros(2, D).index_add_(0, graph, z)


def _pos(seed: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(5, 3, generator=gen, dtype=torch.float64).requires_grad_(True)


N_DRAWS = 40_000
# y = w^T z with w ~ N(mu, diag s2) is exactly Gaussian, so the sample variance of N draws has
# relative standard error sqrt(2 / (N - 1)) = 0.71 % and the sample mean has standard error
# sqrt(var / N). Tolerances are five standard errors: a correct formula fails with probability
# ~1e-6 per entry (never with the fixed seeds); a variance off by more than ~3.5 % fails.
VAR_RTOL = 5.0 * (2.0 / (N_DRAWS - 1)) ** 0.5


def test_latent_variance_matches_draws():
    """``latent_variance(z, s2) = z^T S z`` against Monte Carlo over w ~ N(mu, diag s2)."""
    mu, s2 = _posterior()
    gen = torch.Generator().manual_seed(3)
    phi = torch.randn(4, D, generator=gen, dtype=torch.float64)  # (n_graphs, D) graph latents
    z = 0.3 * torch.randn(6, D, generator=gen, dtype=torch.float64)  # (n_atoms, D) per-atom latents
    w = _draws(mu, s2, N_DRAWS)  # (N, D)
    for latents in (phi, z):
        closed = moments.latent_variance(latents, s2)  # (n,)
        draws = latents @ w.T  # (n, N): one output per weight draw
        torch.testing.assert_close(draws.var(1), closed, rtol=VAR_RTOL, atol=0)
        mean_tol = 5.0 * (closed / N_DRAWS).sqrt()  # (n,)
        assert torch.all((draws.mean(1) - latents @ mu).abs() <= mean_tol)


def test_latent_variance_per_output_matches_draws():
    """``s2 (n_out, d)``: one row of variances per output, each matching its own weight draws."""
    gen = torch.Generator().manual_seed(5)
    mu = torch.randn(3, D, generator=gen, dtype=torch.float64)  # (n_out, D)
    s2 = torch.rand(3, D, generator=gen, dtype=torch.float64) * 0.5 + 0.05  # (n_out, D)
    z = torch.randn(5, D, generator=gen, dtype=torch.float64)  # (n, D)
    w = mu + s2.sqrt() * torch.randn(
        N_DRAWS, 3, D, generator=gen, dtype=torch.float64
    )  # (N, n_out, D)
    draws = torch.einsum("nd,sod->sno", z, w)  # (N, n, n_out)
    closed = moments.latent_variance(z, s2)  # (n, n_out)
    assert closed.shape == (5, 3)
    torch.testing.assert_close(draws.var(0), closed, rtol=VAR_RTOL, atol=0)


def test_latent_variance_shapes():
    """(d,) variances -> one variance per row; (n_out, d) -> one per row and output."""
    _, s2 = _posterior()
    z = torch.randn(2, 3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    assert moments.latent_variance(z, s2).shape == (2, 3)
    s2_out = torch.stack([s2, 2.0 * s2, s2.flip(0)])  # (3, D)
    out = moments.latent_variance(z[0], s2_out)  # (3, 3)
    for k in range(3):
        torch.testing.assert_close(out[:, k], moments.latent_variance(z[0], s2_out[k]))


def test_exact_force_variance_matches_draws():
    mu, s2 = _posterior()
    pos = _pos()
    phi = _toy_phi(pos)
    exact = moments.exact_force_variance(phi, pos, s2)
    (jac,) = moments.latent_gradients(_toy_phi(pos), [pos])  # (D, 5, 3)
    w = _draws(mu, s2, 50_000)
    forces = -torch.einsum("sk,kac->sac", w, jac)
    torch.testing.assert_close(forces.var(0), exact, rtol=0.03, atol=0)
    # graphs are independent: atoms of graph 1 only feel Phi of graph 1
    (jac0,) = moments.latent_gradients(_toy_phi(pos)[:1], [pos])
    assert torch.all(jac0[:, 3:] == 0)


def test_loop_and_batched_gradients_agree():
    pos = _pos()
    weights = torch.randn(3, D, dtype=torch.float64)
    loop = moments.linear_gradients(_toy_phi(pos), [pos], weights, method="loop")[0]
    batched = moments.linear_gradients(_toy_phi(pos), [pos], weights, method="batched")[0]
    torch.testing.assert_close(loop, batched)
    with pytest.raises(ValueError):
        moments.linear_gradients(_toy_phi(pos), [pos], weights, method="jacrev")


def test_auto_falls_back_to_the_loop(monkeypatch):
    pos = _pos()
    weights = torch.randn(3, D, dtype=torch.float64)
    ref = moments.linear_gradients(_toy_phi(pos), [pos], weights, method="loop")[0]
    grad = torch.autograd.grad

    def no_vmap(*args, **kwargs):
        if kwargs.get("is_grads_batched"):
            raise RuntimeError("no batching rule")
        return grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", no_vmap)
    with pytest.warns(RuntimeWarning, match="batched gradients failed"):
        out = moments.linear_gradients(_toy_phi(pos), [pos], weights, method="auto")[0]
    torch.testing.assert_close(out, ref)


def test_sampled_force_variance_is_the_sample_variance_of_the_draws():
    mu, s2 = _posterior()
    pos = _pos()
    w = _draws(mu, s2, 6)
    sampled = moments.sampled_force_variance(_toy_phi(pos), pos, w)
    (jac,) = moments.latent_gradients(_toy_phi(pos), [pos])
    torch.testing.assert_close(sampled, torch.einsum("sk,kac->sac", w, jac).var(0, unbiased=True))
    with pytest.raises(ValueError):
        moments.sample_variance(torch.zeros(1, 3))


def test_gradients_of_inputs_that_do_not_matter_are_zero():
    pos = _pos()
    phi = torch.ones(2, D, dtype=torch.float64)  # no graph at all
    (grads,) = moments.linear_gradients(phi, [pos], torch.eye(D, dtype=torch.float64))
    assert grads.shape == (D, 5, 3) and torch.all(grads == 0)
    unused = torch.zeros(2, 3, 3, dtype=torch.float64, requires_grad=True)
    _, g_unused = moments.latent_gradients(_toy_phi(pos), [pos, unused])
    assert g_unused.shape == (D, 2, 3, 3) and torch.all(g_unused == 0)


def test_kappa():
    mu, s2 = _posterior()
    phi = torch.randn(3, D, dtype=torch.float64)
    iso = torch.full((D,), 0.3, dtype=torch.float64)
    torch.testing.assert_close(
        moments.alignment_kappa(phi, iso), torch.ones(3, dtype=torch.float64)
    )
    aligned = torch.zeros(1, D, dtype=torch.float64)
    aligned[0, s2.argmin()] = 2.0
    assert moments.alignment_kappa(aligned, s2).item() < 1
    # convention kappa(0) = 1 (no direction, no alignment information), finite gradient
    zero = torch.zeros(2, D, dtype=torch.float64, requires_grad=True)
    kappa0 = moments.alignment_kappa(zero, s2)
    assert kappa0.tolist() == [1.0, 1.0]
    (grad,) = torch.autograd.grad(kappa0.sum(), zero)
    assert torch.all(grad == 0)
    mixed = torch.cat([zero.detach(), phi])
    torch.testing.assert_close(
        moments.alignment_kappa(mixed, s2)[2:], moments.alignment_kappa(phi, s2)
    )
    # z^T S z = |z|^2 mean(s2) kappa
    torch.testing.assert_close(
        (phi * phi).sum(-1) * s2.mean() * moments.alignment_kappa(phi, s2),
        moments.latent_variance(phi, s2),
    )
    n_atoms = torch.tensor([3, 10])
    torch.testing.assert_close(
        moments.energy_aleatoric_variance(n_atoms, torch.tensor(0.04, dtype=torch.float64)),
        torch.tensor([0.12, 0.4], dtype=torch.float64),
    )
