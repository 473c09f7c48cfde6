"""Pure loss functions: Gaussian NLL and the negative ELBO (docs/method.md section 2).

Per mini-batch::

    loss = mean NLL over the batch + beta(epoch) * KL(q || p) / N_train

with N_train the number of training examples (not batches). ``beta(epoch)`` is the KL weight
with optional linear annealing.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_LOG_2PI = math.log(2.0 * math.pi)


def gaussian_nll(mean: Tensor, var: Tensor, target: Tensor) -> Tensor:
    """Mean Gaussian negative log-likelihood ``0.5 (log 2 pi var + (y - m)^2 / var)``.

    ``mean`` and ``var`` may carry leading dimensions (e.g. ensemble members ``(M, n, out)``)
    over which ``target`` ``(n, out)`` broadcasts. NaN targets (missing labels) are ignored.
    Returns a scalar; 0 when every target is missing.
    """
    target = target.expand_as(mean)
    mask = ~torch.isnan(target)
    if not bool(mask.any()):
        return mean.sum() * 0.0
    diff = torch.where(mask, mean - target, torch.zeros_like(mean))
    var = torch.where(mask, var, torch.ones_like(var))
    terms = 0.5 * (_LOG_2PI + torch.log(var) + diff * diff / var)
    return (terms * mask).sum() / mask.sum()


def kl_weight(epoch: int, *, beta: float, anneal_epochs: int = 0) -> float:
    """beta, ramped linearly as ``beta * (epoch + 1) / anneal_epochs`` over the first epochs."""
    if anneal_epochs <= 0:
        return float(beta)
    return float(beta) * min(1.0, (epoch + 1) / anneal_epochs)


def negative_elbo(nll: Tensor, kl: Tensor, *, n_train: int, beta: float = 1.0) -> tuple[Tensor, Tensor]:
    """``(loss, kl_term)`` with ``kl_term = beta * KL / n_train`` and ``loss = nll + kl_term``.

    ``n_train`` is the number of training examples (the KL is per data set, the NLL per example).
    """
    if n_train < 1:
        raise ValueError(f"n_train must be >= 1, got {n_train}")
    kl_term = beta * kl / n_train
    return nll + kl_term, kl_term
