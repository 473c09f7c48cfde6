"""Domain guard: geometric rules, fitted on the training structures, that no learned sigma can miss.

A learned uncertainty can be confidently wrong far from the data (two atoms 0.1 A apart, a cell
stretched by 25 %). :class:`DomainGuard` records, from the training structures and within the
cutoff ``r_max``:

- per element pair ``(Z1 <= Z2)``: the shortest interatomic distance ``d_min(Z1, Z2)``;
- per element ``Z``: the largest nearest-neighbour distance ``nn_max(Z)`` of any atom of that
  element (the distance from an atom to its closest neighbour, over all training atoms).

:meth:`DomainGuard.check` then calls a structure **out of domain** when any rule fires:

1. ``short_pair``: a pair closer than ``pair_factor * d_min(Z1, Z2)`` (default
   ``pair_factor = 0.9``: 10 % below the shortest training distance of that pair);
2. ``stretched``: an atom whose nearest neighbour is farther than ``nn_factor * nn_max(Z)``
   (default ``nn_factor = 1.1``), including an atom with no neighbour at all within ``r_max``
   (a dissociated fragment) when every training atom of that element had one;
3. ``unseen_pair``: an element pair within ``r_max`` that never occurred within ``r_max`` in
   training (no ``d_min`` exists; the model never saw the two elements interact). Flags by
   default; ``flag_unseen_pairs=False`` only reports it in the reason;
4. ``unseen_element``: an element absent from training (always flags).

Single-atom training structures (isolated-atom references) count for the elements seen but not
for ``nn_max``: they are not environments the model interpolates between. Atoms closer than
:data:`COINCIDENT_DISTANCE` (0.01 A) raise :class:`CoincidentAtomsError` (a ``ValueError``)
naming both atoms and their elements; no rule is evaluated then.

The guard is plain data (:meth:`DomainGuard.to_dict`, :meth:`DomainGuard.from_dict`), stored by
the trainer as ``checkpoint["metadata"]["domain"]`` and read by the ASE calculator.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ase
import numpy as np
from ase.data import chemical_symbols

from mlip_unc import keys
from mlip_unc.data.graphs import StructureDataset
from mlip_unc.data.neighbours import neighbour_list

__all__ = [
    "COINCIDENT_DISTANCE",
    "NN_FACTOR",
    "PAIR_FACTOR",
    "CoincidentAtomsError",
    "DomainCheck",
    "DomainGuard",
    "check_coincident",
    "pair_distances",
]

log = logging.getLogger(__name__)

COINCIDENT_DISTANCE = 0.01  # Angstrom: closer than this raises CoincidentAtomsError
PAIR_FACTOR = 0.9  # short_pair fires when d < PAIR_FACTOR * d_min(Z1, Z2)
NN_FACTOR = 1.1  # stretched fires when nn(atom) > NN_FACTOR * nn_max(Z)
_FORMAT_VERSION = 1


class CoincidentAtomsError(ValueError):
    """Two atoms (or an atom and a periodic image) closer than 0.01 A."""


@dataclass(frozen=True)
class DomainCheck:
    """The verdict of :meth:`DomainGuard.check` on one structure.

    Attributes:
        out_of_domain: True when any rule fired (module docstring).
        reason: ``""`` when in domain, else one clause per fired rule (``"; "``-joined), each
            naming the rule, the worst atoms and the numbers compared.
        min_ratio: smallest ``d / d_min(Z1, Z2)`` over the pairs within ``r_max`` whose element
            pair was seen in training (``inf`` when there is none); fires below ``pair_factor``.
        max_nn_ratio: largest ``nn / nn_max(Z)`` over the atoms with a bounded element
            (``inf`` for an atom without neighbours; ``0`` when none is checked); fires above
            ``nn_factor``.
        rules: names of the rules that fired (``short_pair``, ``stretched``, ``unseen_pair``,
            ``unseen_element``).
        unseen_pairs: element pairs within ``r_max`` never seen in training, e.g. ``"Al-Cu"``.
    """

    out_of_domain: bool
    reason: str
    min_ratio: float = math.inf
    max_nn_ratio: float = 0.0
    rules: tuple[str, ...] = ()
    unseen_pairs: tuple[str, ...] = field(default=())


def _symbol(z: int) -> str:
    return chemical_symbols[int(z)] if 0 <= int(z) < len(chemical_symbols) else f"Z={int(z)}"


def _pair_name(z1: int, z2: int) -> str:
    a, b = sorted((int(z1), int(z2)))
    return f"{_symbol(a)}-{_symbol(b)}"


def _atoms_distances(
    atoms: ase.Atoms, r_max: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(numbers (n,), i (e,), j (e,), d (e,))`` of all directed pairs closer than ``r_max``."""
    pbc = np.asarray(atoms.pbc, dtype=bool)
    cell = atoms.cell.array if pbc.any() else np.zeros((3, 3))
    edge_index, shift = neighbour_list(atoms.positions, cell, pbc, r_max)
    j, i = edge_index  # [sender j, receiver i]
    vec = atoms.positions[j] - atoms.positions[i] + shift @ cell  # (e, 3)
    return np.asarray(atoms.numbers, dtype=np.int64), i, j, np.linalg.norm(vec, axis=1)


