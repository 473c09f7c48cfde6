"""Held-out errors and uncertainties of an uncertainty-aware calculator on labelled frames."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from ase import Atoms

__all__ = ["evaluate_structures"]


def evaluate_structures(calc: Any, labelled: Sequence[Atoms]) -> dict[str, float]:
    """Errors and uncertainties of ``calc`` on labelled structures (the calculator's own numbers).

    Returns ``force_rmse`` and ``force_mae`` (eV/A, over components), ``energy_mae`` (eV) and
    ``energy_mae_per_atom`` (eV/atom),
    ``mean_max_force_std`` (eV/A), ``mean_energy_std_per_atom`` (epistemic, eV/atom),
    ``relative_force_std`` (mean over frames of max force std / max predicted |F_i|: a
    constant value across data sets means the force std only follows the force magnitude),
    ``flagged_fraction`` and ``n``; only ``n`` (0) for no structures.
    """
    if not labelled:
        return {"n": 0}
    sq, ab, n_comp = 0.0, 0.0, 0
    e_abs, e_abs_total, mfs, esa, flags, rel = [], [], [], [], [], []
    props = ["energy", "forces", "max_force_std", "energy_std"]
    if "flag" in calc.implemented_properties:
        props.append("flag")
    for atoms in labelled:
        ref_e, ref_f = atoms.get_potential_energy(), atoms.get_forces()  # (), (n, 3)
        calc.calculate(atoms.copy(), props)
        res = calc.results
        sq += float(((res["forces"] - ref_f) ** 2).sum())
        ab += float(np.abs(res["forces"] - ref_f).sum())
        n_comp += ref_f.size
        e_abs_total.append(abs(res["energy"] - ref_e))
        e_abs.append(abs(res["energy"] - ref_e) / len(atoms))
        mfs.append(res["max_force_std"])
        rel.append(
            res["max_force_std"] / max(float(np.linalg.norm(res["forces"], axis=1).max()), 1e-12)
        )
        esa.append(calc.energy_std_per_atom(res))
        flags.append(bool(res.get("flag", False)))
    return {
        "n": len(labelled),
        "force_rmse": math.sqrt(sq / n_comp),
        "force_mae": ab / n_comp,
        "energy_mae": float(np.mean(e_abs_total)),
        "energy_mae_per_atom": float(np.mean(e_abs)),
        "mean_max_force_std": float(np.mean(mfs)),
        "mean_energy_std_per_atom": float(np.mean(esa)),
        "relative_force_std": float(np.mean(rel)),
        "flagged_fraction": float(np.mean(flags)),
    }
