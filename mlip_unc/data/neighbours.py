"""Radius neighbour lists (vesin, numpy) and periodic-cell checks.

Edge convention (see ``mlip_unc.keys``): ``edge_index[0] = j`` is the sender (neighbour),
``edge_index[1] = i`` the receiver (centre), and::

    edge_vec = pos[j] - pos[i] + cell_shift @ cell[batch[i]]     # (n_edges, 3)

which is ASE's ``neighbor_list("D")`` vector for the pair ``(i, j, S)``. This module finds the
pairs and their integer shifts ``S`` once; the differentiable vectors are recomputed from
``pos`` and ``cell`` by :mod:`mlip_unc.geometry` (:func:`~mlip_unc.geometry.edge_vectors`).
"""

from __future__ import annotations

from collections.abc import Sequence

import ase
import numpy as np
import vesin

from mlip_unc.data.errors import DataError

__all__ = ["CROWDED_NEIGHBOURS", "check_cell", "crowded_cutoff", "neighbour_list"]

# |det| / prod(|a_k|) below this counts as a degenerate (zero-volume) periodic cell.
_DEGENERATE_CELL_TOL = 1e-8


def check_cell(cell: np.ndarray, pbc: np.ndarray) -> None:
    """Raise ``DataError`` if the periodic lattice vectors do not span their dimension.

    Fully periodic cells need a non-zero volume; for mixed boundary conditions (slabs, wires)
    the periodic vectors must be non-zero and linearly independent. Non-periodic directions
    are not checked (their vectors may be zero).

    Args:
        cell: (3, 3) rows = lattice vectors, Angstrom.
        pbc: (3,) bool.
    """
    periodic = cell[np.asarray(pbc, dtype=bool)]  # (n_periodic, 3)
    if periodic.shape[0] == 0:
        return
    norms = np.linalg.norm(periodic, axis=1)  # (n_periodic,)
    if not np.all(np.isfinite(periodic)) or np.any(norms == 0.0):
        raise DataError(f"periodic cell has a zero or non-finite lattice vector: {cell.tolist()}")
    unit = periodic / norms[:, None]
    # Gram determinant = squared volume of the parallelotope spanned by unit vectors.
    gram_det = float(np.linalg.det(unit @ unit.T))
    if gram_det < _DEGENERATE_CELL_TOL**2:
        raise DataError(
            f"periodic cell has zero volume (lattice vectors are linearly dependent): "
            f"{cell.tolist()}, pbc={np.asarray(pbc).tolist()}"
        )


def _validate_inputs(
    positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, r_max: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check shapes/values; return float64 positions (n, 3), cell (3, 3) and pbc (3,)."""
    pos = np.ascontiguousarray(positions, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise DataError(f"positions must have shape (n_atoms, 3), got {pos.shape}")
    if not np.all(np.isfinite(pos)):
        bad = np.flatnonzero(~np.all(np.isfinite(pos), axis=1))
        raise DataError(f"positions contain NaN or inf (atoms {bad[:10].tolist()})")
    if not (np.isfinite(r_max) and r_max > 0.0):
        raise DataError(f"r_max must be a positive finite number, got {r_max}")
    pbc_arr = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,)).copy()
    cell_arr = np.ascontiguousarray(cell, dtype=np.float64)
    if cell_arr.size != 9:
        raise DataError(f"cell must have shape (3, 3), got {cell_arr.shape}")
    cell_arr = cell_arr.reshape(3, 3)
    check_cell(cell_arr, pbc_arr)
    if not pbc_arr.any():
        cell_arr = np.zeros((3, 3))  # vesin's non-periodic mode ignores the box
    return pos, cell_arr, pbc_arr


def neighbour_list(
    positions: np.ndarray,
    cell: np.ndarray,
    pbc: np.ndarray,
    r_max: float,
    *,
    n_threads: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """All directed pairs closer than ``r_max``, including periodic images.

    Works for molecules (``pbc`` all False; the cell is ignored), periodic cells of any shape
    (also cells smaller than ``r_max``: an atom then sees its own images, never itself with a
    zero shift) and mixed boundary conditions such as slabs. The pair set equals ASE's
    ``neighbor_list("ijS", atoms, r_max)``. Edges are sorted by receiver, sender, shift.

    Args:
        positions: (n_atoms, 3) Cartesian positions, Angstrom.
        cell: (3, 3) rows = lattice vectors, Angstrom.
        pbc: (3,) bool periodicity along each lattice vector.
        r_max: cutoff radius, Angstrom.
        n_threads: vesin threads (0 = all cores).

    Returns:
        edge_index: (2, n_edges) int64, ``[sender j, receiver i]``.
        cell_shift: (n_edges, 3) int64 image offsets ``S`` of ``j``.

    Raises:
        DataError: bad shapes, non-finite positions, non-positive ``r_max`` or a periodic
            cell with zero volume.
    """
    pos, cell_arr, pbc_arr = _validate_inputs(positions, cell, pbc, r_max)
    if pos.shape[0] == 0:
        return np.zeros((2, 0), dtype=np.int64), np.zeros((0, 3), dtype=np.int64)
    calculator = vesin.NeighborList(cutoff=float(r_max), full_list=True, n_threads=n_threads)
    i, j, shift = calculator.compute(pos, cell_arr, pbc_arr.tolist(), "ijS")
    i = i.astype(np.int64)  # (n_edges,)
    j = j.astype(np.int64)  # (n_edges,)
    shift = shift.astype(np.int64).reshape(-1, 3)  # (n_edges, 3)
    keep = ~((i == j) & np.all(shift == 0, axis=1))  # no self-pair with zero shift
    i, j, shift = i[keep], j[keep], shift[keep]
    order = np.lexsort((shift[:, 2], shift[:, 1], shift[:, 0], j, i))
    edge_index = np.stack([j[order], i[order]])  # (2, n_edges) [sender, receiver]
    return edge_index, shift[order]


#: mean neighbours per atom above which :func:`crowded_cutoff` speaks up: potentials use
#: tens (fcc Cu has 45 within 5 Å, 80 within 6 Å); every edge costs time and memory
CROWDED_NEIGHBOURS = 400


def crowded_cutoff(structures: Sequence[ase.Atoms], r_max: float) -> str | None:
    """A warning when ``r_max`` is large for the periodic cells of ``structures`` (more than
    :data:`CROWDED_NEIGHBOURS` neighbours per atom), estimated from their densities before any
    neighbour list is built; ``None`` otherwise (and for molecules, whose neighbours are
    bounded by their atoms)."""
    periodic = [atoms for atoms in structures if atoms.pbc.all() and atoms.get_volume() > 0]
    if not periodic:
        return None
    sphere = 4.0 / 3.0 * np.pi * r_max**3
    neighbours = float(np.mean([len(a) / a.get_volume() * sphere for a in periodic]))
    if neighbours <= CROWDED_NEIGHBOURS:
        return None
    height = min(
        float(h) for a in periodic for h in 1.0 / np.linalg.norm(a.cell.reciprocal(), axis=1)
    )
    return (
        f"data.r_max {r_max:g} Å gives about {neighbours:,.0f} neighbours per atom in the training "
        f"cells ({r_max / height:.0f} periodic images across the thinnest cell, {height:.3g} Å); "
        f"potentials use tens (fcc Cu: 45 within 5 Å), and the graphs, the training and the "
        "posterior fit grow with the count: check data.r_max"
    )
