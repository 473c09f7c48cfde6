"""Atomic structures -> graphs: type map, labels, file reading, dataset, reference energies.

Data flows one way: file (extxyz, CIF, POSCAR) -> ``list[ase.Atoms]`` (validated) -> graphs
(``torch_geometric.data.Data`` with the fields of ``mlip_unc.keys``, built once) -> batches.

Labels. ``energy_key``/``forces_key``/``stress_key`` name where the labels live; ``None`` means
the standard names ``energy``/``forces``/``stress``. A key is looked up first in the attached
calculator's results (ASE >= 3.23 puts the extxyz ``energy=``/``forces``/``stress=`` fields into
a ``SinglePointCalculator``), then in ``atoms.info`` (per-structure) or ``atoms.arrays``
(per-atom). Custom names such as ``energy_xtb``, ``forces_xtb``, ``REF_energy`` therefore work.

Stress conventions (:class:`StressConvention`, inferred from the key name when not given):

* ``stress``: eV/A^3, ASE sign (positive = tensile), 6-component Voigt ``xx yy zz yz xz xy``,
  9 components (row-major) or 3x3.
* ``virial``: eV, ``stress = -virial / volume`` (keys containing "virial", e.g. ``virial``,
  ``REF_virial``); 6 (Voigt, ASE order), 9 or 3x3 components.
* ``vasp_kbar``: kbar in VASP's OUTCAR order ``xx yy zz xy yz zx`` with VASP's sign
  (positive = compressive, i.e. pressure-like), as mlearn's ``virial_stress_kbar``
  (keys containing "kbar"). Converted like ASE's VASP reader:
  ``stress = -value * 0.1 GPa`` (1 kbar = 0.1 GPa = 6.2415e-4 eV/A^3). Checked on mlearn Si
  "Elastic" frames: positive strain gives negative values there, i.e. positive ASE stress.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import ase
import ase.io
import numpy as np
import torch
from ase.data import chemical_symbols
from ase.io.formats import string2index
from ase.units import GPa
from torch_geometric.data import Data

from mlip_unc import keys
from mlip_unc.data.errors import DataError, where
from mlip_unc.data.neighbours import check_cell, neighbour_list

__all__ = [
    "TypeMap",
    "StressConvention",
    "StructureDataset",
    "atoms_to_graph",
    "read_structures",
    "validate_atoms",
    "frame_energy",
    "frame_forces",
    "frame_stress",
    "fit_reference_energies",
    "ISOLATED_ATOM_CONFIG_TYPES",
]

ISOLATED_ATOM_CONFIG_TYPES: tuple[str, ...] = ("IsolatedAtom", "isolated_atom")
_EXTXYZ_SUFFIXES = {".xyz", ".extxyz"}
_POSCAR_SUFFIXES = {".vasp", ".poscar"}
_VOIGT_ASE = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))  # xx yy zz yz xz xy
_VOIGT_VASP = ((0, 0), (1, 1), (2, 2), (0, 1), (1, 2), (0, 2))  # xx yy zz xy yz zx
_KBAR = 0.1 * GPa  # eV/A^3 per kbar


def _symbol(z: int) -> str:
    return chemical_symbols[z] if 0 <= z < len(chemical_symbols) else f"Z={z}"


# ================================================================ type map
@dataclass(frozen=True)
class TypeMap:
    """Sorted atomic numbers -> consecutive type indices ``0..n_types-1``.

    Attributes:
        atomic_numbers: sorted, unique atomic numbers (Z >= 1).
    """

    atomic_numbers: tuple[int, ...]

    def __post_init__(self) -> None:
        zs = tuple(int(z) for z in self.atomic_numbers)
        if not zs:
            raise DataError("a type map needs at least one element")
        if list(zs) != sorted(set(zs)) or zs[0] < 1:
            raise DataError(f"type map atomic numbers must be sorted, unique and >= 1: {zs}")
        object.__setattr__(self, "atomic_numbers", zs)

    @classmethod
    def from_atoms_list(cls, atoms_list: Iterable[ase.Atoms]) -> TypeMap:
        """All elements present in ``atoms_list``."""
        zs: set[int] = set()
        for atoms in atoms_list:
            zs.update(int(z) for z in atoms.numbers)
        return cls(tuple(sorted(zs)))

    @classmethod
    def from_list(cls, atomic_numbers: Sequence[int]) -> TypeMap:
        """Inverse of :meth:`to_list` (for checkpoints); the list is sorted and deduplicated."""
        return cls(tuple(sorted({int(z) for z in atomic_numbers})))

    def to_list(self) -> list[int]:
        """Atomic numbers as a plain list (JSON/checkpoint friendly)."""
        return list(self.atomic_numbers)

    @property
    def symbols(self) -> list[str]:
        return [_symbol(z) for z in self.atomic_numbers]

    def __len__(self) -> int:
        return len(self.atomic_numbers)

    def __contains__(self, z: object) -> bool:
        return z in self.atomic_numbers

    def index(self, z: int, *, context: str | None = None) -> int:
        """Type index of atomic number ``z``.

        Args:
            z: atomic number.
            context: where ``z`` came from (e.g. ``"'train.xyz', frame 3"``) for the error.

        Raises:
            DataError: ``z`` is not in the map; the message names the element and the context.
        """
        try:
            return self.atomic_numbers.index(int(z))
        except ValueError:
            raise DataError(self._unknown_message(int(z), context)) from None

    def indices(self, numbers: np.ndarray, *, context: str | None = None) -> np.ndarray:
        """Vectorised :meth:`index`: (n,) atomic numbers -> (n,) int64 type indices."""
        numbers = np.asarray(numbers, dtype=np.int64)
        table = np.asarray(self.atomic_numbers, dtype=np.int64)
        pos = np.searchsorted(table, numbers)
        pos_clipped = np.minimum(pos, len(table) - 1)
        bad = table[pos_clipped] != numbers
        if np.any(bad):
            raise DataError(self._unknown_message(int(numbers[bad][0]), context))
        return pos_clipped

    def _unknown_message(self, z: int, context: str | None) -> str:
        loc = f" in {context}" if context else ""
        return (
            f"element {_symbol(z)} (Z={z}){loc} is not in the type map "
            f"{self.symbols}; build the type map from data that contains it"
        )


# ================================================================ validation and labels
def validate_atoms(
    atoms: ase.Atoms, *, source: object | None = None, frame_index: int | None = None
) -> None:
    """Raise ``DataError`` for 0 atoms, NaN/inf positions or a degenerate periodic cell."""
    loc = where(source, frame_index)
    if len(atoms) == 0:
        raise DataError(f"{loc}: empty structure (0 atoms)")
    finite = np.all(np.isfinite(atoms.positions), axis=1)  # (n_atoms,)
    if not np.all(finite):
        bad = np.flatnonzero(~finite)
        raise DataError(f"{loc}: NaN or inf in positions of atoms {bad[:10].tolist()}")
    try:
        check_cell(atoms.cell.array, atoms.pbc)
    except DataError as err:
        raise DataError(f"{loc}: {err}") from None


def _calc_results(atoms: ase.Atoms) -> dict:
    calc = atoms.calc
    return dict(getattr(calc, "results", None) or {}) if calc is not None else {}


def _available_keys(atoms: ase.Atoms) -> str:
    arrays = [k for k in atoms.arrays if k not in ("numbers", "positions")]
    return (
        f"calculator results {sorted(_calc_results(atoms))}, info {sorted(atoms.info)}, "
        f"arrays {sorted(arrays)}"
    )


def _lookup(atoms: ase.Atoms, key: str, *, per_atom: bool, context: str) -> np.ndarray | None:
    """Label ``key`` from the calculator results, then ``info`` (per-structure) / ``arrays``."""
    results = _calc_results(atoms)
    if key in results and results[key] is not None:
        return np.asarray(results[key], dtype=np.float64)
    store = atoms.arrays if per_atom else atoms.info
    if key in store:
        try:
            return np.asarray(store[key], dtype=np.float64)
        except (TypeError, ValueError):
            raise DataError(f"{context}: label '{key}' is not numeric: {store[key]!r}") from None
    return None


def _missing(kind: str, key: str, atoms: ase.Atoms, loc: str) -> DataError:
    return DataError(f"{loc}: no {kind} under key '{key}'; available: {_available_keys(atoms)}")


def frame_energy(
    atoms: ase.Atoms, key: str | None = None, *, required: bool = False, context: str | None = None
) -> float | None:
    """Total energy (eV) under ``key`` (default ``"energy"``), or ``None`` when absent.

    Raises:
        DataError: absent and ``required``, not a finite scalar.
    """
    key = key or "energy"
    loc = context or "input structure"
    value = _lookup(atoms, key, per_atom=False, context=loc)
    if value is None:
        if required:
            raise _missing("energy", key, atoms, loc)
        return None
    if value.size != 1 or not np.isfinite(value).all():
        raise DataError(f"{loc}: energy '{key}' must be one finite number, got {value.tolist()}")
    return float(value.reshape(()))


def frame_forces(
    atoms: ase.Atoms, key: str | None = None, *, required: bool = False, context: str | None = None
) -> np.ndarray | None:
    """Forces (n_atoms, 3) eV/A under ``key`` (default ``"forces"``), or ``None`` when absent."""
    key = key or "forces"
    loc = context or "input structure"
    value = _lookup(atoms, key, per_atom=True, context=loc)
    if value is None:
        if required:
            raise _missing("forces", key, atoms, loc)
        return None
    if value.shape != (len(atoms), 3) or not np.isfinite(value).all():
        raise DataError(
            f"{loc}: forces '{key}' must be finite with shape ({len(atoms)}, 3), "
            f"got shape {value.shape}"
        )
    return value


class StressConvention(str, Enum):
    """How a stress-like label is stored (see the module docstring)."""

    STRESS = "stress"
    """eV/A^3, ASE sign; Voigt ``xx yy zz yz xz xy``, 9 components or 3x3."""
    VIRIAL = "virial"
    """eV; ``stress = -virial / volume``."""
    VASP_KBAR = "vasp_kbar"
    """kbar, VASP order ``xx yy zz xy yz zx``, positive = compressive; ``stress = -0.1 GPa * v``."""

    @classmethod
    def infer(cls, key: str) -> StressConvention:
        """``vasp_kbar`` if the key contains "kbar", ``virial`` if it contains "virial"."""
        lower = key.lower()
        if "kbar" in lower:
            return cls.VASP_KBAR
        if "virial" in lower:
            return cls.VIRIAL
        return cls.STRESS


def _to_matrix(value: np.ndarray, voigt_order: tuple[tuple[int, int], ...]) -> np.ndarray:
    """(6,) Voigt in ``voigt_order`` or (9,)/(3, 3) -> (3, 3)."""
    flat = value.reshape(-1)
    if flat.size == 9:
        return flat.reshape(3, 3).copy()
    if flat.size != 6:
        raise ValueError(f"expected 6 (Voigt) or 9 components, got {flat.size}")
    matrix = np.zeros((3, 3))
    for v, (a, b) in zip(flat, voigt_order):
        matrix[a, b] = matrix[b, a] = v
    return matrix


def frame_stress(
    atoms: ase.Atoms,
    key: str | None = None,
    *,
    convention: StressConvention | str | None = None,
    required: bool = False,
    context: str | None = None,
) -> np.ndarray | None:
    """Stress (3, 3) in eV/A^3, ASE sign, converted from ``key``; ``None`` when absent.

    Args:
        key: label name (default ``"stress"``).
        convention: how the label is stored; inferred from ``key`` when ``None``.
    """
    key = key or "stress"
    loc = context or "input structure"
    conv = StressConvention(convention) if convention else StressConvention.infer(key)
    value = _lookup(atoms, key, per_atom=False, context=loc)
    if value is None:
        if required:
            raise _missing("stress", key, atoms, loc)
        return None
    order = _VOIGT_VASP if conv is StressConvention.VASP_KBAR else _VOIGT_ASE
    try:
        matrix = _to_matrix(value, order)  # (3, 3)
    except ValueError as err:
        raise DataError(f"{loc}: stress '{key}': {err}") from None
    if not np.isfinite(matrix).all():
        raise DataError(f"{loc}: stress '{key}' contains NaN or inf")
    if conv is StressConvention.VASP_KBAR:
        return -matrix * _KBAR
    if conv is StressConvention.VIRIAL:
        volume = abs(float(np.linalg.det(atoms.cell.array)))
        if volume <= 0.0:
            raise DataError(f"{loc}: virial '{key}' needs a cell with non-zero volume")
        return -matrix / volume
    return matrix


# ================================================================ graphs
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
        energy_key, forces_key, stress_key: label names (see the module docstring).
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

    def t(x: np.ndarray) -> torch.Tensor:  # a copy: the graph never aliases ``atoms``
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


# ================================================================ reading files
def _select(n: int, index: int | slice | str) -> list[int]:
    """Frame indices picked by an ASE-style index (``":"``, ``"-1"``, ``"2:10:2"``, int, slice)."""
    idx = string2index(index) if isinstance(index, str) else index
    if isinstance(idx, int):
        if not -n <= idx < n:
            raise IndexError(f"frame index {idx} out of range for {n} frames")
        return [idx % n]
    return list(range(n))[idx]


def _read_all(path: Path) -> list[ase.Atoms]:
    """Every structure in ``path`` (extxyz via ASE, CIF/POSCAR via pymatgen, else ASE's guess)."""
    name = path.name.upper()
    suffix = path.suffix.lower()
    if suffix in _EXTXYZ_SUFFIXES:
        return ase.io.read(path, index=":", format="extxyz")
    if suffix == ".cif" or suffix in _POSCAR_SUFFIXES or name.startswith(("POSCAR", "CONTCAR")):
        from pymatgen.io.ase import AseAtomsAdaptor

        if suffix == ".cif":
            from pymatgen.io.cif import CifParser

            structures = CifParser(path).parse_structures(primitive=False)
        else:
            from pymatgen.io.vasp import Poscar

            structures = [Poscar.from_file(path).structure]
        return [AseAtomsAdaptor.get_atoms(s) for s in structures]
    result = ase.io.read(path, index=":")
    return list(result) if isinstance(result, list) else [result]


def _read_frames(path: str | Path, index: int | slice | str = ":") -> list[tuple[int, ase.Atoms]]:
    """(frame index in file, structure) pairs; read errors become ``DataError`` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"structure file not found: '{path}'")
    try:
        frames = _read_all(path)
    except Exception as err:  # any parser failure -> one clear error naming the file
        raise DataError(f"could not read '{path}': {type(err).__name__}: {err}") from err
    try:
        chosen = _select(len(frames), index)
    except (IndexError, ValueError) as err:
        raise DataError(f"'{path}': bad frame index {index!r}: {err}") from None
    return [(k, frames[k]) for k in chosen]


def _read_validated(
    path: str | Path,
    index: int | slice | str,
    *,
    label_keys: dict[str, str | None],
    stress_convention: StressConvention | str | None,
    required: dict[str, bool],
) -> list[tuple[int, ase.Atoms]]:
    """(frame index, structure) pairs of ``path``, each validated as in :func:`read_structures`."""
    frames = _read_frames(path, index)
    for frame, atoms in frames:
        loc = where(path, frame)
        validate_atoms(atoms, source=path, frame_index=frame)
        frame_energy(atoms, label_keys["energy"], required=required["energy"], context=loc)
        frame_forces(atoms, label_keys["forces"], required=required["forces"], context=loc)
        frame_stress(
            atoms, label_keys["stress"], convention=stress_convention,
            required=required["stress"], context=loc,
        )  # fmt: skip
    return frames


def read_structures(
    path: str | Path,
    *,
    index: int | slice | str = ":",
    energy_key: str | None = None,
    forces_key: str | None = None,
    stress_key: str | None = None,
    stress_convention: StressConvention | str | None = None,
    require_energy: bool = True,
    require_forces: bool = True,
    require_stress: bool = False,
) -> list[ase.Atoms]:
    """Read and validate structures (extxyz, CIF, POSCAR/CONTCAR/.vasp, other ASE formats).

    Every frame is checked (non-empty, finite positions, non-degenerate periodic cell,
    well-formed labels) and, when required, must carry the requested labels. CIF and POSCAR
    files carry no labels: pass ``require_energy=False, require_forces=False``.

    Args:
        path: the file.
        index: ASE-style frame selection (``":"``, ``"-1"``, ``"0:100"``, int or slice).
        energy_key, forces_key, stress_key: label names (``None``: standard names).
        stress_convention: how the stress label is stored (inferred from the key if ``None``).
        require_energy, require_forces, require_stress: every frame must carry the label.

    Raises:
        DataError: naming the file, the frame index and the problem (for a missing label:
            the key and the keys that exist).
    """
    frames = _read_validated(
        path, index, stress_convention=stress_convention,
        label_keys={"energy": energy_key, "forces": forces_key, "stress": stress_key},
        required={"energy": require_energy, "forces": require_forces, "stress": require_stress},
    )  # fmt: skip
    return [atoms for _, atoms in frames]


# ================================================================ dataset
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
                atoms, r_max, type_map, energy_key=energy_key, forces_key=forces_key,
                stress_key=stress_key, stress_convention=stress_convention, frame_index=frame,
                source=source, dtype=dtype,
            )
            for frame, atoms in zip(frames, atoms_list)
        ]  # fmt: skip
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
            (path, _read_validated(
                path, index, label_keys=label_keys, stress_convention=stress_convention,
                required=required,
            ))
            for path in paths
        ]  # fmt: skip
        if type_map is None:
            type_map = TypeMap.from_atoms_list(a for _, frames in per_file for _, a in frames)
        graphs = []
        for path, frames in per_file:
            part = cls.from_atoms(
                [atoms for _, atoms in frames], r_max, type_map,
                energy_key=energy_key, forces_key=forces_key, stress_key=stress_key,
                stress_convention=stress_convention, frame_indices=[k for k, _ in frames],
                source=path, dtype=dtype,
            )  # fmt: skip
            graphs.extend(part.graphs)
        return cls(graphs, type_map, r_max)

    def subset(self, indices: Iterable[int]) -> StructureDataset:
        """A dataset with the graphs at ``indices`` (same objects, same type map)."""
        return StructureDataset([self.graphs[int(k)] for k in indices], self.type_map, self.r_max)

    def __len__(self) -> int:
        return len(self.graphs)

    def __getitem__(self, item: int) -> Data:
        return self.graphs[item]

    def __iter__(self):
        return iter(self.graphs)

    def __repr__(self) -> str:
        return (
            f"StructureDataset({len(self)} graphs, elements={self.type_map.symbols}, "
            f"r_max={self.r_max})"
        )


# ================================================================ reference energies
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
            f"reference energies of {[_symbol(z) for z in elements]} are not identifiable "
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
