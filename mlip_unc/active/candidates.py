"""Which MD frames an active-learning round may label, their scores, and the flag audit.

- :func:`visited_frames`: every logged frame of a round's MD (``md.traj``), the candidates of
  ``selection.candidates: visited``;
- :func:`candidate_scores`: the ranking score of each candidate under ``selection.metric``:
  the model's ``max_force_std`` or ``energy_std_per_atom``, the baseline ``max_force`` (largest
  predicted ``|F_i|``) or ``random`` (uniform);
- :func:`audit_flags`: the monitor's flags against the true force error on labelled frames.
  A frame is flagged when its ``max_force_std`` exceeds the force threshold ``t`` (eV/A); it
  truly needs a label when its largest atomic force error ``max_i |F_i - F_i^ref|`` exceeds the
  same ``t``. Precision = flagged and wrong / flagged, recall = flagged and wrong / wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ase import Atoms

from mlip_unc import keys
from mlip_unc.active.selection import score_one, score_properties

__all__ = ["visited_frames", "candidate_scores", "audit_flags", "precision_recall", "FLAG_COUNTS"]

FLAG_COUNTS = ("audit_tp", "audit_fp", "audit_fn", "audit_tn")


def visited_frames(md_dirs: Sequence[Path]) -> list[Atoms]:
    """The frames of ``md_dir/md.traj`` of each folder (positions and cell only: neither the
    model's predictions nor their mark, so the oracle's labels are read as references)."""
    from ase.io import read

    from mlip_unc.keys import PREDICTED_ENERGY

    frames: list[Atoms] = []
    for folder in md_dirs:
        path = Path(folder) / "md.traj"
        if path.is_file() and path.stat().st_size > 0:
            for atoms in read(path, index=":"):
                clean = atoms.copy()
                clean.calc = None
                clean.info.pop(PREDICTED_ENERGY, None)
                frames.append(clean)
    return frames


def max_force(calc: Any, atoms: Atoms) -> float:
    """Largest predicted ``|F_i|`` (eV/A) of ``atoms`` under ``calc`` (computed on a copy)."""
    forces = calc.get_forces(atoms.copy())  # (n_atoms, 3)
    return float(np.linalg.norm(forces, axis=1).max())


def candidate_scores(
    calc: Any, frames: Sequence[Atoms], metric: str, rng: np.random.Generator
) -> np.ndarray:
    """``(n,)`` ranking scores of ``frames`` (higher = label first); a score already in a
    frame's ``info`` (the monitor's, for flagged frames) is used as it is."""
    if not frames:
        return np.zeros(0)
    if metric == "random":
        return rng.random(len(frames))
    if metric == "max_force":
        return np.asarray([max_force(calc, a) for a in frames])
    if all(metric in a.info for a in frames):
        return np.asarray([float(a.info[metric]) for a in frames])
    props = score_properties(calc, forces=metric == keys.CALC_MAX_FORCE_STD)
    return np.asarray([score_one(calc, a, props)[metric] for a in frames])


def audit_flags(calc: Any, labelled: Sequence[Atoms]) -> dict[str, Any]:
    """Flags of ``calc`` on ``labelled`` frames against their true largest force error.

    Returns the counts :data:`FLAG_COUNTS` (true/false positives/negatives), the threshold
    ``audit_threshold`` (eV/A; None without a force threshold: then every count is 0) and the
    per-frame ``audit_max_force_error`` and ``audit_max_force_std`` lists (eV/A).
    """
    threshold = calc.thresholds.max_force_std
    out: dict[str, Any] = {k: 0 for k in FLAG_COUNTS}
    out.update(audit_threshold=threshold, audit_max_force_error=[], audit_max_force_std=[])
    for atoms in labelled:
        ref = atoms.get_forces()  # (n_atoms, 3)
        calc.calculate(atoms.copy(), ["forces", keys.CALC_MAX_FORCE_STD])
        error = float(np.linalg.norm(calc.results["forces"] - ref, axis=1).max())
        std = float(calc.results[keys.CALC_MAX_FORCE_STD])
        out["audit_max_force_error"].append(error)
        out["audit_max_force_std"].append(std)
        if threshold is None:
            continue
        flagged, wrong = std > threshold, error > threshold
        key = {(True, True): "tp", (True, False): "fp", (False, True): "fn", (False, False): "tn"}
        out[f"audit_{key[(flagged, wrong)]}"] += 1
    return out


def precision_recall(counts: dict[str, Any]) -> tuple[float, float]:
    """(precision, recall) of pooled :data:`FLAG_COUNTS`; NaN where undefined."""
    tp, fp, fn = (float(counts.get(f"audit_{k}", 0)) for k in ("tp", "fp", "fn"))
    precision = tp / (tp + fp) if tp + fp else float("nan")
    recall = tp / (tp + fn) if tp + fn else float("nan")
    return precision, recall
