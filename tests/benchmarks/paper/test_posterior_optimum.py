"""ELBO-optimal posterior widths: the closed form against a Monte Carlo ELBO and a numerical
optimum, for homo- and heteroscedastic noise."""

from __future__ import annotations

import pytest
import torch

from benchmarks.paper.posterior_optimum import elbo_optimal_variances, with_optimal_posterior
from mlip_unc import keys
from mlip_unc.config import PropertyConfig
from mlip_unc.data.molecules import smiles_to_graph
from mlip_unc.models.factory import build_model
from mlip_unc.models.property import predict_graphs
from mlip_unc.train.property import target_statistics

SMILES = [
    "CC",
    "CCC",
    "CCCC",
    "CO",
    "CCO",
    "CCCO",
    "CN",
    "CCN",
    "c1ccccc1",
    "Cc1ccccc1",
    "CC(=O)O",
    "CC#N",
]


def _model(likelihood: str):
    graphs = [smiles_to_graph(s, y=0.3 * len(s) + 0.05 * (k % 3)) for k, s in enumerate(SMILES)]
    cfg = PropertyConfig.from_dict(
        {
            "model": {
                "method": "bgnn",
                "hidden": 8,
                "layers": 2,
                "latent_dim": 4,
                "likelihood": likelihood,
                "prior_std": 0.7,
            }
        }
    )
    torch.manual_seed(0)
    mean, std = target_statistics(graphs)
    model = build_model(cfg, y_mean=mean, y_std=std).double().eval()
    return model, graphs


def _neg_elbo_mc(model, graphs, s2_w, s2_b, beta: float, n_draws: int, seed: int) -> float:
    """Mean NLL (standardised targets, w and b drawn from q) + beta KL / N, by Monte Carlo with
    common random numbers across calls (same seed)."""
    head = model.bayes_head
    out = predict_graphs(model, graphs, latent=True)
    z = out[keys.LATENT].double()  # (N, d)
    y = model.standardise(torch.cat([g[keys.TARGET] for g in graphs]).double())[:, 0]  # (N,)
    var_n = (out[keys.ALEATORIC_VAR].double() / model.y_std.double() ** 2)[:, 0]  # (N,)
    gen = torch.Generator().manual_seed(seed)
    mu_w, mu_b = head.weight_mu[0].detach().double(), head.bias_mu[0].detach().double()
    w = mu_w + s2_w.sqrt() * torch.randn(
        n_draws, z.shape[1], generator=gen, dtype=torch.float64
    )  # (S, d)
    b = mu_b + s2_b.sqrt() * torch.randn(n_draws, generator=gen, dtype=torch.float64)  # (S,)
    f = w @ z.T + b[:, None]  # (S, N)
    nll = (0.5 * torch.log(2 * torch.pi * var_n) + 0.5 * (y - f) ** 2 / var_n).mean()
    p2 = head.prior_std**2
    kl = 0.5 * ((s2_w + mu_w**2) / p2 - 1 - torch.log(s2_w / p2)).sum()
    kl = kl + 0.5 * ((s2_b + mu_b**2) / p2 - 1 - torch.log(s2_b / p2))
    return float(nll + beta * kl / len(graphs))


@pytest.mark.parametrize("likelihood", ["homoscedastic", "heteroscedastic"])
@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_closed_form_widths_minimise_the_monte_carlo_elbo(likelihood, beta):
    model, graphs = _model(likelihood)
    s2_w, s2_b = elbo_optimal_variances(model, graphs, beta=beta)
    s2_w, s2_b = s2_w[0], s2_b[0]
    best = _neg_elbo_mc(model, graphs, s2_w, s2_b, beta, 200_000, seed=1)
    for factor in (0.7, 1.4):  # any width off the optimum costs, per coordinate and for the bias
        for k in range(s2_w.shape[0]):
            moved = s2_w.clone()
            moved[k] *= factor
            assert _neg_elbo_mc(model, graphs, moved, s2_b, beta, 200_000, seed=1) > best
        assert _neg_elbo_mc(model, graphs, s2_w, s2_b * factor, beta, 200_000, seed=1) > best


def test_closed_form_equals_a_numerical_optimum_of_the_exact_elbo():
    model, graphs = _model("homoscedastic")
    s2_w, s2_b = elbo_optimal_variances(model, graphs)
    out = predict_graphs(model, graphs, latent=True)
    z = out[keys.LATENT].double()
    var_n = (out[keys.ALEATORIC_VAR].double() / model.y_std.double() ** 2)[:, 0]
    p2, n = model.bayes_head.prior_std**2, len(graphs)
    log_s2 = torch.zeros(z.shape[1] + 1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [log_s2],
        max_iter=1000,
        tolerance_grad=1e-14,
        tolerance_change=0.0,
        line_search_fn="strong_wolfe",
    )

    def closure():  # the s-dependent part of the exact negative ELBO (means fixed)
        opt.zero_grad()
        s2 = log_s2.exp()
        expected = (0.5 * (z.square() @ s2[:-1] + s2[-1]) / var_n).mean()
        loss = (
            n * expected + 0.5 * (s2 / p2 - log_s2).sum()
        )  # n times the per-example ELBO: same optimum
        loss.backward()
        return loss

    opt.step(closure)
    assert torch.allclose(log_s2.detach().exp()[:-1], s2_w[0], rtol=1e-6)
    assert float(log_s2.detach().exp()[-1]) == pytest.approx(float(s2_b[0]), rel=1e-6)


def test_with_optimal_posterior_sets_the_widths_and_keeps_the_means():
    model, graphs = _model("homoscedastic")
    s2_w, s2_b = elbo_optimal_variances(model, graphs)
    rho = model.bayes_head.weight_rho.detach().clone()
    new = with_optimal_posterior(model, graphs)
    assert torch.allclose(new.bayes_head.weight_var.double(), s2_w, rtol=1e-9)
    assert torch.allclose(new.bayes_head.bias_std.double() ** 2, s2_b, rtol=1e-9)
    before, after = predict_graphs(model, graphs), predict_graphs(new, graphs)
    assert torch.equal(before[keys.PREDICTION], after[keys.PREDICTION])
    assert not torch.allclose(before[keys.EPISTEMIC_VAR], after[keys.EPISTEMIC_VAR])
    assert torch.equal(model.bayes_head.weight_rho, rho)  # the original is untouched
    with pytest.raises(ValueError, match="beta"):
        elbo_optimal_variances(model, graphs, beta=0.0)
