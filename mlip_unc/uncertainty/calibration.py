"""Calibration and accuracy metrics for Gaussian regression predictions.

Pure functions with one argument order everywhere, as in uncertainty-toolbox:
``(y_pred, y_std, y_true)``; metrics that need no std take ``(y_pred, y_true)``.
Inputs may be numpy arrays, torch tensors (any device; detached and copied to CPU) or
sequences of floats, of any shape: they are flattened to ``(n,)`` float64, and ``y_std`` is
broadcast against ``y_pred`` (a scalar std is allowed). Metrics return Python floats.

Library implementations are used where they exist: Spearman from ``scipy.stats.spearmanr``,
AUROC as the Mann-Whitney U of ``scipy.stats.mannwhitneyu``, the Gaussian log density and CDF
from ``scipy.stats.norm``. Miscalibration area, ENCE, coverage, CRPS and sharpness follow
uncertainty-toolbox's (and chemprop's) definitions, written out here.

Conventions (the metric list of docs/method.md section 7 of this project):

* ``y_std`` is a standard deviation (not a variance). Negative entries raise ``ValueError``;
  zeros are clipped to :data:`STD_FLOOR` so NLL, z-scores and ENCE stay finite (a zero std
  with a non-zero error then gives a very large NLL, which is the honest answer).
* Non-finite values: ``nan_policy="raise"`` (default) raises ``ValueError`` naming the
  array; ``"omit"`` drops every point where any input is NaN or infinite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from scipy import stats
from scipy.special import ndtri

ArrayLike = np.ndarray | torch.Tensor | Sequence[float] | float
NanPolicy = Literal["raise", "omit"]

STD_FLOOR: float = 1e-12
"""Smallest standard deviation used; zero stds are clipped up to it."""

__all__ = [
    "STD_FLOOR",
    "as_numpy",
    "spearman_corr",
    "rmse",
    "mae",
    "nll",
    "calibration_curve",
    "miscalibration_area",
    "ence",
    "spearman",
    "coverage",
    "crps",
    "sharpness",
    "auroc",
    "regression_metrics",
]


# ---------------------------------------------------------------- input handling
def as_numpy(x: ArrayLike) -> np.ndarray:
    """Flatten ``x`` (numpy array, torch tensor, sequence or scalar) to a float64 ``(n,)`` array."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64).reshape(-1)


def _finite_mask(arrays: dict[str, np.ndarray], nan_policy: NanPolicy) -> np.ndarray:
    if nan_policy not in ("raise", "omit"):
        raise ValueError(f"nan_policy must be 'raise' or 'omit', got {nan_policy!r}")
    mask = np.ones(next(iter(arrays.values())).shape, dtype=bool)
    for name, a in arrays.items():
        bad = ~np.isfinite(a)
        if bad.any() and nan_policy == "raise":
            raise ValueError(
                f"{name} has {int(bad.sum())} non-finite value(s) (first at index "
                f"{int(np.argmax(bad))}); pass nan_policy='omit' to drop those points"
            )
        mask &= ~bad
    return mask


def _pair(
    y_pred: ArrayLike, y_true: ArrayLike, nan_policy: NanPolicy
) -> tuple[np.ndarray, np.ndarray]:
    p, t = as_numpy(y_pred), as_numpy(y_true)
    if p.shape != t.shape:
        raise ValueError(f"y_pred {p.shape} and y_true {t.shape} differ in size")
    m = _finite_mask({"y_pred": p, "y_true": t}, nan_policy)
    if not m.any():
        raise ValueError("no finite points left")
    return p[m], t[m]


