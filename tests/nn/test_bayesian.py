"""BayesianLinear: closed forms against Monte Carlo over posterior draws."""

import torch

from mlip_unc.nn.bayesian import BayesianLinear, BayesianMLP, gaussian_kl


def _layer(estimator="local", seed=0):
    torch.manual_seed(seed)
    layer = BayesianLinear(
        6, 2, prior_std=0.7, init_std=0.3, estimator=estimator, dtype=torch.float64
    )
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
    assert layer.weight_rho.grad is not None
    fd = torch.zeros_like(layer.weight_rho)  # central differences of the KL in each rho
    with torch.no_grad():
        for k in range(fd.numel()):
            rho = layer.weight_rho.view(-1)
            rho[k] += 1e-6
            up = layer.kl()
            rho[k] -= 2e-6
            down = layer.kl()
            rho[k] += 1e-6
            fd.view(-1)[k] = (up - down) / 2e-6
    assert fd.abs().min() > 1e-3  # posterior stds spread away from the prior's: no zero slope
    torch.testing.assert_close(layer.weight_rho.grad, fd, rtol=1e-6, atol=1e-9)


def test_init_std_is_honoured():
    layer = BayesianLinear(4, 1, init_std=0.25)
    assert torch.allclose(layer.weight_std, torch.full((1, 4), 0.25))


def _mlp(activation, seed=0):
    """A full-BNN head 3 -> 8 -> 2 in float64, weights from a forked RNG (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mlp = BayesianMLP(
            3, (8,), 2, prior_std=0.8, init_std=0.2, activation=activation, dtype=torch.float64
        )
        with torch.no_grad():  # spread the posterior stds and give the first layer a bias mean
            for layer in mlp.layers:
                layer.weight_rho.add_(torch.randn_like(layer.weight_rho) * 0.5)
            mlp.layers[0].bias_mu.normal_(0.0, 0.5)
    return mlp


def _mc_tolerances(draws):
    """Five Monte Carlo standard errors of the sample mean and variance over axis 0.

    The full BNN's output is not Gaussian (products of Gaussians), so the variance's standard
    error uses the fourth central moment: SE(s^2) = sqrt((m4 - s^4) / N).
    """
    n = draws.shape[0]
    centred = draws - draws.mean(0)
    var = centred.pow(2).mean(0)
    m4 = centred.pow(4).mean(0)
    return 5.0 * (var / n).sqrt(), 5.0 * ((m4 - var**2).clamp_min(0) / n).sqrt()


def _sampled(mlp, z, n_draws, seed):
    """``n_draws`` training-mode draws per example in one batched call: ``(n_draws, n, out)``."""
    with torch.no_grad():
        out = mlp(z.repeat(n_draws, 1), sample=True, generator=torch.Generator().manual_seed(seed))
    return out.view(n_draws, *z.shape[:1], -1)


def test_full_bnn_with_linear_activation_matches_the_closed_form():
    """With an identity activation the two-layer moments are known exactly.

    Local reparameterisation makes the hidden units independent, h ~ N(m1, v1) per example;
    then y = w2^T h + b2 with w2 ~ N(mu2, s2^2) independent of h:
        E[y]   = mu2^T m1 + mu_b2
        Var[y] = s2^2 . (m1^2 + v1) + mu2^2 . v1 + s_b2^2
    """
    mlp = _mlp(torch.nn.Identity)
    z = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    first, second = mlp.layers
    with torch.no_grad():
        m1, v1 = first.predictive(z)  # (4, 8) each
        mean = m1 @ second.weight_mu.T + second.bias_mu  # (4, 2)
        var = (m1**2 + v1) @ second.weight_var.T + v1 @ (second.weight_mu**2).T + second.bias_std**2
    draws = _sampled(mlp, z, 40_000, seed=2)  # (N, 4, 2)
    mean_tol, var_tol = _mc_tolerances(draws)
    assert torch.all((draws.mean(0) - mean).abs() <= mean_tol)
    assert torch.all((draws.var(0) - var).abs() <= var_tol)
    # predictive() (a loop of forward draws): fewer draws, same check at its own MC error
    mc_mean, mc_var = mlp.predictive(z, n_samples=2000, generator=torch.Generator().manual_seed(3))
    mean_tol, var_tol = _mc_tolerances(draws[:2000])
    assert mc_mean.shape == mc_var.shape == (4, 2)
    assert torch.all((mc_mean - mean).abs() <= mean_tol)
    assert torch.all((mc_var - var).abs() <= var_tol)


def test_full_bnn_draws_match_explicit_weight_draws():
    """SiLU head: per-example draws of the forward pass against whole weight sets from
    ``sample_weights`` pushed through the network (two independent Monte Carlo estimates)."""
    mlp = _mlp(torch.nn.SiLU)
    z = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    n = 40_000
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        w1, b1 = mlp.layers[0].sample_weights(n, generator=gen)  # (N, 8, 3), (N, 8)
        w2, b2 = mlp.layers[1].sample_weights(n, generator=gen)  # (N, 2, 8), (N, 2)
        hidden = torch.nn.functional.silu(
            torch.einsum("nd,shd->snh", z, w1) + b1[:, None]
        )  # (N, 4, 8)
        explicit = torch.einsum("snh,soh->sno", hidden, w2) + b2[:, None]  # (N, 4, 2)
    draws = _sampled(mlp, z, n, seed=6)  # (N, 4, 2)
    mean_a, var_a = _mc_tolerances(draws)
    mean_b, var_b = _mc_tolerances(explicit)
    assert torch.all((draws.mean(0) - explicit.mean(0)).abs() <= (mean_a**2 + mean_b**2).sqrt())
    assert torch.all((draws.var(0) - explicit.var(0)).abs() <= (var_a**2 + var_b**2).sqrt())


def test_full_bnn_kl_is_the_sum_of_closed_form_layer_kls():
    mlp = _mlp(torch.nn.SiLU)
    expected = torch.zeros((), dtype=torch.float64)
    for layer in mlp.layers:
        for mu, std in ((layer.weight_mu, layer.weight_std), (layer.bias_mu, layer.bias_std)):
            ratio = (std / 0.8) ** 2
            expected = expected + 0.5 * (ratio + (mu / 0.8) ** 2 - 1 - ratio.log()).sum()
    torch.testing.assert_close(mlp.kl(), expected)
