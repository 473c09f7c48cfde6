"""Oracle-labelled reference sets for the active-learning benchmark (3BPA with GFN2-xTB).

Every label comes from the oracle (GFN2-xTB through tblite), none from the DFT files: the
starting geometry is the first frame of ``structures/3BPA/train_300K.xyz`` under the data
root. The sets:

- ``md_300K``, ``md_600K``, ``md_1200K``: Langevin NVT with the oracle (0.5 fs steps,
  friction 0.02 / fs, centre of mass fixed), ``equilibration`` steps discarded, then one frame every ``stride`` steps
  (decorrelated: ``stride`` * 0.5 fs apart), ``n_frames`` frames each.
- ``torsion_scan``: each of 3BPA's three central torsions (:func:`central_torsions`: the
  ring-O, O-CH2 and CH2-ring bonds of the benzyl ether bridge) scanned from 0 to 330 degrees
  in 30-degree steps, the other two kept at their starting values; every point relaxed by the
  oracle (BFGS, fmax 0.05 eV/A) with all three torsions held (ASE ``FixInternals``).

Files are extended XYZ with ``energy`` (eV) in ``info`` and ``forces`` (eV/A) in ``arrays``,
written under ``--out`` (default ``$MLIP_UNC_CACHE/al_reference/3bpa_xtb``, the cache
``~/.cache/mlip_unc`` when unset); ``manifest.json`` beside them records each file's SHA-256,
frame count and settings, and a copy is committed as
``benchmarks/results/active_learning/reference_sets.json``. A set whose file matches its
manifest entry is not generated again (resumable); ``--verify`` checks the cached files against
the committed record.

Run from the repository root::

    python -m benchmarks.active_learning.reference_sets --threads 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from ase import Atoms, units
from ase.calculators.calculator import Calculator
from ase.calculators.singlepoint import SinglePointCalculator
from ase.constraints import FixCom, FixInternals
from ase.io import read, write
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary
from ase.neighborlist import natural_cutoffs, neighbor_list
from ase.optimize import BFGS
from tqdm import tqdm

from mlip_unc.active.oracles import make_oracle

DEFAULT_OUT = (
    Path(os.environ.get("MLIP_UNC_CACHE", "~/.cache/mlip_unc")).expanduser()
    / "al_reference"
    / "3bpa_xtb"
)
RECORD = Path("benchmarks/results/active_learning/reference_sets.json")  # the committed checksums
TEMPERATURES = (300, 600, 1200)
SCAN_ANGLES = tuple(range(0, 360, 30))


@dataclass(frozen=True)
class Settings:
    """How the sets are made (stored in the manifest; a change regenerates the sets)."""

    n_frames: int = 200
    stride: int = 20  # MD steps between kept frames (10 fs at 0.5 fs)
    equilibration: int = 2000  # MD steps discarded first (1 ps)
    timestep_fs: float = 0.5
    friction_per_fs: float = 0.02
    relax_fmax: float = 0.05
    relax_steps: int = 300
    seed: int = 0


def data_root() -> Path:
    """The data root: ``MLIP_UNC_DATA``, default ``../shared/data``."""
    return Path(os.environ.get("MLIP_UNC_DATA", "../shared/data"))


def start_geometry(root: Path) -> Atoms:
    """3BPA's starting geometry: positions and numbers of the first training frame only."""
    frame = read(root / "structures" / "3BPA" / "train_300K.xyz", 0)
    return Atoms(frame.numbers, positions=frame.positions)


def bonds(atoms: Atoms) -> list[tuple[int, int]]:
    """Covalent bonds ``(i, j)``, ``i < j``: ASE natural cutoffs x 1.15 (thermal bond stretch)."""
    i, j = neighbor_list("ij", atoms, natural_cutoffs(atoms, mult=1.15))
    return sorted({(int(a), int(b)) for a, b in zip(i, j, strict=True) if a < b})


def ring_atoms(n_atoms: int, edges: Sequence[tuple[int, int]]) -> set[int]:
    """Atoms on a cycle: an edge is in a ring when its ends stay connected without it."""
    adjacency: dict[int, set[int]] = {k: set() for k in range(n_atoms)}
    for a, b in edges:
        adjacency[a].add(b)
        adjacency[b].add(a)
    in_ring: set[int] = set()
    for a, b in edges:
        seen, stack = {a}, [a]
        while stack:
            node = stack.pop()
            for nxt in adjacency[node]:
                if (node, nxt) in ((a, b), (b, a)) or nxt in seen:
                    continue
                seen.add(nxt)
                stack.append(nxt)
        if b in seen:
            in_ring |= {a, b}
    return in_ring


