"""Recalibration: z-scaling, isotonic, state dicts."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch

from mlip_unc.uncertainty.calibration import miscalibration_area
from mlip_unc.uncertainty.recalibration import (
    IdentityCalibrator,
    IsotonicRecalibration,
    ZScaling,
    calibrator_from_state_dict,
    make_calibrator,
)


def _sample(n: int, shrink: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gaussian data whose reported std is the true std times ``shrink``."""
    rng = np.random.default_rng(seed)
    y_pred = rng.normal(size=n)
    true_std = rng.uniform(0.5, 2.0, size=n)
    y_true = y_pred + true_std * rng.normal(size=n)
    return y_pred, shrink * true_std, y_true


def test_zscaling_recovers_factor_three() -> None:
    cal = ZScaling().fit(*_sample(20000, 1.0 / 3.0, seed=0))
    assert cal.scale == pytest.approx(3.0, rel=0.02)
    np.testing.assert_allclose(cal.transform(np.array([1.0, 2.0])), [cal.scale, 2 * cal.scale])


def test_isotonic_map_is_the_empirical_cdf() -> None:
    """Without thinning, R at the validation PIT values is their empirical CDF (monotone)."""
    p, s, t = _sample(200, 0.5, seed=3)
    cal = IsotonicRecalibration(max_knots=10_000).fit(p, s, t)
    assert np.all(np.diff(cal.knots_y) >= 0) and cal.knots_y[0] == 0.0 and cal.knots_y[-1] == 1.0
    pit = np.sort(scipy.stats.norm.cdf((t - p) / s))
    np.testing.assert_allclose(cal.recalibrated_cdf(pit), np.arange(1, 201) / 200, atol=1e-12)


def test_isotonic_improves_miscalibration_and_round_trips(tmp_path) -> None:
    val = _sample(5000, 0.3, seed=1)
    test = _sample(5000, 0.3, seed=2)
    cal = IsotonicRecalibration().fit(*val)
    before = miscalibration_area(*test)
    after = miscalibration_area(test[0], cal.transform(test[1]), test[2])
    assert before > 0.2 and after < 0.03
    assert cal.scale == pytest.approx(1 / 0.3, rel=0.1)

    # plain-python state, loadable with weights_only=True
    path = tmp_path / "cal.pt"
    torch.save({"calibrator": cal.state_dict()}, path)
    restored = calibrator_from_state_dict(torch.load(path, weights_only=True)["calibrator"])
    assert isinstance(restored, IsotonicRecalibration)
    assert restored.scale == pytest.approx(cal.scale)
    np.testing.assert_allclose(restored.transform(test[1]), cal.transform(test[1]))


def test_isotonic_inverse_and_calibrated_identity() -> None:
    cal = IsotonicRecalibration(level=0.95).fit(*_sample(5000, 1.0, seed=3))
    assert cal.scale == pytest.approx(1.0, abs=0.06)
    assert abs(cal.centre_shift) < 0.06
    q = np.linspace(0.01, 0.99, 7)
    np.testing.assert_allclose(cal.recalibrated_cdf(cal.inverse(q)), q, atol=1e-9)
    assert len(cal.state_dict()["knots_x"]) <= 1000


def test_factory_and_tensor_transform() -> None:
    assert isinstance(make_calibrator("none"), IdentityCalibrator)
    assert isinstance(make_calibrator("zscaling"), ZScaling)
    assert isinstance(make_calibrator("isotonic"), IsotonicRecalibration)
    with pytest.raises(ValueError):
        make_calibrator("platt")
    z = ZScaling.from_state_dict(ZScaling(2.0).state_dict())
    out = z.transform(torch.ones(3, dtype=torch.float32))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert torch.allclose(out, torch.full((3,), 2.0))
    ident = calibrator_from_state_dict(make_calibrator("none").state_dict())
    np.testing.assert_allclose(ident.transform([1.5]), [1.5])
