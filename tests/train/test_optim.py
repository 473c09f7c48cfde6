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


def test_ema_warmup_follows_mace_schedule_and_matches_manual_average():
    from torch.optim.swa_utils import AveragedModel

    from mlip_unc.train.optim import ema_decay_at, make_ema_avg_fn

    assert ema_decay_at(0.99, 1) == 2 / 11 and ema_decay_at(0.99, 10_000) == 0.99
    assert ema_decay_at(0.99, 1, warmup=False) == 0.99
    torch.manual_seed(0)
    for warmup in (True, False):
        model = nn.Linear(3, 2)
        ema = AveragedModel(model, multi_avg_fn=make_ema_avg_fn(0.99, warmup=warmup))
        expected = [p.detach().clone() for p in model.parameters()]
        ema.update_parameters(model)  # the first call copies the weights
        for n in range(1, 6):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p))
            ema.update_parameters(model)
            d = (1 + n) / (10 + n) if warmup else 0.99
            expected = [
                d * e + (1 - d) * p.detach()
                for e, p in zip(expected, model.parameters(), strict=False)
            ]
        for e, q in zip(expected, ema.module.parameters(), strict=False):
            torch.testing.assert_close(q, e)
    assert PropertyConfig().train.ema_warmup is True
