"""LPA metrics of docs/method.md section 4: closed forms and a permutation Monte Carlo."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mlip_unc.uncertainty import alignment as al
from mlip_unc.uncertainty.moments import latent_variance


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def posterior() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = _gen(0)
    z = torch.randn(64, 8, generator=g, dtype=torch.float64)
    mu = torch.randn(8, generator=g, dtype=torch.float64)
    s2 = torch.rand(8, generator=g, dtype=torch.float64) + 0.05
    return z, mu, s2


def test_kappa_is_one_for_isotropic_posterior(posterior) -> None:
    z, _, _ = posterior
    split = al.three_factor_split(z, torch.full((8,), 0.3, dtype=torch.float64))
    torch.testing.assert_close(split.kappa, torch.ones(64, dtype=torch.float64))


def test_three_factors_multiply_back(posterior) -> None:
    z, _, s2 = posterior
    norm2, mean_s2, kappa = al.three_factor_split(z, s2)
    u = z.pow(2) @ s2
    torch.testing.assert_close(norm2 * mean_s2 * kappa, u)
    torch.testing.assert_close(latent_variance(z, s2), u)


def test_zero_latent_has_neutral_kappa(posterior) -> None:
    """kappa(0) = 1, the same convention as the potential's per-structure kappa."""
    z, mu, s2 = posterior
    z0 = torch.cat([torch.zeros(2, 8, dtype=torch.float64), z])
    split = al.three_factor_split(z0, s2)
    assert split.kappa[:2].tolist() == [1.0, 1.0] and split.norm2[:2].tolist() == [0.0, 0.0]
    torch.testing.assert_close(split.kappa[2:], al.three_factor_split(z, s2).kappa)
    # z = 0 points are dropped from the means of the logs
    assert al.mean_log_factors(split) == pytest.approx(
        al.mean_log_factors(al.three_factor_split(z, s2))
    )
    with pytest.raises(ValueError, match="no point"):
        al.log_variance_decomposition(al.three_factor_split(z0[:2], s2), split)


def test_alignment_index_is_one_on_s_inverse_mu(posterior) -> None:
    _, mu, s2 = posterior
    z = torch.stack([c * mu / s2 for c in (0.1, 1.0, -3.0)])
    torch.testing.assert_close(al.alignment_index(z, mu, s2), torch.ones(3, dtype=torch.float64))


def test_alignment_index_range_and_threshold(posterior) -> None:
    z, mu, s2 = posterior
    a = al.alignment_index(z, mu, s2)
    assert bool(((a >= 0) & (a <= 1 + 1e-12)).all())
    m = (z @ mu).abs()
    thr = float(m.median())
    a_thr = al.alignment_index(z, mu, s2, min_abs_mean=thr)
    assert torch.equal(torch.isnan(a_thr), m <= thr)
    z0 = torch.zeros(1, 8, dtype=torch.float64)
    assert math.isnan(float(al.alignment_index(z0, mu, s2)[0]))


def test_permutation_baseline_matches_monte_carlo(posterior) -> None:
    z, _, s2 = posterior
    u_actual, u_perm = al.permutation_baseline(z, s2)
    torch.testing.assert_close(u_actual, z.pow(2) @ s2)
    g = _gen(1)
    perms = torch.argsort(torch.rand(4000, 8, generator=g), dim=1)  # (P, d) random permutations
    u_mc = (z.pow(2) @ s2[perms].T).mean(dim=1)  # (n,) mean over permutations
    torch.testing.assert_close(u_mc, u_perm, rtol=0.03, atol=0.0)


def test_rho_lpa_and_low_variance_fraction_for_aligned_latents() -> None:
    g = _gen(2)
    s2 = torch.linspace(0.05, 1.0, 8, dtype=torch.float64)
    scale = torch.linspace(2.0, 0.1, 8, dtype=torch.float64)  # big where s2 is small
    z = torch.randn(200, 8, generator=g, dtype=torch.float64) * scale
    assert al.rho_lpa(z, s2) < -0.9
    assert al.rho_lpa(z, s2.flip(0)) > 0.9
    frac = al.low_variance_energy_fraction(z, s2, r=2)
    assert frac.shape == (200,) and float(frac.mean()) > 0.5
    z_low = torch.zeros(5, 8, dtype=torch.float64)
    z_low[:, :2] = torch.randn(5, 2, generator=g, dtype=torch.float64)
    torch.testing.assert_close(
        al.low_variance_energy_fraction(z_low, s2, r=2), torch.ones(5, dtype=torch.float64)
    )


def test_effective_rank() -> None:
    g = _gen(3)
    z_iso = torch.randn(5000, 8, generator=g, dtype=torch.float64)
    assert al.effective_rank(z_iso) == pytest.approx(8.0, rel=0.02)
    z_one = torch.randn(100, 1, generator=g, dtype=torch.float64) * torch.randn(
        1, 8, generator=g, dtype=torch.float64
    )
    assert al.effective_rank(z_one) == pytest.approx(1.0, abs=1e-6)


def test_log_variance_decomposition_adds_up(posterior) -> None:
    z, _, s2 = posterior
    z_b = 2.0 * z[:40] * torch.linspace(0.5, 1.5, 8, dtype=torch.float64)
    s2_b = 1.7 * s2
    a, b = al.three_factor_split(z, s2), al.three_factor_split(z_b, s2_b)
    dec = al.log_variance_decomposition(a, b)
    direct = float(latent_variance(z_b, s2_b).log().mean() - latent_variance(z, s2).log().mean())
    assert dec.log_u == pytest.approx(direct, rel=1e-10)
    assert dec.log_norm2 + dec.log_mean_s2 + dec.log_kappa == pytest.approx(direct, rel=1e-10)
    # only the posterior width changes -> mean_s2 dominates, by exactly log 3
    only_s2 = al.log_variance_decomposition(a, al.three_factor_split(z, 3.0 * s2))
    assert only_s2.dominant == "mean_s2"
    assert only_s2.log_mean_s2 == pytest.approx(math.log(3.0))
    assert only_s2.log_kappa == pytest.approx(0.0, abs=1e-12)
    assert set(dec.as_dict()) == {"log_norm2", "log_mean_s2", "log_kappa", "log_u"}


def test_lpa_summary_numpy_input(posterior) -> None:
    z, mu, s2 = (t.numpy() for t in posterior)
    summary = al.lpa_summary(z, mu, s2)
    assert set(summary) == {
        "mean_u",
        "mean_norm2",
        "mean_s2",
        "mean_s",
        "mean_kappa",
        "median_alignment",
        "rho_lpa",
        "low_variance_fraction",
        "effective_rank",
    }
    assert all(math.isfinite(v) for v in summary.values())
    assert summary["mean_u"] == pytest.approx(float(((z**2) @ s2).mean()))
    assert summary["mean_s"] == pytest.approx(float(np.sqrt(s2).mean()))
    with pytest.raises(ValueError):
        al.three_factor_split(z, s2[:3])
