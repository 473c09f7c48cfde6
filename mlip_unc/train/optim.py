"""The training core's optimiser: Adam, with weight decay on the deterministic parameters only.

The Bayesian layers (``BayesianLinear``, ``BayesianMLP``) are regularised by their KL term, so
weight decay would double-count their prior. ``foreach=True``: one fused update over all
parameters (the per-tensor loop cost about a third of a small property model's step on a CPU).

The weight average (``train.ema_decay``) warms up as mace-torch's does (torch_ema's
``use_num_updates``): after ``n`` updates the decay is ``min(decay, (1 + n) / (10 + n))``, so
the average follows the fast early training instead of keeping the initial weights for
``~1 / (1 - decay)`` steps; this matters for trainings of a few hundred steps
(docs/what-we-tried.md, "EMA warm-up").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from mlip_unc.nn.bayesian import BayesianLinear, BayesianMLP

__all__ = ["ema_decay_at", "make_ema_avg_fn", "make_optimizer", "param_groups"]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Trainable parameters: deterministic ones with ``weight_decay``, Bayesian ones without."""
    bayes: list[nn.Parameter] = []
    det: list[nn.Parameter] = []
    for module in model.modules():
        target = bayes if isinstance(module, (BayesianLinear, BayesianMLP)) else det
        target.extend(p for p in module.parameters(recurse=False) if p.requires_grad)
    groups = [{"params": det, "weight_decay": weight_decay}]
    if bayes:
        groups.append({"params": bayes, "weight_decay": 0.0})
    return groups


def make_optimizer(
    model: nn.Module, *, lr: float, weight_decay: float, amsgrad: bool = False
) -> torch.optim.Adam:
    """Adam over :func:`param_groups` (``amsgrad``: the AMSGrad variant, mace-torch's default)."""
    return torch.optim.Adam(param_groups(model, weight_decay), lr=lr, foreach=True, amsgrad=amsgrad)


def ema_decay_at(decay: float, num_updates: int, *, warmup: bool = True) -> float:
    """The decay of the ``num_updates``-th average update: ``min(decay, (1 + n) / (10 + n))``
    with ``warmup`` (mace-torch's), else ``decay``."""
    if not warmup:
        return float(decay)
    return min(float(decay), (1.0 + num_updates) / (10.0 + num_updates))


def make_ema_avg_fn(
    decay: float, *, warmup: bool = True
) -> Callable[[list[Tensor], list[Tensor], Tensor | int], None]:
    """``multi_avg_fn`` for ``torch.optim.swa_utils.AveragedModel``: in place,
    ``ema <- d ema + (1 - d) param`` with ``d = ema_decay_at(decay, num_averaged, warmup=warmup)``
    (``num_averaged``: the updates so far, the copy of the first weights included)."""

    def update(ema: list[Tensor], params: list[Tensor], num_averaged: Tensor | int) -> None:
        d = ema_decay_at(decay, int(num_averaged), warmup=warmup)
        with torch.no_grad():
            torch._foreach_lerp_(ema, params, 1.0 - d)

    return update
