"""Force uncertainty at size: boxes of independent molecules and large crystal cells.

The part ``size`` of the force_uncertainty suite (``python -m benchmarks.force_uncertainty
--part size``; this module's own entry point takes the same flags). One model per set, trained
here under the wall budget ``--budget-minutes`` with the shipped config on the suite's training
split (:func:`benchmarks.common.force_frames.dataset_split`): configs/3bpa_equivariant.yaml on 400
frames of train_300K, configs/ethanol_equivariant.yaml on rMD17 ethanol train.xyz,
configs/mlearn_equivariant.yaml on mlearn's Si training set.

Molecules (3BPA: train_mixedT.xyz less the repeats of train_300K; ethanol: test_MD.xyz), in file
order, each centred on a point of a cubic grid in a periodic box of ``k^3`` molecules (``--boxes
27:12,343:1``: twelve boxes of 27, one of 343). The grid spacing is the largest molecular
diameter + r_max + 1 A, so two atoms of different molecules (periodic images too) are at least
r_max + 1 A apart: no edge of the model's graph joins two molecules and each keeps its DFT forces.
Crystal (Si): diamond supercells of ``n^3`` conventional cells (``--si-repeats 3,5``: 216 and
1,000 atoms) from Langevin MD driven by the mlearn SNAP potential (``--si-temperatures
300,1200`` K; :func:`benchmarks.active_learning.reference_sets_si.md_frames`: 1 fs steps, friction
0.02 / fs, ``--si-equilibration`` steps discarded, then ``--si-frames`` frames ``--si-stride``
steps apart), labelled by SNAP (:func:`mlip_unc.active.oracles.snap_oracle`). LAMMPS lives in
another environment (``--snap-python``), which writes the cells to ``--cells-cache`` (outside the
repository); their SHA-256 is recorded.

Rows: ``md_default`` is what ``mlip-unc md`` runs: ``UncertaintyCalculator(payload)`` with its
default mode and on-demand force uncertainties, the integrator's ``get_forces()`` first and
``max_force_std`` on the same structure after (lowrank on the kept forward pass at every size);
``auto``, ``lowrank``, ``sketch``: the calculator in that mode, everything in one pass;
``one_at_a_time``: each molecule alone (its file frame), the md_default path. Columns (every atom
of every box of a row): ``spearman_atom`` = Spearman(sigma_F, |F_pred - F_true|) over atoms with
sigma_F = sqrt(sum_c epistemic Var F_ac); ``spearman_atom_std``: its bootstrap std over resampled
molecules (crystal: atoms); ``spearman_molecule``: per molecule the largest sigma_F against the
largest |dF|; ``std_over_rmse``: sqrt(mean epistemic Var F) / RMSE per component (the suite's
column); ``total_std_over_rmse``: the same with the model's noise variance added; force MAE per
component; CPU seconds of the row. Acceptance per box or cell size: |spearman_atom(md_default) -
spearman_atom(lowrank)| <= 0.02 and std_over_rmse(md_default) in [0.67, 1.5].

Records: ``OUT/force_uncertainty_size.jsonl`` (one step per line: settings, training, cells, one
line per row; a step on file is not made again), ``OUT/force_uncertainty_size.json`` (rows and
acceptance) and the section "Quality at size" of ``OUT/force_uncertainty.md``.

    python -m benchmarks.force_uncertainty --part size --budget-minutes 10 --threads 1
    python -m benchmarks.force_uncertainty --part size --quick --out /tmp/fu_size  # EMT Cu, seconds
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ase.io
import numpy as np
import torch
from ase import Atoms

from benchmarks import force_uncertainty as fu
from benchmarks.common import force_frames as ff
from benchmarks.common.format import fmt2, fmt3
from benchmarks.common.pages import environment
from mlip_unc import keys
from mlip_unc.train.text_files import json_safe
from mlip_unc.uncertainty import diagnostics as diag
from mlip_unc.uncertainty.calibration import spearman_corr

log = logging.getLogger("force_uncertainty_size")
JSONL, JSON = "force_uncertainty_size.jsonl", "force_uncertainty_size.json"
SETS = ("3bpa", "ethanol", "si")
QUICK_SETS = ("cu_clusters", "cu_crystal")  # --quick: EMT Cu made here
ROWS = ("md_default", "auto", "lowrank", "sketch", "one_at_a_time")
CRYSTAL_ROWS = ROWS[:-1]  # no molecules to take one at a time
SPEARMAN_SLACK = 0.02  # |md_default - lowrank| per-atom Spearman
STD_RANGE = (0.67, 1.5)  # std_over_rmse of md_default
SPACING_MARGIN = 1.0  # A beyond r_max between atoms of different molecules
COLUMNS = (
    "spearman_atom",
    "spearman_atom_std",
    "spearman_molecule",
    "std_over_rmse",
    "total_std_over_rmse",
    "force_mae_meV_A",
    "cpu_s",
)
CRYSTALS = {  # set -> (element, structure, lattice A, oracle)
    "si": ("Si", "diamond", 5.47, {"name": "snap", "element": "Si"}),  # reference_sets_si.LATTICE
    "cu_crystal": ("Cu", "fcc", 3.6, "emt"),
}
DEFAULT_CACHE = (
    Path(os.environ.get("MLIP_UNC_CACHE", "~/.cache/mlip_unc")).expanduser()
    / "force_uncertainty_size"
)


@dataclass(frozen=True)
class Block:
    """One measured configuration: a set at one box (cell) size, temperature for crystals."""

    set: str
    atoms_per_box: int  # filled in once the structures are known (0 before)
    per_box: int  # molecules per box; crystal: conventional cells per side
    n_boxes: int  # boxes; crystal: frames
    temperature_k: float | None = None

    @property
    def key(self) -> str:
        t = f":{self.temperature_k:g}K" if self.temperature_k is not None else ""
        return f"{self.set}:{self.per_box}x{self.n_boxes}{t}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("size",), default="size", help=argparse.SUPPRESS)
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument(
        "--budget-minutes", type=float, default=None, help="wall time per model (10; quick: 1/6)"
    )
    p.add_argument(
        "--epochs",
        default="",
        help="SET=N,...: those models train N epochs on the epoch clock (the cosine schedule "
        "follows epochs, not the wall: a loaded machine gets the same model), --budget-minutes "
        "then only caps the run",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, split, MD and bootstrap")
    p.add_argument("--boxes", default=None, help="molecules per box:boxes, ... (27:12,343:1)")
    p.add_argument("--si-repeats", default=None, help="conventional cells per side (3,5)")
    p.add_argument("--si-temperatures", default=None, help="K (300,1200)")
    p.add_argument("--si-frames", type=int, default=None, help="frames per cell (4)")
    p.add_argument("--si-equilibration", type=int, default=None, help="MD steps discarded (300)")
    p.add_argument("--si-stride", type=int, default=None, help="MD steps between frames (50)")
    p.add_argument("--bootstrap", type=int, default=200, help="resamples of spearman_atom_std")
    p.add_argument(
        "--snap-python",
        type=Path,
        default=ff.REPO / ".venv-mace" / "bin" / "python",
        help="interpreter with LAMMPS that makes the Si cells",
    )
    p.add_argument("--cells-cache", type=Path, default=DEFAULT_CACHE, help="where cells are kept")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override, all models"
    )
    p.add_argument("--report-only", action="store_true", help="rewrite the page from the JSON")
    p.add_argument("--make-cells", type=Path, default=None, help=argparse.SUPPRESS)  # subprocess
    p.add_argument("--crystal", default="si", help=argparse.SUPPRESS)
    args = ff.parse_with_quick(p, argv, "tiny EMT Cu clusters and cells made here; needs --out")
    quick = args.quick
    defaults = {  # (full, quick)
        "boxes": ("27:12,343:1", "8:2,27:1"),
        "si_repeats": ("3,5", "1,2"),
        "si_temperatures": ("300,1200", "300"),
        "si_frames": (4, 2),
        "si_equilibration": (300, 5),
        "si_stride": (50, 5),
    }
    for name, pair in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, pair[quick])
    args.sets = (
        list(QUICK_SETS) if quick else [s.strip().lower() for s in args.sets.split(",") if s]
    )
    if bad := [s for s in args.sets if s not in (*SETS, *QUICK_SETS)]:
        p.error(f"unknown set(s) {bad}; choose from {SETS}")
    args.box_list = [tuple(int(x) for x in b.split(":")) for b in args.boxes.split(",") if b]
    for per_box, _ in args.box_list:
        if round(per_box ** (1 / 3)) ** 3 != per_box:
            p.error(f"--boxes: {per_box} molecules do not fill a cubic grid")
    args.repeat_list = [int(x) for x in str(args.si_repeats).split(",") if x]
    args.temperature_list = [float(x) for x in str(args.si_temperatures).split(",") if x]
    args.budget_minutes = args.budget_minutes or (10.0 / 60.0 if quick else 10.0)
    args.epoch_map = {
        k.strip().lower(): int(v) for k, v in (x.split("=") for x in args.epochs.split(",") if x)
    }
    return args


def model_name(set_name: str) -> str:
    """The model that a set is measured with (one Cu model serves both quick sets)."""
    return "cu_emt" if set_name in QUICK_SETS else set_name


def training_split(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The suite's split for a molecular set (and the quick Cu); Si: mlearn's training set."""
    if name != "si":
        return ff.dataset_split(name, args, work)
    return {
        "config": ff.REPO / "configs" / "mlearn_equivariant.yaml",
        "overrides": [],
        "energy_key": "energy",
        "forces_key": "forces",
        "train": args.data_root / "structures" / "mlearn" / "Si" / "training.json",
        "test": None,
        "ood": None,
    }


