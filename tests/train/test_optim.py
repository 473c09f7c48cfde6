"""The training core's optimiser: weight decay off the Bayesian layers, the AMSGrad option."""

from __future__ import annotations

import torch
from torch import nn

from mlip_unc.config import PropertyConfig
from mlip_unc.nn.bayesian import BayesianLinear
from mlip_unc.train.optim import make_optimizer


def test_weight_decay_skips_bayesian_layers_and_amsgrad_is_passed():
    model = nn.Sequential(nn.Linear(3, 4), BayesianLinear(4, 1))
    opt = make_optimizer(model, lr=1e-3, weight_decay=0.1, amsgrad=True)
    det, bayes = opt.param_groups
    assert det["weight_decay"] == 0.1 and bayes["weight_decay"] == 0.0
    assert all(g["amsgrad"] for g in opt.param_groups)
    assert not make_optimizer(model, lr=1e-3, weight_decay=0.0).param_groups[0]["amsgrad"]
    loss = model(torch.randn(5, 3)).square().sum()
    loss.backward()
    opt.step()  # AMSGrad keeps its running max of the second moment
    assert "max_exp_avg_sq" in opt.state[model[0].weight]


def test_amsgrad_config_field_defaults_off():
    assert PropertyConfig().train.amsgrad is False
    assert PropertyConfig.from_dict({"train": {"amsgrad": True}}).train.amsgrad is True
