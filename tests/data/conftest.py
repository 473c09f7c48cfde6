"""Fixtures for the data-layer tests: tiny generated structures and the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import ase
import numpy as np
import pytest
from ase.calculators.singlepoint import SinglePointCalculator

# Per-element energies used to generate labelled molecules (eV).
_E0 = {1: -13.6, 6: -1029.5, 8: -2041.8}


def shared_data_dir() -> Path:
    """``$MLIP_UNC_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("MLIP_UNC_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The shared data folder; skips the test when it is absent."""
    root = shared_data_dir()
    if not root.is_dir():
        pytest.skip(f"shared data folder not found: {root}")
    return root


def _make_molecule(rng: np.random.Generator, numbers: list[int]) -> ase.Atoms:
    """A random non-periodic molecule; energy = sum of per-element energies, random forces."""
    n = len(numbers)
    positions = rng.uniform(0.0, 1.5 * n ** (1 / 3) + 1.0, size=(n, 3))
    atoms = ase.Atoms(numbers=numbers, positions=positions, pbc=False)
    energy = float(sum(_E0[z] for z in numbers))
    atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=rng.normal(size=(n, 3)))
    return atoms


@pytest.fixture()
def element_energies() -> dict[int, float]:
    """The per-element energies (eV) that generate the energies of ``molecules``."""
    return dict(_E0)


@pytest.fixture()
def molecules() -> list[ase.Atoms]:
    """8 labelled molecules of H, C, O with varied compositions (10 atoms or fewer)."""
    rng = np.random.default_rng(0)
    compositions = [
        [6, 1, 1, 1, 1],
        [8, 1, 1],
        [6, 6, 8, 1, 1, 1, 1, 1, 1],
        [6, 8, 8],
        [6, 6, 1, 1, 1, 1],
        [8, 8],
        [6, 1, 1, 1, 8, 1],
        [1, 1],
    ]
    return [_make_molecule(rng, c) for c in compositions]
