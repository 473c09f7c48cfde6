"""Latent regularisers: alignment-guided learning (AGL) and LPA-breaking interventions.

As defined in docs/method.md sections 5 and 6 of this project. Every term is differentiable
with respect to the latents ``z`` only: the posterior means ``mu`` and variances ``s2`` enter
through ``.detach()`` (the stop-gradient ``sg``), so the terms move the encoder's latent
geometry, not the posterior.

Shapes: z (batch, d), mu (d,), s2 (d,); every term returns a scalar tensor ``()``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mlip_unc.config.enums import RegularizerKind
from mlip_unc.uncertainty.moments import latent_variance

__all__ = [
    "RegularizerKind",
    "agl_rayleigh",
    "agl_mean",
    "decorrelation",
    "isotropy_penalty",
    "anti_alignment",
    "LambdaSchedule",
    "regularizer_term",
]

EPS: float = 1e-8


def _rayleigh(z: Tensor, s2: Tensor, eps: float) -> Tensor:
    """Per-example ``z^T sg(S) z / (z^T z + eps)``: (batch,)."""
    s2 = s2.detach().to(z.dtype)
    return latent_variance(z, s2) / ((z * z).sum(dim=1) + eps)


def agl_rayleigh(z: Tensor, s2: Tensor, eps: float = EPS) -> Tensor:
    """AGL Rayleigh term ``mean_batch(z^T sg(S) z / (z^T z + eps))``, docs/method.md section 6 of this project.

    The normalisation by ``||z||^2`` removes the trivial fix of shrinking z; the minimum over
    directions is ``min_k s2_k``, reached by z on the lowest-variance axis.
    """
    return _rayleigh(z, s2, eps).mean()


def agl_mean(z: Tensor, mu: Tensor, s2: Tensor, eps: float = EPS) -> Tensor:
    """AGL mean form ``mean_batch(1 - A(z))``, docs/method.md section 6 of this project.

    ``A(z) = (mu^T z)^2 / ((z^T S z)(mu^T S^-1 mu))`` with ``mu`` and ``S`` detached; ``eps``
    keeps the denominator positive at ``z = 0``. Minimised (0) by z proportional to ``S^-1 mu``.
    """
    mu = mu.detach().to(z.dtype)
    s2 = s2.detach().to(z.dtype)
    m = z @ mu  # (batch,)
    u = latent_variance(z, s2)  # (batch,)
    c = (mu * mu / s2).sum()  # ()
    a = m * m / (u * c + eps)
    return (1.0 - a).mean()


def decorrelation(z: Tensor) -> Tensor:
    """``||offdiag(Cov_batch(z))||_F^2`` with the unbiased batch covariance (0 for batch < 2)."""
    n = z.shape[0]
    if n < 2:
        return (z * 0.0).sum()
    zc = z - z.mean(dim=0, keepdim=True)
    cov = zc.T @ zc / (n - 1)  # (d, d)
    off = cov - torch.diag_embed(torch.diagonal(cov))
    return (off * off).sum()


def isotropy_penalty(z: Tensor, eps: float = EPS) -> Tensor:
    """Isotropy intervention, docs/method.md section 5 of this project.

    With ``m_k = mean_batch z_k^2`` (d,), returns ``Var_k(m_k) / (mean_k m_k)^2`` (squared
    coefficient of variation, population variance): 0 iff all coordinates carry the same
    second moment, and invariant to the scale of z, so the latent scale is held fixed.
    """
    m = (z * z).mean(dim=0)  # (d,)
    return m.var(unbiased=False) / (m.mean() ** 2 + eps)


def anti_alignment(z: Tensor, s2: Tensor, eps: float = EPS) -> Tensor:
    """Anti-alignment intervention ``-mean_batch(z^T sg(S) z / ||z||^2)``, docs/method.md section 5 of this project."""
    return -_rayleigh(z, s2, eps).mean()


@dataclass(frozen=True)
class LambdaSchedule:
    """Regulariser weight ``lambda(epoch)``, docs/method.md section 6 of this project.

    0 for ``epoch < warmup_epochs``, then a linear ramp reaching ``lam_max`` at
    ``warmup_epochs + ramp_epochs`` (constant afterwards); ``lambda(warmup_epochs) = 0``.
    ``ramp_epochs = 0`` jumps to ``lam_max`` at the end of the warm-up. Fractional epochs work.
    """

    warmup_epochs: float
    ramp_epochs: float
    lam_max: float

    def __post_init__(self) -> None:
        if self.warmup_epochs < 0 or self.ramp_epochs < 0:
            raise ValueError("warmup_epochs and ramp_epochs must be >= 0")

    def __call__(self, epoch: float) -> float:
        if epoch < self.warmup_epochs:
            return 0.0
        if self.ramp_epochs == 0:
            return float(self.lam_max)
        frac = min(1.0, (epoch - self.warmup_epochs) / self.ramp_epochs)
        return float(self.lam_max * frac)


def regularizer_term(
    kind: str | RegularizerKind, z: Tensor, mu: Tensor | None, s2: Tensor | None
) -> Tensor:
    """The unweighted extra term for ``kind`` (see :class:`RegularizerKind`); a scalar tensor.

    ``mu``, ``s2``: the Bayesian head's posterior mean and variance ``(d,)``, needed by the
    ``agl_*`` and ``anti`` terms (None without a Bayesian head).
    Multiply by ``LambdaSchedule(...)(epoch)`` and add to the ELBO loss. The rotation
    intervention is a module (:class:`RandomRotation`), not a loss term.
    """
    k = RegularizerKind(kind)
    if k is RegularizerKind.NONE:
        return z.new_zeros(())
    if k is RegularizerKind.ISOTROPY:
        return isotropy_penalty(z)
    if k is RegularizerKind.DECORRELATION:
        return decorrelation(z)
    if mu is None or s2 is None:
        raise ValueError(f"regularizer {k.value!r} needs the posterior of a Bayesian head")
    if k is RegularizerKind.AGL_RAYLEIGH:
        return agl_rayleigh(z, s2)
    if k is RegularizerKind.AGL_MEAN:
        return agl_mean(z, mu, s2)
    return anti_alignment(z, s2)
