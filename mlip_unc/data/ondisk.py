"""Graph datasets on disk, bigger than memory: written once, read back lazily per item.

Format (``FORMAT``, ``VERSION``): a folder (by convention ``*.mlipdb``) holding ``meta.json``
and one raw little-endian array file per field, read through ``numpy.memmap``; no new
dependency. Per-frame arrays have one row per frame, per-atom and per-edge arrays are
concatenated over frames and sliced with ``atom_offset`` / ``edge_offset`` (``n_frames + 1``).
Each item is what :func:`~mlip_unc.data.graphs.atoms_to_graph` builds (neighbour lists
included), so nothing is recomputed at training time; only the type index is not stored (the
element map is known after the last frame): it is looked up from the atomic numbers with the
reader's type map. ``meta.json`` holds the format version, ``r_max``, the elements, the label
keys, the sources (file per frame: ``source_id`` and ``frame_index``, used in every error
message), the shape, byte size and SHA-256 of every array file. Sizes are checked on opening
(a truncated store is refused), checksums by :meth:`OnDiskStore.verify`.

Written by :func:`~mlip_unc.data.ondisk_write.convert_files` (``mlip-unc convert``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import ase
import numpy as np
import torch
from torch_geometric.data import Data

from mlip_unc import keys
from mlip_unc.data.errors import DataError, where
from mlip_unc.data.graphs import StructureDataset
from mlip_unc.data.typemap import TypeMap

__all__ = [
    "ARRAYS",
    "FORMAT",
    "META",
    "VERSION",
    "OnDiskDataset",
    "OnDiskStore",
    "is_store",
    "type_lookup",
]

FORMAT = "mlip-unc-ondisk"
VERSION = 1
META = "meta.json"

#: name -> (rows: "offsets" | "frames" | "atoms" | "edges", dtype, trailing shape)
ARRAYS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "atom_offset": ("offsets", "<i8", ()),
    "edge_offset": ("offsets", "<i8", ()),
    "frame_index": ("frames", "<i8", ()),  # index of the frame in its source file
    "source_id": ("frames", "<i4", ()),  # index into meta["sources"]
    "cell": ("frames", "<f8", (3, 3)),
    "pbc": ("frames", "|u1", (3,)),
    "energy": ("frames", "<f8", ()),
    "stress": ("frames", "<f8", (3, 3)),
    "has_energy": ("frames", "|u1", ()),
    "has_forces": ("frames", "|u1", ()),
    "has_stress": ("frames", "|u1", ()),
    "isolated": ("frames", "|u1", ()),  # is_isolated_atom (reference energies)
    "positions": ("atoms", "<f8", (3,)),
    "numbers": ("atoms", "|u1", ()),
    "forces": ("atoms", "<f8", (3,)),
    "edge_index": ("edges", "<i4", (2,)),  # (sender j, receiver i), local to the frame
    "cell_shift": ("edges", "<i4", (3,)),
}


def array_file(name: str) -> str:
    return f"{name}.bin"


def is_store(path: str | Path) -> bool:
    """Whether ``path`` is an on-disk set (a folder with ``meta.json``)."""
    return (Path(path) / META).is_file()


def _row_counts(meta: dict[str, Any]) -> dict[str, int]:
    n = int(meta["n_frames"])
    return {
        "offsets": n + 1,
        "frames": n,
        "atoms": int(meta["n_atoms"]),
        "edges": int(meta["n_edges"]),
    }


class OnDiskStore:
    """Read access to an on-disk set; arrays are memory-mapped on first use (also after
    pickling, e.g. into DataLoader workers: the maps are not pickled)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_path = self.path / META
        if not meta_path.is_file():
            hint = " (a folder written by 'mlip-unc convert')" if self.path.exists() else ""
            raise DataError(f"'{self.path}': not an on-disk data set{hint}: no {META}")
        try:
            meta = json.loads(meta_path.read_text())
            fmt, version = meta.get("format"), meta.get("version")
            self.n_frames, self.n_atoms, self.n_edges = (
                int(meta[k]) for k in ("n_frames", "n_atoms", "n_edges")
            )
        except (ValueError, KeyError, AttributeError, TypeError) as err:
            raise DataError(
                f"'{meta_path}': corrupted metadata ({type(err).__name__}: {err})"
            ) from None
        if fmt != FORMAT:
            raise DataError(f"'{meta_path}': format {fmt!r} is not {FORMAT!r}")
        if version != VERSION:
            raise DataError(
                f"'{self.path}': format version {version} is not supported (this version reads "
                f"{VERSION}); convert the data again with 'mlip-unc convert'"
            )
        self.meta = meta
        self.r_max = float(meta["r_max"])
        self.type_map = TypeMap.from_list(meta["elements"])
        self.sources: list[str] = list(meta["sources"])
        self._maps: dict[str, np.ndarray] = {}
        self._check_sizes()
        self._check_offsets()

    # ------------------------------------------------------------ checks
    def _check_sizes(self) -> None:
        rows = _row_counts(self.meta)
        for name, (kind, dtype, tail) in ARRAYS.items():
            file = self.path / array_file(name)
            expected = rows[kind] * np.dtype(dtype).itemsize * int(np.prod(tail, dtype=np.int64))
            if not file.is_file():
                raise DataError(
                    f"'{self.path}': array file {file.name} is missing (the set is incomplete)"
                )
            size = file.stat().st_size
            if size != expected:
                raise DataError(
                    f"'{self.path}': {file.name} has {size} bytes, expected {expected} "
                    f"({rows[kind]} {kind} rows): the set is truncated or corrupted; convert again"
                )

    def _check_offsets(self, chunk: int = 1 << 20) -> None:
        for name, total in (("atom_offset", self.n_atoms), ("edge_offset", self.n_edges)):
            off = self.array(name)
            if off[0] != 0 or off[-1] != total:
                raise DataError(
                    f"'{self.path}': {name} runs from {off[0]} to {off[-1]}, expected 0 to {total}: corrupted"
                )
            for lo in range(0, len(off) - 1, chunk):
                step = np.diff(np.asarray(off[lo : lo + chunk + 1]))
                if (step < (1 if name == "atom_offset" else 0)).any():
                    bad = lo + int(np.argmax(step < (1 if name == "atom_offset" else 0)))
                    raise DataError(
                        f"'{self.path}': {name} is not increasing at item {bad} ({self.where(bad)}): corrupted"
                    )

    def verify(self) -> None:
        """Recompute the SHA-256 of every array file (reads the whole set).

        Raises:
            DataError: a file whose content differs from what was written.
        """
        for name, info in self.meta["arrays"].items():
            digest = hashlib.sha256()
            with open(self.path / array_file(name), "rb") as handle:
                for block in iter(lambda: handle.read(1 << 22), b""):
                    digest.update(block)
            if digest.hexdigest() != info["sha256"]:
                raise DataError(
                    f"'{self.path}': {array_file(name)} fails its checksum: corrupted; convert again"
                )

    # ------------------------------------------------------------ access
    def array(self, name: str) -> np.ndarray:
        """The memory-mapped array ``name`` (read-only)."""
        if name not in self._maps:
            kind, dtype, tail = ARRAYS[name]
            shape = (_row_counts(self.meta)[kind], *tail)
            if shape[0] == 0:
                self._maps[name] = np.zeros(shape, dtype=dtype)
            else:
                self._maps[name] = np.memmap(
                    self.path / array_file(name), dtype=dtype, mode="r", shape=shape
                )
        return self._maps[name]

    def where(self, item: int) -> str:
        """``"'source.xyz', frame 12"`` of item ``item`` (falls back to the store's item)."""
        try:
            return where(
                self.sources[int(self.array("source_id")[item])],
                int(self.array("frame_index")[item]),
            )
        except (IndexError, ValueError):
            return where(self.path, item, row="item")

    def num_atoms(self, items: np.ndarray | None = None) -> np.ndarray:
        """(n,) atom counts of ``items`` (all when None), from the offsets only."""
        counts = np.diff(np.asarray(self.array("atom_offset")))
        return counts if items is None else counts[items]

    def __len__(self) -> int:
        return self.n_frames

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": {}}

    def graph(self, item: int, type_lookup: np.ndarray, dtype: torch.dtype = torch.float64) -> Data:
        """Item ``item`` as :func:`~mlip_unc.data.graphs.atoms_to_graph` builds it.

        Args:
            type_lookup: (119,) int64, atomic number -> type index (-1: not in the type map).
            dtype: floating dtype of positions, cell, shifts and labels.
        """
        if not 0 <= item < self.n_frames:
            raise IndexError(f"item {item} out of range for {self.n_frames} items of '{self.path}'")
        a0, a1 = (int(x) for x in self.array("atom_offset")[item : item + 2])
        e0, e1 = (int(x) for x in self.array("edge_offset")[item : item + 2])
        n = a1 - a0
        numbers = np.asarray(self.array("numbers")[a0:a1], dtype=np.int64)  # (n,)
        atom_type = type_lookup[numbers]
        if (atom_type < 0).any():
            z = int(numbers[atom_type < 0][0])
            TypeMap(tuple(int(x) for x in np.flatnonzero(type_lookup >= 0))).index(
                z, context=self.where(item)
            )
        edge_index = np.asarray(self.array("edge_index")[e0:e1], dtype=np.int64).T  # (2, n_edges)
        if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= n):
            raise DataError(
                f"{self.where(item)}: stored edges point outside the frame's {n} atoms: "
                f"'{self.path}' is corrupted; convert again"
            )

        def flag(name: str) -> torch.Tensor:
            return torch.tensor([bool(self.array(name)[item])])

        def t(name: str, lo: int, hi: int) -> torch.Tensor:
            return torch.tensor(np.asarray(self.array(name)[lo:hi]), dtype=dtype)

        fields = {
            keys.POSITIONS: t("positions", a0, a1),  # (n, 3)
            keys.ATOMIC_NUMBERS: torch.tensor(numbers, dtype=torch.long),  # (n,)
            keys.ATOM_TYPE: torch.as_tensor(atom_type, dtype=torch.long),  # (n,)
            keys.EDGE_INDEX: torch.as_tensor(edge_index, dtype=torch.long),  # (2, n_edges)
            keys.CELL_SHIFT: t("cell_shift", e0, e1),  # (n_edges, 3)
            keys.CELL: t("cell", item, item + 1),  # (1, 3, 3)
            keys.PBC: torch.tensor(np.asarray(self.array("pbc")[item], dtype=bool)).reshape(1, 3),
            keys.NUM_ATOMS: torch.tensor([n], dtype=torch.long),
            keys.FRAME_INDEX: torch.tensor([int(self.array("frame_index")[item])]),
            keys.ENERGY: t("energy", item, item + 1),  # (1,)
            keys.FORCES: t("forces", a0, a1),  # (n, 3)
            keys.STRESS: t("stress", item, item + 1),  # (1, 3, 3)
            keys.HAS_ENERGY: flag("has_energy"),
            keys.HAS_FORCES: flag("has_forces"),
            keys.HAS_STRESS: flag("has_stress"),
        }
        return Data(num_nodes=n, **fields)

    def atoms(self, item: int) -> ase.Atoms:
        """Item ``item`` as a structure with its stored labels (a ``SinglePointCalculator``)."""
        from ase.calculators.singlepoint import SinglePointCalculator
        from ase.stress import full_3x3_to_voigt_6_stress

        a0, a1 = (int(x) for x in self.array("atom_offset")[item : item + 2])
        pbc = np.asarray(self.array("pbc")[item], dtype=bool)
        atoms = ase.Atoms(
            numbers=np.asarray(self.array("numbers")[a0:a1], dtype=np.int64),
            positions=np.asarray(self.array("positions")[a0:a1]),
            cell=np.asarray(self.array("cell")[item]),
            pbc=pbc,
        )
        labels: dict[str, Any] = {}
        if self.array("has_energy")[item]:
            labels["energy"] = float(self.array("energy")[item])
        if self.array("has_forces")[item]:
            labels["forces"] = np.array(self.array("forces")[a0:a1])
        if self.array("has_stress")[item]:
            labels["stress"] = full_3x3_to_voigt_6_stress(np.array(self.array("stress")[item]))
        if labels:
            atoms.calc = SinglePointCalculator(atoms, **labels)
        return atoms