def cu_clusters(n: int, seed: int) -> list[Atoms]:
    """``n`` rattled Cu4 tetrahedra labelled by EMT (the quick run's molecules)."""
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator

    edge = 2.55
    base = edge * np.array([[0, 0, 0], [1, 0, 0], [0.5, 0.866, 0], [0.5, 0.289, 0.816]])  # (4, 3)
    out = []
    for k in range(n):
        atoms = Atoms("Cu4", positions=base)
        atoms.rattle(0.15, seed=seed + k)
        atoms.calc = EMT()
        energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
        out.append(atoms)
    return out


def molecules(set_name: str, split: dict[str, Any], n: int, seed: int) -> list[Atoms]:
    """The first ``n`` molecules of the set's held-out file, each with its reference forces."""
    if set_name == "cu_clusters":
        return cu_clusters(n, seed)
    path = split["ood"] if set_name == "3bpa" else split["test"]
    frames = ase.io.read(path, index=f":{n}")
    if len(frames) < n:
        raise SystemExit(f"{path}: {len(frames)} frames, {n} needed")
    return frames


def spacing(mols: list[Atoms], r_max: float) -> float:
    """Grid spacing (A): the largest molecular diameter (about the centroid) + r_max + margin."""
    radius = max(
        float(np.linalg.norm(m.positions - m.positions.mean(0), axis=1).max()) for m in mols
    )
    return 2.0 * radius + r_max + SPACING_MARGIN


