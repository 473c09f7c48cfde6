"""Training data from an on-disk set (``data.train: set.mlipdb``, see :mod:`mlip_unc.data.ondisk`).

:func:`prepare_ondisk` follows :func:`~mlip_unc.train.potential_data.prepare_data` step by
step (frame selection, one-atom frames to the references, split, ``max_train``, type map,
reference energies, statistics), but on item indices: graphs stay on disk and every
statistic is computed by streaming over the items (memory: the index arrays, one graph and
``n_elements^2`` sums), so results match the in-memory path up to floating-point summation
order. ``data.valid``, ``data.test`` may be sets or files (:mod:`mlip_unc.data.datasets`);
``data.isolated_atoms`` a file.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import ase
import numpy as np

from mlip_unc.config import ConfigError, PotentialConfig, ReferenceEnergies
from mlip_unc.data import DataError, TypeMap, read_structures
from mlip_unc.data.ondisk import OnDiskDataset, OnDiskStore
from mlip_unc.data.references import is_isolated_atom
from mlip_unc.data.typemap import element_symbol

if TYPE_CHECKING:  # potential_data imports this module: a cycle at run time
    from mlip_unc.train.potential_data import PreparedData

__all__ = ["prepare_ondisk"]

Frame = tuple[np.ndarray, "float | None", bool, str]  # numbers (n,), energy, isolated, location


def _multi_atom(store: OnDiskStore, items: np.ndarray) -> np.ndarray:
    return items[store.num_atoms(items) != 1]


def _store_frames(store: OnDiskStore, items: Iterable[int]) -> Iterator[Frame]:
    off, numbers = store.array("atom_offset"), store.array("numbers")
    energy, has_energy, isolated = (
        store.array("energy"),
        store.array("has_energy"),
        store.array("isolated"),
    )
    for item in items:
        item = int(item)
        e = float(energy[item]) if has_energy[item] else None
        yield (
            np.asarray(numbers[off[item] : off[item + 1]], dtype=np.int64),
            e,
            bool(isolated[item]),
            store.where(item),
        )


def _atoms_frames(atoms_list: Sequence[ase.Atoms], energy_key: str) -> Iterator[Frame]:
    from mlip_unc.data import frame_energy

    for k, atoms in enumerate(atoms_list):
        loc = f"frame {k}"
        yield (
            np.asarray(atoms.numbers, dtype=np.int64),
            frame_energy(atoms, energy_key, context=loc),
            is_isolated_atom(atoms),
            loc,
        )


def _fit_references(parts: Sequence[Callable[[], Iterator[Frame]]]) -> dict[int, float]:
    """Streaming :func:`~mlip_unc.data.references.fit_reference_energies`: ``parts`` are
    (callable -> frame iterator) re-read per pass; normal equations replace the frame matrix."""

    def frames() -> Iterator[Frame]:
        for part in parts:
            yield from (f for f in part() if f[1] is not None)

    found: dict[int, list[float]] = {}
    any_energy = False
    for numbers, energy, isolated, loc in frames():
        any_energy = True
        if isolated:
            if len(numbers) != 1:
                raise DataError(
                    f"{loc}: marked as an isolated atom but the frame has {len(numbers)} atoms"
                )
            assert energy is not None  # frames() yields labelled frames only
            found.setdefault(int(numbers[0]), []).append(energy)
    if not any_energy:
        raise DataError("no frame has an energy label")
    known = {z: float(np.mean(e)) for z, e in found.items()}
    unknown: set[int] = set()
    for numbers, _, isolated, _ in frames():
        if not isolated:
            unknown.update(int(z) for z in np.unique(numbers) if int(z) not in known)
    elements = sorted(unknown)
    fitted: dict[int, float] = {}
    if elements:
        column = np.full(119, -1, dtype=np.int64)
        column[elements] = np.arange(len(elements))
        known_table = np.zeros(119)
        known_table[list(known)] = list(known.values())
        gram, rhs = np.zeros((len(elements), len(elements))), np.zeros(len(elements))
        for numbers, energy, isolated, _ in frames():
            if isolated:
                continue
            x = np.bincount(column[numbers][column[numbers] >= 0], minlength=len(elements)) / len(
                numbers
            )
            y = (energy - known_table[numbers].sum()) / len(numbers)
            gram += np.outer(x, x)
            rhs += x * y
        solution, _, rank, _ = np.linalg.lstsq(gram, rhs, rcond=1e-10)
        if rank < len(elements):
            warnings.warn(
                f"reference energies of {[element_symbol(z) for z in elements]} are not identifiable from the "
                f"compositions (rank {rank} < {len(elements)}); using the minimum-norm least-squares solution",
                stacklevel=2,
            )
        fitted = {z: float(solution[k]) for k, z in enumerate(elements)}
    return dict(sorted({**known, **fitted}.items()))


def _references(
    kind: ReferenceEnergies, isolated: list, train: list, elements: Sequence[int]
) -> dict[int, float]:
    if kind is ReferenceEnergies.ZERO:
        return {int(z): 0.0 for z in elements}
    if kind is ReferenceEnergies.ISOLATED and not isolated:
        raise ConfigError(
            "model.reference_energies: 'isolated' needs data.isolated_atoms or one-atom frames"
        )
    parts = {ReferenceEnergies.LEAST_SQUARES: train, ReferenceEnergies.ISOLATED: isolated}.get(
        kind, isolated + train
    )
    refs = _fit_references(parts)
    missing = [int(z) for z in elements if int(z) not in refs]
    if missing:
        raise ConfigError(f"model.reference_energies: no reference energy for elements {missing}")
    return {int(z): float(refs[int(z)]) for z in elements}


def _elements(store: OnDiskStore, items: np.ndarray) -> set[int]:
    return {int(z) for numbers, *_ in _store_frames(store, items) for z in np.unique(numbers)}


def _statistics(
    store: OnDiskStore, items: np.ndarray, refs: dict[int, float]
) -> tuple[float, float, float, float]:
    """Energy shift and std (Chan's parallel update per chunk), force RMS, mean neighbours."""
    table = np.zeros(119)
    table[list(refs)] = list(refs.values())
    count, mean, m2 = 0, 0.0, 0.0
    f_sum, f_count = 0.0, 0
    off, forces, has_forces = (
        store.array("atom_offset"),
        store.array("forces"),
        store.array("has_forces"),
    )
    chunk: list[float] = []

    def merge() -> None:
        nonlocal count, mean, m2
        r = np.asarray(chunk)
        n_b, mean_b = len(r), float(r.mean())
        delta, total = mean_b - mean, count + n_b
        m2 += float(((r - mean_b) ** 2).sum()) + delta**2 * count * n_b / total
        mean, count = mean + delta * n_b / total, total
        chunk.clear()

    for item, (numbers, energy, _, _) in zip(items, _store_frames(store, items), strict=False):
        if energy is not None:
            chunk.append((energy - table[numbers].sum()) / len(numbers))
            if len(chunk) >= 4096:
                merge()
        if has_forces[item]:
            f = np.asarray(forces[off[item] : off[item + 1]])
            f_sum, f_count = f_sum + float((f * f).sum()), f_count + f.size
    if chunk:
        merge()
    shift, std = (mean, float(np.sqrt(m2 / count))) if count else (0.0, 1.0)
    force_rms = float(np.sqrt(f_sum / f_count)) if f_count else 0.0
    n_edges = int(np.diff(np.asarray(store.array("edge_offset")))[items].sum())
    n_atoms = int(store.num_atoms(items).sum())
    return shift, std, force_rms, max(n_edges / max(n_atoms, 1), 1.0)


def prepare_ondisk(config: PotentialConfig) -> PreparedData:
    """:func:`~mlip_unc.train.potential_data.prepare_data` for ``data.train`` an on-disk set."""
    from mlip_unc.train.potential_data import PreparedData, _split, select_part

    data = config.data
    selected = select_part(config, data.train)
    store, items = selected.store, selected.indices
    assert store is not None  # prepare_data sends only on-disk sets here
    frames_idx = _multi_atom(store, items)
    one_atom = items[store.num_atoms(items) == 1]
    extra = (
        read_structures(data.isolated_atoms, energy_key=data.energy_key, require_forces=False)
        if data.isolated_atoms
        else []
    )
    if data.valid:
        train_idx, valid = frames_idx, select_part(config, data.valid).multi_atom()
    else:
        pos_train, pos_valid = _split(len(frames_idx), data.valid_fraction, config.seed)
        train_idx = frames_idx[np.asarray(pos_train, dtype=np.int64)]
        multi = np.flatnonzero(store.num_atoms(items) != 1)  # positions of frames_idx in items
        valid = selected.subset(multi[np.asarray(pos_valid, dtype=np.int64)])
    if data.max_train is not None and data.max_train < len(train_idx):
        keep = np.random.default_rng(config.seed).permutation(len(train_idx))[: data.max_train]
        train_idx = train_idx[np.sort(keep)]
    if not len(train_idx):
        raise DataError(f"'{data.train}': no multi-atom training frames")
    type_map = TypeMap(tuple(sorted(_elements(store, train_idx) | valid.elements())))
    isolated = [lambda: _store_frames(store, one_atom)] + (
        [lambda: _atoms_frames(extra, data.energy_key)] if extra else []
    )
    train_frames = [lambda: _store_frames(store, train_idx)]
    refs = _references(
        config.model.reference_energies,
        isolated if (len(one_atom) or extra) else [],
        train_frames,
        type_map.atomic_numbers,
    )
    dtype = config.dtype.torch
    train = OnDiskDataset(store, train_idx, type_map, dtype=dtype)
    valid_set = valid.dataset(type_map, dtype=dtype) if len(valid) else None
    test = None
    if data.test:
        test = (
            select_part(config, data.test, forces=False).multi_atom().dataset(type_map, dtype=dtype)
        )
    shift, std, force_rms, avg_nn = _statistics(store, train_idx, refs)
    return PreparedData(
        train=train,
        valid=valid_set,
        test=test,
        type_map=type_map,
        reference_energies=refs,
        energy_shift=shift,
        energy_std=std,
        force_rms=force_rms,
        avg_num_neighbors=avg_nn,
    )