def type_lookup(type_map: TypeMap) -> np.ndarray:
    """(119,) atomic number -> type index, -1 outside ``type_map``."""
    table = np.full(119, -1, dtype=np.int64)
    table[list(type_map.atomic_numbers)] = np.arange(len(type_map))
    return table


class OnDiskDataset(StructureDataset):
    """A :class:`StructureDataset` whose graphs stay on disk: an item is read when asked for.

    ``graphs`` is the dataset itself (a lazy sequence), so code written for the in-memory
    dataset (``DataLoader(dataset.graphs)``, ``dataset.graphs[k]``, iteration) works unchanged.

    Args:
        store: an :class:`OnDiskStore` or its path.
        indices: the store's items in this view (default: all), in order.
        type_map: element map of ``ATOM_TYPE`` (default: the store's elements).
        dtype: floating dtype of the graphs.
    """

    def __init__(
        self,
        store: OnDiskStore | str | Path,
        indices: Sequence[int] | np.ndarray | None = None,
        type_map: TypeMap | None = None,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        self.store = store if isinstance(store, OnDiskStore) else OnDiskStore(store)
        n = len(self.store)
        self.indices = (
            np.arange(n, dtype=np.int64) if indices is None else np.asarray(indices, dtype=np.int64)
        )
        if self.indices.size and (self.indices.min() < 0 or self.indices.max() >= n):
            raise IndexError(f"indices outside the {n} items of '{self.store.path}'")
        self.type_map = type_map or self.store.type_map
        self.r_max = self.store.r_max
        self.dtype = dtype
        self._lookup = type_lookup(self.type_map)

    @property
    def graphs(self) -> OnDiskDataset:  # type: ignore[override]
        return self

    def subset(self, indices: Iterable[int]) -> OnDiskDataset:
        """A view of the items at ``indices`` of this view (same store, type map, dtype)."""
        chosen = self.indices[np.asarray(list(indices), dtype=np.int64)]
        return OnDiskDataset(self.store, chosen, self.type_map, dtype=self.dtype)

    def __len__(self) -> int:
        return int(self.indices.size)

    def __getitem__(self, item: int) -> Data:
        return self.store.graph(int(self.indices[item]), self._lookup, self.dtype)

    def __iter__(self) -> Iterator[Data]:
        for k in range(len(self)):
            yield self[k]

    def chunks(self, size: int) -> Iterator[list[Data]]:
        """The graphs in lists of at most ``size`` (memory: one chunk)."""
        for lo in range(0, len(self), size):
            yield [self[k] for k in range(lo, min(lo + size, len(self)))]

    def __repr__(self) -> str:
        return (
            f"OnDiskDataset({len(self)} of {len(self.store)} graphs in '{self.store.path}', "
            f"elements={self.type_map.symbols}, r_max={self.r_max})"
        )
