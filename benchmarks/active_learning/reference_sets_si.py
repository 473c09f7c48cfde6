"""Oracle-labelled reference sets of the active-learning benchmark's periodic system: silicon
with the published mlearn SNAP potential as the oracle (a stand-in for DFT).

Every label comes from the oracle (``oracle: {name: snap, element: Si}``,
:func:`mlip_unc.active.oracles.snap_oracle`; the potential files are read from
``$MLEARN_REPO`` or ``~/.cache/mlip_unc/mlearn``, never shipped). The cells start from the
64-atom diamond supercell (2 x 2 x 2 conventional cells, ``a = LATTICE``), the one the
active-learning runs use. The sets (extended XYZ; ``energy`` eV, ``forces`` eV/A, ``stress``):

- ``md_300K``, ``md_1200K``: Langevin NVT from the crystal (1 fs steps, friction
  0.02 / fs), ``equilibration`` steps discarded, then one frame every ``stride`` steps,
  ``n_frames`` frames;
- ``md_melt``: the same at ``melt_k`` after ``premelt_steps`` at ``premelt_k`` (a 64-atom
  crystal at fixed volume superheats: it is melted hot first, then held at ``melt_k``);
- ``vacancy``: the supercell less one atom, relaxed by the oracle (BFGS at fixed cell), then
  ``n_defect_frames`` frames of MD at ``defect_k``; the relaxed frame first;
- ``surface``: the supercell cut along z by ``vacuum`` A of vacuum (two unreconstructed (001)
  faces of a periodic slab), relaxed, then MD at ``defect_k`` as for the vacancy.

Each set's smallest interatomic distance is recorded in the manifest (``min_distance``): the
benchmark's stability runs call a model's frame unphysical below a fraction of the smallest
distance the oracle visits. Files go under ``--out`` (default
``$MLIP_UNC_CACHE/al_reference/si_snap``); ``manifest.json`` beside them records each file's
SHA-256, frame count, minimum distance and seconds, and a copy is committed as
``benchmarks/results/active_learning/reference_sets_si.json``. A set matching its manifest entry
is not made again (resumable); ``--verify`` checks the cached files against the committed record.

Run from the repository root, in the environment with LAMMPS (``.venv-mace``)::

    OMP_NUM_THREADS=1 .venv-mace/bin/python -m benchmarks.active_learning.reference_sets_si
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ase import Atoms, units
from ase.build import bulk
from ase.calculators.calculator import Calculator
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import Stationary, thermalize_momenta
from ase.optimize import BFGS

from benchmarks.active_learning.reference_sets import labelled, manifest_ok, write_sets
from mlip_unc.active.oracles import make_oracle

DEFAULT_OUT = (
    Path(os.environ.get("MLIP_UNC_CACHE", "~/.cache/mlip_unc")).expanduser()
    / "al_reference"
    / "si_snap"
)
RECORD = Path("benchmarks/results/active_learning/reference_sets_si.json")
ORACLE = {"name": "snap", "element": "Si"}
LATTICE = 5.47  # A: near the SNAP potential's own equilibrium (DFT-PBE ~5.47, experiment 5.431)
REPEAT = (2, 2, 2)  # 64 atoms
SETS = ("md_300K", "md_1200K", "md_melt", "vacancy", "surface")


@dataclass(frozen=True)
class Settings:
    """How the sets are made (stored in the manifest; a change regenerates the sets)."""

    n_frames: int = 100  # as many as a few minutes of one shared core make
    stride: int = 25  # MD steps between kept frames (25 fs)
    equilibration: int = 500  # MD steps discarded first (0.5 ps: 10 thermostat times)
    timestep_fs: float = 1.0
    friction_per_fs: float = 0.02
    melt_k: float = 2200.0  # the 64-atom crystal melts within 1 ps here, not at 1800 K in 3 ps
    premelt_k: float = 3000.0
    premelt_steps: int = 1000
    defect_k: float = 600.0
    n_defect_frames: int = 40
    defect_equilibration: int = 500
    vacuum: float = 10.0  # A between the slab's faces: beyond the oracle's and model's cutoffs
    relax_fmax: float = 0.02
    relax_steps: int = 500
    seed: int = 0


def crystal() -> Atoms:
    """The 64-atom diamond supercell of the benchmark (``LATTICE``, ``REPEAT``)."""
    return bulk("Si", "diamond", a=LATTICE, cubic=True) * REPEAT


def vacancy_cell() -> Atoms:
    """The supercell less its first atom."""
    atoms = crystal()
    del atoms[0]
    return atoms


def surface_cell(vacuum: float) -> Atoms:
    """The supercell with ``vacuum`` A added along z: a periodic slab with two (001) faces."""
    atoms = crystal()
    atoms.center(vacuum=vacuum / 2, axis=2)
    return atoms


def min_distance(frames: Sequence[Atoms]) -> float:
    """The smallest interatomic distance (minimum image) over ``frames``."""
    best = np.inf
    for atoms in frames:
        d = atoms.get_all_distances(mic=True)
        best = min(best, float(d[np.triu_indices(len(atoms), 1)].min()))
    return best


def langevin(atoms: Atoms, temperature_k: float, settings: Settings, rng: np.random.Generator):
    """Langevin NVT of ``atoms`` (which carry the oracle) at ``temperature_k``, fresh velocities."""
    thermalize_momenta(atoms, temperature_K=temperature_k, rng=rng)
    Stationary(atoms)
    return Langevin(
        atoms,
        settings.timestep_fs * units.fs,
        temperature_K=temperature_k,
        friction=settings.friction_per_fs / units.fs,
        fixcm=False,
        rng=rng,
    )


def md_frames(
    start: Atoms,
    calc: Calculator,
    temperature_k: float,
    settings: Settings,
    *,
    n_frames: int,
    equilibration: int,
    seed: int,
    premelt: bool = False,
) -> Iterator[Atoms]:
    """``n_frames`` labelled frames of oracle MD at ``temperature_k``; with ``premelt`` the cell
    is first melted (``premelt_steps`` at ``premelt_k``)."""
    atoms = start.copy()
    atoms.calc = calc
    rng = np.random.default_rng(seed)
    if premelt:
        langevin(atoms, settings.premelt_k, settings, rng).run(settings.premelt_steps)
    dyn = langevin(atoms, temperature_k, settings, rng)
    dyn.run(equilibration)
    for _ in range(n_frames):
        dyn.run(settings.stride)
        yield labelled(atoms, calc)


def relaxed(atoms: Atoms, calc: Calculator, settings: Settings) -> Atoms:
    """``atoms`` relaxed by the oracle at fixed cell (BFGS)."""
    atoms = atoms.copy()
    atoms.calc = calc
    BFGS(atoms, logfile=None, maxstep=0.1).run(fmax=settings.relax_fmax, steps=settings.relax_steps)
    return atoms


def defect_frames(start: Atoms, calc: Calculator, settings: Settings, seed: int) -> Iterator[Atoms]:
    """The relaxed defect cell, then ``n_defect_frames`` MD frames at ``defect_k``."""
    relaxed_cell = relaxed(start, calc, settings)
    frame = labelled(relaxed_cell, calc)
    frame.info["relaxed"] = True
    yield frame
    yield from md_frames(
        relaxed_cell,
        calc,
        settings.defect_k,
        settings,
        n_frames=settings.n_defect_frames,
        equilibration=settings.defect_equilibration,
        seed=seed,
    )


def frames_of(name: str, calc: Calculator, settings: Settings) -> tuple[Iterator[Atoms], int]:
    """The frame generator of set ``name`` and its length."""
    md = {"n_frames": settings.n_frames, "equilibration": settings.equilibration}
    if name in ("md_300K", "md_1200K"):
        temperature = float(name.removeprefix("md_").removesuffix("K"))
        seed = settings.seed + int(temperature)
        return md_frames(crystal(), calc, temperature, settings, **md, seed=seed), md["n_frames"]
    if name == "md_melt":
        seed = settings.seed + int(settings.melt_k)
        gen = md_frames(crystal(), calc, settings.melt_k, settings, **md, seed=seed, premelt=True)
        return gen, md["n_frames"]
    if name == "vacancy":
        return defect_frames(vacancy_cell(), calc, settings, settings.seed + 1), (
            settings.n_defect_frames + 1
        )
    if name == "surface":
        cell = surface_cell(settings.vacuum)
        return defect_frames(cell, calc, settings, settings.seed + 2), settings.n_defect_frames + 1
    raise ValueError(f"unknown set {name!r}; known: {', '.join(SETS)}")


def build(out: Path, settings: Settings, sets: Sequence[str], oracle: object = None) -> dict:
    """Make the missing ``sets`` under ``out`` with ``oracle`` (default: the SNAP oracle);
    returns the manifest (also written after each set)."""
    calc = make_oracle(oracle or ORACLE)
    header = {
        "oracle": "mlearn SNAP Si (Zuo et al. 2020), LAMMPS pair_style snap",
        "lattice_A": LATTICE,
        "repeat": list(REPEAT),
    }
    return write_sets(
        out,
        settings,
        sets,
        header,
        lambda name: frames_of(name, calc, settings),
        lambda done, total: {"atoms": len(done[0]), "min_distance": round(min_distance(done), 4)},
    )


def oracle_min_distance(manifest: dict, sets: Sequence[str] = SETS) -> float:
    """The smallest interatomic distance the oracle's reference sets visit (from the manifest)."""
    values = [manifest["sets"][s]["min_distance"] for s in sets if s in manifest.get("sets", {})]
    if not values:
        raise ValueError(f"the manifest holds none of the sets {', '.join(sets)}")
    return float(min(values))


QUICK = Settings(
    n_frames=4,
    stride=2,
    equilibration=4,
    premelt_steps=4,
    n_defect_frames=2,
    defect_equilibration=2,
    relax_steps=3,
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--verify", action="store_true", help="only check the checksums")
    parser.add_argument(
        "--record", type=Path, default=None, help=f"checksum record (default {RECORD})"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sets (short MD) for tests")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    sets = [s for s in args.sets.split(",") if s]
    if args.verify:
        manifest = json.loads((args.record or RECORD).read_text())
        bad = [s for s in sets if not manifest_ok(args.out / f"{s}.xyz", manifest["sets"].get(s))]
        if bad:
            raise SystemExit(f"checksum mismatch or missing: {bad} under {args.out}")
        print(f"all {len(sets)} sets under {args.out} match {args.record or RECORD}")
        return
    manifest = build(args.out, QUICK if args.quick else Settings(), sets)
    if args.record is not None or not args.quick:
        record = args.record or RECORD
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(manifest, indent=2) + "\n")
        print(f"checksums recorded in {record}")


if __name__ == "__main__":
    main()
