"""The one way from a path to a dataset: a structure file or an on-disk set (``mlip-unc convert``).

Training (``data.train`` / ``valid`` / ``test``) and ``mlip-unc eval`` accept either; both go
through :func:`select_frames` (which frames, labels checked) and
:meth:`FrameSelection.dataset` (graphs, in memory for a file, read lazily for a set).
:func:`open_dataset` does both in one call::

    dataset = open_dataset("test.xyz", r_max=5.0, type_map=model_type_map)
    dataset = open_dataset("test.mlipdb", r_max=5.0, type_map=model_type_map)

A set must have been converted with the same ``r_max`` and label keys; otherwise the error
says which ``mlip-unc convert`` option to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import ase
import numpy as np
import torch

from mlip_unc.data.errors import DataError, no_frames
from mlip_unc.data.graphs import StructureDataset
from mlip_unc.data.labels import StressConvention
from mlip_unc.data.ondisk import OnDiskDataset, OnDiskStore, is_store
from mlip_unc.data.readers import _select, read_validated_frames
from mlip_unc.data.typemap import TypeMap

__all__ = [
    "LABELS",
    "FrameSelection",
    "frame_indices",
    "open_dataset",
    "open_store",
    "select_frames",
]

LABELS = ("energy", "forces", "stress")
"""The label kinds, the keys of ``label_keys`` and ``required``."""
_STANDARD = {kind: kind for kind in LABELS}


def frame_indices(n: int, index: int | slice | str) -> list[int]:
    """Indices among ``n`` frames picked by an ASE-style index (``":"``, ``"-1"``, ``"0:100:2"``)."""
    return _select(n, index)


def _keys(label_keys: Mapping[str, str | None] | None) -> dict[str, str | None]:
    return {kind: (label_keys or {}).get(kind) for kind in LABELS}


def open_store(
    path: str | Path, r_max: float, label_keys: Mapping[str, str | None] | None = None
) -> OnDiskStore:
    """Open a set and check that it was built with ``r_max`` and the ``label_keys`` (None:
    the standard names)."""
    store = OnDiskStore(path)
    if abs(store.r_max - r_max) > 1e-9:
        raise DataError(
            f"'{path}' was converted with r_max {store.r_max}, not {r_max}; run "
            f"'mlip-unc convert --r-max {r_max}' again"
        )
    stored = store.meta.get("label_keys", {})
    for kind, key in _keys(label_keys).items():
        have, want = stored.get(kind) or _STANDARD[kind], key or _STANDARD[kind]
        if have != want:
            raise DataError(
                f"'{path}' holds the {kind} label '{have}', not '{want}'; run "
                f"'mlip-unc convert --{kind}-key {want}' again"
            )
    return store


@dataclass(frozen=True)
class FrameSelection:
    """The selected frames of a structure file or an on-disk set, before graphs are built.

    Attributes:
        path: the file or set.
        r_max: cutoff of the graphs, Angstrom.
        indices: ``(n,)`` the frames' indices in the file, or the set's items.
        atoms: the structures of a file (None for a set: they stay on disk).
        store: the set (None for a file).
        label_keys: label name per kind of :data:`LABELS` (None: standard).
        stress_convention: how a file's stress label is stored (None: from its key).
    """

    path: str
    r_max: float
    indices: np.ndarray
    atoms: list[ase.Atoms] | None = None
    store: OnDiskStore | None = None
    label_keys: Mapping[str, str | None] | None = None
    stress_convention: StressConvention | str | None = None

    def __len__(self) -> int:
        return int(self.indices.size)

    def sizes(self) -> np.ndarray:
        """``(n,)`` atoms per frame."""
        if self.store is not None:
            return np.asarray(self.store.num_atoms(self.indices), dtype=np.int64)
        return np.asarray([len(a) for a in self.atoms or []], dtype=np.int64)

    def subset(self, keep: np.ndarray) -> FrameSelection:
        """The frames at positions ``keep`` (a boolean mask or integer positions)."""
        keep = np.arange(len(self))[np.asarray(keep)]
        atoms = None if self.atoms is None else [self.atoms[int(k)] for k in keep]
        return FrameSelection(
            self.path,
            self.r_max,
            self.indices[keep],
            atoms,
            self.store,
            self.label_keys,
            self.stress_convention,
        )

    def multi_atom(self) -> FrameSelection:
        """Without the one-atom frames (isolated atoms give reference energies, not data)."""
        return self.subset(self.sizes() != 1)

    def elements(self) -> set[int]:
        """The atomic numbers present."""
        if self.store is not None:
            off, numbers = self.store.array("atom_offset"), self.store.array("numbers")
            found: set[int] = set()
            for item in self.indices:
                found.update(int(z) for z in np.unique(numbers[off[item] : off[item + 1]]))
            return found
        return {int(z) for a in self.atoms or [] for z in a.numbers}

    def structures(self) -> list[ase.Atoms]:
        """The structures with their labels (read from the set for a set)."""
        if self.store is not None:
            return [self.store.atoms(int(k)) for k in self.indices]
        return list(self.atoms or [])

    def dataset(
        self, type_map: TypeMap | None = None, *, dtype: torch.dtype = torch.float64
    ) -> StructureDataset:
        """The graphs: built now from a file, read per item from a set (``OnDiskDataset``).

        ``type_map``: the model's or the training set's (None: the elements present)."""
        if self.store is not None:
            return OnDiskDataset(self.store, self.indices, type_map, dtype=dtype)
        keys = _keys(self.label_keys)
        return StructureDataset.from_atoms(
            self.atoms or [],
            self.r_max,
            type_map,
            energy_key=keys["energy"],
            forces_key=keys["forces"],
            stress_key=keys["stress"],
            stress_convention=self.stress_convention,
            frame_indices=[int(k) for k in self.indices],
            source=self.path,
            dtype=dtype,
        )


def _require_stored(store: OnDiskStore, items: np.ndarray, required: Mapping[str, bool]) -> None:
    for kind, needed in required.items():
        if needed and items.size:
            has = np.asarray(store.array(f"has_{kind}")[items], dtype=bool)
            if not has.all():
                bad = int(items[np.argmin(has)])
                raise DataError(f"{store.where(bad)}: no {kind} label (stored in '{store.path}')")


def select_frames(
    path: str | Path,
    *,
    r_max: float,
    index: int | slice | str = ":",
    label_keys: Mapping[str, str | None] | None = None,
    required: Mapping[str, bool] | None = None,
    stress_convention: StressConvention | str | None = None,
    accept_predicted: bool = False,
) -> FrameSelection:
    """The frames ``index`` of a structure file or an on-disk set, validated.

    Args:
        path: a file (extxyz, mlearn JSON, CIF, ...) or a set written by ``mlip-unc convert``.
        r_max: the graphs' cutoff (a set must have been converted with it).
        index: ASE-style frame selection.
        label_keys: label name per kind of :data:`LABELS` (None or missing: standard names).
        required: per label kind, whether every selected frame must carry it (default: none).
        stress_convention: how a file's stress label is stored (None: from its key).
        accept_predicted: take a file's labels that a model predicted (``md.traj``) as
            references (False: refused; :mod:`mlip_unc.data.provenance`).

    Raises:
        DataError: naming the file and frame, or the ``mlip-unc convert`` option to change;
            a file that holds no (selected) frames.
    """
    need = {kind: bool((required or {}).get(kind, False)) for kind in LABELS}
    if is_store(path):
        store = open_store(path, r_max, label_keys)
        try:
            items = np.asarray(frame_indices(len(store), index), dtype=np.int64)
        except (IndexError, ValueError) as err:
            raise DataError(f"'{path}': bad frame index {index!r}: {err}") from None
        _require_stored(store, items, need)
        return FrameSelection(str(path), r_max, items, None, store, label_keys, stress_convention)
    frames = read_validated_frames(
        path,
        index,
        label_keys=_keys(label_keys),
        stress_convention=stress_convention,
        required=need,
        accept_predicted=accept_predicted,
    )
    if not frames:  # an empty file: said as such, not later as an empty split or no structures
        raise DataError(no_frames(path) + ("" if index == ":" else f" at index {index!r}"))
    indices = np.asarray([k for k, _ in frames], dtype=np.int64)
    atoms = [a for _, a in frames]
    return FrameSelection(str(path), r_max, indices, atoms, None, label_keys, stress_convention)


def open_dataset(
    path: str | Path,
    *,
    r_max: float,
    type_map: TypeMap | None = None,
    index: int | slice | str = ":",
    label_keys: Mapping[str, str | None] | None = None,
    required: Mapping[str, bool] | None = None,
    multi_atom: bool = False,
    dtype: torch.dtype = torch.float64,
) -> StructureDataset:
    """A structure file or an on-disk set as a dataset (:func:`select_frames`, then
    :meth:`FrameSelection.dataset`); ``multi_atom`` drops the one-atom frames."""
    selection = select_frames(
        path, r_max=r_max, index=index, label_keys=label_keys, required=required
    )
    if multi_atom:
        selection = selection.multi_atom()
    return selection.dataset(type_map, dtype=dtype)
