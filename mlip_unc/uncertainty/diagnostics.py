"""Diagnostics of force uncertainty: does sigma_F carry information beyond |F_pred|?

Pure functions on arrays (numpy, torch tensors or sequences; flattened to float64 as in
:mod:`mlip_unc.uncertainty.calibration`, whose :func:`spearman_corr` and :func:`auroc` are
reused). The failure they detect: with a near rank-one latent Jacobian,
``sigma_F`` is ``|F_pred|`` times a constant, so ranking frames by ``sigma_F`` says nothing
``|F_pred|`` does not already say.

Definitions (n = atoms, f = frames):

* per-atom force std ``sigma_a = sqrt(sum_c Var F_ac)`` (:func:`atom_force_std`), per-atom
  force norm ``|F_a|`` (:func:`atom_force_norm`);
* frame values are the max (or mean) over a frame's atoms (:func:`per_frame`);
* Spearman correlations are ``calibration.spearman_corr`` over the finite pairs
  (``nan_policy="omit"``), NaN with fewer than 3 pairs or a constant input;
* partial Spearman ``rho(x, y | z)``: x, y, z are rank-transformed (average ranks for ties)
  and the Pearson correlation of the ranks of x and y is taken with the ranks of z partialled
  out, ``(r_xy - r_xz r_yz) / sqrt((1 - r_xz^2)(1 - r_yz^2))``, where each ``r`` is a
  Spearman correlation (Pearson of ranks);
* ``std_over_rmse = sqrt(mean Var) / sqrt(mean err^2)`` over every force component.
"""

from __future__ import annotations

import math

import numpy as np

from mlip_unc.uncertainty.calibration import ArrayLike, as_numpy, auroc, spearman_corr

__all__ = [
    "atom_force_std",
    "atom_force_norm",
    "per_frame",
    "sigma_force_spearman_atoms",
    "sigma_force_spearman_frames",
    "partial_spearman",
    "sigma_over_force_auroc",
    "std_over_rmse",
    "frame_ranking",
    "jacobian_effective_rank",
]


def _finite(*arrays: np.ndarray) -> np.ndarray:
    """Mask ``(n,)`` of the positions where every array is finite."""
    mask = np.ones(arrays[0].shape, dtype=bool)
    for a in arrays:
        if a.shape != arrays[0].shape:
            raise ValueError(f"arrays differ in size: {a.shape} vs {arrays[0].shape}")
        mask &= np.isfinite(a)
    return mask


#: points below which :func:`partial_spearman` is NaN (any rank correlation: MIN_RANK_PAIRS of
#: :mod:`~mlip_unc.uncertainty.calibration`)
MIN_PARTIAL_PAIRS = 4


# ---------------------------------------------------------------- per atom and per frame
def atom_force_std(forces_var: ArrayLike) -> np.ndarray:
    """``sigma_a = sqrt(sum_c Var F_ac)`` ``(n_atoms,)`` from a variance ``(n_atoms, 3)``.

    Negative variances (round-off) are clipped to 0.
    """
    var = as_numpy(forces_var).reshape(-1, 3)
    return np.sqrt(np.clip(var, 0.0, None).sum(1))


def atom_force_norm(forces: ArrayLike) -> np.ndarray:
    """``|F_a|`` ``(n_atoms,)``: Euclidean norm over x, y, z of ``forces (n_atoms, 3)``."""
    return np.linalg.norm(as_numpy(forces).reshape(-1, 3), axis=1)


def per_frame(
    values: ArrayLike, atom_frame: ArrayLike, n_frames: int | None = None, how: str = "max"
) -> np.ndarray:
    """Reduce per-atom ``values (n_atoms,)`` to ``(n_frames,)`` by ``how`` = "max" or "mean".

    ``atom_frame (n_atoms,)`` is the frame (0..n_frames-1) of each atom; a frame without atoms
    gets NaN.
    """
    v = as_numpy(values)
    frame = np.asarray(atom_frame, dtype=np.int64).reshape(-1)
    if frame.shape != v.shape:
        raise ValueError(f"values {v.shape} and atom_frame {frame.shape} differ in size")
    n = int(frame.max()) + 1 if n_frames is None else int(n_frames)
    count = np.bincount(frame, minlength=n).astype(np.float64)
    if how == "mean":
        out = np.bincount(frame, weights=v, minlength=n) / np.maximum(count, 1.0)
    elif how == "max":
        out = np.full(n, -np.inf)
        np.maximum.at(out, frame, v)
    else:
        raise ValueError(f"how must be 'max' or 'mean', got {how!r}")
    return np.where(count > 0, out, np.nan)


