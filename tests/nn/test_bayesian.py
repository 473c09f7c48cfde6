"""BayesianLinear: closed forms against Monte Carlo over posterior draws."""

import torch

from mlip_unc.nn.bayesian import BayesianLinear, BayesianMLP, gaussian_kl


def _layer(estimator="local", seed=0):
    torch.manual_seed(seed)
    layer = BayesianLinear(6, 2, prior_std=0.7, init_std=0.3, estimator=estimator, dtype=torch.float64)
    with torch.no_grad():  # spread the posterior stds so the test is not isotropic
        layer.weight_rho.add_(torch.randn_like(layer.weight_rho) * 0.5)
    return layer


def test_closed_form_predictive_matches_weight_draws():
    layer = _layer()
    z = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mean, var = layer.predictive(z)
    w, b = layer.sample_weights(100_000, generator=torch.Generator().manual_seed(2))
    draws = torch.einsum("nd,sod->sno", z, w) + b[:, None, :]  # (S, n, out)
    torch.testing.assert_close(draws.mean(0), mean, atol=0.02 * var.sqrt().max().item(), rtol=0.02)
    assert torch.allclose(draws.var(0), var, rtol=0.02)


def test_closed_form_kl_matches_monte_carlo():
    layer = _layer()
    gen = torch.Generator().manual_seed(3)
    w, _ = layer.sample_weights(200_000, generator=gen)
    q = torch.distributions.Normal(layer.weight_mu.detach(), layer.weight_std.detach())
    p = torch.distributions.Normal(0.0, layer.prior_std)
    mc = (q.log_prob(w) - p.log_prob(w)).sum((1, 2)).mean()
    exact = gaussian_kl(layer.weight_mu, layer.weight_std, layer.prior_std)
    assert abs(mc.item() - exact.item()) / exact.item() < 0.02
    assert layer.kl() > exact  # the bias adds its own KL


def test_local_reparameterisation_and_flipout_match_weight_sampling():
    z = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for estimator in ("local", "flipout"):
        layer = _layer(estimator)
        mean, var = layer.predictive(z)
        gen = torch.Generator().manual_seed(5)
        # Flipout shares one weight perturbation per call: draw over many calls.
        with torch.no_grad():
            draws = torch.stack([layer(z, sample=True, generator=gen) for _ in range(50_000)])
        draws = draws.view(50_000, 3, 2)
        assert torch.allclose(draws.mean(0), mean, atol=0.02 * var.sqrt().max().item())
        assert torch.allclose(draws.var(0), var, rtol=0.02), estimator


def test_eval_mode_returns_the_mean_and_kl_is_differentiable():
    layer = _layer().eval()
    z = torch.randn(4, 6, dtype=torch.float64)
    assert torch.equal(layer(z), layer.predictive(z)[0])
    layer.kl().backward()
    assert layer.weight_rho.grad is not None and layer.weight_rho.grad.abs().sum() > 0


def test_init_std_is_honoured():
    layer = BayesianLinear(4, 1, init_std=0.25)
    assert torch.allclose(layer.weight_std, torch.full((1, 4), 0.25))


def test_full_bnn_monte_carlo_moments():
    torch.manual_seed(0)
    mlp = BayesianMLP(3, (8,), 1, init_std=0.2, dtype=torch.float64)
    z = torch.randn(4, 3, dtype=torch.float64)
    mean, var = mlp.predictive(z, n_samples=4000, generator=torch.Generator().manual_seed(0))
    assert mean.shape == (4, 1) and (var > 0).all()
    assert mlp.kl() > 0
