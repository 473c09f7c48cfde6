"""Cost of the calculator's properties in the order ASE asks for them, relative to plain E+F.

Times one calculator per case on the same structures, each call on a new structure (positions
moved by 1e-4 A), CPU time of this process (``time.process_time``, robust to other jobs on the
machine), median after two warm-up calls:

- ``readme``: ``get_forces()`` then ``get_property("max_force_std")`` (the README's order);
- ``reverse``: ``max_force_std`` then forces;
- ``energy_std_then_forces``: the default mode's calculator asked for ``energy_std`` first;
- ``energy_mode``: ``uncertainty="energy"``, ``energy_std`` then forces;

each divided by ``uncertainty="none"`` asked for forces. Structures: the first frame of
``structures/3BPA/train_300K.xyz`` under the data root (27 atoms) and 27 copies of it in a
periodic box (729 atoms). One JSON record per run is appended to ``--out``, labelled with
``--label`` and the import path of ``mlip_unc`` (so that two code versions, e.g. a git
worktree put first on ``PYTHONPATH``, can be compared in one session)::

    python -m benchmarks.speed.property_order --model MODEL.pt --label now \\
        --out benchmarks/results/speed_property_order.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from ase import Atoms
from ase.io import read

import mlip_unc
from benchmarks.common.pages import environment
from benchmarks.common.records import append_jsonl
from mlip_unc import keys
from mlip_unc.calculator import UncertaintyCalculator

CASES: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "readme": (None, ("forces", keys.CALC_MAX_FORCE_STD)),
    "reverse": (None, (keys.CALC_MAX_FORCE_STD, "forces")),
    "energy_std_then_forces": (None, (keys.CALC_ENERGY_STD, "forces")),
    "energy_mode": ("energy", (keys.CALC_ENERGY_STD, "forces")),
}


def box_of_copies(atoms: Atoms, n: int, spacing: float = 12.0) -> Atoms:
    """``n**3`` copies of a molecule in a periodic box (one copy per ``spacing`` A cube)."""
    cell = atoms.copy()
    cell.cell = [spacing] * 3
    cell.pbc = True
    return cell.repeat((n, n, n))


def cpu_seconds(
    calc: UncertaintyCalculator, atoms: Atoms, props: Sequence[str], reps: int
) -> float:
    """Median CPU seconds of asking ``props`` in order, each repetition on a new structure."""
    times = []
    for _ in range(reps + 2):
        atoms.positions += 1e-4
        atoms.calc = calc
        start = time.process_time()
        for name in props:
            calc.get_property(name, atoms)
        times.append(time.process_time() - start)
    return float(np.median(times[2:]))


def measure(model: str, structures: dict[str, tuple[Atoms, int]]) -> list[dict]:
    """One row per structure: E+F milliseconds and each case's ratio to it."""
    rows = []
    for name, (atoms, reps) in structures.items():
        base = cpu_seconds(
            UncertaintyCalculator(model, uncertainty="none"), atoms, ["forces"], reps
        )
        row: dict = {"structure": name, "atoms": len(atoms), "ef_ms": round(base * 1e3, 2)}
        for case, (mode, props) in CASES.items():
            calc = UncertaintyCalculator(model, uncertainty=mode)
            row[case] = round(cpu_seconds(calc, atoms, props, reps) / base, 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a potential checkpoint (model.pt)")
    parser.add_argument("--label", required=True, help="name of the code version measured")
    parser.add_argument("--out", type=Path, required=True, help="JSONL to append the run to")
    parser.add_argument("--data-root", type=Path, default=None)
    parser.add_argument("--reps", type=int, default=40, help="calls per case (27 atoms)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    root = args.data_root or Path(os.environ.get("MLIP_UNC_DATA", "../shared/data"))
    molecule = read(root / "structures" / "3BPA" / "train_300K.xyz", 0)
    structures = {
        "3bpa": (molecule.copy(), args.reps),
        "3bpa_box27": (box_of_copies(molecule, 3), max(3, args.reps // 5)),
    }
    rows = measure(args.model, structures)
    record = {
        "label": args.label,
        "mlip_unc": str(Path(mlip_unc.__file__).parent),
        "model": args.model,
        "threads": 1,
        "rows": rows,
        **environment(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    append_jsonl(args.out, record)


if __name__ == "__main__":
    main()
