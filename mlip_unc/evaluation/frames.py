"""Per-frame outputs of an evaluation: the frame table (CSV) and an extxyz of predictions.

* :func:`frame_table` / :func:`write_frame_csv`: one row per structure (errors, stds).
* :func:`write_predictions_xyz`: the input structures with their reference labels (ASE's
  ``energy``/``forces``/``stress`` fields) and the predictions beside them under prefixed keys,
  as ``mace_eval_configs`` writes ``MACE_energy``/``MACE_forces``/``MACE_stress``.

Definitions: energy error = E_pred - E (eV); per atom = / n_atoms; energy std = sqrt(epistemic
+ aleatoric); force error per atom = |F_pred - F|; force std per atom = sqrt(sum over x, y, z
of the epistemic variance); stress error per frame = mean |sigma_pred - sigma| over the 6
Voigt components (GPa).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import ase
import ase.io
import numpy as np
from ase.calculators.singlepoint import SinglePointCalculator
from ase.units import GPa

from mlip_unc.atomic_write import atomic_write_text
from mlip_unc.evaluation.predictions import Predictions, to_voigt
from mlip_unc.uncertainty import diagnostics as diag

__all__ = ["PREDICTION_PREFIX", "frame_table", "write_frame_csv", "write_predictions_xyz"]

PREDICTION_PREFIX = "mlip_unc_"
"""Prefix of the prediction keys in :func:`write_predictions_xyz`."""


def frame_table(pred: Predictions) -> dict[str, np.ndarray]:
    """One row per frame (columns as arrays ``(n_frames,)``).

    Columns: ``frame_index, num_atoms, energy_true, energy_pred, energy_error,
    energy_error_per_atom, energy_std, energy_epistemic_std, forces_mean_error,
    forces_mae, forces_mean_std, forces_max_std, forces_pred_mean_norm, forces_pred_max_norm,
    local_energy_max_std, stress_mae_GPa`` (eV, eV/A, GPa; NaN where a label or an
    uncertainty is absent; ``stress_mae_GPa`` only for periodic frames with a stress label);
    ``forces_pred_mean/max_norm``: mean/max over the frame's atoms of the predicted |F|.
    """
    n = pred.n_frames
    error = np.where(pred.has_energy, pred.energy_pred - pred.energy_true, np.nan)
    epi = pred.energy_epistemic_var
    f_err = pred.forces_pred - pred.forces_true  # (n_atoms, 3)
    f_norm = np.linalg.norm(f_err, axis=1)
    f_pred = diag.atom_force_norm(pred.forces_pred)  # (n_atoms,)
    mean = partial(
        diag.per_frame, atom_frame=pred.atom_frame, n_frames=n, how="mean"
    )  # -> (n_frames,)
    top = partial(diag.per_frame, atom_frame=pred.atom_frame, n_frames=n, how="max")
    has_f = pred.has_forces
    table = {
        "frame_index": pred.frame_index,
        "num_atoms": pred.num_atoms,
        "energy_true": np.where(pred.has_energy, pred.energy_true, np.nan),
        "energy_pred": pred.energy_pred,
        "energy_error": error,
        "energy_error_per_atom": error / pred.num_atoms,
        "energy_std": np.full(n, np.nan) if epi is None else np.sqrt(epi + pred.energy_noise_var),
        "energy_epistemic_std": np.full(n, np.nan) if epi is None else np.sqrt(epi),
        "forces_mean_error": np.where(has_f, mean(f_norm), np.nan),
        "forces_mae": np.where(has_f, mean(np.abs(f_err).mean(1)), np.nan),
        "forces_mean_std": np.full(n, np.nan),
        "forces_max_std": np.full(n, np.nan),
        "forces_pred_mean_norm": mean(f_pred),
        "forces_pred_max_norm": top(f_pred),
        "local_energy_max_std": np.full(n, np.nan),
        "stress_mae_GPa": np.full(n, np.nan),
    }
    if pred.forces_epistemic_var is not None:
        atom_std = diag.atom_force_std(pred.forces_epistemic_var)  # (n_atoms,)
        table["forces_mean_std"] = mean(atom_std)
        table["forces_max_std"] = top(atom_std)
    if pred.local_energy_var is not None:
        local = np.sqrt(np.clip(pred.local_energy_var, 0.0, None))
        table["local_energy_max_std"] = top(local)
    mask = pred.stress_mask
    if mask.any() and pred.stress_pred is not None and pred.stress_true is not None:
        s_err = np.abs(to_voigt(pred.stress_pred - pred.stress_true)).mean(1) / GPa  # (n_frames,)
        table["stress_mae_GPa"] = np.where(mask, s_err, np.nan)
    return table


def write_frame_csv(table: Mapping[str, np.ndarray], path: str | os.PathLike) -> Path:
    """Write :func:`frame_table` as CSV (one header line, one row per frame), atomically."""
    columns = list(table)
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for row in zip(*(table[c] for c in columns), strict=False):
        writer.writerow([_fmt(v) for v in row])
    return atomic_write_text(path, buffer.getvalue())


def _fmt(value: Any) -> str:
    if isinstance(value, (np.integer, int)):
        return str(int(value))
    return f"{float(value):.8g}"


def _reference_copy(atoms: ase.Atoms) -> ase.Atoms:
    """A copy with ``info``/``arrays`` and the reference labels of the attached calculator."""
    copy = atoms.copy()  # copies info and arrays, not the calculator
    results = dict(getattr(atoms.calc, "results", None) or {})
    labels = {
        k: results[k]
        for k in ("energy", "free_energy", "forces", "stress")
        if results.get(k) is not None
    }
    if labels:
        copy.calc = SinglePointCalculator(copy, **labels)
    return copy


def write_predictions_xyz(
    atoms_list: Sequence[ase.Atoms],
    pred: Predictions,
    path: str | os.PathLike,
    *,
    prefix: str = PREDICTION_PREFIX,
) -> Path:
    """Write the structures with their predictions as extended XYZ (atomically).

    ``atoms_list`` are the evaluated structures in the order of ``pred``. Each frame keeps its
    ``info``/``arrays`` and reference labels and gains (with ``prefix``, default
    ``mlip_unc_``): info ``energy`` (eV); ``energy_var`` (total predictive variance,
    epistemic + noise, eV^2) and ``energy_epistemic_var`` when the mode gives them; arrays
    ``forces`` (eV/A), ``forces_var`` (epistemic + noise) and ``forces_epistemic_var`` when
    given, ``energies_var`` (local energy variances) when given; for periodic frames info
    ``stress`` (6, ASE Voigt order xx yy zz yz xz xy, eV/A^3, ASE sign) and ``stress_var``
    (6, epistemic: there is no stress noise model, as in the calculator) when given.
    ASE's extxyz writer keeps 8 decimals of per-atom values (``forces_var`` to 1e-8 (eV/A)^2).

    Raises:
        ValueError: the structures do not match the predictions (count or atoms per frame).
    """
    if len(atoms_list) != pred.n_frames:
        raise ValueError(f"{len(atoms_list)} structures for {pred.n_frames} predicted frames")
    frames = []
    for k, atoms in enumerate(atoms_list):
        rows = np.flatnonzero(pred.atom_frame == k)  # (n_atoms_k,) rows of this frame's atoms
        if len(rows) != len(atoms):
            raise ValueError(f"frame {k}: {len(atoms)} atoms but {len(rows)} predicted")
        out = _reference_copy(atoms)
        out.info[f"{prefix}energy"] = float(pred.energy_pred[k])
        if pred.energy_epistemic_var is not None:
            epi = float(pred.energy_epistemic_var[k])
            out.info[f"{prefix}energy_var"] = epi + float(pred.energy_noise_var[k])
            out.info[f"{prefix}energy_epistemic_var"] = epi
        out.arrays[f"{prefix}forces"] = pred.forces_pred[rows]
        if pred.forces_epistemic_var is not None:
            epi_f = pred.forces_epistemic_var[rows]
            out.arrays[f"{prefix}forces_var"] = epi_f + pred.forces_noise_var[rows]
            out.arrays[f"{prefix}forces_epistemic_var"] = epi_f
        if pred.local_energy_var is not None:
            out.arrays[f"{prefix}energies_var"] = pred.local_energy_var[rows]
        if pred.periodic is not None and pred.periodic[k] and pred.stress_pred is not None:
            out.info[f"{prefix}stress"] = to_voigt(pred.stress_pred[k])
            if pred.stress_epistemic_var is not None:
                out.info[f"{prefix}stress_var"] = to_voigt(pred.stress_epistemic_var[k])
        frames.append(out)
    buffer = io.StringIO()
    ase.io.write(buffer, frames, format="extxyz")
    return atomic_write_text(path, buffer.getvalue())
