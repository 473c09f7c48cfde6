"""Potential losses: Gaussian NLL, per-atom energy term, KL scaled by N_train structures."""

import math

import torch
import torch.nn.functional as F

from mlip_unc.train.losses import (
    energy_nll,
    forces_nll,
    gaussian_nll_terms,
    kl_term,
    masked_mean,
    potential_loss,
)


def test_gaussian_nll_matches_torch():
    g = torch.Generator().manual_seed(0)
    r, var = torch.randn(20, generator=g), torch.rand(20, generator=g) + 0.1
    expected = F.gaussian_nll_loss(r, torch.zeros(20), var, full=True, reduction="none")
    assert torch.allclose(gaussian_nll_terms(r, var), expected)


def test_energy_term_is_total_energy_nll_per_atom():
    pred, true = torch.tensor([1.0, 2.0]), torch.tensor([1.5, 1.0])
    n, var = torch.tensor([2, 5]), torch.tensor([0.3, 0.7])  # total-energy noise variances
    total = gaussian_nll_terms(pred - true, var) - torch.log(n.float())  # density of E/n = n x density of E
    assert torch.allclose(energy_nll(pred, true, n, var), total.mean())
    only_first = energy_nll(pred, true, n, var, torch.tensor([True, False]))
    assert torch.allclose(only_first, total[0])


def test_forces_summed_per_structure_and_masked():
    f_pred, f_true = torch.ones(3, 3), torch.zeros(3, 3)
    graph = torch.tensor([0, 0, 1])  # structure 0 has 2 atoms, structure 1 has 1
    one = gaussian_nll_terms(torch.ones(()), torch.ones(()))
    assert torch.allclose(forces_nll(f_pred, f_true, torch.tensor(1.0), graph), (6 * one + 3 * one) / 2)
    mask = torch.tensor([False, True])
    assert torch.allclose(forces_nll(f_pred, f_true, torch.tensor(1.0), graph, mask), 3 * one)
    assert masked_mean(torch.ones(3), torch.zeros(3, dtype=torch.bool)).item() == 0.0


def test_kl_scaled_by_number_of_training_structures():
    kl = torch.tensor(12.0)
    assert kl_term(kl, 0.5, 8).item() == 0.5 * 12.0 / 8
    parts = potential_loss({"energy": torch.tensor(1.0), "forces": torch.tensor(2.0)},
                           {"energy": 1.0, "forces": 10.0}, kl=kl, beta=0.5, n_train=8,
                           regularizer=torch.tensor(3.0), lam=0.1)  # fmt: skip
    assert math.isclose(parts["nll"].item(), 21.0)
    assert math.isclose(parts["kl_term"].item(), 0.75)
    assert math.isclose(parts["loss"].item(), 21.0 + 0.75 + 0.3, rel_tol=1e-6)
