"""The ELBO-optimal mean-field posterior widths of a trained Bayesian last layer (docs/method.md s.4).

For fixed features z and a Gaussian likelihood, the negative ELBO of section 2 (mean NLL over
the N training examples + beta KL / N) is minimised over each posterior variance in closed
form: the expected squared error under q adds ``sum_k s_k^2 z_k^2`` to each example's
``(y - mu^T z - mu_b)^2``, and the KL adds ``(s_k^2 / sigma_p^2 - log s_k^2) / 2``, so::

    s_k*^2 = (1 / sigma_p^2 + sum_n z_nk^2 / (beta sigma_n^2(z_n)))^-1      (weights)
    s_b*^2 = (1 / sigma_p^2 + sum_n 1     / (beta sigma_n^2(z_n)))^-1      (bias)

with the model's own noise variance sigma_n^2 (homoscedastic or per example, in the
standardised target units the loss uses), whatever the means are. A run whose posterior
widths have not converged (the widths move slowly under Adam at the study's learning rate)
can thus be evaluated at the widths training would reach for its features: the means and
the features stay as trained. The paper study's claim 1 concerns exactly these widths.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data

from mlip_unc import keys
from mlip_unc.models.property import StandardisedModel, predict_graphs

__all__ = ["elbo_optimal_variances", "with_optimal_posterior"]


@torch.no_grad()
def elbo_optimal_variances(
    model: StandardisedModel, train: Sequence[Data], *, beta: float = 1.0
) -> tuple[Tensor, Tensor]:
    """``(s2_w (out, d), s2_b (out,))``: the optimal posterior variances of ``model``'s Bayesian
    last layer for its features of ``train`` (float64)."""
    head = model.bayes_head
    if head is None:
        raise ValueError("the model has no Bayesian last layer")
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    out = predict_graphs(model, train, latent=True)
    z = out[keys.LATENT].double()  # (N, d)
    noise = (
        out[keys.ALEATORIC_VAR].double() / model.y_std.double().cpu() ** 2
    )  # (N, out), standardised units
    precision_prior = 1.0 / head.prior_std**2
    inv = 1.0 / (beta * noise)  # (N, out)
    s2_w = 1.0 / (precision_prior + inv.T @ z.square())  # (out, d)
    s2_b = 1.0 / (precision_prior + inv.sum(0))  # (out,)
    return s2_w, s2_b


def with_optimal_posterior(
    model: StandardisedModel, train: Sequence[Data], *, beta: float = 1.0
) -> StandardisedModel:
    """A copy of ``model`` whose last-layer widths are :func:`elbo_optimal_variances`."""
    s2_w, s2_b = elbo_optimal_variances(model, train, beta=beta)
    new = copy.deepcopy(model)
    head = new.bayes_head
    with torch.no_grad():
        head.weight_rho.copy_(_inverse_softplus(s2_w.sqrt()).to(head.weight_rho))
        if head.bias_rho is not None:
            head.bias_rho.copy_(_inverse_softplus(s2_b.sqrt()).to(head.bias_rho))
    return new


def _inverse_softplus(std: Tensor) -> Tensor:
    """rho with softplus(rho) = std, elementwise (std > 0), stable for small and large std."""
    return std + torch.log(-torch.expm1(-std))
