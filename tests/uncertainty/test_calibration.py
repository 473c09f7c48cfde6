"""Closed-form and Monte Carlo checks of the calibration metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlip_unc.uncertainty import calibration as cal


@pytest.fixture(scope="module")
def calibrated() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """20000 heteroscedastic Gaussian points whose std is exactly right."""
    rng = np.random.default_rng(0)
    n = 20000
    y_pred = rng.normal(size=n)
    y_std = rng.uniform(0.5, 2.0, size=n)
    y_true = y_pred + y_std * rng.normal(size=n)
    return y_pred, y_std, y_true


def test_rmse_mae_closed_form() -> None:
    p, t = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 4.0])
    assert cal.rmse(p, t) == pytest.approx(math.sqrt(5 / 3))
    assert cal.mae(p, t) == pytest.approx(1.0)


def test_nll_of_perfect_gaussian_sample() -> None:
    rng = np.random.default_rng(1)
    sigma = 2.0
    y_true = sigma * rng.normal(size=20000)
    value = cal.nll(np.zeros_like(y_true), sigma, y_true)
    assert value == pytest.approx(0.5 * math.log(2 * math.pi * sigma**2) + 0.5, abs=0.02)


def test_nll_single_point_exact() -> None:
    assert cal.nll([1.0], [0.5], [2.0]) == pytest.approx(-scipy.stats.norm(1.0, 0.5).logpdf(2.0))


def test_miscalibration_area_calibrated_vs_overconfident(calibrated) -> None:
    p, s, t = calibrated
    assert cal.miscalibration_area(p, s, t) < 0.01
    assert cal.miscalibration_area(p, 0.2 * s, t) > 0.3


def test_calibration_curve_endpoints(calibrated) -> None:
    p, s, t = calibrated
    expected, observed = cal.calibration_curve(p, s, t, n_levels=10)
    assert expected.shape == observed.shape == (11,)
    assert observed[0] == 0.0 and observed[-1] == 1.0
    assert np.all(np.diff(observed) >= 0)
    np.testing.assert_allclose(observed, expected, atol=0.02)


def test_coverage_95(calibrated) -> None:
    assert cal.coverage(*calibrated, level=0.95) == pytest.approx(0.95, abs=0.01)


def test_ence_calibrated_and_not(calibrated) -> None:
    p, s, t = calibrated
    assert cal.ence(p, s, t) < 0.05
    # std twice too large: RMSE/RMV = 0.5 in every bin
    assert cal.ence(p, 2 * s, t) == pytest.approx(0.5, abs=0.03)


def test_crps_matches_monte_carlo() -> None:
    rng = np.random.default_rng(2)
    mu, sigma, y = np.array([0.0, 1.0, -2.0]), np.array([1.0, 0.3, 2.0]), np.array([0.5, 2.0, -2.1])
    m = 200_000
    x = mu + sigma * rng.normal(size=(m, 3))
    x2 = mu + sigma * rng.normal(size=(m, 3))
    mc = np.mean(np.abs(x - y), axis=0) - 0.5 * np.mean(np.abs(x - x2), axis=0)  # (3,)
    assert cal.crps(mu, sigma, y) == pytest.approx(mc.mean(), rel=0.01)


def test_spearman_and_sharpness() -> None:
    err = np.array([0.1, 0.5, 0.2, 2.0])
    assert cal.spearman(np.zeros(4), err, err) == pytest.approx(1.0)
    assert cal.spearman(np.zeros(4), 1.0 / err, err) == pytest.approx(-1.0)
    assert math.isnan(cal.spearman(np.zeros(4), np.ones(4), err))
    assert cal.sharpness([3.0, 4.0]) == pytest.approx(math.sqrt(12.5))


def test_auroc() -> None:
    rng = np.random.default_rng(3)
    assert cal.auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert cal.auroc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == 0.0
    assert cal.auroc(np.ones(6), [0, 1, 0, 1, 0, 1]) == 0.5
    labels = rng.integers(0, 2, size=4000)
    assert cal.auroc(rng.normal(size=4000), labels) == pytest.approx(0.5, abs=0.03)
    with pytest.raises(ValueError):
        cal.auroc([0.1, 0.2], [1, 1])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(-3, 3)), min_size=2, max_size=30))
def test_auroc_counts_pairs(pairs: list[tuple[int, int]]) -> None:
    """AUROC = P(score_pos > score_neg) + 0.5 P(tie), over all positive-negative pairs."""
    scores = np.array([float(s) for s, _ in pairs])
    labels = np.arange(len(pairs)) % 2
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    expected = float(np.mean((diff > 0) + 0.5 * (diff == 0)))
    assert cal.auroc(scores, labels) == pytest.approx(expected, abs=1e-12)


def test_spearman_corr_constant_and_short() -> None:
    assert math.isnan(cal.spearman_corr([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(cal.spearman_corr([1.0], [2.0]))
    assert cal.spearman_corr([1.0, 2.0, 2.0, 5.0], [3.0, 1.0, 1.0, 0.0]) == pytest.approx(
        scipy.stats.spearmanr([1.0, 2.0, 2.0, 5.0], [3.0, 1.0, 1.0, 0.0]).statistic
    )


def test_spearman_corr_matches_scipy() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=50), rng.normal(size=50).round(1)
    assert cal.spearman_corr(a, b) == pytest.approx(scipy.stats.spearmanr(a, b).statistic)


def test_zero_std_and_nan_handling() -> None:
    # zero std with zero error stays finite
    assert math.isfinite(cal.nll([1.0, 2.0], [0.0, 1.0], [1.0, 2.5]))
    with pytest.raises(ValueError, match="y_true has 1 non-finite"):
        cal.nll([1.0, 2.0], [1.0, 1.0], [np.nan, 2.0])
    omitted = cal.rmse([1.0, 2.0, 3.0], [np.nan, 2.0, 4.0], nan_policy="omit")
    assert omitted == pytest.approx(math.sqrt(0.5))
    with pytest.raises(ValueError, match="negative"):
        cal.coverage([0.0], [-1.0], [0.0])


def test_regression_metrics_keys_and_torch_input(calibrated) -> None:
    p, s, t = (torch.as_tensor(a[:500], dtype=torch.float32) for a in calibrated)
    metrics = cal.regression_metrics(p, s, t)
    assert set(metrics) == {
        "rmse",
        "mae",
        "nll",
        "spearman",
        "miscalibration_area",
        "ence",
        "coverage_95",
        "crps",
        "sharpness",
    }
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    assert metrics["rmse"] == pytest.approx(
        cal.rmse(calibrated[0][:500], calibrated[2][:500]), rel=1e-5
    )
