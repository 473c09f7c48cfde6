"""Reading structure files: extxyz (ASE), CIF and POSCAR (pymatgen), JSON lists in mlearn's
layout (:mod:`mlip_unc.data.json_reader`), other ASE formats.

Every frame read here is validated (:func:`mlip_unc.data.labels.validate_atoms`) and its
labels are checked (:mod:`mlip_unc.data.labels`): labels that a model predicted (``md.traj``,
:mod:`mlip_unc.data.provenance`) are refused unless ``accept_predicted``. Errors name the file
and the frame.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

import ase
import ase.io
from ase.io.formats import string2index

from mlip_unc.data.errors import DataError, no_frames, not_found, where
from mlip_unc.data.json_reader import read_json_structures
from mlip_unc.data.labels import (
    StressConvention,
    frame_energy,
    frame_forces,
    frame_stress,
    validate_atoms,
)
from mlip_unc.data.provenance import refuse_predicted

__all__ = ["read_structures", "read_validated_frames"]

_EXTXYZ_SUFFIXES = {".xyz", ".extxyz"}
_POSCAR_SUFFIXES = {".vasp", ".poscar"}


def _select(n: int, index: int | slice | str) -> list[int]:
    """Frame indices picked by an ASE-style index (``":"``, ``"-1"``, ``"2:10:2"``, int, slice)."""
    idx = string2index(index) if isinstance(index, str) else index
    if isinstance(idx, str):  # string2index passes through what is neither an int nor a slice
        raise ValueError("not an int or a slice")
    if isinstance(idx, int):
        if not -n <= idx < n:
            raise IndexError(f"frame index {idx} out of range for {n} frames")
        return [idx % n]
    return list(range(n))[idx]


def _read_all(path: Path) -> list[ase.Atoms]:
    """Every structure in ``path`` (extxyz via ASE, CIF/POSCAR via pymatgen, JSON in mlearn's
    layout, else ASE's guess)."""
    name = path.name.upper()
    suffix = path.suffix.lower()
    if suffix in _EXTXYZ_SUFFIXES:
        return cast(list[ase.Atoms], ase.io.read(path, index=":", format="extxyz"))
    if suffix == ".json":
        return read_json_structures(path)
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


def _read_frames(
    path: str | os.PathLike, index: int | slice | str = ":"
) -> list[tuple[int, ase.Atoms]]:
    """(frame index in file, structure) pairs; read errors become ``DataError`` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(not_found(path))
    try:
        frames = _read_all(path)
    except DataError:  # already names the file and the entry
        raise
    except Exception as err:  # any parser failure -> one clear error naming the file
        raise DataError(f"could not read '{path}': {type(err).__name__}: {err}") from err
    try:
        chosen = _select(len(frames), index)
    except (IndexError, ValueError) as err:
        if not frames:
            raise DataError(no_frames(path)) from None
        raise DataError(f"'{path}': bad frame index {index!r}: {err}") from None
    return [(k, frames[k]) for k in chosen]


def read_validated_frames(
    path: str | os.PathLike,
    index: int | slice | str,
    *,
    label_keys: dict[str, str | None],
    stress_convention: StressConvention | str | None,
    required: dict[str, bool],
    accept_predicted: bool = False,
) -> list[tuple[int, ase.Atoms]]:
    """(frame index, structure) pairs of ``path``, each validated as in :func:`read_structures`.

    Args:
        path: the file.
        index: ASE-style frame selection.
        label_keys: label name per ``"energy"``, ``"forces"``, ``"stress"`` (``None``: standard).
        stress_convention: how the stress label is stored (inferred from the key if ``None``).
        required: per label kind, whether every frame must carry it.
        accept_predicted: take labels that a model predicted as references (False: refused,
            :func:`mlip_unc.data.provenance.refuse_predicted`).

    Returns:
        (index of the frame in the file, structure) for each selected frame.
    """
    frames = _read_frames(path, index)
    for frame, atoms in frames:
        loc = where(path, frame)
        validate_atoms(atoms, source=path, frame_index=frame)
        frame_energy(atoms, label_keys["energy"], required=required["energy"], context=loc)
        frame_forces(atoms, label_keys["forces"], required=required["forces"], context=loc)
        frame_stress(
            atoms,
            label_keys["stress"],
            convention=stress_convention,
            required=required["stress"],
            context=loc,
        )
        if not accept_predicted:
            refuse_predicted(atoms, label_keys, loc)
    return frames


def read_structures(
    path: str | os.PathLike,
    *,
    index: int | slice | str = ":",
    energy_key: str | None = None,
    forces_key: str | None = None,
    stress_key: str | None = None,
    stress_convention: StressConvention | str | None = None,
    require_energy: bool = True,
    require_forces: bool = True,
    require_stress: bool = False,
    accept_predicted: bool = False,
) -> list[ase.Atoms]:
    """Read and validate structures (extxyz, CIF, POSCAR/CONTCAR/.vasp, mlearn-layout JSON
    (``.json``: energy, forces and stress with the stress converted to ASE's convention, see
    :mod:`mlip_unc.data.json_reader`), other ASE formats).

    Every frame is checked (non-empty, finite positions, non-degenerate periodic cell,
    well-formed labels) and, when required, must carry the requested labels. CIF and POSCAR
    files carry no labels: pass ``require_energy=False, require_forces=False``.

    Args:
        path: the file.
        index: ASE-style frame selection (``":"``, ``"-1"``, ``"0:100"``, int or slice).
        energy_key, forces_key, stress_key: label names (``None``: standard names).
        stress_convention: how the stress label is stored (inferred from the key if ``None``).
        require_energy, require_forces, require_stress: every frame must carry the label.
        accept_predicted: take labels that a model predicted (``md.traj``) as references;
            ``True`` also where only the structures are used (MD starts).

    Raises:
        DataError: naming the file, the frame index and the problem (for a missing label:
            the key and the keys that exist; for predicted labels: how to accept them).
    """
    frames = read_validated_frames(
        path,
        index,
        stress_convention=stress_convention,
        label_keys={"energy": energy_key, "forces": forces_key, "stress": stress_key},
        required={"energy": require_energy, "forces": require_forces, "stress": require_stress},
        accept_predicted=accept_predicted,
    )
    return [atoms for _, atoms in frames]
