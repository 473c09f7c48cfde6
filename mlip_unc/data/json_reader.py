"""JSON lists of labelled structures in mlearn's layout -> ``ase.Atoms`` with their labels.

The layout of materialsvirtuallab/mlearn ``data/{element}/{training,test}.json`` (and of
maml/pymatgen "docs"): a JSON list, one entry per structure::

    {"structure": <pymatgen Structure.as_dict() or Molecule.as_dict()>,
     "outputs": {"energy": total energy (eV),
                 "forces": (n_atoms, 3) eV/A,
                 "virial_stress": 6 components, kbar, VASP order xx yy zz xy yz zx,
                                  positive = compressive},
     "num_atoms": n_atoms, "group": ..., "description": ..., "tag": ..., ...}

Each entry becomes one structure (frame index = list index): cell and positions from the
structure dict (fractional ``abc`` times the lattice, as pymatgen reads them; Cartesian
``xyz`` for a Molecule), the labels in a ``SinglePointCalculator`` under the standard names
``energy``, ``forces`` and ``stress`` (eV/A^3, ASE's sign and Voigt order, converted by
:func:`mlip_unc.data.labels.stress_to_ase`, the one conversion), the raw ``virial_stress``
also in ``info["virial_stress_kbar"]`` (the key of the extxyz conversions in shared/data,
read with the same conversion), and the entry's other scalar fields (``group``,
``description``, ...) in ``info``. Absent or ``null`` outputs are absent labels.

An ASE database JSON (a dict with ``ids``) is passed to ASE's reader instead.
"""

from __future__ import annotations

import json
import math
from numbers import Real
from pathlib import Path
from typing import Any

import ase
import ase.io
import numpy as np
from ase.calculators.singlepoint import SinglePointCalculator
from ase.data import atomic_numbers
from ase.stress import full_3x3_to_voigt_6_stress

from mlip_unc.data.errors import DataError, where
from mlip_unc.data.labels import StressConvention, stress_to_ase

__all__ = ["RAW_STRESS_KEY", "entry_to_atoms", "read_json_structures"]

RAW_STRESS_KEY = "virial_stress_kbar"
"""``info`` key of the raw mlearn ``virial_stress`` (kbar, VASP order and sign)."""

_SKIP_FIELDS = {"structure", "outputs"}


