"""Speed: per-call cost of the ASE calculator, training throughput and peak memory.

1. Calculator: the median wall time of one ``calc.calculate(atoms, properties, all_changes)``
   (what ``atoms.get_forces()`` etc. run on a new geometry) after warm-up calls, ``--repeats``
   rounds in which every row of every (model, system) is called once, the order rotated from
   round to round, so that a drift of the machine's load hits all rows alike. Systems: ethanol
   (9 atoms), 3BPA (27 atoms: the first frame of ``3BPA/train_300K.xyz`` under ``--data-root``,
   else 3BPA embedded by RDKit) and fcc Cu 3x3x3 cubic cells (108 atoms, periodic). Rows: energy,
   E+F, E+F with the energy variance, the force-uncertainty modes exact / lowrank / sampled (4
   draws), E+F+stress (periodic only), a 5-member committee (E+F with sigma) and mace-torch's
   ``MACECalculator`` (E+F) when ``mace`` imports. Each row is also given as a ratio to E+F of
   the same model and system in the same run. Models: the native equivariant backbone with the
   sizes of ``configs/3bpa_equivariant.yaml`` and the GIN of ``configs/ethanol_gin.yaml``, with
   UNTRAINED weights and a random full posterior (the cost of a call does not depend on the
   weights' values); the MACE is an untrained mace-torch ``ScaleShiftMACE`` with the sizes of
   the accuracy benchmark's mace-torch row.
2. Training throughput: structures/s of the potential trainer (``Trainer.train_epoch`` of the
   training core on generated EMT-labelled molecules, each config's batch size) and
   molecules/s of the property trainer (GIN ``bgnn``, the paper-study sizes, on generated SMILES),
   after one warm-up epoch.
3. Peak memory: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of a fresh subprocess per
   section, read after its set-up (imports, model, structure) and after three calls of the
   section (or one training epoch); both are reported.

4. Part ``size`` (``--part size``, :mod:`benchmarks.speed.size_part`): in one process, our
   calculator in every uncertainty mode (both property orders), mace-torch's MACECalculator
   single and a 5-model committee, on molecules, a liquid and a crystal from about 10 to 10,000
   atoms, at each of ``--threads`` (e.g. ``1,all``); the floor of the method, MD throughput and
   per-row peak memory. Run it in ``.venv-mace`` (where mace-torch lives; elsewhere the mace
   rows are "not measured").
5. Part ``md`` (``--part md``, :mod:`benchmarks.speed.md_part`): steps/s of ASE Langevin MD,
   plain (``uncertainty="none"``) and monitored by the package's ``UncertaintyMonitor`` every
   10th and every step (the default mode), mace-torch plain and a 5-model committee read every
   10th step, at about 27, 1,000 and 10,000 atoms (``--kinds``, default molecules), at each of
   ``--threads``; run it in ``.venv-mace`` too. Its table goes to the top of speed.md.

Results: ``OUT/speed.json`` (one entry per part: ``main``, ``mace`` from ``--mace-only``,
``size``, merged into the same file) and ``OUT/speed.md``. ``--quick`` (< 30 s, for CI): tiny
models, small systems, 3 repeats, one memory probe (part size: 2 repeats, systems of <= 27 atoms).

    python -m benchmarks.speed --out benchmarks/results
    /work/venv_mace/bin/python -m benchmarks.speed --mace-only --out benchmarks/results
    .venv-mace/bin/python -m benchmarks.speed --part size --threads 1,all --out benchmarks/results
    .venv-mace/bin/python -m benchmarks.speed --part md --threads 1,2 --out benchmarks/results
    python -m benchmarks.speed --report-only   # rewrite speed.md from speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.tables import write_page
from benchmarks.speed import fixtures as setup
from benchmarks.speed import md_part, size_part, sizes
from mlip_unc.atomic_write import atomic_write_text

REPO = Path(__file__).resolve().parents[2]

STEM = "speed"
PARTS = ("main", "mace")
SIZE_PART = size_part.PART
MD_PART = md_part.PART
MULTI = (SIZE_PART, MD_PART)  # the parts that take several thread counts
STAGES = ("calls", "train", "memory")


# ================================================================ arguments
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default benchmarks/results; needed with --quick)",
    )
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument(
        "--threads",
        default="1",
        help="torch threads (also OMP_NUM_THREADS of the probes); parts size and md: a comma "
        "list, 'all' = every core, e.g. 1,all",
    )
    p.add_argument(
        "--part",
        choices=PARTS + MULTI,
        default=None,
        help="main (default), mace (= --mace-only), size: the calculator from 10 to 10,000 "
        "atoms, every mode, mace-torch, floor, MD, memory (benchmarks/speed/size_part.py), or "
        "md: MD steps/s, plain and monitored (benchmarks/speed/md_part.py)",
    )
    p.add_argument(
        "--kinds",
        default=None,
        help="parts size and md: which kinds of system (molecules, liquid, crystal; default: "
        "all for size, molecules for md)",
    )
    p.add_argument(
        "--max-atoms", type=int, default=None, help="parts size and md: leave out larger systems"
    )
    p.add_argument(
        "--max-call-s",
        type=float,
        default=60.0,
        help="part size: skip a row whose one call is predicted to take longer",
    )
    p.add_argument(
        "--row-budget-s",
        type=float,
        default=None,
        help="part size: fewer timed calls (>= 1) for a row beyond this many seconds (default "
        "5); part md: a row's timed seconds (default 12)",
    )
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 20; quick 3)")
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed calls per row first (default 3; quick 1)"
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny models and systems, < 30 s; needs --out"
    )
    p.add_argument(
        "--mace-only",
        action="store_true",
        help="part 'mace': the MACE rows and the native equivariant E+F beside them (needs mace-torch)",
    )
    p.add_argument(
        "--stages",
        default=",".join(STAGES),
        help="any of calls,train,memory; without 'calls' the part's calls are read from OUT/speed.json "
        "and the other stages are added to them (a resumed run)",
    )
    p.add_argument(
        "--probe", default=None, help=argparse.SUPPRESS
    )  # internal: one memory section as JSON
    p.add_argument(
        "--report-only", action="store_true", help="only rewrite OUT/speed.md from OUT/speed.json"
    )
    args = p.parse_args(argv)
    args.part = args.part or ("mace" if args.mace_only else "main")
    args.mace_only = args.part == "mace"
    args.thread_list = parse_threads(args.threads, p)
    if args.part not in MULTI and len(args.thread_list) > 1:
        p.error("--threads takes several values only with --part size or md")
    args.threads = args.thread_list[0]
    if args.kinds is None:
        args.kinds = ",".join(md_part.KINDS if args.part == MD_PART else sizes.KINDS)
    args.kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if not args.kinds or set(args.kinds) - set(sizes.KINDS):
        p.error(f"--kinds takes a comma-separated subset of {sizes.KINDS}")
    args.stages = [x.strip() for x in args.stages.split(",") if x.strip()]
    if not args.stages or set(args.stages) - set(STAGES):
        p.error(f"--stages takes a comma-separated subset of {STAGES}")
    if args.quick and args.out is None and args.probe is None:
        p.error("--quick writes to the folder given by --out")
    args.out = args.out or REPO / "benchmarks" / "results"
    if args.part == SIZE_PART:
        args.repeats = args.repeats or (2 if args.quick else 10)
    args.repeats = args.repeats or (3 if args.quick else 20)
    args.warmup = (1 if args.quick else 3) if args.warmup is None else args.warmup
    if args.data_root is None:
        args.data_root = Path(os.environ.get("MLIP_UNC_DATA") or REPO.parent / "shared" / "data")
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1, --warmup >= 0")
    return args


def parse_threads(text: str, p: argparse.ArgumentParser) -> list[int]:
    """``"1,all"`` -> ``[1, os.cpu_count()]`` (each >= 1, duplicates dropped)."""
    out: list[int] = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        n = (os.cpu_count() or 1) if item == "all" else int(item) if item.isdigit() else 0
        if n < 1:
            p.error(f"--threads: {item!r} is not a positive integer or 'all'")
        if n not in out:
            out.append(n)
    if not out:
        p.error("--threads needs a value")
    return out


# ================================================================ timing
class Row:
    """One timed call: ``fn()`` is one calculator call; grouped by (model, system)."""

    def __init__(
        self, model: str, system: str, n_atoms: int, row: str, fn: Callable[[], Any]
    ) -> None:
        self.model, self.system, self.n_atoms, self.row, self.fn = model, system, n_atoms, row, fn
        self.ms: list[float] = []

    @property
    def group(self) -> tuple[str, str]:
        return self.model, self.system


def time_rows(rows: list[Row], repeats: int, warmup: int) -> None:
    """``warmup`` calls of each row, then ``repeats`` rounds of one call per row (rotated order)."""
    for row in rows:
        for _ in range(warmup):
            row.fn()
    for r in range(repeats):
        shift = (r * 7) % len(
            rows
        )  # a rotation: each row meets other neighbours from round to round
        for row in rows[shift:] + rows[:shift]:
            start = time.perf_counter()
            row.fn()
            row.ms.append(1e3 * (time.perf_counter() - start))


def summarise(rows: list[Row], reference: str = "E+F") -> list[dict[str, Any]]:
    """Median ms per row, its ratio to the group's E+F (medians; and the median of per-round ratios)."""
    refs = {row.group: row for row in rows if row.row == reference}
    out = []
    for row in rows:
        ref = refs.get(row.group)
        med = statistics.median(row.ms)
        entry = {
            "model": row.model,
            "system": row.system,
            "n_atoms": row.n_atoms,
            "row": row.row,
            "ms_median": med,
            "ms_q25": float(np.percentile(row.ms, 25)),
            "ms_q75": float(np.percentile(row.ms, 75)),
            "repeats": len(row.ms),
            "ratio": None,
            "ratio_paired": None,
        }
        if ref is not None:
            entry["ratio"] = med / statistics.median(ref.ms)
            entry["ratio_paired"] = statistics.median(
                a / b for a, b in zip(row.ms, ref.ms, strict=False)
            )
        out.append(entry)
    return out


