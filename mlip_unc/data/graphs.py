"""Structures -> graphs (built once) and the dataset that holds them.

Data flows one way: file (extxyz, CIF, POSCAR) -> ``list[ase.Atoms]`` (validated,
:mod:`mlip_unc.data.readers`) -> graphs (``torch_geometric.data.Data`` with the fields of
``mlip_unc.keys``, :func:`atoms_to_graph`) -> :class:`StructureDataset` -> batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import ase
import numpy as np
import torch
from torch_geometric.data import Data

from mlip_unc import keys
from mlip_unc.data.errors import where
from mlip_unc.data.labels import (
    StressConvention,
    frame_energy,
    frame_forces,
    frame_stress,
    validate_atoms,
)
from mlip_unc.data.neighbours import neighbour_list
from mlip_unc.data.readers import read_validated_frames
from mlip_unc.data.typemap import TypeMap

__all__ = ["atoms_to_graph", "StructureDataset"]


def atoms_to_graph(
    atoms: ase.Atoms,
    r_max: float,
    type_map: TypeMap,
    *,
    energy_key: str | None = None,
    forces_key: str | None = None,
    stress_key: str | None = None,
    stress_convention: StressConvention | str | None = None,
    frame_index: int | None = None,
    source: object | None = None,
    dtype: torch.dtype = torch.float64,
) -> Data:
    """One structure -> a graph with the fields of ``mlip_unc.keys``.

    Absent labels are stored as zeros with the ``HAS_*`` flag False. Non-periodic structures
    (``pbc`` all False) get a zero cell (their shifts are all zero).

    Args:
        atoms: the structure.
        r_max: cutoff radius, Angstrom.
        type_map: element -> type index map.
        energy_key, forces_key, stress_key: label names (see :mod:`mlip_unc.data.labels`).
        stress_convention: how the stress label is stored (inferred from the key if ``None``).
        frame_index: index of the frame in its source (stored; used in error messages).
        source: file name or label of the source (used in error messages).
        dtype: floating dtype of positions, cell, shifts and labels.

    Raises:
        DataError: empty structure, non-finite positions, zero-volume periodic cell, an
            element outside ``type_map``, malformed labels.
    """
    loc = where(source, frame_index)
    validate_atoms(atoms, source=source, frame_index=frame_index)
    n_atoms = len(atoms)
    atom_type = type_map.indices(atoms.numbers, context=loc)  # (n_atoms,)
    pbc = np.asarray(atoms.pbc, dtype=bool)  # (3,)
    cell = atoms.cell.array if pbc.any() else np.zeros((3, 3))  # (3, 3)
    edge_index, cell_shift = neighbour_list(atoms.positions, cell, pbc, r_max)
    energy = frame_energy(atoms, energy_key, context=loc)
    forces = frame_forces(atoms, forces_key, context=loc)  # (n_atoms, 3) | None
    stress = frame_stress(atoms, stress_key, convention=stress_convention, context=loc)

    def t(x: np.ndarray | list[float]) -> torch.Tensor:  # a copy: the graph never aliases ``atoms``
        return torch.tensor(np.asarray(x), dtype=dtype)

    fields = {
        keys.POSITIONS: t(atoms.positions),  # (n_atoms, 3)
        keys.ATOMIC_NUMBERS: torch.tensor(atoms.numbers, dtype=torch.long),  # (n_atoms,)
        keys.ATOM_TYPE: torch.as_tensor(atom_type, dtype=torch.long),  # (n_atoms,)
        keys.EDGE_INDEX: torch.as_tensor(edge_index, dtype=torch.long),  # (2, n_edges)
        keys.CELL_SHIFT: t(cell_shift),  # (n_edges, 3)
        keys.CELL: t(cell).reshape(1, 3, 3),
        keys.PBC: torch.tensor(pbc).reshape(1, 3),
        keys.NUM_ATOMS: torch.tensor([n_atoms], dtype=torch.long),
        keys.FRAME_INDEX: torch.tensor([-1 if frame_index is None else frame_index]),
        keys.ENERGY: t([0.0 if energy is None else energy]),  # (1,)
        keys.FORCES: t(np.zeros((n_atoms, 3)) if forces is None else forces),
        keys.STRESS: t(np.zeros((3, 3)) if stress is None else stress).reshape(1, 3, 3),
        keys.HAS_ENERGY: torch.tensor([energy is not None]),
        keys.HAS_FORCES: torch.tensor([forces is not None]),
        keys.HAS_STRESS: torch.tensor([stress is not None]),
    }
    return Data(num_nodes=n_atoms, **fields)


class StructureDataset(torch.utils.data.Dataset):
    """Graphs built once from structures; usable with ``torch_geometric.loader.DataLoader``.

    Attributes:
        graphs: one ``Data`` per structure.
        type_map: the element map used to build ``ATOM_TYPE``.
        r_max: cutoff radius used for the edges, Angstrom.
    """

    def __init__(self, graphs: Sequence[Data], type_map: TypeMap, r_max: float) -> None:
        self.graphs = list(graphs)
        self.type_map = type_map
        self.r_max = float(r_max)

    @classmethod
    def from_atoms(
        cls,
        atoms_list: Sequence[ase.Atoms],
        r_max: float,
        type_map: TypeMap | None = None,
        *,
        energy_key: str | None = None,
        forces_key: str | None = None,
        stress_key: str | None = None,
        stress_convention: StressConvention | str | None = None,
        frame_indices: Sequence[int] | None = None,
        source: object | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> StructureDataset:
        """Build graphs from structures; the type map is built from them when not given."""
        if type_map is None:
            type_map = TypeMap.from_atoms_list(atoms_list)
        frames = range(len(atoms_list)) if frame_indices is None else frame_indices
        graphs = [
            atoms_to_graph(
                atoms,
                r_max,
                type_map,
                energy_key=energy_key,
                forces_key=forces_key,
                stress_key=stress_key,
                stress_convention=stress_convention,
                frame_index=frame,
                source=source,
                dtype=dtype,
            )
            for frame, atoms in zip(frames, atoms_list, strict=False)
        ]
        return cls(graphs, type_map, r_max)

    @classmethod
    def from_files(
        cls,
        paths: str | Path | Sequence[str | Path],
        r_max: float,
        type_map: TypeMap | None = None,
        *,
        index: int | slice | str = ":",
        energy_key: str | None = None,
        forces_key: str | None = None,
        stress_key: str | None = None,
        stress_convention: StressConvention | str | None = None,
        require_energy: bool = True,
        require_forces: bool = True,
        require_stress: bool = False,
        dtype: torch.dtype = torch.float64,
    ) -> StructureDataset:
        """Read files (see :func:`read_structures`) and build graphs.

        Pass the training set's ``type_map`` for validation/test files; when ``None`` it is
        built from the elements in ``paths``.
        """
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        label_keys = {"energy": energy_key, "forces": forces_key, "stress": stress_key}
        required = {"energy": require_energy, "forces": require_forces, "stress": require_stress}
        per_file = [
            (
                path,
                read_validated_frames(
                    path,
                    index,
                    label_keys=label_keys,
                    stress_convention=stress_convention,
                    required=required,
                ),
            )
            for path in paths
        ]
        if type_map is None:
            type_map = TypeMap.from_atoms_list(a for _, frames in per_file for _, a in frames)
        graphs = []
        for path, frames in per_file:
            part = cls.from_atoms(
                [atoms for _, atoms in frames],
                r_max,
                type_map,
                energy_key=energy_key,
                forces_key=forces_key,
                stress_key=stress_key,
                stress_convention=stress_convention,
                frame_indices=[k for k, _ in frames],
                source=path,
                dtype=dtype,
            )
            graphs.extend(part.graphs)
        return cls(graphs, type_map, r_max)

    def subset(self, indices: Iterable[int]) -> StructureDataset:
        """A dataset with the graphs at ``indices`` (same objects, same type map)."""
        return StructureDataset([self.graphs[int(k)] for k in indices], self.type_map, self.r_max)

    def __len__(self) -> int:
        return len(self.graphs)

    def __getitem__(self, item: int) -> Data:
        return self.graphs[item]

    def __iter__(self) -> Iterator[Data]:
        return iter(self.graphs)

    def __repr__(self) -> str:
        return (
            f"StructureDataset({len(self)} graphs, elements={self.type_map.symbols}, "
            f"r_max={self.r_max})"
        )
