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


def test_energy_term_is_per_atom_nll_counted_per_atom():
    pred, true = torch.tensor([1.0, 2.0]), torch.tensor([1.5, 1.0])
    n, var = torch.tensor([2, 5]), torch.tensor([0.3, 0.7])  # total-energy noise variances
    per_atom = gaussian_nll_terms(pred - true, var) - torch.log(
        n.float()
    )  # density of E/n = n x density of E
    expected = n * per_atom  # each structure counted once per atom
    assert torch.allclose(energy_nll(pred, true, n, var, per_atom=True), expected.mean())
    only_first = energy_nll(pred, true, n, var, torch.tensor([True, False]), per_atom=True)
    assert torch.allclose(only_first, expected[0])
    assert torch.allclose(energy_nll(pred, true, n, var), per_atom.mean())  # once per structure
    # Monte Carlo: labels drawn from the model's noise, E ~ N(E_pred, var), give the expected
    # term n (0.5 log(2 pi var / n^2) + 0.5): var / n^2 is the variance of the per-atom residual
    g = torch.Generator().manual_seed(0)
    m, n5, v = 200_000, torch.full((200_000,), 5), torch.tensor(0.7, dtype=torch.float64)
    labels = 2.0 + v.sqrt() * torch.randn(m, generator=g, dtype=torch.float64)
    mc = energy_nll(torch.full((m,), 2.0, dtype=torch.float64), labels, n5, v, per_atom=True)
    closed = 5 * (0.5 * torch.log(2 * math.pi * v / 25) + 0.5)
    assert torch.allclose(mc, closed, atol=5 * 5 * math.sqrt(0.5 / m))  # 5 standard errors


def test_energy_and_force_terms_grow_alike_with_size():
    """A supercell repeating a structure k times (same per-atom error and noise std per atom)
    multiplies both the energy and the force term by k: the balance does not depend on size."""
    per_atom_var = torch.tensor(0.01)  # variance of the per-atom energy residual, any size

    def terms(k):
        n = torch.tensor([4 * k])
        var = per_atom_var * n**2  # total-energy variance giving that per-atom variance
        e = energy_nll(
            torch.tensor([0.1]) * n, torch.zeros(1), n, var.double(), per_atom=True
        )  # 0.1 eV/atom off
        graph = torch.zeros(4 * k, dtype=torch.long)
        f = forces_nll(
            torch.full((4 * k, 3), 0.2), torch.zeros(4 * k, 3), torch.tensor(0.04), graph
        )
        return e, f

    (e1, f1), (e3, f3) = terms(1), terms(3)
    assert torch.allclose(e3, 3 * e1) and torch.allclose(f3, 3 * f1)


def test_energy_count_auto_is_per_atom_for_periodic_training_data():
    from torch_geometric.data import Data

    from mlip_unc.config import EnergyCount
    from mlip_unc.train.potential import energy_per_atom

    def graph(n, periodic=False):
        return Data(pbc=torch.full((1, 3), periodic), num_nodes=n)

    molecule, crystal = graph(9), graph(8, periodic=True)
    assert energy_per_atom(EnergyCount.AUTO, [molecule, crystal]) is True
    assert energy_per_atom(EnergyCount.AUTO, [molecule]) is False
    # molecules: per atom when sizes spread more than 2x (one-atom reference frames aside)
    assert energy_per_atom(EnergyCount.AUTO, [graph(9), graph(6), graph(1)]) is False
    assert energy_per_atom(EnergyCount.AUTO, [graph(8), graph(17)]) is True
    assert energy_per_atom(EnergyCount.AUTO, [graph(8), graph(16)]) is False
    assert energy_per_atom(EnergyCount.ATOM, [molecule]) is True
    assert energy_per_atom(EnergyCount.STRUCTURE, [crystal]) is False


def test_forces_summed_per_structure_and_masked():
    f_pred, f_true = torch.ones(3, 3), torch.zeros(3, 3)
    graph = torch.tensor([0, 0, 1])  # structure 0 has 2 atoms, structure 1 has 1
    one = gaussian_nll_terms(torch.ones(()), torch.ones(()))
    assert torch.allclose(
        forces_nll(f_pred, f_true, torch.tensor(1.0), graph), (6 * one + 3 * one) / 2
    )
    mask = torch.tensor([False, True])
    assert torch.allclose(forces_nll(f_pred, f_true, torch.tensor(1.0), graph, mask), 3 * one)
    assert masked_mean(torch.ones(3), torch.zeros(3, dtype=torch.bool)).item() == 0.0


def test_kl_scaled_by_number_of_training_structures():
    kl = torch.tensor(12.0)
    assert kl_term(kl, 0.5, 8).item() == 0.5 * 12.0 / 8
    parts = potential_loss(
        {"energy": torch.tensor(1.0), "forces": torch.tensor(2.0)},
        {"energy": 1.0, "forces": 10.0},
        kl=kl,
        beta=0.5,
        n_train=8,
        regularizer=torch.tensor(3.0),
        lam=0.1,
    )
    assert math.isclose(parts["nll"].item(), 21.0)
    assert math.isclose(parts["kl_term"].item(), 0.75)
    assert math.isclose(parts["loss"].item(), 21.0 + 0.75 + 0.3, rel_tol=1e-6)
