"""The neighbour-density power spectrum against its bond-angle closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numpy.polynomial import legendre

from mlip_unc.nn.power_spectrum import edge_spherical_harmonics, power_spectrum


@pytest.mark.parametrize("l_max", [1, 2, 3])
def test_power_spectrum_is_the_legendre_sum_over_bond_pairs(l_max):
    """B_i,c,l = sum_jk w_ij,c w_ik,c (2l + 1) P_l(cos theta_jik) / avg^2 (component-normalised Y)."""
    rng = np.random.default_rng(l_max)
    n_edges, channels, avg = 5, 3, 2.5
    vectors = torch.tensor(rng.normal(size=(n_edges, 3)))
    weights = torch.tensor(rng.normal(size=(n_edges, channels)))
    receiver = torch.tensor([0, 0, 0, 1, 1])  # three bonds at atom 0, two at atom 1, none at atom 2
    b = power_spectrum(weights, receiver, edge_spherical_harmonics(vectors, l_max), 3, avg)
    assert b.shape == (3, channels * (l_max + 1))
    unit = vectors / vectors.norm(dim=-1, keepdim=True)
    for i in range(3):
        bonds = (receiver == i).nonzero().flatten()
        cos = (unit[bonds] @ unit[bonds].T).numpy()  # (k, k)
        for c in range(channels):
            w = weights[bonds, c].numpy()
            for ell in range(l_max + 1):
                p = legendre.legval(cos, [0] * ell + [1])  # P_l(cos theta_jk)
                expected = (2 * ell + 1) * w @ p @ w / avg**2
                assert b[i, c * (l_max + 1) + ell].item() == pytest.approx(
                    expected, rel=1e-9, abs=1e-12
                )


def test_coincident_atoms_give_no_nan_in_the_harmonics():
    sh = edge_spherical_harmonics(torch.zeros(2, 3, dtype=torch.float64), 2)
    assert torch.isfinite(sh).all()