def calculator_rows(
    args: argparse.Namespace, systems: dict[str, Any], models: list[str]
) -> list[Row]:
    """Every (model, system, row) of the part as a :class:`Row`."""
    rows: list[Row] = []
    for model in models:
        for system, atoms in systems.items():
            for name, fn in setup.calls(
                model, atoms, quick=args.quick, mace_only=args.mace_only
            ).items():
                rows.append(Row(model, system, len(atoms), name, fn))
    return rows


# ================================================================ training throughput
def training(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    systems = setup.systems(args.data_root, quick=args.quick)
    with tempfile.TemporaryDirectory(prefix="mlip_unc_speed_") as work:
        for model, system in setup.train_cases(args.quick):
            trainer, n, batch = setup.potential_trainer(
                model, systems[system], Path(work), quick=args.quick
            )
            out.append(
                {
                    "trainer": "potential",
                    "model": model,
                    "data": setup.train_data_label(system, n),
                    "batch_size": batch,
                    "per_s": setup.throughput(trainer, n, epochs=1 if args.quick else 2),
                    "unit": "structures/s",
                }
            )
            print(
                f"[train] potential {model} {system}: {out[-1]['per_s']:.1f} structures/s",
                flush=True,
            )
        trainer, n, batch = setup.property_trainer(quick=args.quick)
        out.append(
            {
                "trainer": "property",
                "model": "gin_bgnn",
                "data": f"{n} generated SMILES",
                "batch_size": batch,
                "per_s": setup.throughput(trainer, n, epochs=1 if args.quick else 2),
                "unit": "molecules/s",
            }
        )
        print(f"[train] property gin: {out[-1]['per_s']:.1f} molecules/s", flush=True)
    return out


# ================================================================ memory (subprocess per section)
def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def probe(args: argparse.Namespace) -> None:
    """Child process: set up one section, read maxrss, run it, read maxrss again; print JSON."""
    kind, *rest = args.probe.split("/")
    if kind == "call":
        model, system, row = rest
        atoms = setup.systems(args.data_root, quick=args.quick)[system]
        fn = setup.calls(model, atoms, quick=args.quick, only=row)[row]
        before = _maxrss_mib()
        for _ in range(3):
            fn()
    else:  # train/potential/<model>/<system> or train/property
        work = Path(tempfile.mkdtemp(prefix="mlip_unc_speed_probe_"))
        if rest[0] == "potential":
            atoms = setup.systems(args.data_root, quick=args.quick)[rest[2]]
            trainer, _n, _ = setup.potential_trainer(rest[1], atoms, work, quick=args.quick)
        else:
            trainer, _n, _ = setup.property_trainer(quick=args.quick)
        before = _maxrss_mib()
        trainer.train_epoch()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"section": args.probe, "setup_mib": before, "peak_mib": _maxrss_mib()}))


