"""A potential's errors on a test set: the frames, their labels, an ASE calculator's predictions
(mace-torch's, a published model's) and the metrics the accuracy tables report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mlip_unc.data import frame_energy, frame_forces, frame_stress, read_structures
from mlip_unc.evaluation.evaluate import Predictions, potential_metrics
from mlip_unc.train.text_files import json_safe

KEEP = {
    "energy_mae_meV_atom": "energy_mae_meV_atom",
    "energy_rmse_meV_atom": "energy_rmse_meV_atom",
    "forces_mae_meV_A": "force_mae_meV_A",
    "forces_rmse_meV_A": "force_rmse_meV_A",
    "stress_mae_GPa": "stress_mae_GPa",
    "stress_rmse_GPa": "stress_rmse_GPa",
    "n_frames": "n_frames",
}


def read_frames(path: Path, spec: dict[str, Any]) -> list:
    """Structures of ``path`` without the one-atom (reference) frames, labels under ``spec``'s keys."""
    frames = read_structures(
        path,
        energy_key=spec["energy_key"],
        forces_key=spec["forces_key"],
        stress_key=spec["stress_key"],
        require_forces=False,
    )
    return [a for a in frames if len(a) > 1]


def isolated_energies(paths: list[Path | str], spec: dict[str, Any]) -> dict[int, float]:
    """E0(Z) of the one-atom frames in ``paths`` (the same frames our trainer uses)."""
    out: dict[int, float] = {}
    for path in paths:
        for atoms in read_structures(path, energy_key=spec["energy_key"], require_forces=False):
            if len(atoms) == 1 and (e := frame_energy(atoms, spec["energy_key"])) is not None:
                out[int(atoms.numbers[0])] = float(e)
    return out


def truth(frames: list, spec: dict[str, Any]) -> dict[str, np.ndarray]:
    """float64 labels of ``frames``: energy (n,), forces (n_atoms, 3), stress (n, 3, 3), masks."""
    e = [frame_energy(a, spec["energy_key"]) for a in frames]
    f = [frame_forces(a, spec["forces_key"]) for a in frames]
    s = [frame_stress(a, spec["stress_key"]) if spec["stress_key"] else None for a in frames]
    return {
        "energy": np.array([np.nan if v is None else v for v in e]),
        "has_energy": np.array([v is not None for v in e]),
        "forces": np.concatenate(
            [np.zeros((len(a), 3)) if v is None else v for a, v in zip(frames, f, strict=False)]
        ),
        "has_forces": np.array([v is not None for v in f]),
        "stress": np.stack([np.zeros((3, 3)) if v is None else v for v in s]),
        "has_stress": np.array([v is not None for v in s]),
        "periodic": np.array([bool(a.pbc.any()) and a.cell.volume > 0 for a in frames]),
    }


def metrics(pred: Predictions) -> dict[str, Any]:
    full = potential_metrics(pred)
    return json_safe({new: full.get(old) for old, new in KEEP.items()})


def calculator_predictions(calc: Any, frames: list, spec: dict[str, Any]) -> Predictions:
    """Predictions of an ASE calculator (mace's, a published model's) on ``frames`` (stress for periodic ones), our labels."""
    t = truth(frames, spec)
    energy, forces, stress = [], [], []
    for atoms, periodic in zip(frames, t["periodic"], strict=False):
        a = atoms.copy()
        a.calc = calc
        energy.append(a.get_potential_energy())
        forces.append(a.get_forces())
        voigt = a.get_stress() if periodic else np.zeros(6)  # ASE Voigt xx yy zz yz xz xy
        stress.append(
            np.array(
                [
                    [voigt[0], voigt[5], voigt[4]],
                    [voigt[5], voigt[1], voigt[3]],
                    [voigt[4], voigt[3], voigt[2]],
                ]
            )
        )
    n = np.array([len(a) for a in frames])
    forces_pred = np.concatenate(forces)
    return Predictions(
        frame_index=np.arange(len(frames)),
        num_atoms=n,
        has_energy=t["has_energy"],
        has_forces=t["has_forces"],
        energy_true=t["energy"],
        energy_pred=np.array(energy),
        energy_noise_var=np.zeros(len(frames)),
        atom_frame=np.repeat(np.arange(len(frames)), n),
        forces_true=t["forces"],
        forces_pred=forces_pred,
        forces_noise_var=np.zeros_like(forces_pred),
        periodic=t["periodic"],
        has_stress=t["has_stress"],
        stress_true=t["stress"],
        stress_pred=np.stack(stress),
    )
