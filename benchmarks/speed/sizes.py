"""The systems of the size part: three kinds of structure at about 10, 100, 1,000 and 10,000 atoms.

- ``molecules``: 3BPA (the first frame of ``structures/3BPA/train_300K.xyz`` under the data
  root, else embedded by RDKit, as :mod:`benchmarks.speed.fixtures` does): one isolated
  molecule (27 atoms, the smallest 3BPA system), then copies in a periodic box, one per 12 A
  cube (a dilute molecular box: few neighbours between copies);
- ``liquid``: water at 1 g/cm^3, one randomly rotated molecule per 3.104 A cube, rattled 0.02 A
  (a dense periodic liquid, about 50 neighbours within 5 A per atom);
- ``crystal``: fcc Cu (a = 3.61 A) supercells of the cubic cell, rattled 0.05 A.

Each kind has its own atom counts (stated on the page); the cost of a call depends on the
number of atoms and of neighbours, so the three kinds bracket molecules, liquids and solids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ase import Atoms
from ase.build import bulk, molecule

from benchmarks.speed.fixtures import _three_bpa
from benchmarks.speed.property_order import box_of_copies

KINDS = ("molecules", "liquid", "crystal")
MOLECULE_SPACING = 12.0  # A per 3BPA copy (property_order.box_of_copies)
WATER_SPACING = (18.015 / 0.602214) ** (1 / 3)  # A: one H2O per cube at 1 g/cm^3
CU_A = 3.61
# (kind -> repeats of the unit) of the full and of the quick part; None = one isolated molecule
FULL: dict[str, list[tuple[int, int, int] | None]] = {
    "molecules": [None, (2, 2, 1), (3, 3, 4), (6, 7, 9)],  # 27, 108, 972, 10206 atoms
    "liquid": [(2, 2, 1), (3, 3, 4), (6, 7, 8), (14, 15, 16)],  # 12, 108, 1008, 10080
    "crystal": [(2, 1, 1), (5, 5, 1), (5, 5, 10), (10, 10, 25)],  # 8, 100, 1000, 10000
}
QUICK: dict[str, list[tuple[int, int, int] | None]] = {
    "molecules": [None],
    "liquid": [(2, 1, 1), (2, 2, 1)],  # 6, 12
    "crystal": [(1, 1, 1), (2, 1, 1)],  # 4, 8
}


@dataclass(frozen=True)
class System:
    """One structure of the size part: its kind, a name with its atom count, how it was made."""

    kind: str
    atoms: Atoms
    source: str

    @property
    def n_atoms(self) -> int:
        return len(self.atoms)

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.n_atoms}"

    @property
    def periodic(self) -> bool:
        return bool(self.atoms.pbc.all())


def molecules(data_root: Path, reps: tuple[int, int, int] | None) -> System:
    """One isolated 3BPA (``reps`` None) or ``reps`` copies of it in a periodic box."""
    bpa, source = _three_bpa(data_root)
    if reps is None:
        return System("molecules", bpa, f"one 3BPA molecule, {source}, not periodic")
    box = box_of_copies(bpa, 1, MOLECULE_SPACING).repeat(reps)
    box.rattle(0.01, seed=1)
    return System(
        "molecules",
        box,
        f"{int(np.prod(reps))} copies of 3BPA ({source}) on a {reps} grid of "
        f"{MOLECULE_SPACING:g} A cubes, rattled 0.01 A, periodic",
    )


def _rotation(rng: np.random.Generator) -> np.ndarray:
    """A random proper rotation (QR of a Gaussian matrix, signs fixed)."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def water(reps: tuple[int, int, int], seed: int = 0) -> System:
    """Water at 1 g/cm^3: one randomly rotated H2O per ``WATER_SPACING`` cube, rattled 0.02 A."""
    rng = np.random.default_rng(seed)
    h2o = molecule("H2O")
    h2o.positions -= h2o.positions[0]  # oxygen at the origin
    sites = np.array(np.meshgrid(*[np.arange(n) for n in reps], indexing="ij")).reshape(3, -1).T
    positions = [(site + 0.5) * WATER_SPACING + h2o.positions @ _rotation(rng).T for site in sites]
    box = Atoms(
        h2o.get_chemical_symbols() * len(sites),
        positions=np.concatenate(positions),
        cell=np.array(reps, dtype=float) * WATER_SPACING,
        pbc=True,
    )
    box.rattle(0.02, seed=seed)
    return System(
        "liquid",
        box,
        f"{len(sites)} H2O at 1 g/cm^3 ({reps} grid of {WATER_SPACING:.3f} A cubes, "
        "random orientations), rattled 0.02 A, periodic",
    )


def crystal(reps: tuple[int, int, int]) -> System:
    """fcc Cu, ``reps`` cubic cells (4 atoms each), rattled 0.05 A."""
    cu = bulk("Cu", "fcc", a=CU_A, cubic=True).repeat(reps)
    cu.rattle(0.05, seed=0)
    return System(
        "crystal", cu, f"fcc Cu a = {CU_A} A, cubic cell x {reps}, rattled 0.05 A, periodic"
    )


def build(kind: str, reps: tuple[int, int, int] | None, data_root: Path) -> System:
    """The system of ``kind`` with ``reps`` repeats of its unit."""
    if kind == "molecules":
        return molecules(data_root, reps)
    if reps is None:
        raise ValueError(f"{kind} needs repeats")
    return water(reps) if kind == "liquid" else crystal(reps)


def size_series(
    data_root: Path, *, quick: bool, kinds: tuple[str, ...] = KINDS, max_atoms: int | None = None
) -> list[System]:
    """Every system of the part, kind by kind, small to large (``max_atoms``: leave out larger)."""
    table = QUICK if quick else FULL
    out = []
    for kind in kinds:
        for reps in table[kind]:
            system = build(kind, reps, data_root)
            if max_atoms is None or system.n_atoms <= max_atoms:
                out.append(system)
    return out