def memory(args: argparse.Namespace, sections: list[str]) -> list[dict[str, Any]]:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    out = []
    for section in sections:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.speed",
            "--probe",
            section,
            "--threads",
            str(args.threads),
            "--data-root",
            str(args.data_root),
            *(["--quick"] if args.quick else []),
        ]
        done = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"memory probe {section} failed:\n{done.stderr[-2000:]}")
        rec = json.loads(done.stdout.strip().splitlines()[-1])
        rec["increase_mib"] = rec["peak_mib"] - rec["setup_mib"]
        out.append(rec)
        print(
            f"[memory] {section}: peak {rec['peak_mib']:.0f} MiB (+{rec['increase_mib']:.0f})",
            flush=True,
        )
    return out


MEMORY_ROWS = ("E+F", "E+F+exact", "E+F+lowrank", "committee5")


def memory_sections(args: argparse.Namespace, calls_done: list[dict[str, Any]]) -> list[str]:
    """Quick: one call. Else: E+F, exact, lowrank and the committee on the largest system, and
    the trainers on 3BPA-sized molecules (a probe costs a process start: seconds to a minute)."""
    rows = [(c["model"], c["system"], c["row"], c["n_atoms"]) for c in calls_done]
    if args.quick:
        return [f"call/{rows[0][0]}/{rows[0][1]}/E+F"]
    largest = max(n for *_, n in rows)
    calls = [f"call/{m}/{s}/{r}" for m, s, r, n in rows if n == largest and r in MEMORY_ROWS]
    if args.mace_only:
        return calls
    train = [f"train/potential/{m}/{s}" for m, s in setup.train_cases(False) if s == "3bpa_27"] + [
        "train/property"
    ]
    return calls + train


