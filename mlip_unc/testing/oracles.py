"""The oracle contract checks: :func:`check_oracle` (listed in :mod:`mlip_unc.testing`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from ase import Atoms

from mlip_unc.testing.common import ContractError, close, random_rotation

__all__ = ["check_oracle", "oracle_test_structures"]


def oracle_test_structures(
    elements: Sequence[str] = ("Cu",), *, bond: float = 2.5, periodic: bool = True, seed: int = 0
) -> list[Atoms]:
    """A four-atom cluster (a distorted tetrahedron, nearest neighbours about ``bond`` apart)
    and, with ``periodic``, a rattled four-atom fcc cell of the same spacing; the elements
    cycle over the atoms."""
    rng = np.random.default_rng(seed)
    tetra = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]]) * bond / math.sqrt(8)
    symbols = [elements[k % len(elements)] for k in range(4)]
    cluster = Atoms(symbols, positions=tetra + rng.normal(0, 0.05 * bond, size=(4, 3)))
    out = [cluster]
    if periodic:
        a = bond * math.sqrt(2)
        frac = np.array([[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]])
        cell = Atoms(symbols, scaled_positions=frac, cell=np.eye(3) * a, pbc=True)
        cell.positions += rng.normal(0, 0.03 * bond, size=(4, 3))
        out.append(cell)
    return out


def check_oracle(
    oracle: Any,
    structures: Sequence[Atoms] | None = None,
    *,
    elements: Sequence[str] = ("Cu",),
    periodic: bool = True,
    step: float = 1e-3,
    energy_atol: float = 1e-6,
    force_atol: float = 1e-3,
    force_rtol: float = 1e-3,
    stress_atol: float = 1e-4,
    n_components: int = 6,
    seed: int = 0,
) -> list[str]:
    """Check an oracle: what :func:`~mlip_unc.active.oracles.make_oracle` builds from
    ``oracle`` (a registered name or mapping, ``"module:factory"``, or an ASE calculator).

    Args:
        structures: what to label; default :func:`oracle_test_structures` of ``elements``
            (a cluster and, with ``periodic``, an fcc cell).
        step: finite-difference step, A (forces) and strain (stress).
        energy_atol: eV, energies that must agree (again, translated, permuted, rotated).
        force_atol, force_rtol: forces against central differences, eV/A.
        stress_atol: eV/A^3, stress against central differences of the strain.
        n_components: force components checked per structure (random; all if fewer).
        seed: the components and the default structures.

    Returns:
        The names of the checks that passed, in order.

    Raises:
        ContractError: the first check that failed.
    """
    from mlip_unc.active.oracles import label_structures, make_oracle

    calc = make_oracle(oracle)
    if structures is None:
        structures = oracle_test_structures(elements, periodic=periodic, seed=seed)
    rng = np.random.default_rng(seed)
    checks: dict[str, None] = {}

    def label(atoms: Atoms) -> tuple[float, np.ndarray]:
        atoms = atoms.copy()
        atoms.calc = calc
        energy = atoms.get_potential_energy()
        forces = np.asarray(atoms.get_forces(), dtype=np.float64)
        atoms.calc = None
        return float(energy), forces

    for k, atoms in enumerate(structures):
        where = f"structure {k} ({atoms.get_chemical_formula()})"
        energy, forces = label(atoms)
        if not math.isfinite(energy):
            raise ContractError(f"shapes: {where}: energy {energy}")
        if forces.shape != (len(atoms), 3) or not np.all(np.isfinite(forces)):
            raise ContractError(
                f"shapes: {where}: forces of shape {forces.shape}, expected ({len(atoms)}, 3), "
                "finite"
            )
        checks["shapes"] = None

        other = atoms.copy()
        other.positions[0] += 0.1
        e_other, _ = label(other)
        if abs(e_other - energy) <= energy_atol:
            raise ContractError(f"consistency: {where}: moving an atom leaves the energy as it was")
        again, forces_again = label(atoms)
        close(
            "consistency",
            f"{where}: energies of the same structure, again",
            again,
            energy,
            atol=energy_atol,
            rtol=0,
        )
        close(
            "consistency",
            f"{where}: forces of the same structure, again",
            forces_again,
            forces,
            atol=force_atol,
            rtol=0,
        )
        (stored,) = label_structures([atoms], calc)
        close(
            "consistency",
            f"{where}: label_structures' energy",
            stored.get_potential_energy(),
            energy,
            atol=energy_atol,
            rtol=0,
        )
        checks["consistency"] = None

        flat = rng.permutation(3 * len(atoms))[:n_components]
        numeric, analytic = [], []
        for index in flat:
            a, c = divmod(int(index), 3)
            e = []
            for s in (1.0, -1.0):
                moved = atoms.copy()
                moved.positions[a, c] += s * step
                e.append(label(moved)[0])
            numeric.append(-(e[0] - e[1]) / (2 * step))
            analytic.append(forces[a, c])
        close(
            "finite_difference_forces",
            f"{where}: forces and -dE/dx",
            analytic,
            numeric,
            atol=force_atol,
            rtol=force_rtol,
        )
        checks["finite_difference_forces"] = None

        if atoms.pbc.all() and "stress" in getattr(calc, "implemented_properties", ()):
            from ase.calculators.fd import calculate_numerical_stress

            strained = atoms.copy()
            strained.calc = calc
            stress = strained.get_stress(voigt=False)
            numeric_stress = calculate_numerical_stress(strained, eps=step, voigt=False)
            close(
                "finite_difference_stress",
                f"{where}: stress and dE/dstrain / V",
                stress,
                numeric_stress,
                atol=stress_atol,
                rtol=1e-3,
            )
            checks["finite_difference_stress"] = None

        moved = atoms.copy()
        moved.positions += np.array([0.31, -0.17, 0.23])
        perm = rng.permutation(len(atoms))
        moved = moved[perm]
        rotate = not atoms.pbc.any()
        rot = random_rotation(rng) if rotate else np.eye(3)
        moved.positions = moved.positions @ rot.T
        e_moved, f_moved = label(moved)
        close(
            "invariance",
            f"{where}: energies of the translated, permuted"
            + (", rotated" if rotate else "")
            + " structure",
            e_moved,
            energy,
            atol=energy_atol,
            rtol=0,
        )
        close(
            "invariance",
            f"{where}: forces of the moved structure",
            f_moved,
            forces[perm] @ rot.T,
            atol=force_atol,
            rtol=force_rtol,
        )
        checks["invariance"] = None
    return list(checks)
