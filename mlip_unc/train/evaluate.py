"""Evaluation of an interatomic potential on a dataset: metrics dict and per-frame table.

Data flow: graphs -> :func:`predict` (arrays in eV and eV/A) -> :func:`potential_metrics`
(accuracy in meV, calibration) and :func:`frame_table` (one row per structure). A "model" has
the forward signature of ``BayesianPotential`` and ``noise_variances`` (a ``Committee`` too).

Definitions used throughout (frame = structure):

* energy error = E_pred - E (eV); per atom = / n_atoms.
* energy std = sqrt(total predictive variance) = sqrt(epistemic + aleatoric) (eV).
* force error per atom = |F_pred - F| (Euclidean norm over x, y, z); force std per atom =
  sqrt(sum over x, y, z of the epistemic variance); a frame's "mean |force error|" and
  "mean/max force std" are the mean/max of those over its atoms.
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

import csv
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.data.data import BaseData
from torch_geometric.loader import DataLoader
from tqdm.auto import tqdm

from mlip_unc import keys
from mlip_unc.models.committee import Committee, load_potential
from mlip_unc.models.full_posterior import default_uncertainty_mode
from mlip_unc.models.potential import UncertaintyMode
from mlip_unc.uncertainty import calibration as cal
from mlip_unc.uncertainty import diagnostics as diag

__all__ = [
    "Predictions",
    "EvalReport",
    "Committee",
    "load_potential",
    "predict",
    "potential_metrics",
    "frame_table",
    "evaluate_potential",
    "write_frame_csv",
]

MEV = 1000.0


# ================================================================ predictions
@dataclass
class Predictions:
    """Predictions over a dataset, as numpy float64 arrays (eV, eV/A).

    Per frame ``(n_frames,)``: ``frame_index`` (index in the source file), ``num_atoms``,
    ``has_energy``, ``has_forces``, ``energy_true``, ``energy_pred``, ``energy_noise_var``,
    ``energy_epistemic_var`` (None in mode "none").
    Per atom ``(n_atoms, ...)``: ``atom_frame`` (position of the atom's frame, 0..n_frames-1),
    ``forces_true``, ``forces_pred``, ``forces_noise_var`` (n_atoms, 3),
    ``forces_epistemic_var`` (n_atoms, 3; None unless mode "exact"/"sampled" or a committee),
    ``local_energy_var`` (n_atoms,; None in mode "none").
    """

    frame_index: np.ndarray
    num_atoms: np.ndarray
    has_energy: np.ndarray
    has_forces: np.ndarray
    energy_true: np.ndarray
    energy_pred: np.ndarray
    energy_noise_var: np.ndarray
    atom_frame: np.ndarray
    forces_true: np.ndarray
    forces_pred: np.ndarray
    forces_noise_var: np.ndarray
    energy_epistemic_var: np.ndarray | None = None
    forces_epistemic_var: np.ndarray | None = None
    local_energy_var: np.ndarray | None = None

    @property
    def n_frames(self) -> int:
        return int(self.num_atoms.shape[0])

    @property
    def atom_has_forces(self) -> np.ndarray:  # (n_atoms,) bool
        return self.has_forces[self.atom_frame]


def _graphs_and_loader(data: Any, batch_size: int) -> tuple[list, Iterable]:
    if isinstance(data, DataLoader):
        return list(data.dataset), data
    graphs = [data] if isinstance(data, BaseData) else list(data)
    return graphs, DataLoader(graphs, batch_size=batch_size, shuffle=False)


def _frame_indices(graphs: list) -> np.ndarray:
    """``FRAME_INDEX`` of each graph (its position in the list when a graph has none)."""
    return np.array([int(g[keys.FRAME_INDEX].reshape(-1)[0]) if keys.FRAME_INDEX in g else k
                     for k, g in enumerate(graphs)], dtype=np.int64)  # fmt: skip


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def predict(
    model: nn.Module,
    data: Any,
    *,
    uncertainty: UncertaintyMode | str = UncertaintyMode.NONE,
    n_samples: int = 4,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = False,
) -> Predictions:
    """Run ``model`` over ``data`` (a graph, graphs, a ``StructureDataset`` or a
    non-shuffling ``DataLoader``).

    Args:
        uncertainty: "none", "energy", "exact" or "sampled" (see ``UncertaintyMode``).
        n_samples: posterior draws of the sampled mode.
        seed: seed of the generator for the sampled mode.
    """
    mode = UncertaintyMode(uncertainty)
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    parts: dict[str, list[np.ndarray]] = {}
    n_seen = 0
    try:
        graphs, loader = _graphs_and_loader(data, batch_size)
        for batch in tqdm(loader, disable=not progress, leave=False, desc="predict"):
            out = model(batch, compute_forces=True, uncertainty=mode, n_samples=n_samples, generator=generator)
            noise = model.noise_variances(batch)
            graph = batch[keys.BATCH] if getattr(batch, keys.BATCH, None) is not None else torch.zeros(
                batch[keys.POSITIONS].shape[0], dtype=torch.long
            )
            row = {
                "num_atoms": _np(batch[keys.NUM_ATOMS].reshape(-1)),
                "has_energy": _np(batch[keys.HAS_ENERGY].reshape(-1)),
                "has_forces": _np(batch[keys.HAS_FORCES].reshape(-1)),
                "energy_true": _np(batch[keys.ENERGY].reshape(-1)),
                "energy_pred": _np(out[keys.ENERGY]),
                "energy_noise_var": _np(noise[keys.ENERGY].expand_as(out[keys.ENERGY])),
                "atom_frame": _np(graph) + n_seen,
                "forces_true": _np(batch[keys.FORCES]),
                "forces_pred": _np(out[keys.FORCES]),
                "forces_noise_var": _np(noise[keys.FORCES].expand_as(out[keys.FORCES])),
            }
            optional = {
                "energy_epistemic_var": keys.ENERGY_EPISTEMIC_VAR,
                "forces_epistemic_var": keys.FORCES_VAR,
                "local_energy_var": keys.LOCAL_ENERGY_VAR,
            }
            row.update({name: _np(out[key]) for name, key in optional.items() if key in out})
            for name, value in row.items():
                parts.setdefault(name, []).append(value)
            n_seen += int(out[keys.ENERGY].shape[0])
    finally:
        model.train(was_training)
    if not parts:
        raise ValueError("no structures to evaluate")
    arrays = {name: np.concatenate(values) for name, values in parts.items()}
    arrays["frame_index"] = _frame_indices(graphs)
    for name in ("num_atoms", "atom_frame"):
        arrays[name] = arrays[name].astype(np.int64)
    for name in ("has_energy", "has_forces"):
        arrays[name] = arrays[name].astype(bool)
    for name in ("energy_epistemic_var", "forces_epistemic_var", "local_energy_var"):
        if name in arrays and len(parts[name]) != len(parts["energy_pred"]):
            del arrays[name]  # present in some batches only: drop rather than misalign
    return Predictions(**arrays)


# ================================================================ per frame
def frame_table(pred: Predictions) -> dict[str, np.ndarray]:
    """One row per frame (columns as arrays ``(n_frames,)``).

    Columns: ``frame_index, num_atoms, energy_true, energy_pred, energy_error,
    energy_error_per_atom, energy_std, energy_epistemic_std, forces_mean_error,
    forces_mae, forces_mean_std, forces_max_std, forces_pred_mean_norm, forces_pred_max_norm,
    local_energy_max_std`` (eV, eV/A; NaN where a label or an uncertainty is absent);
    ``forces_pred_mean/max_norm``: mean/max over the frame's atoms of the predicted |F|.
    """
    n = pred.n_frames
    error = np.where(pred.has_energy, pred.energy_pred - pred.energy_true, np.nan)
    epi = pred.energy_epistemic_var
    f_err = pred.forces_pred - pred.forces_true  # (n_atoms, 3)
    f_norm = np.linalg.norm(f_err, axis=1)
    f_pred = diag.atom_force_norm(pred.forces_pred)  # (n_atoms,)
    mean = partial(diag.per_frame, atom_frame=pred.atom_frame, n_frames=n, how="mean")  # -> (n_frames,)
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
    }
    if pred.forces_epistemic_var is not None:
        atom_std = diag.atom_force_std(pred.forces_epistemic_var)  # (n_atoms,)
        table["forces_mean_std"] = mean(atom_std)
        table["forces_max_std"] = top(atom_std)
    if pred.local_energy_var is not None:
        local = np.sqrt(np.clip(pred.local_energy_var, 0.0, None))
        table["local_energy_max_std"] = top(local)
    return table


def uncertainty_levels(model: nn.Module, data: Any, *, batch_size: int = 16, uncertainty: str | None = None) -> dict:
    """Calibrated levels for relative flagging thresholds, over ``data`` (the validation set).

    The mean over frames of ``max_force_std`` (max over atoms of sqrt(sum_c Var F_ic)) and of
    ``energy_std_per_atom`` (epistemic energy std / n_atoms): the definitions of
    :class:`mlip_unc.calculator.UncertaintyCalculator`, stored in a checkpoint's
    ``metadata["uncertainty_levels"]``, in the calculator's default mode, recorded as ``mode``.
    """
    uncertainty = uncertainty or default_uncertainty_mode(model)
    table = frame_table(predict(model, data, uncertainty=uncertainty, batch_size=batch_size))
    return {
        "mode": uncertainty,
        "max_force_std": float(np.nanmean(table["forces_max_std"])),
        "energy_std_per_atom": float(np.nanmean(table["energy_epistemic_std"] / table["num_atoms"])),
        "n_structures": int(len(table["num_atoms"])),
    }


def write_frame_csv(table: Mapping[str, np.ndarray], path: str | os.PathLike) -> Path:
    """Write :func:`frame_table` as CSV (one header line, one row per frame)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(table)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for row in zip(*(table[c] for c in columns)):
            writer.writerow([_fmt(v) for v in row])
    return path


def _fmt(value: Any) -> str:
    if isinstance(value, (np.integer, int)):
        return str(int(value))
    return f"{float(value):.8g}"


# ================================================================ metrics
def _calibration(prefix: str, y_pred: np.ndarray, y_std: np.ndarray, y_true: np.ndarray) -> dict[str, float]:
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
        out["energy_spearman"] = diag.spearman(np.sqrt(epi), np.abs(err))
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
        out["forces_spearman"] = diag.spearman(np.sqrt(epi).ravel(), np.abs(err).ravel())
        out["forces_frame_spearman"] = diag.spearman(
            table["forces_mean_std"][frames], table["forces_mean_error"][frames]
        )
        out["forces_mean_std_meV_A"] = MEV * float(np.mean(std))
        out.update(_force_diagnostics(pred, table, err))
    if pred.energy_epistemic_var is not None:
        out["energy_std_vs_force_error_spearman"] = diag.spearman(
            table["energy_epistemic_std"][frames], table["forces_mean_error"][frames]
        )
    if pred.local_energy_var is not None:
        out["local_std_vs_force_error_spearman"] = diag.spearman(
            table["local_energy_max_std"][frames], table["forces_mean_error"][frames]
        )
    return out


def _force_diagnostics(pred: Predictions, table: Mapping[str, np.ndarray], err: np.ndarray) -> dict[str, float]:
    """sigma_F against |F_pred| (all atoms/frames), partial Spearman and std/RMSE (labelled ones)."""
    frames = pred.has_forces
    epi = pred.forces_epistemic_var  # (n_atoms, 3)
    return {
        "forces_std_vs_pred_spearman": diag.sigma_force_spearman_atoms(epi, pred.forces_pred),
        "forces_std_vs_pred_frame_spearman": diag.spearman(
            table["forces_max_std"], table["forces_pred_max_norm"]
        ),
        "forces_partial_spearman_given_force": diag.partial_spearman(
            table["forces_max_std"][frames], table["forces_mean_error"][frames],
            table["forces_pred_max_norm"][frames],
        ),
        "forces_std_over_rmse": diag.std_over_rmse(epi[pred.atom_has_forces], err),
    }  # fmt: skip


def potential_metrics(pred: Predictions, table: Mapping[str, np.ndarray] | None = None) -> dict[str, float]:
    """Accuracy (meV) and calibration metrics of :class:`Predictions`.

    Keys: ``n_frames``, ``n_atoms``; ``energy_mae_meV_atom, energy_rmse_meV_atom,
    energy_mae_meV, energy_rmse_meV, forces_mae_meV_A, forces_rmse_meV_A``; with energy
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
    }


@dataclass
class EvalReport:
    """Result of :func:`evaluate_potential`: flat metrics, the per-frame table, raw predictions."""

    metrics: dict[str, float]
    frames: dict[str, np.ndarray]
    predictions: Predictions


def evaluate_potential(
    model: nn.Module,
    data: Any,
    *,
    uncertainty: UncertaintyMode | str = UncertaintyMode.EXACT,
    n_samples: int = 4,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = False,
) -> EvalReport:
    """Predict ``data`` and compute :func:`potential_metrics` and :func:`frame_table`."""
    pred = predict(
        model, data, uncertainty=uncertainty, n_samples=n_samples, batch_size=batch_size,
        seed=seed, progress=progress,
    )  # fmt: skip
    table = frame_table(pred)
    return EvalReport(potential_metrics(pred, table), table, pred)

