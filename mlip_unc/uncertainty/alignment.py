"""Latent-posterior alignment (LPA) metrics, as defined in docs/method.md section 4 of this project.

Setting (docs/method.md section 2 of this project): latents ``z`` (n, d), mean-field Gaussian
posterior of the output weights with means ``mu`` (d,) and variances ``s2`` (d,), ``S = diag(s2)``.
The epistemic variance of the latent part is ``U(z) = z^T S z``.

Functions accept torch tensors or numpy arrays and compute in torch; ``mu`` and ``s2`` are cast
to the dtype and device of ``z`` (numpy input becomes float64 on the CPU). Per-point results are
tensors, scalar summaries Python floats. Nothing is detached here, so the per-point functions
are differentiable; the training terms in ``mlip_unc.train.regularizers`` detach the posterior.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from mlip_unc.uncertainty.calibration import spearman_corr
from mlip_unc.uncertainty.moments import alignment_kappa, latent_variance

TensorLike = Tensor | np.ndarray | Sequence[float]

__all__ = [
    "ThreeFactorSplit",
    "LogUDecomposition",
    "three_factor_split",
    "alignment_index",
    "rho_lpa",
    "low_variance_energy_fraction",
    "permutation_baseline",
    "mean_log_factors",
    "log_variance_decomposition",
    "effective_rank",
    "lpa_summary",
]


def _as_z(z: TensorLike) -> Tensor:
    t = z if isinstance(z, Tensor) else torch.as_tensor(np.asarray(z, dtype=np.float64))
    if t.dim() != 2:
        raise ValueError(f"z must be (n, d), got shape {tuple(t.shape)}")
    return t


def _as_vec(v: TensorLike, z: Tensor, name: str) -> Tensor:
    t = v if isinstance(v, Tensor) else torch.as_tensor(np.asarray(v, dtype=np.float64))
    t = t.to(dtype=z.dtype, device=z.device)
    if t.shape != (z.shape[1],):
        raise ValueError(f"{name} must be (d,) = ({z.shape[1]},), got {tuple(t.shape)}")
    return t


class ThreeFactorSplit(NamedTuple):
    """``z^T S z = norm2 * mean_s2 * kappa`` (docs/method.md section 4 of this project)."""

    norm2: Tensor
    """(n,) | squared latent norm ``||z||^2``."""
    mean_s2: Tensor
    """() | mean posterior variance ``s_bar^2 = mean_k s_k^2``."""
    kappa: Tensor
    """(n,) | alignment factor ``(u^T S u) / s_bar^2`` with ``u = z/||z||``; 1 where z = 0."""


def three_factor_split(z: TensorLike, s2: TensorLike) -> ThreeFactorSplit:
    """Three-factor split ``z^T S z = ||z||^2 * s_bar^2 * kappa(z)``.

    As defined in docs/method.md section 4 of this project. ``kappa = 1`` means no alignment
    (the expectation under a random permutation of the posterior axes); ``kappa < 1`` is LPA.
    ``kappa`` is :func:`mlip_unc.uncertainty.moments.alignment_kappa`, with ``kappa(0) = 1``.
    """
    zt = _as_z(z)
    s2t = _as_vec(s2, zt, "s2")
    norm2 = (zt * zt).sum(dim=1)  # (n,)
    return ThreeFactorSplit(norm2, s2t.mean(), alignment_kappa(zt, s2t))


def alignment_index(
    z: TensorLike, mu: TensorLike, s2: TensorLike, min_abs_mean: float = 0.0
) -> Tensor:
    """Mean-conditioned alignment index ``A(z) = (mu^T z)^2 / ((z^T S z)(mu^T S^-1 mu))`` in [0, 1].

    As defined in docs/method.md section 4 of this project (Cauchy-Schwarz; ``A = 1`` iff
    ``z`` is proportional to ``S^-1 mu``). Ill-conditioned for ``m = mu^T z`` near 0, so
    entries with ``|m| <= min_abs_mean`` are NaN (with the default 0.0 only exact zeros);
    ``min_abs_mean`` is absolute, in the units of the prediction's latent part.

    Shapes: z (n, d), mu (d,), s2 (d,) -> (n,).
    """
    zt = _as_z(z)
    mut, s2t = _as_vec(mu, zt, "mu"), _as_vec(s2, zt, "s2")
    m = zt @ mut  # (n,)
    u = latent_variance(zt, s2t)  # (n,)
    c = (mut * mut / s2t).sum()  # () mu^T S^-1 mu
    a = m * m / (u * c)
    return torch.where(m.abs() > min_abs_mean, a, torch.full_like(a, float("nan")))


def rho_lpa(z: TensorLike, s2: TensorLike) -> float:
    """Axis correlation: Spearman over coordinates k of ``(mean_n z_k^2, s2_k)``.

    As defined in docs/method.md section 4 of this project; negative = aligned (latent energy
    sits on low-variance axes). NaN if either side is constant.
    """
    zt = _as_z(z)
    s2t = _as_vec(s2, zt, "s2")
    second_moment = (zt * zt).mean(dim=0)  # (d,)
    return spearman_corr(second_moment.detach(), s2t.detach())


def low_variance_energy_fraction(z: TensorLike, s2: TensorLike, r: int) -> Tensor:
    """Share of ``||z||^2`` on the ``r`` coordinates with the smallest ``s2_k``, per point (n,).

    As defined in docs/method.md section 4 of this project. Under no alignment its expectation
    is about ``r / d``. Ties in ``s2`` are broken by coordinate index.
    """
    zt = _as_z(z)
    s2t = _as_vec(s2, zt, "s2")
    if not 1 <= r <= zt.shape[1]:
        raise ValueError(f"r must be in [1, d={zt.shape[1]}], got {r}")
    low = torch.argsort(s2t.detach(), stable=True)[:r]  # (r,)
    z2 = zt * zt
    return z2[:, low].sum(dim=1) / z2.sum(dim=1)


def permutation_baseline(z: TensorLike, s2: TensorLike) -> tuple[Tensor, Tensor]:
    """Permutation test: ``(U_actual (n,), U_perm (n,))`` with ``U_perm = ||z||^2 * mean(s2)``.

    As defined in docs/method.md section 4 of this project. ``U_perm`` is the exact expectation
    of ``z^T S_pi z`` over uniformly random permutations ``pi`` of the posterior axes.
    """
    zt = _as_z(z)
    s2t = _as_vec(s2, zt, "s2")
    split = three_factor_split(zt, s2t)
    return latent_variance(zt, s2t), split.norm2 * split.mean_s2


@dataclass(frozen=True)
class LogUDecomposition:
    """Change of ``mean log U`` from model a to model b, split over the three factors.

    ``log_u = log_norm2 + log_mean_s2 + log_kappa`` (each a difference b - a of means over
    points; docs/method.md section 4 of this project).
    """

    log_norm2: float
    """Difference of ``mean log ||z||^2``."""
    log_mean_s2: float
    """Difference of ``log s_bar^2``."""
    log_kappa: float
    """Difference of ``mean log kappa``."""
    log_u: float
    """Difference of ``mean log U`` (the sum of the three)."""

    @property
    def dominant(self) -> str:
        """Name of the factor with the largest absolute change: norm2, mean_s2 or kappa."""
        parts = {"norm2": self.log_norm2, "mean_s2": self.log_mean_s2, "kappa": self.log_kappa}
        return max(parts, key=lambda k: abs(parts[k]))

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def mean_log_factors(
    stats: ThreeFactorSplit | tuple[TensorLike, TensorLike, TensorLike],
) -> tuple[float, float, float]:
    """``(mean log ||z||^2, log s_bar^2, mean log kappa)`` of a :func:`three_factor_split`.

    Means over the points with ``z != 0`` (and a finite, positive kappa); NaN means when there
    is none. Their sum is ``mean log U`` over those points (docs/method.md section 4).
    """
    norm2, mean_s2, kappa = (
        torch.as_tensor(np.asarray(v, dtype=np.float64))
        if not isinstance(v, Tensor)
        else v.detach().double().cpu()
        for v in stats
    )
    ok = (norm2 > 0) & (kappa > 0) & torch.isfinite(kappa)  # drop z = 0 points
    return (
        float(norm2[ok].log().mean()),
        math.log(float(mean_s2)),
        float(kappa[ok].log().mean()),
    )


def log_variance_decomposition(
    model_a_stats: ThreeFactorSplit | tuple[TensorLike, TensorLike, TensorLike],
    model_b_stats: ThreeFactorSplit | tuple[TensorLike, TensorLike, TensorLike],
) -> LogUDecomposition:
    """Which factor moved ``log U`` between two models (b minus a).

    Each argument is a :class:`ThreeFactorSplit` (or a ``(norm2, mean_s2, kappa)`` tuple) from
    :func:`three_factor_split`; the two may cover different points. Since
    ``log U = log||z||^2 + log s_bar^2 + log kappa`` per point, the differences of the means
    add up to the difference of ``mean log U`` (as defined in docs/method.md section 4 of this
    project). Points with ``z = 0`` are dropped.
    """
    a, b = mean_log_factors(model_a_stats), mean_log_factors(model_b_stats)
    if math.isnan(a[0]) or math.isnan(b[0]):
        raise ValueError("no point with ||z|| > 0")
    d = [bb - aa for aa, bb in zip(a, b, strict=False)]
    return LogUDecomposition(log_norm2=d[0], log_mean_s2=d[1], log_kappa=d[2], log_u=sum(d))


def effective_rank(z: TensorLike, *, center: bool = False) -> float:
    """Effective rank ``exp(H(p))`` with ``p_i = sigma_i^2 / sum_j sigma_j^2`` over singular values of z.

    Roy & Vetterli (2007) normalise the singular values themselves; here they are squared (the
    spectrum of ``z^T z``), as specified for this project. Ranges from 1 (rank one) to
    ``min(n, d)`` (isotropic). ``center=True`` subtracts the mean latent first (the default
    keeps the uncentred second moment, which is what ``z^T S z`` sees). NaN for z = 0.
    """
    zt = _as_z(z).detach().double().cpu()
    if center:
        zt = zt - zt.mean(dim=0, keepdim=True)
    sv2 = torch.linalg.svdvals(zt) ** 2
    total = sv2.sum()
    if total <= 0:
        return float("nan")
    p = sv2 / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


@torch.no_grad()
def lpa_summary(
    z: TensorLike,
    mu: TensorLike,
    s2: TensorLike,
    *,
    min_abs_mean: float = 0.0,
    r: int | None = None,
) -> dict[str, float]:
    """Summary of docs/method.md section 4 of this project over a set of latents.

    Keys: ``mean_u`` (mean z^T S z), ``mean_norm2``, ``mean_s2``, ``mean_s`` (mean posterior std
    ``sqrt(s2_k)`` over k), ``mean_kappa`` (points with z = 0 count with ``kappa = 1``),
    ``median_alignment`` (NaN-ignoring median of A with
    ``min_abs_mean``), ``rho_lpa``, ``low_variance_fraction`` (mean over points, ``r = d // 4``
    unless given, at least 1), ``effective_rank``.
    """
    zt = _as_z(z)
    s2t = _as_vec(s2, zt, "s2")
    split = three_factor_split(zt, s2t)
    r_eff = max(1, zt.shape[1] // 4) if r is None else r
    a = alignment_index(zt, mu, s2t, min_abs_mean)
    return {
        "mean_u": float(latent_variance(zt, s2t).mean()),
        "mean_norm2": float(split.norm2.mean()),
        "mean_s2": float(split.mean_s2),
        "mean_s": float(s2t.sqrt().mean()),
        "mean_kappa": float(torch.nanmean(split.kappa)),
        "median_alignment": float(torch.nanmedian(a))
        if bool(torch.isfinite(a).any())
        else float("nan"),
        "rho_lpa": rho_lpa(zt, s2t),
        "low_variance_fraction": float(torch.nanmean(low_variance_energy_fraction(zt, s2t, r_eff))),
        "effective_rank": effective_rank(zt),
    }