def _triple(
    y_pred: ArrayLike, y_std: ArrayLike, y_true: ArrayLike, nan_policy: NanPolicy
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked ``(y_pred (n,), y_std (n,), y_true (n,))`` with std clipped to STD_FLOOR."""
    p, t = as_numpy(y_pred), as_numpy(y_true)
    s = as_numpy(y_std)
    if p.shape != t.shape:
        raise ValueError(f"y_pred {p.shape} and y_true {t.shape} differ in size")
    if s.size == 1:
        s = np.full_like(p, s.item())
    if s.shape != p.shape:
        raise ValueError(f"y_std {s.shape} does not match y_pred {p.shape}")
    m = _finite_mask({"y_pred": p, "y_std": s, "y_true": t}, nan_policy)
    p, s, t = p[m], s[m], t[m]
    if p.size == 0:
        raise ValueError("no finite points left")
    if (s < 0).any():
        raise ValueError("y_std has negative entries (pass a standard deviation, not a log)")
    return p, np.maximum(s, STD_FLOOR), t


# ---------------------------------------------------------------- rank correlation
MIN_RANK_PAIRS = 3
"""Fewest (finite) pairs a rank correlation is computed from; with fewer it is NaN."""


def spearman_corr(a: ArrayLike, b: ArrayLike, *, nan_policy: NanPolicy = "raise") -> float:
    """The Spearman rank correlation of two ``(n,)`` arrays (``scipy.stats.spearmanr``): the
    one every rank correlation of the package is (:func:`spearman` is this of ``y_std`` and
    ``|y_pred - y_true|``).

    NaN, without a warning, with fewer than :data:`MIN_RANK_PAIRS` pairs or a constant array.
    ``nan_policy="omit"``: over the pairs where both are finite.
    """
    x, y = as_numpy(a), as_numpy(b)
    if x.shape != y.shape:
        raise ValueError(f"arrays differ in size: {x.shape} vs {y.shape}")
    m = _finite_mask({"a": x, "b": y}, nan_policy)
    x, y = x[m], y[m]
    if x.size < MIN_RANK_PAIRS or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(stats.spearmanr(x, y).statistic)


# ---------------------------------------------------------------- accuracy
def rmse(y_pred: ArrayLike, y_true: ArrayLike, *, nan_policy: NanPolicy = "raise") -> float:
    """Root mean squared error."""
    p, t = _pair(y_pred, y_true, nan_policy)
    return float(np.sqrt(np.mean((p - t) ** 2)))


def mae(y_pred: ArrayLike, y_true: ArrayLike, *, nan_policy: NanPolicy = "raise") -> float:
    """Mean absolute error."""
    p, t = _pair(y_pred, y_true, nan_policy)
    return float(np.mean(np.abs(p - t)))


# ---------------------------------------------------------------- proper scores
def nll(
    y_pred: ArrayLike, y_std: ArrayLike, y_true: ArrayLike, *, nan_policy: NanPolicy = "raise"
) -> float:
    """Gaussian negative log-likelihood, mean over points, including ``0.5 log(2 pi)``.

    ``mean( 0.5 log(2 pi sigma^2) + (y - mu)^2 / (2 sigma^2) )``.
    """
    p, s, t = _triple(y_pred, y_std, y_true, nan_policy)
    return float(-np.mean(stats.norm.logpdf(t, loc=p, scale=s)))


def crps(
    y_pred: ArrayLike, y_std: ArrayLike, y_true: ArrayLike, *, nan_policy: NanPolicy = "raise"
) -> float:
    """Continuous ranked probability score of a Gaussian, closed form, mean over points.

    ``sigma [ z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi) ]`` with ``z = (y - mu)/sigma``
    (Gneiting & Raftery 2007); equals ``E|X - y| - 0.5 E|X - X'|`` for ``X, X' ~ N(mu, sigma^2)``.
    """
    p, s, t = _triple(y_pred, y_std, y_true, nan_policy)
    z = (t - p) / s
    per_point = s * (
        z * (2.0 * stats.norm.cdf(z) - 1.0) + 2.0 * stats.norm.pdf(z) - 1.0 / math.sqrt(math.pi)
    )
    return float(np.mean(per_point))


# ---------------------------------------------------------------- calibration
def calibration_curve(
    y_pred: ArrayLike,
    y_std: ArrayLike,
    y_true: ArrayLike,
    n_levels: int = 100,
    *,
    nan_policy: NanPolicy = "raise",
) -> tuple[np.ndarray, np.ndarray]:
    """Expected vs observed proportions of centred Gaussian intervals.

    For each level ``p`` in ``linspace(0, 1, n_levels + 1)`` the observed proportion is the
    fraction of points with ``|y - mu| <= Phi^-1(0.5 + p/2) * sigma`` (uncertainty-toolbox's
    ``prop_type="interval"``; chemprop's miscalibration curve).

    Returns:
        ``(expected (n_levels + 1,), observed (n_levels + 1,))``.
    """
    if n_levels < 1:
        raise ValueError("n_levels must be >= 1")
    p, s, t = _triple(y_pred, y_std, y_true, nan_policy)
    expected = np.linspace(0.0, 1.0, n_levels + 1)
    half_width = ndtri(0.5 + 0.5 * expected)  # (L,), 0 .. inf
    abs_z = np.sort(np.abs(t - p) / s)  # (n,)
    observed = np.searchsorted(abs_z, half_width, side="right") / abs_z.size
    return expected, observed


def miscalibration_area(
    y_pred: ArrayLike,
    y_std: ArrayLike,
    y_true: ArrayLike,
    n_levels: int = 100,
    *,
    nan_policy: NanPolicy = "raise",
) -> float:
    """Area between the observed-vs-expected interval curve and the diagonal, in [0, 0.5].

    Trapezoidal integral of ``|observed - expected|`` over the levels of
    :func:`calibration_curve` (chemprop's definition; uncertainty-toolbox computes the same
    area with polygons, which differs only inside a segment where the curves cross).
    """
    expected, observed = calibration_curve(y_pred, y_std, y_true, n_levels, nan_policy=nan_policy)
    gap = np.abs(observed - expected)
    return float(np.sum(0.5 * (gap[1:] + gap[:-1]) * np.diff(expected)))  # trapezoid rule


def ence(
    y_pred: ArrayLike,
    y_std: ArrayLike,
    y_true: ArrayLike,
    n_bins: int = 10,
    *,
    nan_policy: NanPolicy = "raise",
) -> float:
    """Expected normalised calibration error (Levi et al. 2022; chemprop v1's definition).

    Points are sorted by std and split into ``n_bins`` bins of (almost) equal count; per bin
    ``RMV = sqrt(mean sigma^2)`` and ``RMSE = sqrt(mean err^2)``;
    ``ENCE = mean_bins |RMV - RMSE| / RMV``. 0 is perfectly calibrated.
    """
    p, s, t = _triple(y_pred, y_std, y_true, nan_policy)
    n_bins = min(n_bins, p.size)
    order = np.argsort(s, kind="mergesort")
    vals = []
    for idx in np.array_split(order, n_bins):
        rmv = math.sqrt(float(np.mean(s[idx] ** 2)))
        err = math.sqrt(float(np.mean((p[idx] - t[idx]) ** 2)))
        vals.append(abs(rmv - err) / rmv)
    return float(np.mean(vals))


def spearman(
    y_pred: ArrayLike, y_std: ArrayLike, y_true: ArrayLike, *, nan_policy: NanPolicy = "raise"
) -> float:
    """The calibration metric ``spearman_corr(y_std, |y_pred - y_true|)``: does a larger std
    come with a larger error? NaN when the std is constant."""
    p, s, t = _triple(y_pred, y_std, y_true, nan_policy)
    return spearman_corr(s, np.abs(p - t))


def coverage(
    y_pred: ArrayLike,
    y_std: ArrayLike,
    y_true: ArrayLike,
    level: float = 0.95,
    *,
    nan_policy: NanPolicy = "raise",
) -> float:
    """Fraction of points inside the central Gaussian interval of probability ``level``."""
    if not 0.0 < level < 1.0:
        raise ValueError("level must be in (0, 1)")
    p, s, t = _triple(y_pred, y_std, y_true, nan_policy)
    half = float(ndtri(0.5 + 0.5 * level))
    return float(np.mean(np.abs(t - p) <= half * s))


def sharpness(y_std: ArrayLike, *, nan_policy: NanPolicy = "raise") -> float:
    """Root mean variance ``sqrt(mean sigma^2)`` (uncertainty-toolbox's sharpness)."""
    s = as_numpy(y_std)
    s = s[_finite_mask({"y_std": s}, nan_policy)]
    if (s < 0).any():
        raise ValueError("y_std has negative entries")
    return float(np.sqrt(np.mean(s**2)))


# ---------------------------------------------------------------- OOD detection
def auroc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Area under the ROC curve: Mann-Whitney ``U / (n_pos n_neg)`` (``scipy.stats.mannwhitneyu``).

    Args:
        scores: ``(n,)`` higher = more likely positive (e.g. predictive std for OOD).
        labels: ``(n,)`` 1/True = positive (e.g. out-of-distribution), 0/False = negative.

    Ties count one half. Raises ``ValueError`` if only one class is present or scores are
    non-finite.
    """
    s = as_numpy(scores)
    y = as_numpy(labels)
    if s.shape != y.shape:
        raise ValueError(f"scores {s.shape} and labels {y.shape} differ in size")
    _finite_mask({"scores": s, "labels": y}, "raise")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels must be 0/1")
    pos = y == 1.0
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("auroc needs both positive and negative labels")
    u = stats.mannwhitneyu(s[pos], s[~pos], method="asymptotic").statistic
    return float(u / (n_pos * n_neg))


# ---------------------------------------------------------------- all at once
def regression_metrics(
    y_pred: ArrayLike,
    y_std: ArrayLike,
    y_true: ArrayLike,
    *,
    nan_policy: NanPolicy = "raise",
) -> dict[str, float]:
    """All metrics of docs/method.md section 7 of this project.

    Keys: ``rmse, mae, nll, spearman, miscalibration_area, ence, coverage_95, crps, sharpness``.
    """
    p, s, t = _triple(y_pred, y_std, y_true, nan_policy)
    return {
        "rmse": rmse(p, t),
        "mae": mae(p, t),
        "nll": nll(p, s, t),
        "spearman": spearman(p, s, t),
        "miscalibration_area": miscalibration_area(p, s, t),
        "ence": ence(p, s, t),
        "coverage_95": coverage(p, s, t, 0.95),
        "crps": crps(p, s, t),
        "sharpness": sharpness(s),
    }
