"""Is an exploration frame physical? The geometry rules that stop active-learning MD.

A poor model can tear a molecule apart or push two atoms onto each other within a few
femtoseconds. Such frames say nothing about the region a user cares about, yet a reference
calculation on them is expensive and their huge forces dominate any training they join. So
exploration MD stops at the first frame that breaks one of these rules, restarts from the last
good state, and the broken frame never becomes a candidate nor reaches the oracle::

    guard = GeometryGuard.from_structure(start, GuardSettings())
    why = guard.check(atoms)      # None, or "bond 3-7 at 1.62x its start length"

Rules (those of the stability runs of the active-learning benchmark):

- a bond of the starting structure (two atoms closer than 1.15 x the sum of ASE's natural
  radii there) longer than ``stretch`` (1.5) or shorter than ``compress`` (0.7) times its
  starting length; checked for molecules by default (``bonds: None``), since bonds in a hot
  crystal or a liquid rearrange legitimately;
- two atoms closer than ``min_distance`` (0.7 A, minimum image);
- a non-finite position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ase import Atoms
from ase.neighborlist import natural_cutoffs, neighbor_list

from mlip_unc.config import GuardSettings

__all__ = ["GeometryGuard", "start_bonds"]


def start_bonds(atoms: Atoms, mult: float = 1.15) -> np.ndarray:
    """(n_bonds, 2) int pairs ``i < j`` closer than ``mult`` x the sum of natural radii
    (minimum image for periodic structures)."""
    i, j = neighbor_list("ij", atoms, natural_cutoffs(atoms, mult=mult))
    keep = i < j
    pairs = np.unique(np.stack([i[keep], j[keep]], axis=1), axis=0)  # (n_bonds, 2)
    return pairs.reshape(-1, 2).astype(np.int64)


@dataclass(frozen=True)
class GeometryGuard:
    """The rules of one starting structure (build with :meth:`from_structure`).

    Attributes:
        pairs: (n_bonds, 2) bonded atom pairs checked (empty: no bond rule).
        lengths: (n_bonds,) their starting lengths (A).
        settings: the thresholds.
    """

    pairs: np.ndarray
    lengths: np.ndarray
    settings: GuardSettings

    @classmethod
    def from_structure(cls, atoms: Atoms, settings: GuardSettings | None = None) -> GeometryGuard:
        """The guard of starting structure ``atoms``: its bonds when ``settings.bonds`` (or,
        when that is ``None``, when ``atoms`` is not periodic)."""
        settings = settings or GuardSettings()
        check_bonds = settings.bonds if settings.bonds is not None else not atoms.pbc.any()
        pairs = start_bonds(atoms) if check_bonds else np.zeros((0, 2), dtype=np.int64)
        mic = bool(atoms.pbc.any())
        lengths = (
            atoms.get_distances(pairs[:, 0], pairs[:, 1], mic=mic)
            if len(pairs)
            else np.zeros(0)  # (n_bonds,)
        )
        return cls(pairs=pairs, lengths=np.asarray(lengths, dtype=np.float64), settings=settings)

    def check(self, atoms: Atoms) -> str | None:
        """Why ``atoms`` is unphysical, or ``None`` when it is fine."""
        pos = atoms.positions  # (n, 3)
        if not np.isfinite(pos).all():
            return "non-finite positions"
        mic = bool(atoms.pbc.any())
        s = self.settings
        if len(self.pairs):
            d = atoms.get_distances(self.pairs[:, 0], self.pairs[:, 1], mic=mic)  # (n_bonds,)
            ratio = d / self.lengths
            k = int(np.argmax(np.abs(np.log(ratio))))
            if ratio[k] > s.stretch or ratio[k] < s.compress:
                a, b = self.pairs[k]
                return f"bond {a}-{b} at {ratio[k]:.2f}x its start length"
        if len(atoms) > 1 and s.min_distance > 0:
            close = _closest_pair(atoms, s.min_distance)
            if close is not None:
                i, j, d = close
                return f"atoms {i} and {j} {d:.2f} A apart (< {s.min_distance} A)"
        return None


def _closest_pair(atoms: Atoms, cutoff: float) -> tuple[int, int, float] | None:
    """The closest pair of atoms nearer than ``cutoff`` (minimum image), or None.

    A molecule's cell is often a large empty box (50 A for the 3BPA files): ASE's cell-list
    search would bin that box at the cutoff (about 360,000 cells, ~0.5 s a call), so
    non-periodic structures use a k-d tree of the positions instead."""
    if atoms.pbc.any():
        i, j, d = neighbor_list("ijd", atoms, cutoff)
    else:
        from scipy.spatial import cKDTree

        pairs = cKDTree(atoms.positions).query_pairs(cutoff, output_type="ndarray")  # (m, 2)
        i, j = pairs[:, 0], pairs[:, 1]
        d = np.linalg.norm(atoms.positions[i] - atoms.positions[j], axis=1)  # (m,)
    if not len(d):
        return None
    k = int(np.argmin(d))
    return int(i[k]), int(j[k]), float(d[k])
