"""Per-element reference energies E0 (isolated atoms, else least squares on compositions).

The least squares fit the per-atom energies, E / n = sum_Z (n_Z / n) E0(Z), the normalisation
of the per-atom energy loss, so molecular and periodic data are treated alike: for an
elemental set (every frame one element, as mlearn's Si, Ge, Li) E0 is the mean per-atom
energy of the frames, whatever their sizes.

An isolated atom is a frame marked so (``info["config_type"]`` in
:data:`ISOLATED_ATOM_CONFIG_TYPES`), or a one-atom frame that is not periodic or whose
nearest periodic image is at least :data:`ISOLATED_IMAGE_DISTANCE` away (an atom in a vacuum
box). A one-atom bulk cell (a primitive fcc or bcc cell) is a crystal, not an isolated atom.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import ase
import numpy as np

from mlip_unc.data.errors import DataError
from mlip_unc.data.labels import frame_energy
from mlip_unc.data.typemap import element_symbol

__all__ = [
    "ISOLATED_ATOM_CONFIG_TYPES",
    "ISOLATED_IMAGE_DISTANCE",
    "fit_reference_energies",
    "is_isolated_atom",
]

ISOLATED_ATOM_CONFIG_TYPES: tuple[str, ...] = ("IsolatedAtom", "isolated_atom")
ISOLATED_IMAGE_DISTANCE = 8.0
"""Angstrom: a periodic one-atom frame with no image closer than this is an isolated atom."""


def _nearest_image_distance(atoms: ase.Atoms) -> float:
    """Distance from the atom to its nearest periodic image (inf along no periodic direction)."""
    cell = atoms.cell.array[atoms.pbc]  # (n_periodic, 3) lattice vectors
    if len(cell) == 0:
        return float("inf")
    shifts = (
        np.array(np.meshgrid(*[[-1, 0, 1]] * len(cell), indexing="ij")).reshape(len(cell), -1).T
    )
    vectors = shifts[np.any(shifts != 0, axis=1)] @ cell  # (3^k - 1, 3)
    return float(np.linalg.norm(vectors, axis=1).min())


def is_isolated_atom(atoms: ase.Atoms) -> bool:
    """Whether the frame is an isolated atom (see the module docstring)."""
    if atoms.info.get("config_type") in ISOLATED_ATOM_CONFIG_TYPES:
        return True
    return len(atoms) == 1 and _nearest_image_distance(atoms) >= ISOLATED_IMAGE_DISTANCE


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
    """Fit (E - sum(known)) / n = (counts / n) @ e on ``elements``, per atom (minimum-norm if
    rank deficient)."""
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
    n_atoms = np.array([len(atoms) for _, atoms, _ in frames], dtype=np.float64)[
        :, None
    ]  # (n_frames, 1)
    solution, _, rank, _ = np.linalg.lstsq(counts / n_atoms, target / n_atoms[:, 0], rcond=None)
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

    Isolated-atom frames (:func:`is_isolated_atom`) give E0 directly (mean over repeats).
    Elements without such a frame are fitted by least squares of the remaining per-atom
    energy on the element fractions over the other frames (for one element: the mean
    per-atom energy); rank deficiency (e.g. one fixed composition) gives the minimum-norm
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
    isolated = [entry for entry in labelled if is_isolated_atom(entry[1])]
    others = [entry for entry in labelled if not is_isolated_atom(entry[1])]
    known = _isolated_energies(isolated)
    unknown = sorted({int(z) for _, a, _ in others for z in a.numbers} - set(known))
    fitted = _least_squares_energies(others, unknown, known) if unknown else {}
    return dict(sorted({**known, **fitted}.items()))