def box(mols: list[Atoms], step: float) -> Atoms:
    """The molecules centred on a cubic grid of ``step`` A in a periodic cube, in order."""
    side = round(len(mols) ** (1 / 3))
    grid = (np.indices((side,) * 3).reshape(3, -1).T + 0.5) * step  # (side^3, 3)
    numbers = np.concatenate([m.numbers for m in mols])
    positions = np.concatenate(
        [m.positions - m.positions.mean(0) + centre for m, centre in zip(mols, grid, strict=True)]
    )  # (n_atoms, 3)
    return Atoms(numbers, positions=positions, cell=np.eye(3) * side * step, pbc=True)


def crystal_cells(
    set_name: str,
    repeat: int,
    temperature_k: float,
    *,
    n_frames: int,
    equilibration: int,
    stride: int,
    seed: int,
) -> list[Atoms]:
    """Frames of oracle-driven Langevin MD of the ``repeat^3`` conventional supercell, labelled
    by the oracle (reference_sets_si.md_frames)."""
    from ase.build import bulk

    from benchmarks.active_learning.reference_sets_si import Settings, md_frames
    from mlip_unc.active.oracles import make_oracle

    element, structure, lattice, oracle = CRYSTALS[set_name]
    start = bulk(element, structure, a=lattice, cubic=True) * (repeat, repeat, repeat)
    calc = make_oracle(oracle)
    frames = md_frames(
        start,
        calc,
        temperature_k,
        Settings(stride=stride, seed=seed),
        n_frames=n_frames,
        equilibration=equilibration,
        seed=seed,
    )
    return list(frames)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cells(block: Block, args: argparse.Namespace, steps: ff.Steps) -> list[Atoms]:
    """The block's labelled crystal frames: from the cache when its SHA-256 matches the record,
    else made (Si: by ``--snap-python``, which has LAMMPS) and recorded."""
    seed = args.seed + int(block.temperature_k or 0) + block.per_box
    step = f"cells:{block.key}"
    path = (
        args.cells_cache
        / f"{block.set}_{block.per_box}x{block.n_boxes}_{block.temperature_k:g}K_s{seed}.xyz"
    )
    record = steps.get(step)
    if record and path.is_file() and sha256(path) == record["sha256"]:
        return ase.io.read(path, index=":")
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "n_frames": block.n_boxes,
        "equilibration": args.si_equilibration,
        "stride": args.si_stride,
        "seed": seed,
    }
    start = time.time()
    if block.set == "si":
        command = [
            str(args.snap_python),
            "-m",
            "benchmarks.force_uncertainty_size",
            "--make-cells",
            str(path),
            "--crystal",
            block.set,
            "--si-repeats",
            str(block.per_box),
            "--si-temperatures",
            f"{block.temperature_k:g}",
            "--si-frames",
            str(block.n_boxes),
            "--si-equilibration",
            str(args.si_equilibration),
            "--si-stride",
            str(args.si_stride),
            "--seed",
            str(seed),
            "--out",
            str(args.out),
        ]
        log.info("[cells] %s: %s", block.key, shlex.join(command))
        subprocess.run(command, check=True, cwd=ff.REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    else:
        frames = crystal_cells(
            block.set, block.per_box, float(block.temperature_k or 0), **{**settings}
        )
        ase.io.write(path, frames, format="extxyz")
    frames = ase.io.read(path, index=":")
    steps.add(
        step,
        {
            "path": str(path),
            "sha256": sha256(path),
            "atoms": len(frames[0]),
            "wall_s": time.time() - start,
            **settings,
        },
    )
    return frames


def evaluate(
    payload: dict[str, Any], structures: list[Atoms], row: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Predicted forces, epistemic and total force variances (each ``(n_atoms, 3)``, the
    structures' atoms in order) of one row, and how it ran. One calculator for all structures
    (as one md run keeps one)."""
    from mlip_unc.calculator import UncertaintyCalculator
    from mlip_unc.models.full_posterior import auto_keeps_lowrank

    md_path = row in ("md_default", "one_at_a_time")
    calc = (
        UncertaintyCalculator(payload)  # mlip-unc md: the default mode, on demand
        if md_path
        else UncertaintyCalculator(payload, uncertainty=row, on_demand=False)
    )
    forces, var, total, ran = [], [], [], set()
    for structure in structures:
        atoms = structure.copy()  # the reference labels stay on `structure`
        atoms.calc = calc
        calls = (calc.n_model_calls, calc.n_uncertainty_calls)
        forces.append(atoms.get_forces())  # (n, 3): what an integrator asks for
        if md_path:
            calc.get_property(keys.CALC_MAX_FORCE_STD, atoms)  # what the md monitor asks for next
        var.append(calc.get_property("forces_epistemic_var", atoms))  # (n, 3), from the cache
        total.append(calc.get_property("forces_var", atoms))  # (n, 3)
        passes = (calc.n_model_calls - calls[0], calc.n_uncertainty_calls - calls[1])
        mode = calc.uncertainty
        if md_path and calc.on_demand:
            mode = "lowrank" if mode == "auto" else mode  # calculator._add_force_uncertainty
        elif mode == "auto":
            keeps = auto_keeps_lowrank(len(atoms), int(calc.model.posterior_rank))
            mode = "lowrank" if keeps else "sketch"
        ran.add(f"{mode} ({'on demand' if passes[1] else 'one pass'})")
    info = {"calculator_mode": calc.uncertainty, "on_demand": calc.on_demand, "ran": sorted(ran)}
    return np.concatenate(forces), np.concatenate(var), np.concatenate(total), info


def bootstrap_std(
    sigma: np.ndarray, error: np.ndarray, units: np.ndarray, resamples: int, seed: int
) -> float | None:
    """Std of Spearman(sigma, error) over ``resamples`` draws of whole units (``units (n,)``:
    each atom's molecule, all of one size; or one unit per atom)."""
    if resamples < 2:
        return None
    counts = np.bincount(units)
    if np.any(counts != counts[0]):
        raise ValueError("bootstrap units must be of one size")
    members = np.argsort(units, kind="stable").reshape(counts.size, counts[0])  # (units, size)
    draws = np.random.default_rng(seed).integers(0, counts.size, (resamples, counts.size))
    idx = members[draws].reshape(resamples, -1)  # (resamples, n)
    rho = ff._row_rank_corr(sigma[idx], error[idx])
    return float(np.nanstd(rho))


def row_values(
    pred: np.ndarray,
    true: np.ndarray,
    var: np.ndarray,
    total: np.ndarray,
    molecule: np.ndarray | None,
    resamples: int,
    seed: int,
) -> dict[str, Any]:
    """The row's columns from forces and variances ``(n_atoms, 3)``; ``molecule (n_atoms,)``:
    each atom's molecule (None: a crystal, no per-molecule column, atoms resampled)."""
    err = pred - true  # (n, 3)
    sigma, abs_err = np.sqrt(var.sum(1)), np.linalg.norm(err, axis=1)  # (n,) each
    out: dict[str, Any] = {"spearman_atom": spearman_corr(sigma, abs_err, nan_policy="omit")}
    units = np.arange(len(sigma)) if molecule is None else molecule
    out["spearman_atom_std"] = bootstrap_std(sigma, abs_err, units, resamples, seed)
    if molecule is not None:
        top_sigma, top_err = (np.full(molecule.max() + 1, -np.inf) for _ in range(2))
        np.maximum.at(top_sigma, molecule, sigma)
        np.maximum.at(top_err, molecule, abs_err)
        out["spearman_molecule"] = spearman_corr(top_sigma, top_err, nan_policy="omit")
    else:
        out["spearman_molecule"] = None
    out["std_over_rmse"] = diag.std_over_rmse(var, err)
    out["total_std_over_rmse"] = diag.std_over_rmse(total, err)
    out["force_mae_meV_A"] = 1e3 * float(np.mean(np.abs(err)))
    return out


def blocks(set_name: str, args: argparse.Namespace) -> list[Block]:
    if set_name in CRYSTALS:
        return [
            Block(set_name, 0, r, args.si_frames, t)
            for r in args.repeat_list
            for t in args.temperature_list
        ]
    return [Block(set_name, 0, per_box, n) for per_box, n in args.box_list]


def run_set(set_name: str, args: argparse.Namespace, steps: ff.Steps, work: Path) -> None:
    """Train the set's model (once), then every block's rows not yet on file."""
    from mlip_unc.models.checkpoint import load_checkpoint
    from mlip_unc.models.potential import BayesianPotential

    name = model_name(set_name)
    todo = [
        (b, row)
        for b in blocks(set_name, args)
        for row in (CRYSTAL_ROWS if set_name in CRYSTALS else ROWS)
        if not steps.get(f"row:{b.key}:{row}")
    ]
    if not todo:
        return
    split = training_split(name, args, work)
    if epochs := args.epoch_map.get(name):
        split["overrides"] = [
            *split["overrides"],
            f"train.epochs={epochs}",
            "train.schedule_clock=epochs",
        ]
    folder = ff.train(name, split, args, steps, 1, folder="force_uncertainty_size")
    payload = load_checkpoint(folder / "model.pt", kind="potential")
    r_max = float(BayesianPotential.from_checkpoint(dict(payload)).r_max)
    for block in dict.fromkeys(b for b, _ in todo):
        rows = [row for b, row in todo if b == block]
        if set_name in CRYSTALS:
            structures = cells(block, args, steps)
            molecule, units = None, structures
        else:
            mols = molecules(set_name, split, block.per_box * block.n_boxes, args.seed)
            step = spacing(mols, r_max)
            structures = [
                box(mols[k : k + block.per_box], step) for k in range(0, len(mols), block.per_box)
            ]
            molecule = np.repeat(np.arange(len(mols)), [len(m) for m in mols])  # (n_atoms,)
            units = mols
        true = np.concatenate([s.get_forces() for s in units])  # (n_atoms, 3) reference
        for row in rows:
            log.info("[size] %s %s", block.key, row)
            start = time.process_time()
            pred, var, total, info = evaluate(
                payload, units if row == "one_at_a_time" else structures, row
            )
            values = row_values(pred, true, var, total, molecule, args.bootstrap, args.seed)
            steps.add(
                f"row:{block.key}:{row}",
                {
                    "set": set_name,
                    "row": row,
                    "block": block.key,
                    "atoms_per_box": len(structures[0]),
                    "boxes": len(structures),
                    "molecules": None if molecule is None else len(units),
                    "temperature_K": block.temperature_k,
                    "atoms": len(true),
                    **values,
                    "cpu_s": time.process_time() - start,
                    **info,
                    "spacing_A": None if molecule is None else step,
                    "load_avg": environment()["load_avg"],
                },
            )


def acceptance(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per block: the md default's per-atom Spearman against lowrank's (within SPEARMAN_SLACK)
    and its std_over_rmse (in STD_RANGE)."""
    out = []
    for block in dict.fromkeys(r["block"] for r in rows):
        by_row = {r["row"]: r for r in rows if r["block"] == block}
        md, low = by_row.get("md_default"), by_row.get("lowrank")
        if md is None or low is None:
            continue
        gap = abs(md["spearman_atom"] - low["spearman_atom"])
        ratio = md["std_over_rmse"]
        std_miss = max(0.0, STD_RANGE[0] - ratio, ratio - STD_RANGE[1])
        out.append(
            {
                "block": block,
                "set": md["set"],
                "atoms_per_box": md["atoms_per_box"],
                "temperature_K": md["temperature_K"],
                "spearman_gap": gap,
                "spearman_met": gap <= SPEARMAN_SLACK,
                "std_over_rmse": ratio,
                "std_missed_by": std_miss,
                "std_met": std_miss == 0.0,
            }
        )
    return out


def assemble(steps: ff.Steps, args: argparse.Namespace, status: str) -> dict[str, Any]:
    settings = steps.get("settings") or {}
    wanted = {f"{b.key}" for s in args.sets for b in blocks(s, args)}
    rows = [
        {k: v for k, v in r.items() if k not in ("line",)}
        for step, r in steps.records.items()
        if step.startswith("row:") and r["block"] in wanted
    ]
    order = {s: k for k, s in enumerate(args.sets)}
    rows.sort(
        key=lambda r: (
            order.get(r["set"], 99),
            r["atoms_per_box"],
            r["temperature_K"] or 0,
            ROWS.index(r["row"]),
        )
    )
    meta = {k: settings.get(k) for k in ("command", "started", *ff.SETTINGS, "threads")}
    meta.update(
        status=status,
        updated=time.strftime("%Y-%m-%d %H:%M"),
        environment=environment(),
        commands=steps.commands,
        train_minutes={
            s.split(":")[1]: r["train_minutes"]
            for s, r in steps.records.items()
            if s.startswith("train:")
        },
        cells={
            s.removeprefix("cells:"): {k: r[k] for k in ("sha256", "atoms", "wall_s", "n_frames")}
            for s, r in steps.records.items()
            if s.startswith("cells:")
        },
        si_md={
            "equilibration_steps": args.si_equilibration,
            "stride_steps": args.si_stride,
            "timestep_fs": 1.0,
            "friction_per_fs": 0.02,
        },
        bootstrap_resamples=args.bootstrap,
        epochs=settings.get("epochs") or {},
    )
    return json_safe({"meta": meta, "rows": rows, "acceptance": acceptance(rows)})


def size_section(folder: Path) -> list[str]:
    """The page's "Quality at size" section from ``folder/force_uncertainty_size.json`` (empty
    without it)."""
    path = folder / JSON
    if not path.is_file():
        return []
    results = json.loads(path.read_text())
    meta, rows = results["meta"], results["rows"]
    env = meta.get("environment") or {}
    loads = [r["load_avg"][0] for r in rows if r.get("load_avg")]
    lines = [
        "## Quality at size",
        "",
        "Boxes of independent molecules (each keeps its DFT forces) and Si cells from SNAP-driven MD "
        "labelled by SNAP; one model per set. md_default = what `mlip-unc md` runs (the calculator's "
        "default, force sigma on demand after get_forces: lowrank); one_at_a_time = each molecule "
        "alone, the same path. rho = Spearman(sigma_F, |dF|) per atom (± bootstrap std over "
        "molecules; Si: atoms) and per molecule (largest sigma vs largest |dF|); std/RMSE epistemic "
        "(total: with the model's noise). Definitions: benchmarks/force_uncertainty_size.py; "
        f"records: `{JSON}`, `{JSONL}`.",
        "",
        "| set | atoms per box | boxes (frames) | T (K) | row | ran | rho atom | rho molecule "
        "| std/RMSE | total std/RMSE | MAE meV/A | CPU s |",
        "|---" * 12 + "|",
    ]
    for r in rows:
        rho = fmt2(r["spearman_atom"]) + (
            f" ± {r['spearman_atom_std']:.2f}" if r.get("spearman_atom_std") is not None else ""
        )
        temperature = "" if r["temperature_K"] is None else f"{r['temperature_K']:g}"
        count = r["molecules"] if r["row"] == "one_at_a_time" else r["boxes"]
        lines.append(
            f"| {r['set']} | {r['atoms_per_box'] if r['row'] != 'one_at_a_time' else 'alone'} "
            f"| {count} | {temperature} | {r['row']} | {', '.join(r['ran'])} | {rho} "
            f"| {fmt2(r['spearman_molecule'])} | {fmt2(r['std_over_rmse'])} "
            f"| {fmt2(r['total_std_over_rmse'])} | {fmt2(r['force_mae_meV_A'])} | {r['cpu_s']:.0f} |"
        )
    lines += [
        "",
        f"Acceptance (md_default: per-atom rho within {SPEARMAN_SLACK} of lowrank; std/RMSE in "
        f"[{STD_RANGE[0]}, {STD_RANGE[1]}]):",
    ]
    for a in results["acceptance"]:
        t = "" if a["temperature_K"] is None else f", {a['temperature_K']:g} K"
        std = "met" if a["std_met"] else f"missed by {a['std_missed_by']:.2f}"
        lines.append(
            f"- {a['set']}, {a['atoms_per_box']} atoms{t}: |rho gap| {fmt3(a['spearman_gap'])} "
            f"({'met' if a['spearman_met'] else 'missed'}); std/RMSE {fmt3(a['std_over_rmse'])} ({std})"
        )
    cells = meta.get("cells") or {}
    md = meta.get("si_md") or {}
    epochs = meta.get("epochs") or {}
    train = ", ".join(
        (f"{k} {epochs[k]} epochs in {v[0]:.1f} min" if k in epochs else f"{k} {v[0]:.1f} min")
        for k, v in (meta.get("train_minutes") or {}).items()
    )
    cmds = meta.get("commands") or [meta.get("command")]
    lines += [
        "",
        f"Run: `{cmds[-1]}`"
        + (f" ({len(cmds)} invocations, first `{cmds[0]}`)" if len(cmds) > 1 else "")
        + f"; status {meta['status']}, started {meta['started']}, updated {meta['updated']}; "
        f"{env.get('machine')}; load average (1 min) at the rows "
        + (f"{min(loads):.2f}-{max(loads):.2f}" if loads else "n/a")
        + f"; training (epoch clock where epochs are given; wall minutes on the shared CPU) "
        f"{train or 'n/a'}; {meta['threads']} thread(s); versions in `{JSON}`. "
        f"Crystal MD: {md.get('timestep_fs')} fs steps, friction {md.get('friction_per_fs')} / fs, "
        f"{md.get('equilibration_steps')} steps discarded, frames {md.get('stride_steps')} steps apart; "
        f"{len(cells)} cell file(s) outside the repository, SHA-256 in `{JSON}`.",
    ]
    return lines


def save(steps: ff.Steps, args: argparse.Namespace, status: str) -> dict[str, Any]:
    results = assemble(steps, args, status)
    tmp = args.out / f".{JSON}.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    os.replace(tmp, args.out / JSON)
    write_page(args.out)
    return results


def write_page(out: Path) -> None:
    """Rewrite ``out/force_uncertainty.md``: the suite's page with this section, or this
    section alone when the suite's JSON is not there (a --quick folder)."""
    suite = out / "force_uncertainty.json"
    if suite.is_file():
        fu.write_markdown(json.loads(suite.read_text()), out / "force_uncertainty.md")
    else:
        text = ["# Force uncertainty: quality at size", "", *size_section(out)[2:]]
        (out / "force_uncertainty.md").write_text("\n".join(text) + "\n")


def make_cells_main(args: argparse.Namespace) -> None:
    """``--make-cells PATH``: the crystal frames of one cell size and temperature (run by the
    interpreter that has the oracle)."""
    frames = crystal_cells(
        args.crystal,
        args.repeat_list[0],
        args.temperature_list[0],
        n_frames=args.si_frames,
        equilibration=args.si_equilibration,
        stride=args.si_stride,
        seed=args.seed,
    )
    tmp = args.make_cells.with_suffix(".tmp.xyz")
    ase.io.write(tmp, frames, format="extxyz")
    os.replace(tmp, args.make_cells)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.make_cells is not None:
        make_cells_main(args)
        return {}
    if args.report_only:
        write_page(args.out)
        return json.loads((args.out / JSON).read_text())
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(
        [
            "python",
            "-m",
            "benchmarks.force_uncertainty",
            "--part",
            "size",
            *(sys.argv[1:] if argv is None else argv),
        ]
    )
    settings = {
        "command": command,
        "epochs": args.epoch_map,
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "quick": args.quick,
        "seed": args.seed,
        "budget_minutes": args.budget_minutes,
        "overrides": args.overrides,
        "threads": args.threads,
        "data_root": None if args.quick else str(args.data_root),
    }
    steps = ff.Steps(args.out / JSONL, settings)
    steps.note_command(command)
    with tempfile.TemporaryDirectory(prefix="mlip_unc_fu_size_") as work:
        for set_name in args.sets:
            run_set(set_name, args, steps, Path(work))
            save(steps, args, "partial")
    results = save(steps, args, "complete")
    log.info("results: %s", args.out / JSON)
    return results


if __name__ == "__main__":
    main()
