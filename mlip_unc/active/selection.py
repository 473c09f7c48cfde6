"""Pick structures for reference (DFT) labelling: rank by uncertainty, optionally diversify.

:func:`select` ranks by a score (e.g. the max force std) and keeps the top ``k`` and/or those
above a threshold. With ``features`` it diversifies: among a pool of the highest-scoring
candidates it runs farthest-point sampling (FPS), starting from the top-scoring one, so that
near-duplicate frames of one MD excursion do not all get labelled.

Features for FPS are either a model-independent structure descriptor
(:func:`distance_histograms`: the interatomic-distance histogram of docs/method.md s.7,
:func:`mlip_unc.uncertainty.density.structure_descriptor`, Gaussian-smeared) or the model's
latent (mean per-atom latent), provided by the caller.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from ase import Atoms
from tqdm.auto import tqdm

from mlip_unc import keys
from mlip_unc.uncertainty.density import structure_descriptor

__all__ = [
    "select",
    "farthest_point_sampling",
    "distance_histograms",
    "score_structures",
    "SCORE_METRICS",
]


def farthest_point_sampling(features: np.ndarray, k: int, *, start: int = 0) -> np.ndarray:
    """Greedy max-min selection of ``k`` rows of ``features`` (n, f), starting at ``start``.

    Features are standardised per column first (zero-variance columns are left unscaled).
    Returns row indices in pick order.
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"features must have shape (n, f), got {x.shape}")
    n = x.shape[0]
    k = min(int(k), n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    scale = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(scale > 0, scale, 1.0)
    picked = [int(start)]
    dist = np.linalg.norm(x - x[start], axis=1)
    for _ in range(k - 1):
        dist[picked] = -np.inf
        nxt = int(np.argmax(dist))
        picked.append(nxt)
        dist = np.minimum(dist, np.linalg.norm(x - x[nxt], axis=1))
    return np.asarray(picked, dtype=np.int64)


def select(
    scores: Sequence[float] | np.ndarray,
    *,
    top_k: int | None = None,
    threshold: float | None = None,
    features: np.ndarray | None = None,
    pool_factor: int = 4,
) -> np.ndarray:
    """Indices of the structures to label, highest score first (or FPS order when diverse).

    Args:
        scores: (n,) uncertainty per structure (higher = less supported).
        top_k: keep at most this many.
        threshold: keep only scores strictly above it.
        features: (n, f) descriptors; given together with ``top_k``, the ``top_k`` are chosen by
            FPS from the ``pool_factor * top_k`` best-scoring candidates (after the threshold).
        pool_factor: size of the FPS pool relative to ``top_k``.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if top_k is None and threshold is None:
        raise ValueError("select needs top_k, threshold or both")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    order = np.argsort(-s, kind="stable")  # best first
    if threshold is not None:
        order = order[s[order] > threshold]
    if top_k is None:
        return order
    if features is None or len(order) <= top_k:
        return order[:top_k]
    feats = np.asarray(features, dtype=np.float64)
    if feats.shape[0] != s.shape[0]:
        raise ValueError(f"features have {feats.shape[0]} rows for {s.shape[0]} scores")
    pool = order[: max(top_k, pool_factor * top_k)]
    return pool[farthest_point_sampling(feats[pool], top_k, start=0)]


def distance_histograms(
    structures: Sequence[Atoms], *, r_max: float = 5.0, n_bins: int = 32
) -> np.ndarray:
    """(n_structures, n_bins) interatomic-distance histograms per atom, Gaussian-smeared.

    The FPS features of active learning: :func:`~mlip_unc.uncertainty.density.structure_descriptor`
    with a smearing of one bin width (``r_max / n_bins``), periodic images included. A fixed,
    model-independent descriptor; it ignores chemistry, which is enough to tell a hot or
    compressed frame from an equilibrium one.
    """
    return structure_descriptor(structures, n_bins=n_bins, r_max=r_max, smearing=r_max / n_bins)


# ====================================================================== scoring
SCORE_METRICS = keys.UNCERTAINTY_SCORES


def score_structures(
    calc: Any, structures: Sequence[Atoms], *, forces: bool = True
) -> dict[str, np.ndarray]:
    """Uncertainties of each structure under ``calc`` (an ``UncertaintyCalculator``).

    Returns ``(n,)`` arrays: ``max_force_std`` (eV/A; NaN without force uncertainty),
    ``energy_std_per_atom`` (epistemic, eV/atom), ``energy_std`` (total, eV), ``alignment``,
    ``flag`` (bool). With ``forces`` the calculator's force uncertainty is computed (its mode's
    cost). A progress bar shows on a terminal when the log level is INFO or lower.
    """
    props = score_properties(calc, forces=forces)
    rows: dict[str, list] = {k: [] for k in SCORE_KEYS}
    show = sys.stderr.isatty() and logging.getLogger("mlip_unc").getEffectiveLevel() <= logging.INFO
    for atoms in tqdm(structures, desc="scoring", unit="structure", disable=not show, leave=False):
        for key, value in score_one(calc, atoms, props).items():
            rows[key].append(value)
    out = {k: np.asarray(v, dtype=bool if k == "flag" else np.float64) for k, v in rows.items()}
    return out


SCORE_KEYS = (*SCORE_METRICS, "energy_std", "alignment", "flag")


def score_properties(calc: Any, *, forces: bool = True) -> list[str]:
    """The calculator properties :func:`score_one` asks for."""
    props = ["energy_std"] + (
        [keys.CALC_MAX_FORCE_STD]
        if forces and keys.CALC_MAX_FORCE_STD in calc.implemented_properties
        else []
    )
    if "flag" in calc.implemented_properties:
        props.append("flag")
    return props


def score_one(calc: Any, atoms: Atoms, props: Sequence[str]) -> dict[str, float | bool]:
    """The scores of :func:`score_structures` for one structure (computed on a copy)."""
    atoms = atoms.copy()
    calc.calculate(atoms, list(props))
    res = calc.results
    return {
        keys.CALC_MAX_FORCE_STD: float(res.get(keys.CALC_MAX_FORCE_STD, np.nan)),
        keys.CALC_ENERGY_STD_PER_ATOM: float(calc.energy_std_per_atom(res)),
        "energy_std": float(res["energy_std"]),
        "alignment": float(res.get("alignment", np.nan)),  # a committee has none
        "flag": bool(res.get("flag", False)),
    }


def absolute_threshold(
    calc: Any, metric: str, threshold: float | None, relative: bool
) -> float | None:
    """``threshold`` in the metric's units (a multiple of the checkpoint's level when ``relative``)."""
    if threshold is None or not relative:
        return threshold
    from mlip_unc.calculator import Thresholds

    return getattr(
        Thresholds(**{metric: threshold}, relative=True).absolute(calc.uncertainty_levels), metric
    )


def flag_structures(
    calc: Any,
    structures: Sequence[Atoms],
    *,
    metric: str = keys.CALC_MAX_FORCE_STD,
    top_k: int | None = None,
    threshold: float | None = None,
    relative: bool = False,
    diverse: str = "none",
) -> tuple[list[Atoms], dict[str, np.ndarray]]:
    """The structures to send to the reference method, ranked by ``metric``; ``mlip-unc flag``.

    Args:
        calc: an ``UncertaintyCalculator``.
        metric: ``max_force_std`` or ``energy_std_per_atom``.
        top_k, threshold: keep the ``top_k`` highest scores and/or those above ``threshold``
            (a multiple of the checkpoint's validation level when ``relative``).
        diverse: ``none``, ``descriptor`` (distance histograms) or ``latent``: farthest-point
            selection of the ``top_k`` in that feature space.

    Returns:
        ``(selected, scores)``: copies of the chosen structures, best first, with
        ``source_index``, ``rank`` and the scores in ``info`` (labels in the input are kept;
        no model values are written as labels), and every structure's scores.
    """
    if top_k is None and threshold is None:
        raise ValueError("give top_k, threshold or both")
    if diverse != "none" and top_k is None:
        raise ValueError("a diverse selection picks top_k structures; give top_k")
    threshold = absolute_threshold(calc, metric, threshold, relative)
    scores = score_structures(calc, structures, forces=metric == keys.CALC_MAX_FORCE_STD)
    features = None
    if diverse == "descriptor":
        features = distance_histograms(structures)
    elif diverse == "latent":
        features = np.stack([calc.latent(a) for a in structures])
    chosen = select(scores[metric], top_k=top_k, threshold=threshold, features=features)
    selected = [
        flagged_copy(structures[int(k)], int(k), rank, {key: scores[key][k] for key in INFO_SCORES})
        for rank, k in enumerate(chosen)
    ]
    return selected, scores


INFO_SCORES = (keys.CALC_MAX_FORCE_STD, keys.CALC_ENERGY_STD_PER_ATOM, "alignment")


def flagged_copy(atoms: Atoms, source_index: int, rank: int, scores: dict[str, Any]) -> Atoms:
    """A copy of a selected structure (labels kept) with ``source_index``, ``rank`` and the
    :data:`INFO_SCORES` in ``info``."""
    out = atoms.copy()
    out.calc = atoms.calc
    out.info.update(
        {"source_index": source_index, "rank": rank, **{k: float(scores[k]) for k in INFO_SCORES}}
    )
    return out