def sigma_force_spearman_atoms(forces_var: ArrayLike, forces_pred: ArrayLike) -> float:
    """Per-atom ``Spearman(sigma_a, |F_pred,a|)``; near 1 means sigma_F is |F| in disguise."""
    return spearman_corr(
        atom_force_std(forces_var), atom_force_norm(forces_pred), nan_policy="omit"
    )


def sigma_force_spearman_frames(
    forces_var: ArrayLike, forces_pred: ArrayLike, atom_frame: ArrayLike
) -> float:
    """Per-frame ``Spearman(max_a sigma_a, max_a |F_pred,a|)`` (frame = max over its atoms)."""
    sigma = per_frame(atom_force_std(forces_var), atom_frame)
    force = per_frame(atom_force_norm(forces_pred), atom_frame)
    return spearman_corr(sigma, force, nan_policy="omit")  # a frame without atoms: NaN


# ---------------------------------------------------------------- beyond |F_pred|
def partial_spearman(x: ArrayLike, y: ArrayLike, control: ArrayLike) -> float:
    """Partial Spearman correlation of ``x`` and ``y`` given ``control`` (all ``(n,)``).

    Rank-transform all three (over the points where all are finite), then the partial Pearson
    correlation of the ranks: ``(r_xy - r_xz r_yz) / sqrt((1 - r_xz^2)(1 - r_yz^2))``.
    E.g. ``x`` = sigma_F, ``y`` = force error, ``control`` = |F_pred|: how well sigma_F ranks
    errors beyond what |F_pred| explains. NaN when fewer than 4 points, an input is constant,
    or ``control`` ranks ``x`` or ``y`` perfectly (``|r| = 1``: nothing left to correlate).
    """
    a, b, c = as_numpy(x), as_numpy(y), as_numpy(control)
    ok = _finite(a, b, c)
    if ok.sum() < MIN_PARTIAL_PAIRS:
        return float("nan")
    a, b, c = a[ok], b[ok], c[ok]
    r_xy, r_xz, r_yz = spearman_corr(a, b), spearman_corr(a, c), spearman_corr(b, c)
    denom = (1.0 - r_xz**2) * (1.0 - r_yz**2)
    if not (math.isfinite(r_xy) and math.isfinite(denom)) or denom <= 1e-12:
        return float("nan")
    return float(np.clip((r_xy - r_xz * r_yz) / math.sqrt(denom), -1.0, 1.0))


def sigma_over_force_auroc(sigma: ArrayLike, force: ArrayLike, labels: ArrayLike) -> float:
    """AUROC of ``sigma / |F_pred|`` for separating in-domain (label 0) from OOD (label 1).

    ``sigma (n,)`` and ``force (n,)`` are frame values (e.g. both the max over atoms);
    a zero force gives an infinite ratio, clipped to the largest finite one (a frame with no
    predicted force but some uncertainty ranks highest). 0.5 when the ratio is constant
    (sigma proportional to |F|); uses ``calibration.auroc`` (ties count one half).
    """
    s, f, y = as_numpy(sigma), as_numpy(force), as_numpy(labels)
    ok = _finite(s, f, y)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(f[ok] > 0, s[ok] / f[ok], np.where(s[ok] > 0, np.inf, 0.0))
    finite = np.isfinite(ratio)
    top = ratio[finite].max() if finite.any() else 0.0
    return auroc(np.where(finite, ratio, top * (1.0 + 1e-9) + 1e-300), y[ok])


def std_over_rmse(var: ArrayLike, errors: ArrayLike) -> float:
    """Mean predicted std over mean error, per force component: ``sqrt(mean var) / sqrt(mean err^2)``.

    ``var`` is the predicted variance of each component (e.g. ``(n_atoms, 3)`` epistemic force
    variances), ``errors`` the errors ``F_pred - F_true`` of the same shape; both are averaged
    over every component of every atom (of every frame). 1 = the stds are, on average, the size
    of the errors; << 1 = overconfident. Finite pairs only; NaN without errors or at zero RMSE.
    """
    v, e = as_numpy(var), as_numpy(errors)
    if v.shape != e.shape:
        raise ValueError(f"var {v.shape} and errors {e.shape} differ in size")
    ok = _finite(v, e)
    if not ok.any():
        return float("nan")
    mse = float(np.mean(e[ok] ** 2))
    if mse == 0.0:
        return float("nan")
    return math.sqrt(float(np.mean(np.clip(v[ok], 0.0, None))) / mse)