def _numeric(value: Any, what: str, loc: str) -> np.ndarray:
    """``value`` as a finite float64 array (any shape), else a DataError naming ``what``."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{loc}: {what} is not a numeric array: {str(value)[:80]}") from None
    if not np.isfinite(array).all():
        raise DataError(f"{loc}: {what} contains NaN or inf")
    return array


def _array(value: Any, shape: tuple[int, ...], what: str, loc: str) -> np.ndarray:
    """``value`` as a finite float64 array of ``shape``, else a DataError naming ``what``."""
    array = _numeric(value, what, loc)
    if array.shape != shape:
        raise DataError(f"{loc}: {what} must have shape {shape}, got {array.shape}")
    return array


def _site_number(site: Any, k: int, loc: str) -> int:
    """Atomic number of site ``k`` (one species, occupancy 1, a known element)."""
    species = site.get("species") if isinstance(site, dict) else None
    if not isinstance(species, list) or not species or not isinstance(species[0], dict):
        raise DataError(f"{loc}: site {k} has no 'species' list")
    if len(species) != 1 or not math.isclose(float(species[0].get("occu", 1.0)), 1.0, abs_tol=1e-6):
        raise DataError(
            f"{loc}: site {k} is disordered ({species}); only ordered structures are supported"
        )
    symbol = species[0].get("element")
    if symbol not in atomic_numbers or symbol == "X":
        raise DataError(f"{loc}: site {k}: unknown element {symbol!r}")
    return int(atomic_numbers[symbol])


def _structure_to_atoms(structure: Any, loc: str) -> ase.Atoms:
    """A pymatgen Structure/Molecule dict -> ``ase.Atoms`` (no labels)."""
    if not isinstance(structure, dict):
        raise DataError(
            f"{loc}: 'structure' must be a pymatgen structure dict, got {type(structure).__name__}"
        )
    sites = structure.get("sites")
    if not isinstance(sites, list) or not sites:
        raise DataError(f"{loc}: 'structure' has no sites")
    numbers = [_site_number(site, k, loc) for k, site in enumerate(sites)]
    lattice = structure.get("lattice")
    if lattice is None:  # a Molecule: Cartesian coordinates, no cell
        xyz = [site.get("xyz") for site in sites]
        positions = _array(xyz, (len(sites), 3), "site coordinates 'xyz'", loc)
        return ase.Atoms(numbers=numbers, positions=positions, pbc=False)
    matrix = lattice.get("matrix") if isinstance(lattice, dict) else None
    cell = _array(matrix, (3, 3), "lattice 'matrix'", loc)  # rows = lattice vectors
    pbc = lattice.get("pbc", (True, True, True))
    if all("abc" in site for site in sites):
        frac = _array(
            [site["abc"] for site in sites], (len(sites), 3), "site coordinates 'abc'", loc
        )
        positions = frac @ cell  # (n_atoms, 3)
    else:
        positions = _array(
            [site.get("xyz") for site in sites], (len(sites), 3), "site coordinates 'xyz'", loc
        )
    return ase.Atoms(numbers=numbers, positions=positions, cell=cell, pbc=[bool(p) for p in pbc])


def _energy(value: Any, loc: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise DataError(f"{loc}: outputs 'energy' must be one finite number, got {str(value)[:80]}")
    return float(value)


def entry_to_atoms(
    entry: Any, *, source: object | None = None, index: int | None = None
) -> ase.Atoms:
    """One list entry -> ``ase.Atoms`` with its labels (see the module docstring).

    Raises:
        DataError: naming ``source`` and the list ``index``: not a dict, no ``structure``,
            bad sites (unknown element, disordered), wrong shapes, non-finite values,
            ``num_atoms`` disagreeing with the sites.
    """
    loc = where(source, index, row="entry")
    if not isinstance(entry, dict):
        raise DataError(
            f"{loc}: expected an object with 'structure' and 'outputs', got {type(entry).__name__}"
        )
    if "structure" not in entry:
        raise DataError(f"{loc}: no 'structure'; keys: {sorted(entry)}")
    atoms = _structure_to_atoms(entry["structure"], loc)
    n = len(atoms)
    if entry.get("num_atoms") is not None and entry["num_atoms"] != n:
        raise DataError(
            f"{loc}: 'num_atoms' is {entry['num_atoms']} but the structure has {n} sites"
        )
    outputs = entry.get("outputs") or {}
    if not isinstance(outputs, dict):
        raise DataError(f"{loc}: 'outputs' must be an object, got {type(outputs).__name__}")
    results: dict[str, Any] = {}
    if outputs.get("energy") is not None:
        results["energy"] = _energy(outputs["energy"], loc)
    if outputs.get("forces") is not None:
        results["forces"] = _array(outputs["forces"], (n, 3), "outputs 'forces'", loc)
    if outputs.get("virial_stress") is not None:
        raw = _numeric(outputs["virial_stress"], "outputs 'virial_stress'", loc)
        if raw.size not in (6, 9):
            raise DataError(
                f"{loc}: outputs 'virial_stress' must have 6 (or 9) components, got {raw.size}"
            )
        if not atoms.pbc.any():
            raise DataError(f"{loc}: outputs 'virial_stress' given for a structure without a cell")
        stress = stress_to_ase(raw, StressConvention.VASP_KBAR)  # (3, 3) eV/A^3, ASE sign
        results["stress"] = full_3x3_to_voigt_6_stress(stress)  # (6,) xx yy zz yz xz xy
        atoms.info[RAW_STRESS_KEY] = raw.reshape(-1)
    for name, value in entry.items():
        if name not in _SKIP_FIELDS and isinstance(value, (str, int, float, bool)):
            atoms.info[name] = value
    if results:
        atoms.calc = SinglePointCalculator(atoms, **results)
    return atoms


def read_json_structures(path: str | Path) -> list[ase.Atoms]:
    """Every entry of a JSON file in mlearn's layout (or an ASE database JSON) as ``ase.Atoms``.

    Raises:
        DataError: not JSON (with line and column), neither a list of entries nor an ASE
            database, or a bad entry (naming the file and the list index).
    """
    path = Path(path)
    try:
        with path.open() as handle:
            document = json.load(handle)
    except json.JSONDecodeError as err:
        raise DataError(
            f"'{path}': not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}"
        ) from None
    if isinstance(document, dict) and "ids" in document:  # ASE's database JSON
        result = ase.io.read(path, index=":", format="json")
        return list(result) if isinstance(result, list) else [result]
    if isinstance(document, dict) and "structure" in document:
        document = [document]
    if not isinstance(document, list):
        raise DataError(
            f"'{path}': expected a JSON list of {{structure, outputs}} entries (mlearn's layout), "
            f"got {type(document).__name__}"
        )
    if not document:
        raise DataError(f"'{path}': the JSON list is empty")
    return [entry_to_atoms(entry, source=path, index=k) for k, entry in enumerate(document)]
