"""Running a potential over a dataset: :class:`Predictions` (numpy, eV, eV/A, eV/A^3).

A "model" has the forward signature of ``BayesianPotential`` and ``noise_variances`` (a
``Committee`` too). The stress is computed for batches holding a periodic structure (a cell
with non-zero volume); non-periodic structures have stress 0 and ``periodic`` False.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data.data import BaseData
from torch_geometric.loader import DataLoader
from tqdm.auto import tqdm

from mlip_unc import keys
from mlip_unc.models.committee import Committee
from mlip_unc.models.devices import module_device, to_device
from mlip_unc.models.potential import BayesianPotential, UncertaintyMode

__all__ = ["VOIGT", "Predictions", "predict", "to_voigt"]

VOIGT = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))
"""ASE's Voigt order ``xx yy zz yz xz xy`` as (row, column) pairs."""


def to_voigt(matrix: np.ndarray) -> np.ndarray:
    """``(..., 3, 3)`` -> ``(..., 6)`` in ASE's Voigt order (the upper triangle)."""
    rows, cols = zip(*VOIGT, strict=False)
    return matrix[..., list(rows), list(cols)]


@dataclass
class Predictions:
    """Predictions over a dataset, as numpy float64 arrays (eV, eV/A, eV/A^3).

    Per frame ``(n_frames,)``: ``frame_index`` (index in the source file), ``num_atoms``,
    ``has_energy``, ``has_forces``, ``energy_true``, ``energy_pred``, ``energy_noise_var``,
    ``energy_epistemic_var`` (None in mode "none"); ``periodic``, ``has_stress`` (bool) and
    ``stress_true``, ``stress_pred`` ``(n_frames, 3, 3)`` (ASE sign; 0 for non-periodic frames,
    NaN where the model gave no stress), ``stress_epistemic_var`` ``(n_frames, 3, 3)`` (None
    unless mode "exact"/"sampled" or a committee).
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
    periodic: np.ndarray | None = None
    has_stress: np.ndarray | None = None
    stress_true: np.ndarray | None = None
    stress_pred: np.ndarray | None = None
    stress_epistemic_var: np.ndarray | None = None

    @property
    def n_frames(self) -> int:
        return int(self.num_atoms.shape[0])

    @property
    def atom_has_forces(self) -> np.ndarray:  # (n_atoms,) bool
        return self.has_forces[self.atom_frame]

    @property
    def stress_mask(self) -> np.ndarray:  # (n_frames,) bool
        """Periodic frames with a stress label and a finite predicted stress."""
        if self.has_stress is None or self.periodic is None or self.stress_pred is None:
            return np.zeros(self.n_frames, dtype=bool)
        finite = np.isfinite(self.stress_pred).all(axis=(1, 2))
        return self.has_stress & self.periodic & finite


def _graphs_and_loader(data: Any, batch_size: int) -> tuple[list, Iterable]:
    if isinstance(data, DataLoader):
        return list(data.dataset), data
    graphs = [data] if isinstance(data, BaseData) else list(data)
    return graphs, DataLoader(graphs, batch_size=batch_size, shuffle=False)


def _frame_indices(graphs: list) -> np.ndarray:
    """``FRAME_INDEX`` of each graph (its position in the list when a graph has none)."""
    return np.array(
        [
            int(g[keys.FRAME_INDEX].reshape(-1)[0]) if keys.FRAME_INDEX in g else k
            for k, g in enumerate(graphs)
        ],
        dtype=np.int64,
    )


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def _periodic(batch: Any, n_graphs: int) -> np.ndarray:
    """``(n_graphs,)`` bool: a periodic direction and a cell with non-zero volume."""
    cell = getattr(batch, keys.CELL, None)
    if cell is None:
        return np.zeros(n_graphs, dtype=bool)
    volume = np.abs(np.linalg.det(_np(cell).reshape(-1, 3, 3)))  # (n_graphs,)
    pbc = getattr(batch, keys.PBC, None)
    periodic = volume > 0
    if pbc is not None:
        periodic &= _np(pbc).reshape(-1, 3).astype(bool).any(1)
    return periodic


def _stress_row(batch: Any, out: dict, n_graphs: int, computed: bool) -> dict[str, np.ndarray]:
    """Stress labels, predictions and epistemic variances of one batch."""
    has = getattr(batch, keys.HAS_STRESS, None)
    label = getattr(batch, keys.STRESS, None)
    row = {
        "periodic": _periodic(batch, n_graphs),
        "has_stress": np.zeros(n_graphs, bool)
        if has is None
        else _np(has).reshape(-1).astype(bool),
        "stress_true": np.zeros((n_graphs, 3, 3))
        if label is None
        else _np(label).reshape(-1, 3, 3),
    }
    if not computed:  # non-periodic structures: stress 0, exactly; periodic ones: not asked, NaN
        row["stress_pred"] = np.where(
            row["periodic"][:, None, None], np.nan, np.zeros((n_graphs, 3, 3))
        )
        row["stress_epistemic_var"] = np.zeros((n_graphs, 3, 3))
        return row
    stress = out.get(keys.STRESS)
    row["stress_pred"] = (
        np.full((n_graphs, 3, 3), np.nan) if stress is None else _np(stress).reshape(-1, 3, 3)
    )
    if keys.STRESS_VAR in out:
        row["stress_epistemic_var"] = _np(out[keys.STRESS_VAR]).reshape(-1, 3, 3)
    return row


def predict(
    model: BayesianPotential | Committee,
    data: Any,
    *,
    uncertainty: UncertaintyMode | str = UncertaintyMode.NONE,
    n_samples: int = 4,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = False,
    stress: bool = False,
) -> Predictions:
    """Run ``model`` over ``data`` (a graph, graphs, a ``StructureDataset`` or a
    non-shuffling ``DataLoader``).

    Args:
        uncertainty: "none", "energy", "exact" or "sampled" (see ``UncertaintyMode``).
        n_samples: posterior draws of the sampled mode.
        seed: seed of the generator for the sampled mode.
        stress: also predict the stress of periodic structures (with its epistemic variance
            in the modes that give force variances); off by default (the training's
            validation does not need it; :func:`~mlip_unc.evaluation.evaluate.evaluate_potential`
            turns it on). Without it, periodic frames have a NaN stress prediction.
    """
    mode = UncertaintyMode(uncertainty)
    device = module_device(model)  # batches follow the model (a GPU-trained one is validated there)
    generator = torch.Generator(device).manual_seed(seed)
    was_training = model.training
    model.eval()
    parts: dict[str, list[np.ndarray]] = {}
    n_seen, any_stress = 0, False
    try:
        graphs, loader = _graphs_and_loader(data, batch_size)
        for batch in tqdm(loader, disable=not progress, leave=False, desc="predict"):
            batch = to_device(batch, device)
            n_graphs = int(batch[keys.NUM_ATOMS].reshape(-1).shape[0])
            with_stress = stress and bool(_periodic(batch, n_graphs).any())
            any_stress |= with_stress
            kwargs = {"compute_stress": True} if with_stress else {}
            out = model(
                batch,
                compute_forces=True,
                uncertainty=mode,
                n_samples=n_samples,
                generator=generator,
                **kwargs,
            )
            noise = model.noise_variances(batch)
            graph = (
                batch[keys.BATCH]
                if getattr(batch, keys.BATCH, None) is not None
                else torch.zeros(batch[keys.POSITIONS].shape[0], dtype=torch.long)
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
                **_stress_row(batch, out, n_graphs, with_stress),
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
    for name in (
        "energy_epistemic_var",
        "forces_epistemic_var",
        "local_energy_var",
        "stress_epistemic_var",
    ):
        if name in arrays and len(parts[name]) != len(parts["energy_pred"]):
            del arrays[name]  # present in some batches only: drop rather than misalign
    if not any_stress:  # no periodic structure: no stress variance was predicted
        arrays.pop("stress_epistemic_var", None)
    return Predictions(**arrays)