def frame_ranking(
    score: ArrayLike,
    error: ArrayLike,
    force: ArrayLike,
    score_ood: ArrayLike | None = None,
    error_ood: ArrayLike | None = None,
    force_ood: ArrayLike | None = None,
) -> dict[str, float]:
    """How a frame score ranks in-domain errors and separates OOD frames.

    Args:
        score, error, force: in-domain frame values ``(n,)``: the uncertainty score (e.g. max
            force std), the error (e.g. mean |F_pred - F_true|) and the predicted force
            (e.g. max |F_pred|); ``*_ood``: the same ``(m,)`` on OOD frames, or None.

    Returns:
        ``spearman_frame_in_domain`` (score vs error, in-domain), ``spearman_frame_pooled``
        (in-domain + OOD; in-domain only without OOD), ``partial_spearman_given_force``
        (in-domain score vs error given force), ``auroc_ood`` (score: in-domain 0 vs OOD 1)
        and ``auroc_sigma_over_force`` (score / force); the AUROCs are NaN without OOD frames.
    """
    s, e, f = as_numpy(score), as_numpy(error), as_numpy(force)
    out = {"auroc_ood": math.nan, "auroc_sigma_over_force": math.nan}
    if score_ood is not None:
        if error_ood is None or force_ood is None:
            raise ValueError("score_ood needs error_ood and force_ood (the same OOD frames)")
        labels = np.r_[np.zeros(s.size), np.ones(as_numpy(score_ood).size)]
        s_all = np.r_[s, as_numpy(score_ood)]
        out["auroc_ood"] = auroc(s_all, labels)
        out["auroc_sigma_over_force"] = sigma_over_force_auroc(
            s_all, np.r_[f, as_numpy(force_ood)], labels
        )
        pooled = spearman_corr(s_all, np.r_[e, as_numpy(error_ood)], nan_policy="omit")
    else:
        pooled = spearman_corr(s, e, nan_policy="omit")
    return {
        **out,
        "spearman_frame_in_domain": spearman_corr(s, e, nan_policy="omit"),
        "spearman_frame_pooled": pooled,
        "partial_spearman_given_force": partial_spearman(s, e, f),
    }


# ---------------------------------------------------------------- force Jacobian of the latents
# jacobian_effective_rank: added by the features work
def jacobian_effective_rank(jacobian: ArrayLike, *, rel_tol: float | None = None) -> float:
    """Effective rank of the latents' position Jacobian ``J = dPhi/dr`` ``(d, 3N)``.

    ``J`` may also be ``(d, N, 3)`` (any trailing shape is flattened per row). With singular
    values ``s_i`` and ``p_i = s_i / sum_j s_j``: ``exp(-sum_i p_i log p_i)`` (Roy & Vetterli's
    effective rank; 1 for ``J = a g^T``, ``k`` for ``k`` equal singular values), or with
    ``rel_tol`` the number of ``s_i > rel_tol * max(s)``. 0 for a zero matrix. Near 1 means
    every latent moves along one direction in configuration space, so sigma_F ~ |F_pred|
    whatever the posterior (method.md 3b).
    """
    detach = getattr(jacobian, "detach", None)
    raw = detach().cpu().numpy() if detach is not None else jacobian
    jac = np.asarray(raw, dtype=np.float64)
    jac = jac.reshape(jac.shape[0], -1) if jac.ndim > 1 else jac.reshape(1, -1)
    s = np.linalg.svd(jac, compute_uv=False)
    if not np.all(np.isfinite(s)):
        raise ValueError("the Jacobian has non-finite entries")
    if s.size == 0 or s.max() <= 0.0:
        return 0.0
    if rel_tol is not None:
        return float(np.count_nonzero(s > rel_tol * s.max()))
    p = s / s.sum()
    p = p[p > 0]
    return float(math.exp(-np.sum(p * np.log(p))))