def central_torsions(atoms: Atoms) -> list[tuple[int, int, int, int]]:
    """3BPA's three central torsions, as atom indices ``(i, j, k, l)``.

    The bridge between the two aromatic rings is ring C - O - CH2 - ring C; the torsions turn
    about its three bonds: (ring neighbour, ring C, O, CH2), (ring C, O, CH2, ring C) and
    (O, CH2, ring C, ring neighbour). The ring neighbour is the heavy ring atom of lowest index.
    """
    edges = bonds(atoms)
    heavy = {k for k in range(len(atoms)) if atoms.numbers[k] > 1}
    rings = ring_atoms(len(atoms), edges) & heavy
    adjacency: dict[int, list[int]] = {k: [] for k in range(len(atoms))}
    for a, b in edges:
        adjacency[a].append(b)
        adjacency[b].append(a)
    oxygens = [k for k in heavy if atoms.numbers[k] == 8 and k not in rings]
    for o in oxygens:
        ring_side = [n for n in adjacency[o] if n in rings]
        chain_side = [n for n in adjacency[o] if n in heavy and n not in rings]
        if len(ring_side) != 1 or len(chain_side) != 1:
            continue
        c_ring1, ch2 = ring_side[0], chain_side[0]
        c_ring2 = [n for n in adjacency[ch2] if n in rings]
        if len(c_ring2) != 1:
            continue
        n1 = min(n for n in adjacency[c_ring1] if n in rings)
        n2 = min(n for n in adjacency[c_ring2[0]] if n in rings)
        return [(n1, c_ring1, o, ch2), (c_ring1, o, ch2, c_ring2[0]), (o, ch2, c_ring2[0], n2)]
    raise ValueError(
        f"no ring-O-CH2-ring bridge found in {atoms.get_chemical_formula()}: not 3BPA?"
    )


def labelled(atoms: Atoms, calc: Calculator) -> Atoms:
    """A copy of ``atoms`` carrying the oracle's energy and forces (constraints dropped)."""
    atoms = Atoms(atoms.numbers, positions=atoms.positions, cell=atoms.cell, pbc=atoms.pbc)
    atoms.calc = calc
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
    return atoms


def oracle_md(
    atoms: Atoms, calc: Calculator, temperature_k: float, settings: Settings, *, seed: int
) -> Iterator[Atoms]:
    """``settings.n_frames`` labelled frames of Langevin NVT at ``temperature_k``."""
    atoms = atoms.copy()
    atoms.set_constraint(FixCom())  # no drift of the molecule (ASE's advice over Langevin's fixcm)
    atoms.calc = calc
    rng = np.random.default_rng(seed)
    MaxwellBoltzmannDistribution(atoms, temperature_K=temperature_k, rng=rng)
    Stationary(atoms)
    dyn = Langevin(
        atoms,
        settings.timestep_fs * units.fs,
        temperature_K=temperature_k,
        friction=settings.friction_per_fs / units.fs,
        fixcm=False,
        rng=rng,
    )
    dyn.run(settings.equilibration)
    for _ in range(settings.n_frames):
        dyn.run(settings.stride)
        yield labelled(atoms, calc)


def torsion_scan(atoms: Atoms, calc: Calculator, settings: Settings) -> Iterator[Atoms]:
    """Relaxed points of the three 1-D torsion scans (module docstring), in scan order."""
    torsions = central_torsions(atoms)
    start = [atoms.get_dihedral(*t) for t in torsions]
    sides = [
        moving_side(atoms, t) for t in torsions
    ]  # from the starting bonds, not a distorted point
    for which, torsion in enumerate(torsions):
        for angle in SCAN_ANGLES:
            point = atoms.copy()
            targets = list(start)
            targets[which] = float(angle)
            for t, target, side in zip(torsions, targets, sides, strict=True):
                point.set_dihedral(*t, target, indices=side)
            point.set_constraint(
                FixInternals(
                    dihedrals_deg=[[a, list(t)] for a, t in zip(targets, torsions, strict=True)]
                )
            )
            point.calc = calc
            relaxed = relax_held(point, settings)
            if relaxed is None:  # the constraint solver failed at every step size: skip, say so
                print(
                    f"torsion {which} at {angle} deg: not relaxed with the torsions held; skipped"
                )
                continue
            frame = labelled(relaxed, calc)
            frame.info.update(torsion=which, torsion_atoms=list(torsion), angle_deg=float(angle))
            yield frame


def relax_held(point: Atoms, settings: Settings) -> Atoms | None:
    """``point`` relaxed by BFGS under its constraints; smaller steps when ASE's solver for the
    held torsions fails to converge (large first steps from a clashing start), None if all do."""
    for maxstep in (0.1, 0.03, 0.01):
        trial = point.copy()
        trial.calc = point.calc
        try:
            BFGS(trial, logfile=None, maxstep=maxstep).run(
                fmax=settings.relax_fmax, steps=settings.relax_steps
            )
        except ValueError:  # FixInternals.adjust_positions did not converge
            continue
        return trial
    return None