# ================================================================ results
def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def merge(path: Path, part: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Read ``path`` (if any), replace ``part``, return the whole (written by the caller)."""
    results: dict[str, Any] = {"parts": {}}
    if path.is_file():
        results = json.loads(path.read_text())
    results.setdefault("parts", {})[part] = entry
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.report_only:
        results = json.loads((args.out / f"{STEM}.json").read_text())
        write_page(args.out / f"{STEM}.md", setup.render(results), setup.tables(results))
        return results
    torch.set_num_threads(args.threads)
    if args.probe:
        probe(args)
        return {}
    part = args.part
    command = shlex.join(
        ["python", "-m", "benchmarks.speed", *(sys.argv[1:] if argv is None else argv)]
    )
    if part == SIZE_PART:
        return run_size(args, command)
    if part == MD_PART:
        return run_md(args, command)
    stage_log = {
        "command": command,
        "python": sys.executable,
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "load_avg_start": load_avg(),
        "stages": args.stages,
    }
    if "calls" in args.stages:
        entry = run_calls(args, command)
    else:  # resumed: the calls of an earlier invocation of this part
        previous = (
            json.loads((args.out / f"{STEM}.json").read_text())["parts"]
            if (args.out / f"{STEM}.json").is_file()
            else {}
        )
        if part not in previous:
            raise SystemExit(
                f"--stages without 'calls' needs part {part!r} in {args.out / STEM}.json"
            )
        entry = previous[part]
    entry["meta"].setdefault("invocations", []).append(stage_log)
    save(
        args,
        part,
        entry,
        stage_log,
        status="calls done" if "calls" in args.stages else entry["meta"]["status"],
    )
    if "train" in args.stages and not args.mace_only:
        entry["training"] = training(args)
        save(args, part, entry, stage_log, status="training done")
    if "memory" in args.stages:
        entry["memory"] = []
        for section in memory_sections(args, entry["calls"]):  # saved after each probe
            entry["memory"] += memory(args, [section])
            save(args, part, entry, stage_log, status="memory running")
    results = save(args, part, entry, stage_log, status="complete")
    print(f"results: {args.out / STEM}.md", flush=True)
    return results


def run_calls(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The calculator stage: every row timed, interleaved; the part's entry."""
    meta = {
        "command": command,
        "python": sys.executable,
        "quick": args.quick,
        "threads": args.threads,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "load_avg_start": load_avg(),
        "versions": setup.versions(),
        "cpu": platform.processor() or platform.machine(),
        "weights": "untrained (random init, random full posterior)",
        "skipped": {},
    }
    systems = setup.systems(args.data_root, quick=args.quick)
    meta["systems"] = {
        name: setup.describe(name, atoms, args.data_root, args.quick)
        for name, atoms in systems.items()
    }
    models = setup.models_for(args.quick, mace_only=args.mace_only)
    if not setup.mace_available():
        if args.mace_only:
            raise SystemExit("--mace-only needs mace-torch (`pip install mlip-unc[mace]`)")
        meta["skipped"]["mace"] = (
            "mace-torch not importable in this Python (run --mace-only in an env with it)"
        )
    rows = calculator_rows(args, systems, models)
    print(f"[calc] {len(rows)} rows x {args.repeats} rounds", flush=True)
    time_rows(rows, args.repeats, args.warmup)
    meta.update(load_avg_end=load_avg(), finished=time.strftime("%Y-%m-%d %H:%M"))
    return {"meta": meta, "calls": summarise(rows)}


def size_settings(args: argparse.Namespace) -> size_part.Settings:
    """The size part's settings from the command line (quick: short budgets)."""
    return size_part.Settings(
        threads=tuple(args.thread_list),
        kinds=args.kinds,
        max_atoms=args.max_atoms,
        repeats=args.repeats,
        row_budget_s=args.row_budget_s or (0.5 if args.quick else 5.0),
        max_call_s=args.max_call_s,
        md_budget_s=0.5 if args.quick else 3.0,
        md_max_steps=5 if args.quick else 20,
        first_warmup=1 if args.quick else 2,
        quick=args.quick,
    )


def saver(args: argparse.Namespace, part: str) -> Callable[[dict[str, Any]], None]:
    """``save(entry)``: merge ``entry`` as ``part`` into OUT/speed.json, rewrite speed.md."""

    def save_entry(entry: dict[str, Any]) -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        results = merge(args.out / f"{STEM}.json", part, entry)
        atomic_write_text(args.out / f"{STEM}.json", json.dumps(results, indent=1))
        write_page(args.out / f"{STEM}.md", setup.render(results), setup.tables(results))

    return save_entry


def run_size(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Part ``size``: measured, merged into OUT/speed.json and speed.md after every system."""
    size_part.run(size_settings(args), args.data_root, command, saver(args, SIZE_PART))
    print(f"results: {args.out / STEM}.md", flush=True)
    return json.loads((args.out / f"{STEM}.json").read_text())


def md_settings(args: argparse.Namespace) -> md_part.Settings:
    """The md part's settings from the command line (quick: one chunk a row, tiny budgets)."""
    return md_part.Settings(
        threads=tuple(args.thread_list),
        kinds=args.kinds,
        max_atoms=args.max_atoms,
        row_budget_s=args.row_budget_s or (0.2 if args.quick else 12.0),
        min_chunks=1 if args.quick else 2,
        max_chunks=2 if args.quick else 40,
        warmup_steps=1 if args.quick else 2,
        quick=args.quick,
    )


def run_md(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Part ``md``: measured, merged into OUT/speed.json and speed.md after every system."""
    md_part.run(md_settings(args), args.data_root, command, saver(args, MD_PART))
    print(f"results: {args.out / STEM}.md", flush=True)
    return json.loads((args.out / f"{STEM}.json").read_text())


def save(
    args: argparse.Namespace,
    part: str,
    entry: dict[str, Any],
    stage_log: dict[str, Any],
    *,
    status: str,
) -> dict[str, Any]:
    """Merge ``entry`` as ``part`` into OUT/speed.json and rewrite speed.md (after every stage)."""
    entry["meta"]["status"] = status
    stage_log.update(load_avg_end=load_avg(), finished=time.strftime("%Y-%m-%d %H:%M"))
    args.out.mkdir(parents=True, exist_ok=True)
    results = merge(args.out / f"{STEM}.json", part, entry)
    atomic_write_text(args.out / f"{STEM}.json", json.dumps(results, indent=1))
    write_page(args.out / f"{STEM}.md", setup.render(results), setup.tables(results))
    return results


if __name__ == "__main__":
    main()