def pair_distances(graph: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(numbers (n,), i (e,), j (e,), d (e,))`` of a PyG graph's edges (float64 NumPy).

    ``d = |pos[j] - pos[i] + cell_shift @ cell|`` (the edge convention of :mod:`mlip_unc.keys`);
    the graph needs ``atomic_numbers``, ``pos``, ``edge_index`` and, if periodic, ``cell`` and
    ``cell_shift``.
    """
    pos = graph[keys.POSITIONS].detach().cpu().double().numpy()  # (n, 3)
    numbers = graph[keys.ATOMIC_NUMBERS].detach().cpu().numpy().astype(np.int64)  # (n,)
    j, i = graph[keys.EDGE_INDEX].detach().cpu().numpy()  # (e,), (e,)
    vec = pos[j] - pos[i]  # (e, 3)
    shift = getattr(graph, keys.CELL_SHIFT, None)
    cell = getattr(graph, keys.CELL, None)
    if shift is not None and cell is not None and len(i):
        vec = (
            vec
            + shift.detach().cpu().double().numpy()
            @ cell.detach().cpu().double().numpy().reshape(3, 3)
        )
    return numbers, i.astype(np.int64), j.astype(np.int64), np.linalg.norm(vec, axis=1)


def _raise_if_coincident(numbers: np.ndarray, i: np.ndarray, j: np.ndarray, d: np.ndarray) -> None:
    close = np.flatnonzero(d < COINCIDENT_DISTANCE)
    if close.size == 0:
        return
    k = close[np.argmin(d[close])]
    a, b = sorted((int(i[k]), int(j[k])))
    image = " (a periodic image)" if a == b else ""
    shown = np.floor(d[k] * 1e4) / 1e4  # rounded down, so never printed at the limit
    raise CoincidentAtomsError(
        f"atoms {a} ({_symbol(numbers[a])}) and {b} ({_symbol(numbers[b])}){image} are "
        f"{shown:.4f} A apart (< {COINCIDENT_DISTANCE} A): coincident atoms, the model is undefined "
        f"there ({close.size // 2 or 1} such pair(s) in this {len(numbers)}-atom structure)"
    )


def check_coincident(structure: ase.Atoms | Any, r_max: float = 1.0) -> None:
    """Raise :class:`CoincidentAtomsError` if two atoms of an ``ase.Atoms`` or graph are < 0.01 A apart."""
    if isinstance(structure, ase.Atoms):
        _raise_if_coincident(*_atoms_distances(structure, max(r_max, 2 * COINCIDENT_DISTANCE)))
    else:
        _raise_if_coincident(*pair_distances(structure))


def _nearest(n_atoms: int, i: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``(n_atoms,)`` nearest-neighbour distance of each atom (``inf`` without neighbours)."""
    nn = np.full(n_atoms, np.inf)
    np.minimum.at(nn, i, d)
    return nn


class DomainGuard:
    """Per element pair shortest and per element largest nearest-neighbour training distances.

    Build with :meth:`fit`; see the module docstring for the rules and margins.

    Args:
        r_max: cutoff (Angstrom) within which pairs and nearest neighbours are looked for.
        min_distance: ``{(Z1, Z2): d_min}`` with ``Z1 <= Z2``, Angstrom.
        max_nn_distance: ``{Z: nn_max}``, Angstrom; ``None`` = unbounded (a training atom of
            that element had no neighbour within ``r_max``, or it only occurred alone).
        pair_factor, nn_factor, flag_unseen_pairs: the margins and switches of the rules.
        n_structures: number of structures fitted (informative).
    """

    def __init__(
        self,
        r_max: float,
        min_distance: Mapping[tuple[int, int], float],
        max_nn_distance: Mapping[int, float | None],
        *,
        pair_factor: float = PAIR_FACTOR,
        nn_factor: float = NN_FACTOR,
        flag_unseen_pairs: bool = True,
        n_structures: int = 0,
    ) -> None:
        if not (math.isfinite(r_max) and r_max > 0):
            raise ValueError(f"r_max must be a positive number, got {r_max!r}")
        if not 0 < pair_factor <= 1:
            raise ValueError(f"pair_factor must be in (0, 1], got {pair_factor!r}")
        if nn_factor < 1:
            raise ValueError(f"nn_factor must be >= 1, got {nn_factor!r}")
        self.r_max = float(r_max)
        self.min_distance = {
            tuple(sorted((int(a), int(b)))): float(d) for (a, b), d in min_distance.items()
        }
        self.max_nn_distance = {
            int(z): None if v is None else float(v) for z, v in max_nn_distance.items()
        }
        self.pair_factor = float(pair_factor)
        self.nn_factor = float(nn_factor)
        self.flag_unseen_pairs = bool(flag_unseen_pairs)
        self.n_structures = int(n_structures)

    # ------------------------------------------------------------------ fit
    @classmethod
    def fit(
        cls,
        structures: StructureDataset | Iterable[ase.Atoms] | Iterable[Any],
        r_max: float | None = None,
        **options: Any,
    ) -> DomainGuard:
        """Fit on ``ase.Atoms`` or PyG graphs (a :class:`StructureDataset` or a list of graphs).

        Args:
            structures: the training structures.
            r_max: cutoff, Angstrom; defaults to the dataset's ``r_max`` for a
                :class:`StructureDataset`, required otherwise. With graphs it must not exceed
                the cutoff they were built with (longer pairs are missing from their edges).
            **options: ``pair_factor``, ``nn_factor``, ``flag_unseen_pairs``.

        Raises:
            ValueError: no ``r_max``, no structures, or coincident atoms in a structure.
        """
        if r_max is None and isinstance(structures, StructureDataset):
            r_max = structures.r_max
        if r_max is None:
            raise ValueError(
                "DomainGuard.fit needs r_max (the cutoff) unless given a StructureDataset"
            )
        if isinstance(structures, StructureDataset):
            if r_max > structures.r_max + 1e-12:
                raise ValueError(f"r_max {r_max} exceeds the dataset's cutoff {structures.r_max}")
            structures = structures.graphs
        min_d: dict[tuple[int, int], float] = {}
        bound: dict[int, float] = {}  # largest finite nearest-neighbour distance per element
        unbounded: set[int] = set()  # elements with an atom without neighbours (multi-atom frames)
        seen: set[int] = set()
        n = 0
        for n, item in enumerate(structures, start=1):  # noqa: B007 (n counts the structures)
            numbers, i, j, d = (
                _atoms_distances(item, r_max)
                if isinstance(item, ase.Atoms)
                else pair_distances(item)
            )
            keep = d < r_max
            i, j, d = i[keep], j[keep], d[keep]
            _raise_if_coincident(numbers, i, j, d)
            seen.update(numbers.tolist())
            z1, z2 = np.minimum(numbers[i], numbers[j]), np.maximum(numbers[i], numbers[j])  # (e,)
            for a, b in set(zip(z1.tolist(), z2.tolist(), strict=False)):
                shortest = float(d[(z1 == a) & (z2 == b)].min())
                min_d[(a, b)] = min(min_d.get((a, b), math.inf), shortest)
            if len(numbers) < 2:  # an isolated-atom reference: element seen, no nn bound
                continue
            nn = _nearest(len(numbers), i, d)  # (n,)
            for z in np.unique(numbers).tolist():
                largest = float(nn[numbers == z].max())
                if math.isfinite(largest):
                    bound[z] = max(bound.get(z, 0.0), largest)
                else:
                    unbounded.add(z)
        if n == 0:
            raise ValueError("DomainGuard.fit got no structures")
        max_nn = {z: (None if z in unbounded or z not in bound else bound[z]) for z in sorted(seen)}
        guard = cls(r_max, min_d, max_nn, n_structures=n, **options)
        log.info("domain guard fitted on %d structures: %s", n, guard.summary())
        return guard

    # ------------------------------------------------------------------ check
    @property
    def elements(self) -> list[int]:
        """Atomic numbers seen in training."""
        return sorted(self.max_nn_distance)

    def check(self, structure: ase.Atoms | Any, *, cutoff: float | None = None) -> DomainCheck:
        """Apply the rules (module docstring) to an ``ase.Atoms`` or a PyG graph.

        Args:
            structure: the structure; an ``ase.Atoms`` gets its own neighbour list within
                ``r_max``, a graph's edges are used as they are.
            cutoff: the cutoff a graph was built with; it must be >= ``r_max`` (pairs between
                the two radii would be missing). Ignored for ``ase.Atoms``.

        Raises:
            CoincidentAtomsError: two atoms closer than 0.01 A (names both, with elements).
            ValueError: a graph built with a cutoff below ``r_max``.
        """
        if isinstance(structure, ase.Atoms):
            numbers, i, j, d = _atoms_distances(structure, self.r_max)
        else:
            if cutoff is not None and cutoff < self.r_max - 1e-12:
                raise ValueError(
                    f"the graph's cutoff {cutoff} is below the domain guard's r_max {self.r_max}; "
                    "check the ase.Atoms instead"
                )
            numbers, i, j, d = pair_distances(structure)
        keep = d < self.r_max
        return self._evaluate(numbers, i[keep], j[keep], d[keep])

    def _evaluate(
        self, numbers: np.ndarray, i: np.ndarray, j: np.ndarray, d: np.ndarray
    ) -> DomainCheck:
        _raise_if_coincident(numbers, i, j, d)
        rules: list[str] = []
        clauses: list[str] = []
        unknown = sorted(set(numbers.tolist()) - set(self.max_nn_distance))
        if unknown:
            rules.append("unseen_element")
            clauses.append(
                f"unseen_element: {', '.join(_symbol(z) for z in unknown)} not in training"
            )
        # rule 1 (short_pair) and 3 (unseen_pair): per edge, its pair's training minimum
        z1, z2 = np.minimum(numbers[i], numbers[j]), np.maximum(numbers[i], numbers[j])  # (e,)
        d_min = np.full(d.shape, np.nan)  # (e,) nan = pair never seen
        for a, b in set(zip(z1.tolist(), z2.tolist(), strict=False)):
            d_min[(z1 == a) & (z2 == b)] = self.min_distance.get((a, b), np.nan)
        seen = np.isfinite(d_min)
        unseen_pairs = tuple(
            sorted(
                {
                    _pair_name(a, b)
                    for a, b in zip(z1[~seen].tolist(), z2[~seen].tolist(), strict=False)
                }
            )
        )
        min_ratio = math.inf
        if seen.any():
            ratio = d[seen] / d_min[seen]  # (e_seen,)
            k = int(np.argmin(ratio))
            min_ratio = float(ratio[k])
            if min_ratio < self.pair_factor:
                e = np.flatnonzero(seen)[k]
                a, b = sorted((int(i[e]), int(j[e])))
                n_short = int((ratio < self.pair_factor).sum()) // 2 or 1
                rules.append("short_pair")
                clauses.append(
                    f"short_pair: {_pair_name(numbers[a], numbers[b])} atoms {a} and {b} at {d[e]:.3f} A "
                    f"< {self.pair_factor:g} x {d_min[e]:.3f} A (training minimum); {n_short} such pair(s)"
                )
        if unseen_pairs and self.flag_unseen_pairs:
            rules.append("unseen_pair")
            clauses.append(
                f"unseen_pair: {', '.join(unseen_pairs)} within {self.r_max:g} A never seen in training"
            )
        # rule 2 (stretched): nearest-neighbour distance against the element's training maximum
        bound = np.array(
            [
                np.nan if self.max_nn_distance.get(z) is None else self.max_nn_distance[z]
                for z in numbers.tolist()
            ]
        )  # (n,)
        checked = np.isfinite(bound)
        max_nn_ratio = 0.0
        if checked.any():
            nn = _nearest(len(numbers), i, d)  # (n,)
            ratio = nn[checked] / bound[checked]
            k = int(np.argmax(ratio))
            max_nn_ratio = float(ratio[k])
            if max_nn_ratio > self.nn_factor:
                a = int(np.flatnonzero(checked)[k])
                n_far = int((ratio > self.nn_factor).sum())
                if math.isfinite(nn[a]):
                    what = (
                        f"nearest neighbour {nn[a]:.3f} A > {self.nn_factor:g} x {bound[a]:.3f} A"
                    )
                else:
                    what = f"has no neighbour within {self.r_max:g} A; every training one had (<= {bound[a]:.3f} A)"
                rules.append("stretched")
                clauses.append(
                    f"stretched: {_symbol(numbers[a])} atom {a} {what} (training maximum); {n_far} such atom(s)"
                )
        return DomainCheck(
            out_of_domain=bool(rules),
            reason="; ".join(clauses),
            min_ratio=min_ratio,
            max_nn_ratio=max_nn_ratio,
            rules=tuple(rules),
            unseen_pairs=unseen_pairs,
        )

    # ------------------------------------------------------------------ plain data
    def summary(self) -> str:
        """One line: shortest pair distances and nearest-neighbour bounds."""
        pairs = ", ".join(
            f"{_pair_name(a, b)} {d:.2f}" for (a, b), d in sorted(self.min_distance.items())
        )
        nn = ", ".join(
            f"{_symbol(z)} {'-' if v is None else f'{v:.2f}'}"
            for z, v in sorted(self.max_nn_distance.items())
        )
        return f"r_max {self.r_max:g} A; d_min [{pairs}] A; nn_max [{nn}] A"

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, floats, ints, bools, None): JSON and weights-only checkpoint safe."""
        return {
            "version": _FORMAT_VERSION,
            "r_max": self.r_max,
            "pair_factor": self.pair_factor,
            "nn_factor": self.nn_factor,
            "flag_unseen_pairs": self.flag_unseen_pairs,
            "n_structures": self.n_structures,
            "min_distance": [[a, b, d] for (a, b), d in sorted(self.min_distance.items())],
            "max_nn_distance": [[z, v] for z, v in sorted(self.max_nn_distance.items())],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DomainGuard:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: an unknown format version or missing fields.
        """
        version = data.get("version")
        if version != _FORMAT_VERSION:
            raise ValueError(
                f"unknown domain guard format version {version!r} (expected {_FORMAT_VERSION})"
            )
        try:
            return cls(
                float(data["r_max"]),
                {(int(a), int(b)): float(d) for a, b, d in data["min_distance"]},
                {int(z): None if v is None else float(v) for z, v in data["max_nn_distance"]},
                pair_factor=float(data["pair_factor"]),
                nn_factor=float(data["nn_factor"]),
                flag_unseen_pairs=bool(data["flag_unseen_pairs"]),
                n_structures=int(data.get("n_structures", 0)),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"malformed domain guard data: {err!r}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DomainGuard) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"DomainGuard({self.n_structures} structures; {self.summary()})"
