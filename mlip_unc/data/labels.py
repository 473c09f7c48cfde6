"""Structure validation and labels: energy, forces and stress under any key and convention.

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
  (positive = compressive, i.e. pressure-like), as mlearn's ``outputs.virial_stress`` (JSON)
  and ``virial_stress_kbar`` (the extxyz conversions in shared/data; keys containing "kbar").
  Converted like ASE's VASP reader: ``stress = -value * 0.1 GPa`` (1 kbar = 0.1 GPa =
  6.2415e-4 eV/A^3).

ASE's convention (the package's, everywhere): ``stress = (1/V) dE/d(strain)`` in eV/A^3, so a
stretched cell that wants to contract has positive stress (tensile positive).

mlearn's convention, checked (``tests/data/test_json_reader.py``): its MTP writer names the
order ``vasp_stress_order = [xx, yy, zz, xy, yz, xz]`` (materialsvirtuallab/mlearn
``mlearn/potentials/mtp.py``); on the Si "Elastic" strain series the energy differences equal
the work integral of ``V stress : d(strain)`` with the stress converted here, for the normal
(modes 0-2) and the shear (xy, zx, yz) modes alike, which fixes unit, sign and order.

:func:`stress_to_ase` is the one conversion of every convention; the readers
(:mod:`mlip_unc.data.json_reader` included) call it.
"""

from __future__ import annotations

from enum import Enum

import ase
import numpy as np
from ase.units import GPa

from mlip_unc.data.errors import DataError, where
from mlip_unc.data.neighbours import check_cell

__all__ = [
    "StressConvention",
    "frame_energy",
    "frame_forces",
    "frame_stress",
    "stress_to_ase",
    "validate_atoms",
]

_VOIGT_ASE = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))  # xx yy zz yz xz xy
_VOIGT_VASP = ((0, 0), (1, 1), (2, 2), (0, 1), (1, 2), (0, 2))  # xx yy zz xy yz zx
_KBAR = 0.1 * GPa  # eV/A^3 per kbar


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


def _required_lookup(
    atoms: ase.Atoms, kind: str, key: str, *, per_atom: bool, required: bool, loc: str
) -> np.ndarray | None:
    """The label ``key`` of ``atoms``; None when absent, :class:`DataError` if also ``required``."""
    value = _lookup(atoms, key, per_atom=per_atom, context=loc)
    if value is None and required:
        raise _missing(kind, key, atoms, loc)
    return value


def frame_energy(
    atoms: ase.Atoms, key: str | None = None, *, required: bool = False, context: str | None = None
) -> float | None:
    """Total energy (eV) under ``key`` (default ``"energy"``), or ``None`` when absent.

    Raises:
        DataError: absent and ``required``, not a finite scalar.
    """
    key, loc = key or "energy", context or "input structure"
    value = _required_lookup(atoms, "energy", key, per_atom=False, required=required, loc=loc)
    if value is None:
        return None
    if value.size != 1 or not np.isfinite(value).all():
        raise DataError(f"{loc}: energy '{key}' must be one finite number, got {value.tolist()}")
    return float(value.reshape(()))


def frame_forces(
    atoms: ase.Atoms, key: str | None = None, *, required: bool = False, context: str | None = None
) -> np.ndarray | None:
    """Forces (n_atoms, 3) eV/A under ``key`` (default ``"forces"``), or ``None`` when absent."""
    key, loc = key or "forces", context or "input structure"
    value = _required_lookup(atoms, "forces", key, per_atom=True, required=required, loc=loc)
    if value is None:
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
    for v, (a, b) in zip(flat, voigt_order, strict=False):
        matrix[a, b] = matrix[b, a] = v
    return matrix


def stress_to_ase(
    value: np.ndarray | list, convention: StressConvention | str, *, volume: float | None = None
) -> np.ndarray:
    """A stress-like label -> stress (3, 3) in eV/A^3 with ASE's sign: the one conversion.

    Args:
        value: 6 Voigt components (in the convention's order), 9 (row-major) or (3, 3).
        convention: how ``value`` is stored (:class:`StressConvention`).
        volume: cell volume in A^3 (needed by ``virial`` only).

    Raises:
        ValueError: wrong number of components, NaN/inf, a virial without a positive volume.
    """
    conv = StressConvention(convention)
    order = _VOIGT_VASP if conv is StressConvention.VASP_KBAR else _VOIGT_ASE
    matrix = _to_matrix(np.asarray(value, dtype=np.float64), order)  # (3, 3)
    if not np.isfinite(matrix).all():
        raise ValueError("contains NaN or inf")
    if conv is StressConvention.VASP_KBAR:
        return -matrix * _KBAR
    if conv is StressConvention.VIRIAL:
        if volume is None or not volume > 0.0:
            raise ValueError("a virial needs a cell with non-zero volume")
        return -matrix / volume
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
    value = _required_lookup(atoms, "stress", key, per_atom=False, required=required, loc=loc)
    if value is None:
        return None
    volume = abs(float(np.linalg.det(atoms.cell.array)))
    try:
        return stress_to_ase(value, conv, volume=volume)  # (3, 3)
    except ValueError as err:
        raise DataError(f"{loc}: stress '{key}' ({conv.value}): {err}") from None
