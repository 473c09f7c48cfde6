"""Held-out errors and uncertainties of an uncertainty-aware calculator on labelled frames."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from ase import Atoms

from mlip_unc import keys

__all__ = ["evaluate_structures"]


def evaluate_structures(calc: Any, labelled: Sequence[Atoms]) -> dict[str, float]:
    """Errors and uncertainties of ``calc`` on labelled structures (the calculator's own numbers).

    Returns ``force_rmse`` and ``force_mae`` (eV/A, over components), ``energy_mae`` (eV) and
    ``energy_mae_per_atom`` (eV/atom),
    ``mean_max_force_std`` (eV/A), ``mean_energy_std_per_atom`` (epistemic, eV/atom),
    ``force_rms`` (RMS of the reference force components, eV/A), ``relative_force_std``
    (``mean_max_force_std / force_rms``: the same value on two sets means the force std only
    follows the force magnitude; over the set's force scale, not one frame's largest predicted
    force, which an untrained model puts near zero), ``flagged_fraction`` and ``n``; only ``n``
    (0) for no structures.
    """
    if not labelled:
        return {"n": 0}
    sq, ab, ref_sq, n_comp = 0.0, 0.0, 0.0, 0
    e_abs, e_abs_total, mfs, esa, flags = [], [], [], [], []
    props = ["energy", "forces", keys.CALC_MAX_FORCE_STD, "energy_std"]
    if "flag" in calc.implemented_properties:
        props.append("flag")
    for atoms in labelled:
        ref_e, ref_f = atoms.get_potential_energy(), atoms.get_forces()  # (), (n, 3)
        calc.calculate(atoms.copy(), props)
        res = calc.results
        sq += float(((res["forces"] - ref_f) ** 2).sum())
        ab += float(np.abs(res["forces"] - ref_f).sum())
        ref_sq += float((ref_f**2).sum())
        n_comp += ref_f.size
        e_abs_total.append(abs(res["energy"] - ref_e))
        e_abs.append(abs(res["energy"] - ref_e) / len(atoms))
        mfs.append(res[keys.CALC_MAX_FORCE_STD])
        esa.append(calc.energy_std_per_atom(res))
        flags.append(bool(res.get("flag", False)))
    force_rms = math.sqrt(ref_sq / n_comp)
    return {
        "n": len(labelled),
        "force_rmse": math.sqrt(sq / n_comp),
        "force_mae": ab / n_comp,
        "energy_mae": float(np.mean(e_abs_total)),
        "energy_mae_per_atom": float(np.mean(e_abs)),
        "mean_max_force_std": float(np.mean(mfs)),
        "mean_energy_std_per_atom": float(np.mean(esa)),
        "force_rms": force_rms,
        "relative_force_std": float(np.mean(mfs)) / force_rms if force_rms > 0 else math.nan,
        "flagged_fraction": float(np.mean(flags)),
    }
