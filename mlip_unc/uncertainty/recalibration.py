"""Post-hoc recalibration of Gaussian predictive standard deviations.

Calibrators are fitted on a validation set with ``fit(y_pred, y_std, y_true)`` and applied
with ``transform(y_std) -> y_std``. Their state is a dict of plain floats / lists of floats
(``state_dict()`` / ``from_state_dict(d)``), so it can live in a checkpoint that is loaded
with ``torch.load(weights_only=True)``. ``make_calibrator(name)`` picks the class from a
string, ``calibrator_from_state_dict(d)`` restores any of them.

``transform`` returns a numpy array for numpy/sequence input and a tensor of the input's
dtype and device for tensor input.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Protocol

import numpy as np
import torch
from scipy.special import ndtr, ndtri

from mlip_unc.uncertainty.calibration import STD_FLOOR, ArrayLike, _triple, as_numpy

__all__ = [
    "CalibratorKind",
    "Calibrator",
    "IdentityCalibrator",
    "ZScaling",
    "IsotonicRecalibration",
    "make_calibrator",
    "calibrator_from_state_dict",
]


class CalibratorKind(str, Enum):
    """Post-hoc std recalibration methods."""

    NONE = "none"
    """Identity: the std is returned unchanged."""
    ZSCALING = "zscaling"
    """One scalar multiplier ``c`` on the std, minimising the validation Gaussian NLL."""
    ISOTONIC = "isotonic"
    """Isotonic regression of observed vs expected CDF (Kuleshov et al. 2018), read as a std."""


class Calibrator(Protocol):
    """What every calibrator offers."""

    def fit(self, y_pred: ArrayLike, y_std: ArrayLike, y_true: ArrayLike) -> Calibrator: ...

    def transform(self, y_std: ArrayLike) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...


def _scale_like(y_std: ArrayLike, factor: float) -> Any:
    """``factor * y_std`` keeping the container type (tensor stays a tensor)."""
    if isinstance(y_std, torch.Tensor):
        return y_std * factor
    return np.asarray(y_std, dtype=np.float64) * factor


# ---------------------------------------------------------------- identity
class IdentityCalibrator:
    """No recalibration (``make_calibrator("none")``)."""

    def fit(self, y_pred: ArrayLike, y_std: ArrayLike, y_true: ArrayLike) -> IdentityCalibrator:
        return self

    def transform(self, y_std: ArrayLike) -> Any:
        return _scale_like(y_std, 1.0)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": CalibratorKind.NONE.value}

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> IdentityCalibrator:
        return cls()


# ---------------------------------------------------------------- z-scaling
class ZScaling:
    """Scalar std multiplier ``c`` fitted by minimising the Gaussian NLL on validation data.

    The NLL of ``N(mu, (c sigma)^2)`` is minimised in closed form by
    ``c^2 = mean((y - mu)^2 / sigma^2)`` (mean squared z-score). Levi et al. 2022 call it
    std scaling; ``transform(y_std) = c * y_std``.
    """

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = float(scale)

    def fit(
        self, y_pred: ArrayLike, y_std: ArrayLike, y_true: ArrayLike, *, nan_policy: str = "raise"
    ) -> ZScaling:
        p, s, t = _triple(y_pred, y_std, y_true, nan_policy)  # type: ignore[arg-type]
        self.scale = math.sqrt(float(np.mean(((t - p) / s) ** 2)))
        return self

    def transform(self, y_std: ArrayLike) -> Any:
        return _scale_like(y_std, self.scale)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": CalibratorKind.ZSCALING.value, "scale": self.scale}

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> ZScaling:
        return cls(scale=float(d["scale"]))


# ---------------------------------------------------------------- isotonic
class IsotonicRecalibration:
    """Isotonic recalibration of the predictive CDF (Kuleshov et al. 2018), read as a std.

    Fit: with ``p_i = Phi((y_i - mu_i) / sigma_i)`` on validation data, regress the
    empirical ``P_hat(p) = #{j: p_j <= p} / n`` on ``p`` with an isotonic fit ``R``. At the
    sorted ``p_i`` the empirical CDF is already non-decreasing, so the isotonic least-squares
    fit (pool-adjacent-violators) is ``P_hat`` itself and no solver is needed. ``R`` is
    pinned at ``R(0) = 0`` and ``R(1) = 1`` and linearly interpolated between knots. The
    recalibrated CDF is ``R(Phi((y - mu)/sigma))``.

    Read-out as a Gaussian std (this project's choice): because ``R`` acts on the
    standardised residual, the recalibrated central interval of probability ``level`` is
    ``[mu + sigma a, mu + sigma b]`` with ``a = Phi^-1(R^-1((1 - level)/2))`` and
    ``b = Phi^-1(R^-1((1 + level)/2))`` for every point. The Gaussian std with that interval
    width is ``sigma * (b - a) / (2 Phi^-1((1 + level)/2))``, so ``transform`` multiplies the
    std by one factor. Default ``level = 0.6827`` (the +-1 sigma interval); ``level = 0.95``
    matches the 95 % interval instead. ``R^-1`` is the generalised inverse
    ``min{x: R(x) >= q}``. The shift ``sigma (a + b) / 2`` of the interval centre is exposed
    as :attr:`centre_shift` (in units of sigma) but not applied to the mean.
    """

    def __init__(self, level: float = 0.6827, max_knots: int = 1000) -> None:
        if not 0.0 < level < 1.0:
            raise ValueError("level must be in (0, 1)")
        if max_knots < 2:
            raise ValueError("max_knots must be >= 2")
        self.level = float(level)
        self.max_knots = int(max_knots)
        self.knots_x: np.ndarray = np.array([0.0, 1.0])  # (k,) expected CDF values
        self.knots_y: np.ndarray = np.array([0.0, 1.0])  # (k,) observed (non-decreasing)

    # -- fit
    def fit(
        self, y_pred: ArrayLike, y_std: ArrayLike, y_true: ArrayLike, *, nan_policy: str = "raise"
    ) -> IsotonicRecalibration:
        p, s, t = _triple(y_pred, y_std, y_true, nan_policy)  # type: ignore[arg-type]
        cdf = np.sort(ndtr((t - p) / s))  # (n,)
        fitted = (
            np.searchsorted(cdf, cdf, side="right") / cdf.size
        )  # (n,) non-decreasing, in (0, 1]
        x = np.concatenate([[0.0], cdf, [1.0]])
        y = np.maximum.accumulate(np.concatenate([[0.0], fitted, [1.0]]))
        self.knots_x, self.knots_y = _compress_knots(x, y, self.max_knots)
        return self

    # -- the recalibration map and its inverse
    def recalibrated_cdf(self, p: ArrayLike) -> np.ndarray:
        """``R(p)`` for expected cumulative probabilities ``p`` (n,)."""
        return np.interp(as_numpy(p), self.knots_x, self.knots_y)

    def inverse(self, q: ArrayLike) -> np.ndarray:
        """Generalised inverse ``R^-1(q) = min{x: R(x) >= q}`` for ``q`` in [0, 1] (n,)."""
        qv = np.clip(as_numpy(q), 0.0, 1.0)
        xs, ys = self.knots_x, self.knots_y
        hi = np.clip(np.searchsorted(ys, qv, side="left"), 1, len(ys) - 1)
        lo = hi - 1
        dy = ys[hi] - ys[lo]
        frac = np.where(dy > 0, (qv - ys[lo]) / np.where(dy > 0, dy, 1.0), 0.0)
        out = xs[lo] + np.clip(frac, 0.0, 1.0) * (xs[hi] - xs[lo])
        return np.where(qv <= ys[0], xs[0], out)

    def _interval_z(self) -> tuple[float, float]:
        q = np.array([0.5 - 0.5 * self.level, 0.5 + 0.5 * self.level])
        x = np.clip(self.inverse(q), 1e-15, 1.0 - 1e-15)
        a, b = ndtri(x)
        return float(a), float(b)

    @property
    def scale(self) -> float:
        """Std multiplier ``(b - a) / (2 Phi^-1((1 + level)/2))``."""
        a, b = self._interval_z()
        return max((b - a) / (2.0 * float(ndtri(0.5 + 0.5 * self.level))), STD_FLOOR)

    @property
    def centre_shift(self) -> float:
        """Centre of the recalibrated interval relative to ``mu``, in units of sigma."""
        a, b = self._interval_z()
        return 0.5 * (a + b)

    def transform(self, y_std: ArrayLike) -> Any:
        return _scale_like(y_std, self.scale)

    # -- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": CalibratorKind.ISOTONIC.value,
            "level": self.level,
            "max_knots": self.max_knots,
            "knots_x": [float(v) for v in self.knots_x],
            "knots_y": [float(v) for v in self.knots_y],
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> IsotonicRecalibration:
        obj = cls(level=float(d["level"]), max_knots=int(d.get("max_knots", 1000)))
        obj.knots_x = np.asarray(d["knots_x"], dtype=np.float64)
        obj.knots_y = np.asarray(d["knots_y"], dtype=np.float64)
        return obj


def _compress_knots(x: np.ndarray, y: np.ndarray, max_knots: int) -> tuple[np.ndarray, np.ndarray]:
    """Drop interior knots of constant runs of ``y``, then thin to at most ``max_knots``.

    Thinning keeps evenly spaced knots (always the two ends); the interpolant stays
    non-decreasing, so the checkpoint state stays small for large validation sets.
    """
    same_prev = np.concatenate([[False], y[1:] == y[:-1]])
    same_next = np.concatenate([y[:-1] == y[1:], [False]])
    keep = ~(same_prev & same_next)
    x, y = x[keep], y[keep]
    if x.size > max_knots:
        idx = np.unique(np.round(np.linspace(0, x.size - 1, max_knots)).astype(np.int64))
        x, y = x[idx], y[idx]
    return x, y


# ---------------------------------------------------------------- factories
_CLASSES: dict[CalibratorKind, Any] = {
    CalibratorKind.NONE: IdentityCalibrator,
    CalibratorKind.ZSCALING: ZScaling,
    CalibratorKind.ISOTONIC: IsotonicRecalibration,
}


def make_calibrator(
    name: str | CalibratorKind,
) -> IdentityCalibrator | ZScaling | IsotonicRecalibration:
    """A fresh calibrator from ``"none" | "zscaling" | "isotonic"``."""
    return _CLASSES[CalibratorKind(name)]()


def calibrator_from_state_dict(
    d: dict[str, Any],
) -> IdentityCalibrator | ZScaling | IsotonicRecalibration:
    """Restore any calibrator from its ``state_dict()`` (dispatch on ``d["kind"]``)."""
    return _CLASSES[CalibratorKind(d["kind"])].from_state_dict(d)
