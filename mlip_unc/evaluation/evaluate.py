"""Evaluation of an interatomic potential on a dataset: the metrics and :func:`evaluate_potential`.

Data flow: graphs -> :func:`~mlip_unc.evaluation.predictions.predict` (arrays in eV, eV/A,
eV/A^3) -> :func:`potential_metrics` (accuracy in meV and GPa, calibration) and
:func:`~mlip_unc.evaluation.frames.frame_table` (one row per structure; also the CSV and the
extxyz of predictions, :mod:`mlip_unc.evaluation.frames`). A "model" has the forward signature
of ``BayesianPotential`` and ``noise_variances`` (a ``Committee`` too). The uncertainty levels
stored with a model are fitted by :func:`mlip_unc.posthoc.levels.uncertainty_levels`.

Definitions used throughout (frame = structure):

* energy error = E_pred - E (eV); per atom = / n_atoms.
* energy std = sqrt(total predictive variance) = sqrt(epistemic + aleatoric) (eV).
* force error per atom = |F_pred - F| (Euclidean norm over x, y, z); force std per atom =
  sqrt(sum over x, y, z of the epistemic variance); a frame's "mean |force error|" and
  "mean/max force std" are the mean/max of those over its atoms.
* stress error: over the 6 Voigt components (xx yy zz yz xz xy, ASE sign) of the periodic
  frames with a stress label, in GPa.
* Calibration metrics (nll, miscalibration area, coverage) use the total predictive std:
  energies per structure in eV, forces per Cartesian component in eV/A (epistemic + noise).
  Spearman correlations use the epistemic std (identical ranks for a homoscedastic noise
  at the component level).
* Does sigma_F say more than |F_pred|? (:mod:`mlip_unc.uncertainty.diagnostics`): per-atom
  Spearman(force std, |F_pred|); per-frame Spearman(max force std, max |F_pred|); partial
  Spearman of the frame max force std with the frame mean |force error| given the frame max
  |F_pred|; std/RMSE = sqrt(mean epistemic variance) / RMSE, per force component.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from ase.units import GPa

from mlip_unc.evaluation.frames import frame_table, write_frame_csv, write_predictions_xyz
from mlip_unc.evaluation.predictions import Predictions, predict, to_voigt
from mlip_unc.models.committee import Committee
from mlip_unc.models.loading import load_potential
from mlip_unc.models.potential import BayesianPotential, UncertaintyMode
from mlip_unc.uncertainty import calibration as cal
from mlip_unc.uncertainty import diagnostics as diag

__all__ = [
    "Committee",
    "EvalReport",
    "Predictions",
    "evaluate_potential",
    "frame_table",
    "load_potential",
    "potential_metrics",
    "predict",
    "write_frame_csv",
    "write_predictions_xyz",
]

MEV = 1000.0


# ================================================================ metrics
def _calibration(
    prefix: str, y_pred: np.ndarray, y_std: np.ndarray, y_true: np.ndarray
) -> dict[str, float]:
    if y_pred.size < 2:
        return {}
    return {
        f"{prefix}_nll": cal.nll(y_pred, y_std, y_true),
        f"{prefix}_miscalibration_area": cal.miscalibration_area(y_pred, y_std, y_true),
        f"{prefix}_coverage_95": cal.coverage(y_pred, y_std, y_true, 0.95),
    }


def _energy_metrics(pred: Predictions) -> dict[str, float]:
    mask = pred.has_energy
    if not mask.any():
        return {}
    err = (pred.energy_pred - pred.energy_true)[mask]
    per_atom = err / pred.num_atoms[mask]
    out = {
        "energy_mae_meV_atom": MEV * float(np.mean(np.abs(per_atom))),
        "energy_rmse_meV_atom": MEV * float(np.sqrt(np.mean(per_atom**2))),
        "energy_mae_meV": MEV * float(np.mean(np.abs(err))),
        "energy_rmse_meV": MEV * float(np.sqrt(np.mean(err**2))),
    }
    if pred.energy_epistemic_var is not None:
        epi = pred.energy_epistemic_var[mask]
        std = np.sqrt(epi + pred.energy_noise_var[mask])
        out.update(_calibration("energy", pred.energy_pred[mask], std, pred.energy_true[mask]))
        out["energy_spearman"] = cal.spearman_corr(np.sqrt(epi), np.abs(err), nan_policy="omit")
        out["energy_mean_std_meV"] = MEV * float(np.mean(std))
    return out


def _forces_metrics(pred: Predictions, table: Mapping[str, np.ndarray]) -> dict[str, float]:
    atoms = pred.atom_has_forces
    if not atoms.any():
        return {}
    err = (pred.forces_pred - pred.forces_true)[atoms]  # (n, 3)
    out = {
        "forces_mae_meV_A": MEV * float(np.mean(np.abs(err))),
        "forces_rmse_meV_A": MEV * float(np.sqrt(np.mean(err**2))),
    }
    frames = pred.has_forces
    if pred.forces_epistemic_var is not None:
        epi = pred.forces_epistemic_var[atoms]
        std = np.sqrt(epi + pred.forces_noise_var[atoms])
        out.update(_calibration("forces", pred.forces_pred[atoms], std, pred.forces_true[atoms]))
        out["forces_spearman"] = cal.spearman_corr(
            np.sqrt(epi).ravel(), np.abs(err).ravel(), nan_policy="omit"
        )
        out["forces_frame_spearman"] = cal.spearman_corr(
            table["forces_mean_std"][frames], table["forces_mean_error"][frames], nan_policy="omit"
        )
        out["forces_mean_std_meV_A"] = MEV * float(np.mean(std))
        out.update(_force_diagnostics(pred, table, err))
    if pred.energy_epistemic_var is not None:
        out["energy_std_vs_force_error_spearman"] = cal.spearman_corr(
            table["energy_epistemic_std"][frames],
            table["forces_mean_error"][frames],
            nan_policy="omit",
        )
    if pred.local_energy_var is not None:
        out["local_std_vs_force_error_spearman"] = cal.spearman_corr(
            table["local_energy_max_std"][frames],
            table["forces_mean_error"][frames],
            nan_policy="omit",
        )
    return out


def _force_diagnostics(
    pred: Predictions, table: Mapping[str, np.ndarray], err: np.ndarray
) -> dict[str, float]:
    """sigma_F against |F_pred| (all atoms/frames), partial Spearman and std/RMSE (labelled ones)."""
    frames = pred.has_forces
    epi = pred.forces_epistemic_var  # (n_atoms, 3)
    if epi is None:
        return {}
    return {
        "forces_std_vs_pred_spearman": diag.sigma_force_spearman_atoms(epi, pred.forces_pred),
        "forces_std_vs_pred_frame_spearman": cal.spearman_corr(
            table["forces_max_std"], table["forces_pred_max_norm"], nan_policy="omit"
        ),
        "forces_partial_spearman_given_force": diag.partial_spearman(
            table["forces_max_std"][frames],
            table["forces_mean_error"][frames],
            table["forces_pred_max_norm"][frames],
        ),
        "forces_std_over_rmse": diag.std_over_rmse(epi[pred.atom_has_forces], err),
    }


def _stress_metrics(pred: Predictions) -> dict[str, float]:
    """Stress MAE/RMSE (GPa) over the 6 Voigt components of the labelled periodic frames."""
    mask = pred.stress_mask
    if not mask.any() or pred.stress_pred is None or pred.stress_true is None:
        return {}
    err = to_voigt(pred.stress_pred[mask] - pred.stress_true[mask]) / GPa  # (n, 6) GPa
    out = {
        "stress_mae_GPa": float(np.mean(np.abs(err))),
        "stress_rmse_GPa": float(np.sqrt(np.mean(err**2))),
        "stress_n_frames": int(mask.sum()),
    }
    if pred.stress_epistemic_var is not None:
        std = np.sqrt(np.clip(to_voigt(pred.stress_epistemic_var[mask]), 0.0, None)) / GPa
        out["stress_mean_epistemic_std_GPa"] = float(np.mean(std))
        out["stress_spearman"] = cal.spearman_corr(
            std.ravel(), np.abs(err).ravel(), nan_policy="omit"
        )
    return out


def potential_metrics(
    pred: Predictions, table: Mapping[str, np.ndarray] | None = None
) -> dict[str, float]:
    """Accuracy (meV, GPa) and calibration metrics of :class:`Predictions`.

    Keys: ``n_frames``, ``n_atoms``; ``energy_mae_meV_atom, energy_rmse_meV_atom`` (per atom)
    beside ``energy_mae_meV, energy_rmse_meV`` (total), ``forces_mae_meV_A,
    forces_rmse_meV_A``; for periodic frames with a stress label ``stress_mae_GPa,
    stress_rmse_GPa, stress_n_frames`` (6 Voigt components) and, with stress variances,
    ``stress_mean_epistemic_std_GPa, stress_spearman``; with energy
    uncertainties ``energy_nll`` (eV units), ``energy_spearman`` (epistemic std vs |error|),
    ``energy_miscalibration_area, energy_coverage_95, energy_mean_std_meV``; with force
    uncertainties the same for ``forces_*`` (per component) plus ``forces_frame_spearman``
    (frame mean force std vs frame mean |force error|), ``forces_std_vs_pred_spearman``
    (per atom, epistemic force std vs predicted |F|), ``forces_std_vs_pred_frame_spearman``
    (frame max std vs frame max |F_pred|), ``forces_partial_spearman_given_force`` (frame max
    std vs frame mean |force error| given frame max |F_pred|), ``forces_std_over_rmse``
    (sqrt(mean epistemic variance) / RMSE per component); frame-level Spearman of the energy
    std and of the max local energy std against the frame mean |force error|.
    """
    table = frame_table(pred) if table is None else table
    return {
        "n_frames": pred.n_frames,
        "n_atoms": int(pred.num_atoms.sum()),
        **_energy_metrics(pred),
        **_forces_metrics(pred, table),
        **_stress_metrics(pred),
    }


@dataclass
class EvalReport:
    """Result of :func:`evaluate_potential`: flat metrics, the per-frame table, raw predictions."""

    metrics: dict[str, float]
    frames: dict[str, np.ndarray]
    predictions: Predictions


def evaluate_potential(
    model: BayesianPotential | Committee,
    data: Any,
    *,
    uncertainty: UncertaintyMode | str = UncertaintyMode.EXACT,
    n_samples: int = 4,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = False,
    stress: bool = True,
) -> EvalReport:
    """Predict ``data`` and compute :func:`potential_metrics` and :func:`frame_table`
    (``stress``: also the stress of periodic structures, see :func:`predict`)."""
    pred = predict(
        model,
        data,
        uncertainty=uncertainty,
        n_samples=n_samples,
        batch_size=batch_size,
        seed=seed,
        progress=progress,
        stress=stress,
    )
    table = frame_table(pred)
    return EvalReport(potential_metrics(pred, table), table, pred)