def moving_side(atoms: Atoms, torsion: tuple[int, int, int, int]) -> list[int]:
    """Atoms on the ``k`` side of the ``j-k`` bond (the part that turns with ``l``)."""
    _, j, k, _ = torsion
    adjacency: dict[int, set[int]] = {n: set() for n in range(len(atoms))}
    for a, b in bonds(atoms):
        adjacency[a].add(b)
        adjacency[b].add(a)
    seen, stack = {k}, [k]
    while stack:
        node = stack.pop()
        for nxt in adjacency[node] - {j} - seen if node == k else adjacency[node] - seen:
            seen.add(nxt)
            stack.append(nxt)
    if j in seen:
        raise ValueError(f"bond {j}-{k} is in a ring: it cannot be turned")
    return sorted(seen)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest_ok(path: Path, entry: dict | None) -> bool:
    return entry is not None and path.exists() and sha256(path) == entry.get("sha256")


def write_sets(
    out: Path,
    settings: Any,
    sets: Sequence[str],
    header: dict,
    frames_of: Callable[[str], tuple[Iterable[Atoms], int]],
    describe: Callable[[list[Atoms], int], dict] = lambda done, total: {},
) -> dict:
    """Generate the ``sets`` missing under ``out`` (``frames_of(name)``: the oracle's frames and
    how many are expected) and keep ``out/manifest.json``: ``header``, the ``settings`` dataclass
    (a change of settings regenerates every set) and per set its checksum, frame count,
    ``describe(frames, expected)`` and seconds. Written after each set; a set whose file matches
    its checksum is kept."""
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if manifest.get("settings") != asdict(settings):
        manifest = {"settings": asdict(settings), **header, "sets": {}}
    for name in sets:
        path = out / f"{name}.xyz"
        if manifest_ok(path, manifest["sets"].get(name)):
            print(f"{name}: up to date ({path})")
            continue
        frames, total = frames_of(name)
        start = time.perf_counter()
        done = list(tqdm(frames, total=total, desc=name, unit="frame"))
        partial = path.with_suffix(".xyz.partial")
        write(partial, done, format="extxyz")
        partial.replace(path)
        manifest["sets"][name] = {
            "sha256": sha256(path),
            "frames": len(done),
            **describe(done, total),
            "seconds": round(time.perf_counter() - start, 1),
        }
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def build(out: Path, settings: Settings, sets: Sequence[str], *, root: Path) -> dict:
    """Generate the missing ``sets`` under ``out``; returns the manifest (also written)."""
    atoms = start_geometry(root)
    calc = make_oracle("xtb")

    def frames_of(name: str) -> tuple[Iterable[Atoms], int]:
        if name.startswith("md_"):
            temperature = float(name.removeprefix("md_").removesuffix("K"))
            seed = settings.seed + int(temperature)
            return oracle_md(atoms, calc, temperature, settings, seed=seed), settings.n_frames
        if name == "torsion_scan":
            return torsion_scan(atoms, calc, settings), 3 * len(SCAN_ANGLES)
        raise ValueError(f"unknown set {name!r}; known: {all_sets()}")

    return write_sets(
        out,
        settings,
        sets,
        {"oracle": "GFN2-xTB (tblite)"},
        frames_of,
        # torsion points the held relaxation could not reach
        lambda done, total: {"skipped": total - len(done)},
    )


def all_sets() -> list[str]:
    return [f"md_{t}K" for t in TEMPERATURES] + ["torsion_scan"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--data-root", type=Path, default=None)
    parser.add_argument("--sets", default=",".join(all_sets()))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--verify", action="store_true", help="only check the checksums")
    parser.add_argument(
        "--record", type=Path, default=None, help=f"checksum record (default {RECORD})"
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sets (4 frames, short MD) for tests"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    settings = (
        Settings(n_frames=4, stride=2, equilibration=4, relax_steps=3) if args.quick else Settings()
    )
    sets = [s for s in args.sets.split(",") if s]
    if args.verify:
        manifest = json.loads((args.record or RECORD).read_text())
        bad = [s for s in sets if not manifest_ok(args.out / f"{s}.xyz", manifest["sets"].get(s))]
        if bad:
            raise SystemExit(f"checksum mismatch or missing: {bad} under {args.out}")
        print(f"all {len(sets)} sets under {args.out} match {args.record or RECORD}")
        return
    manifest = build(args.out, settings, sets, root=args.data_root or data_root())
    if args.record is not None or not args.quick:
        record = args.record or RECORD
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(manifest, indent=2) + "\n")
        print(f"checksums recorded in {record}")


if __name__ == "__main__":
    main()
