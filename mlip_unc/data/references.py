"""Per-element reference energies E0 (isolated atoms, else least squares on compositions)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import ase
import numpy as np

from mlip_unc.data.errors import DataError
from mlip_unc.data.labels import frame_energy
from mlip_unc.data.typemap import element_symbol

__all__ = ["fit_reference_energies", "ISOLATED_ATOM_CONFIG_TYPES"]

ISOLATED_ATOM_CONFIG_TYPES: tuple[str, ...] = ("IsolatedAtom", "isolated_atom")


def _is_isolated(atoms: ase.Atoms) -> bool:
    return len(atoms) == 1 or atoms.info.get("config_type") in ISOLATED_ATOM_CONFIG_TYPES


def _isolated_energies(frames: list[tuple[int, ase.Atoms, float]]) -> dict[int, float]:
    """Per-element energies from (frame index, single-atom frame, energy); mean over repeats."""
    found: dict[int, list[float]] = {}
    for frame, atoms, energy in frames:
        if len(atoms) != 1:
            raise DataError(
                f"frame {frame}: config_type '{atoms.info.get('config_type')}' marks an "
                f"isolated atom but the frame has {len(atoms)} atoms"
            )
        found.setdefault(int(atoms.numbers[0]), []).append(energy)
    return {z: float(np.mean(e)) for z, e in found.items()}


def _least_squares_energies(
    frames: list[tuple[int, ase.Atoms, float]], elements: list[int], known: dict[int, float]
) -> dict[int, float]:
    """Fit E - sum(known) = counts @ e on ``elements`` (minimum-norm if rank deficient)."""
    column = {z: k for k, z in enumerate(elements)}
    counts = np.zeros((len(frames), len(elements)))  # (n_frames, n_elements)
    target = np.zeros(len(frames))  # (n_frames,)
    for row, (_, atoms, energy) in enumerate(frames):
        target[row] = energy
        for z in atoms.numbers:
            if int(z) in known:
                target[row] -= known[int(z)]
            else:
                counts[row, column[int(z)]] += 1.0
    solution, _, rank, _ = np.linalg.lstsq(counts, target, rcond=None)
    if rank < len(elements):
        warnings.warn(
            f"reference energies of {[element_symbol(z) for z in elements]} are not identifiable "
            f"from the compositions (rank {rank} < {len(elements)}); using the minimum-norm "
            f"least-squares solution",
            stacklevel=3,
        )
    return {z: float(solution[column[z]]) for z in elements}


def fit_reference_energies(
    atoms_list: Sequence[ase.Atoms], energy_key: str | None = None
) -> dict[int, float]:
    """Per-element reference energies E0 (eV), atomic number -> energy.

    Isolated-atom frames (one atom, or ``info["config_type"]`` in
    :data:`ISOLATED_ATOM_CONFIG_TYPES`) give E0 directly (mean over repeats). Elements without
    such a frame are fitted by least squares of the remaining energy on element counts over
    the other frames; rank deficiency (e.g. one fixed composition) gives the minimum-norm
    solution and a warning. Frames without an energy are ignored.

    Raises:
        DataError: no frame has an energy under ``energy_key``.
    """
    labelled = []
    for frame, atoms in enumerate(atoms_list):
        energy = frame_energy(atoms, energy_key, context=f"frame {frame}")
        if energy is not None:
            labelled.append((frame, atoms, energy))
    if not labelled:
        raise DataError(f"no frame has an energy under key '{energy_key or 'energy'}'")
    isolated = [entry for entry in labelled if _is_isolated(entry[1])]
    others = [entry for entry in labelled if not _is_isolated(entry[1])]
    known = _isolated_energies(isolated)
    unknown = sorted({int(z) for _, a, _ in others for z in a.numbers} - set(known))
    fitted = _least_squares_energies(others, unknown, known) if unknown else {}
    return dict(sorted({**known, **fitted}.items()))
