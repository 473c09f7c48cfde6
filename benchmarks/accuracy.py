"""Accuracy at MACE's level: this project's potentials beside mace-torch's own MACE,
each trained for the same wall-time budget on one thread, on the same files.

Datasets (``--data-root``): ethanol (train.xyz -> test_MD.xyz); 3BPA (400 of train_300K -> the
other 100, split of benchmarks/force_uncertainty.py; the same models also on train_mixedT less
its frames repeated from train_300K, reported as ``3BPA_mixedT``); solvent_xtb (train_200 ->
test, xTB keys, isolated atoms in the training file); mlearn Si, Ge, Li (training.json ->
test.json, read directly, with stress). Rows:

- ``native``: configs/<set>_equivariant.yaml (<set>: ethanol, 3bpa, solvent_xtb, mlearn);
- ``gin``: configs/<set>_gin.yaml, else the native config with the model section of
  configs/ethanol_gin.yaml;
- ``mace_backbone``: configs/<set>_mace.yaml, else the native config with the model section of
  configs/ethanol_mace.yaml (mace-torch's blocks under this project's Bayesian head and trainer);
- ``mace_torch``: mace-torch's MACE trained by its own CLI (``mace_run_train`` beside the running
  python; 32 channels, max_L 1, max_ell 3, correlation 3, 2 interactions, r_max and batch size
  of the native config, lr 0.01, EMA 0.99, its default loss weights, E0s from isolated atoms
  where the data has them, else ``average``). Budget: the CLI has no wall-time limit, so it
  runs with an unreachable max_num_epochs; ``--budget-minutes`` after it logs "Started
  training" (our trainer's clock also starts after data preparation) the epoch in progress is
  let finish, then the process is stopped (SIGTERM; train_minutes is the time to that epoch's
  validation, so up to one epoch over the budget, in the peer's favour); mace keeps one
  checkpoint, written whenever the validation loss improves (EMA weights), and a second call
  with ``--restart_latest --max_num_epochs <that epoch>`` loads it, trains no further and
  saves the .model, which mace's own ASE calculator evaluates. ``--mace-stage-two f`` (runs
  labelled ``[stage2]``): mace's own stage two, as our mlearn configs' ``loss.stage_two_*``: the
  first call is stopped after the fraction f of the budget as above, a second call with
  ``--restart_latest --stage_two --start_swa <epoch of the kept checkpoint>`` (mace's stage-two
  defaults: energy weight 1000, forces 100, stress 10, lr 1e-3; the best stage-two epoch by
  mace's validation loss is kept) runs for the rest of the budget (its clock again from
  "Started training"), and the stage-two .model is evaluated.

Metrics (mlip_unc.evaluation.evaluate.potential_metrics for every row, float64 labels): energy MAE
per atom (meV/atom), force MAE per component (meV/A), stress MAE over the 6 Voigt components of
periodic frames (GPa). Parameters: all trainable tensors (our rows include the head's posterior
std and the noise scales). The mace rows are skipped, with the reason, where mace-torch cannot
be imported. Every finished run is appended to ``OUT/accuracy.jsonl`` (skipped when the
command is run again: resumable) and kept: ``--repeat k`` runs seeds seed..seed+k-1, a rerun
with another ``--seed`` adds runs; the md shows mean +- std and n. ``--quick``: EMT Cu made
here, configs/tiny_emt.yaml and small models, 10 s per row.

    /work/venv_mace/bin/python -m benchmarks.accuracy --datasets ethanol,3BPA --budget-minutes 10
    python -m benchmarks.accuracy --quick --out /tmp/acc_quick
    python -m benchmarks.accuracy --report-only   # rewrite accuracy.json/.md from accuracy.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from benchmarks.common import mace_torch as mt
from benchmarks.common.evaluation import calculator_predictions, metrics, read_frames, truth
from benchmarks.common.force_frames import REPO, RESULTS, dataset_spec, row_config
from benchmarks.common.format import fmt_sig3
from benchmarks.common.pages import environment, peer_sections, run_section
from benchmarks.common.tables import Table, write_page
from mlip_unc.atomic_write import atomic_write_text
from mlip_unc.config import load_potential_config
from mlip_unc.data import StructureDataset, TypeMap
from mlip_unc.evaluation.evaluate import evaluate_potential
from mlip_unc.models.loading import load_potential
from mlip_unc.train.potential import run_training
from mlip_unc.train.text_files import json_safe

log = logging.getLogger("accuracy")
DATASETS = ("ethanol", "3BPA", "solvent_xtb", "Si", "Ge", "Li")
MLEARN = ("Si", "Ge", "Li")
ROWS = ("native", "gin", "mace_backbone", "mace_torch")
MACE_ROWS = ("mace_backbone", "mace_torch")
COLUMNS = (
    "energy_mae_meV_atom",
    "force_mae_meV_A",
    "stress_mae_GPa",
    "train_minutes",
    "parameters",
)
SETTINGS = ("quick", "budget_minutes", "split_seed", "overrides")  # a resumed run must match these
QUICK_MACE = {
    "num_channels": 8,
    "max_L": 0,
    "max_ell": 1,
    "correlation": 2,
    "num_interactions": 2,
    "num_radial_basis": 4,
}


# ================================================================ arguments and data
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument(
        "--budget-minutes", type=float, default=None, help="wall time per row (10; quick: 1/6)"
    )
    for flag, default, text in (
        ("--threads", 1, "torch threads (mace_torch: OMP/MKL threads)"),
        ("--seed", 0, "seed of the first repeat"),
        ("--repeat", 1, "seeds seed..seed+k-1"),
        ("--split-seed", 0, "seed of the 3BPA split (fixed across repeats)"),
    ):
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override, our rows"
    )
    p.add_argument(
        "--variant",
        default="",
        help="label of our rows' runs whose config differs from earlier runs in "
        "the same results (e.g. a changed default in configs/); shown as 'row [label]', its own row",
    )
    p.add_argument(
        "--keep-mace-model",
        action="store_true",
        help="copy mace_torch's .model (~4 MB) to checkpoints",
    )
    p.add_argument(
        "--mace-stage-two",
        type=float,
        default=None,
        metavar="FRACTION",
        help="mace_torch with mace's own stage two from this fraction of the budget (our mlearn "
        "configs' loss.stage_two_start: 0.75); its runs are labelled [stage2]",
    )
    p.add_argument(
        "--mace-arch",
        choices=("fixed", "backbone"),
        default="fixed",
        help="mace_torch's model: 'fixed' (MACE_MODEL) or 'backbone', the architecture and batch size of "
        "the mace_backbone row's config (configs/<set>_mace.yaml); runs labelled [arch_backbone]",
    )
    p.add_argument("--quick", action="store_true", help="tiny EMT Cu data made here; needs --out")
    p.add_argument("--out", type=Path, default=None, help=f"results folder (default {RESULTS})")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite OUT/accuracy.json and .md from OUT/accuracy.jsonl (nothing trained)",
    )
    args = p.parse_args(argv)
    names = {d.lower(): d for d in DATASETS}
    args.datasets = (
        ["cu_emt"]
        if args.quick
        else [
            names.get(d.strip().lower(), d.strip()) for d in args.datasets.split(",") if d.strip()
        ]
    )
    if bad := [d for d in args.datasets if d not in (*DATASETS, "cu_emt")]:
        p.error(f"unknown dataset(s) {bad}; choose from {DATASETS}")
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if bad := [r for r in args.rows if r not in ROWS]:
        p.error(f"unknown row(s) {bad}; choose from {ROWS}")
    if args.quick and args.out is None:
        p.error("--quick writes to the folder given by --out")
    if args.mace_stage_two is not None and not 0.0 < args.mace_stage_two < 1.0:
        p.error(
            f"--mace-stage-two is a fraction of the budget in (0, 1), got {args.mace_stage_two}"
        )
    args.out = args.out or RESULTS
    args.budget_minutes = args.budget_minutes or (10.0 / 60.0 if args.quick else 10.0)
    args.data_root = args.data_root or Path(
        os.environ.get("MLIP_UNC_DATA") or REPO.parent / "shared" / "data"
    )
    return args


# ================================================================ our rows
def run_ours(
    name: str, row: str, seed: int, spec: dict[str, Any], args: argparse.Namespace, work: Path
) -> dict:
    """Train one of our rows for the budget, evaluate it on every test file of ``spec``."""
    raw, source = row_config(spec, row, args)
    tag = f"_{args.variant}" if args.variant else ""
    out = args.out / "checkpoints" / "accuracy" / f"{name}_{row}{tag}_seed{seed}"
    path = work / f"{name}_{row}.yaml"
    path.write_text(yaml.safe_dump(raw))
    overrides = [
        f"data_root={args.data_root}",
        f"out={out}",
        f"seed={seed}",
        f"train.max_minutes={args.budget_minutes}",
        "train.schedule_clock=wall",  # equal wall time: the schedule follows the clock
        "train.progress=false",
        "train.resume=false",
        "train.overwrite=true",
        *spec["overrides"],
        *args.overrides,
    ]
    config = load_potential_config(path, overrides)
    load = os.getloadavg()[0]
    result = run_training(config)[0]
    for last in out.rglob("last.pt"):
        last.unlink()
    model = load_potential(out / "model.pt")
    tests = {}
    for label, test in spec["tests"].items():
        frames = read_frames(Path(test), spec)
        data = StructureDataset.from_atoms(
            frames,
            model.r_max,
            TypeMap.from_list(model.type_map),
            energy_key=spec["energy_key"],
            forces_key=spec["forces_key"],
            stress_key=spec["stress_key"],
            dtype=model.dtype,
        )
        pred = evaluate_potential(model, data, uncertainty="none", batch_size=16).predictions
        t = truth(frames, spec)  # float64 labels (the graphs hold them in the model's dtype)
        pred.energy_true, pred.forces_true, pred.stress_true = t["energy"], t["forces"], t["stress"]
        tests[label] = metrics(pred)
    return {
        "train_minutes": result.train_minutes,
        "parameters": sum(p.numel() for p in model.parameters()),
        "epochs": len(result.history),
        "best_epoch": result.best_epoch,
        "stop_reason": result.stop_reason,
        "config": source,
        "checkpoint": str(out.relative_to(args.out)),
        "load_avg": [load, os.getloadavg()[0]],
        "loss": config.loss.model_dump(mode="json"),
        "variant": args.variant,
        "tests": tests,
    }


def run_mace_torch(
    name: str, seed: int, spec: dict[str, Any], args: argparse.Namespace, work: Path
) -> dict:
    from mace.calculators import MACECalculator

    raw, source = row_config(spec, "mace_torch", args)
    (work / "cfg.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_potential_config(
        work / "cfg.yaml", [f"data_root={args.data_root}", *spec["overrides"]]
    )
    mace_work = work / f"mace_{name}_{seed}"
    shutil.rmtree(mace_work, ignore_errors=True)
    mace_work.mkdir(parents=True)
    cmd = mt.mace_command(spec, cfg, seed, mace_work, *peer_model(spec, cfg, args))
    threads = str(args.threads)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONUNBUFFERED": "1",
    }
    log_path, log_two = mace_work / "mace_run_train.log", mace_work / "mace_run_train_stage_two.log"
    load = os.getloadavg()[0]
    two_start, variant = args.mace_stage_two, peer_variant(args)
    stage_two = two_start is not None
    out = (
        args.out
        / "checkpoints"
        / "accuracy"
        / f"{name}_mace_torch{'_' + variant if variant else ''}_seed{seed}"
    )
    out.mkdir(parents=True, exist_ok=True)
    budget_s = 60.0 * args.budget_minutes
    # With a stage two, it is out of reach in the first call: the optimizer state then holds SWALR's swa_lr,
    # without which mace's restart into stage two fails (KeyError 'swa_lr').
    first = [*cmd, "--stage_two", "--start_swa", "999999"] if stage_two else cmd
    (out / "command.txt").write_text(shlex.join(first) + "\n")
    try:
        seconds = mt.run_mace(first, log_path, budget_s * (two_start or 1.0), env)
        if (
            stage_two
        ):  # restart from the kept stage-one checkpoint with mace's stage two from its epoch
            start = mt.last_epoch(mace_work, swa=False, budget=args.budget_minutes)
            second = [*cmd, "--restart_latest", "--stage_two", "--start_swa", str(start)]
            (out / "command.txt").write_text(shlex.join(first) + "\n" + shlex.join(second) + "\n")
            seconds += mt.run_mace(second, log_two, max(budget_s - seconds, 0.0), env)
    finally:
        for log_file in (log_path, log_two):
            if log_file.is_file():
                shutil.copy2(log_file, out / log_file.name)
    epoch = mt.last_epoch(mace_work, swa=stage_two, budget=args.budget_minutes)
    final = [
        *cmd,
        "--restart_latest",
        "--max_num_epochs",
        str(epoch),
    ]  # load, train no further, save .model
    if stage_two:  # mace keeps stage two only when it starts before max_num_epochs
        final += ["--stage_two", "--start_swa", str(max(epoch - 1, 0))]
    mt.run_mace(final, log_path, None, env)
    model_name = "mace_stagetwo.model" if stage_two else "mace.model"
    model_file = next(
        p for p in (mace_work / model_name, *mace_work.rglob(model_name)) if p.is_file()
    )
    calc = MACECalculator(model_paths=str(model_file), device="cpu", default_dtype=cfg.dtype.value)
    tests = {
        label: metrics(calculator_predictions(calc, read_frames(Path(test), spec), spec))
        for label, test in spec["tests"].items()
    }
    if args.keep_mace_model:
        shutil.copy2(model_file, out / "mace.model")
    shutil.copy2(log_path, out / "mace_run_train.log")
    n_epochs = len(set(mt.epochs_logged(log_path))) + (
        len(set(mt.epochs_logged(log_two))) if stage_two else 0
    )
    return {
        "train_minutes": seconds / 60.0,
        "parameters": sum(p.numel() for p in calc.models[0].parameters()),
        "epochs": n_epochs,
        "best_epoch": epoch,
        "stop_reason": "time" if seconds else "finished",
        "config": f"mace_run_train (r_max, batch size, valid fraction, dtype of {source})",
        "checkpoint": str(out.relative_to(args.out)),
        "load_avg": [load, os.getloadavg()[0]],
        "tests": tests,
        "mace_model": mt.flags(cmd, (*mt.MACE_MODEL, "radial_MLP", "batch_size")),
        **({"variant": variant, "stage_two_start": two_start} if variant else {}),
    }


def peer_variant(args: argparse.Namespace) -> str:
    """The label of this invocation's mace_torch runs: ``stage2`` with ``--mace-stage-two``,
    ``arch_backbone`` with ``--mace-arch backbone``, joined by ``+``."""
    parts = ["stage2"] * (args.mace_stage_two is not None) + ["arch_backbone"] * (
        args.mace_arch == "backbone"
    )
    return "+".join(parts)


def peer_model(
    spec: dict[str, Any], cfg: Any, args: argparse.Namespace
) -> tuple[dict[str, Any], int]:
    """mace_torch's model flags and batch size: MACE_MODEL and the native config's batch size, or
    (``--mace-arch backbone``) those of the mace_backbone row's config."""
    if args.quick:
        return QUICK_MACE, cfg.train.batch_size
    if args.mace_arch == "fixed":
        return mt.MACE_MODEL, cfg.train.batch_size
    raw, source = row_config(spec, "mace_backbone", args)
    kwargs = raw["model"]["backbone_kwargs"]
    model = {flag: kwargs[key] for key, flag in mt.BACKBONE_TO_MACE.items() if key in kwargs}
    if missing := set(mt.MACE_MODEL) - set(model):
        raise ValueError(
            f"{source}: backbone_kwargs lack {sorted(missing)} for mace_torch --mace-arch backbone"
        )
    if "radial_mlp" in kwargs:
        model["radial_MLP"] = "[" + ", ".join(str(int(v)) for v in kwargs["radial_mlp"]) + "]"
    return model, int(raw.get("train", {}).get("batch_size", cfg.train.batch_size))


def is_peer(row: str) -> bool:
    """``mace_torch`` and its variants (``mace_torch [stage2]``): never one of our rows."""
    return row.startswith("mace_torch")


# ================================================================ bookkeeping
class Runs:
    """Finished runs and invocations, one JSON object per line of ``path``."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path = path
        lines = path.read_text().splitlines() if path.is_file() else []
        self.records = [json.loads(line) for line in lines if line.strip()]
        old = next((r for r in self.records if r["kind"] == "settings"), None)
        if old is not None and {k: old[k] for k in SETTINGS} != {k: settings[k] for k in SETTINGS}:
            raise SystemExit(
                f"{path} was made with {old}; use another --out or delete it to start over"
            )
        if old is None:
            self.add({"kind": "settings", **{k: settings[k] for k in SETTINGS}})

    def add(self, record: dict[str, Any]) -> None:
        record = json_safe({**record, "time": time.strftime("%Y-%m-%d %H:%M:%S")})
        self.records.append(record)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def runs(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == "run"]

    def done(self, dataset: str, row: str, seed: int, variant: str = "") -> bool:
        return any(
            r["dataset"] == dataset
            and r["row"] == row
            and r["seed"] == seed
            and r.get("variant", "") == variant
            for r in self.runs()
        )


def summary(values: list[float | None]) -> tuple[float | None, float | None]:
    """(mean, sample std; None for n = 1) of the non-null values."""
    v = [x for x in values if x is not None]
    if not v:
        return None, None
    return float(np.mean(v)), (float(np.std(v, ddof=1)) if len(v) > 1 else None)


def assemble(runs: Runs, meta: dict[str, Any]) -> dict[str, Any]:
    """``{"meta": ..., dataset: {row: {COLUMNS (means), n, spread (std), runs}}}``; a run's
    further test sets (3BPA's mixedT) become the dataset ``<dataset>_<label>``."""
    meta["notes"] = {}  # what the runs cannot say themselves: note records of the JSONL
    for rec in runs.records:
        if rec["kind"] == "note":
            meta["notes"].setdefault(rec["dataset"], []).append(rec["text"])
    results: dict[str, Any] = {"meta": meta}
    for rec in runs.runs():
        labels = list(rec["tests"])
        for k, label in enumerate(labels):
            name = rec["dataset"] if k == 0 else f"{rec['dataset']}_{label}"
            one = {
                "seed": rec["seed"],
                **{c: rec["tests"][label].get(c) for c in COLUMNS[:3]},
                **{c: rec[c] for c in COLUMNS[3:]},
                "test": label,
                "n_frames": rec["tests"][label].get("n_frames"),
                "epochs": rec.get("epochs"),
                "stop_reason": rec.get("stop_reason"),
                "load_avg": rec.get("load_avg"),
                "checkpoint": rec.get("checkpoint"),
                "config": rec.get("config"),
                "loss": rec.get("loss"),
                "variant": rec.get("variant", ""),
                "stage_two_start": rec.get("stage_two_start"),
                **({"mace_model": rec["mace_model"]} if rec.get("mace_model") else {}),
            }
            row = rec["row"] + (
                f" [{one['variant']}]" if one["variant"] else ""
            )  # another config: its own row
            results.setdefault(name, {}).setdefault(row, {"runs": []})["runs"].append(one)
    for name, rows in results.items():
        if name == "meta":
            continue
        for row, entry in rows.items():
            stats = {c: summary([r[c] for r in entry["runs"]]) for c in COLUMNS}
            rows[row] = {
                **{c: m for c, (m, _) in stats.items()},
                "n": len(entry["runs"]),
                "spread": {c: s for c, (_, s) in stats.items()},
                "runs": entry["runs"],
            }
        results[name] = {r: rows[r] for r in (*ROWS, *sorted(set(rows) - set(ROWS))) if r in rows}
    return results


def acceptance(results: dict[str, Any]) -> list[str]:
    """The acceptance lines (our best row's force MAE against mace_torch's on ethanol and 3BPA,
    and the mlearn rows), computed from ``results`` (means over runs)."""
    lines = []
    for name in ("ethanol", "3BPA"):
        rows = results.get(name, {})
        ours = {
            r: v["force_mae_meV_A"]
            for r, v in rows.items()
            if not is_peer(r) and v["force_mae_meV_A"] is not None
        }
        ref = (rows.get("mace_torch") or {}).get("force_mae_meV_A")
        if not ours or ref is None:
            lines.append(f"- {name}: best of our rows F-MAE <= mace_torch: n/a (runs missing)")
            continue
        best = min(ours, key=ours.get)
        verdict = (
            "met"
            if ours[best] <= ref
            else f"missed by {ours[best] - ref:.1f} meV/A ({ours[best] / ref:.2f}x)"
        )
        lines.append(
            f"- {name}: best of our rows F-MAE ({best}) {ours[best]:.1f} vs mace_torch {ref:.1f} meV/A: {verdict}"
        )
        peer = {
            r["seed"]: r["force_mae_meV_A"]
            for r in rows["mace_torch"].get("runs", [])
            if r["force_mae_meV_A"] is not None
        }
        for (
            row,
            v,
        ) in rows.items():  # the same run: each seed's mace_torch ran in the same invocation
            for r in v.get("runs", []) if not is_peer(row) else []:
                if r["force_mae_meV_A"] is not None and r["seed"] in peer:
                    f, g = r["force_mae_meV_A"], peer[r["seed"]]
                    lines.append(
                        f"  - same run (seed {r['seed']}): {row} {f:.1f} vs mace_torch {g:.1f} meV/A "
                        f"({f / g:.2f}x): {'met' if f <= g else 'missed'}"
                    )
    current = [
        (n, f"{row} [{variant}]")
        for n in MLEARN
        for row, variant in CURRENT_MLEARN.items()
        if f"{row} [{variant}]" in results.get(n, {})
    ]
    if current:
        verdicts = [(n, r, results[n][r]["energy_mae_meV_atom"]) for n, r in current]
        lines.append(
            "- mlearn, this project's rows as configs/ holds them now (CURRENT_MLEARN), mean E MAE <= 10 "
            "meV/atom: "
            + "; ".join(
                f"{n} {r} {fmt_sig3(e)}: {'met' if e is not None and e <= 10 else 'missed'}"
                for n, r, e in verdicts
            )
        )
        lines.append(
            "- every run's row (earlier configs included; mace_torch = mace-torch's own recipe, reported "
            "beside ours):"
        )
    for name in MLEARN:
        for row, v in results.get(name, {}).items():
            e = v["energy_mae_meV_atom"]
            verdict = "n/a" if e is None else "met" if e <= 10.0 else f"missed ({e:.1f} > 10)"
            lines.append(f"- {name} {row}: E MAE {fmt_sig3(e)} meV/atom <= 10: {verdict}")
    if not any(n in results for n in MLEARN):
        lines.append("- mlearn Si, Ge, Li: E MAE <= 10 meV/atom per row: n/a (not run yet)")
    return lines


#: The variant label of each of our rows whose config configs/mlearn_*.yaml holds now (kept by hand, as RUN_NOTES).
CURRENT_MLEARN = {"native": "angular", "gin": "angular", "mace_backbone": "maxL0_lmax2_bs2"}


# Zuo et al., J. Phys. Chem. A 2020, 124, 731: test-set MAE, energy (meV/atom) and force (eV/A), of the two
# models that a later paper tabulated beside its own (the paper's table itself could not be read here).
PUBLISHED: dict[str, dict[str, tuple[float, float]]] = {
    "Si": {"GAP": (2.91, 0.07), "MTP": (2.21, 0.06)},
    "Ge": {"GAP": (2.06, 0.05), "MTP": (1.79, 0.05)},
    "Li": {"GAP": (0.49, 0.01), "MTP": (0.49, 0.01)},
}
PUBLISHED_SOURCE = (
    "Zuo et al., J. Phys. Chem. A 2020, 124, 731, GAP and MTP columns as quoted by ACEpotentials.jl "
    "(Witt et al., J. Chem. Phys. 159, 164101 (2023)) in examples/zuobench/error_table.jl of ACEsuit/ACEpotentials.jl "
    "at commit 12b4422, to two decimals (forces to 0.01 eV/Å); same mlearn training/test split"
)
PUBLISHED_NOT_FOUND = (
    "not found: the stored copies of the paper (arXiv:1906.08888 on ar5iv; the J. Phys. Chem. A PDF; a slideshare copy) could only be "
    "read up to the abstract; materialsvirtuallab/mlearn at 10c427a (README.md, mvl_models/README.md, the notebooks) "
    "has no table of test errors; ACEpotentials.jl quotes only GAP and MTP; no number is shown rather "
    "than one from memory"
)


def write_markdown(results: dict[str, Any], path: Path) -> None:
    """The page: one table of every (set, row), the published mlearn numbers, the acceptance
    verdicts, then the run footer; per-row configs and per-run notes stay in the JSON."""
    meta = results["meta"]
    every = rows_table(results)
    shown = headline_rows(results)
    lines = [
        "# Accuracy: this project's potentials vs mace-torch's MACE at equal wall time",
        "",
        *Table("", every.header, [r for r in every.rows if (r[0], r[1]) in shown]).markdown(),
        "",
        "Per set: the unmarked rows, the rows of the configs that configs/ holds now "
        "(mlearn sets), and of the other marked rows the lowest F MAE of ours and of mace_torch. "
        + every.link("Every row (each config tried)"),
        "",
        (
            "Energy MAE per atom, force MAE per component, stress MAE over the 6 Voigt components of "
            "periodic frames, training minutes, trainable parameters; mean ± std over the n runs (each "
            "run in accuracy.json). A row `row [label]` ran another config than the unmarked row (its "
            "config and loss section are in accuracy.json). Test sets: ethanol test_MD (1000), 3BPA the "
            "100 train_300K frames not trained on, 3BPA_mixedT train_mixedT less its frames also in "
            "train_300K (same models), solvent_xtb test, mlearn test.json."
        ),
        "",
        "mace_torch: " + meta["mace_torch_method"],
        "",
    ]
    lines += published_lines(results, path.parent / "mlearn_published.json")
    verdicts = [
        line
        for line in acceptance(results)
        if not line.startswith("  ")  # the per-seed lines and the per-run mlearn list: JSON
        and "every run's row" not in line
        and not any(line.startswith(f"- {n} ") for n in MLEARN)
    ]
    lines += ["## Acceptance, computed from accuracy.json", "", *verdicts, ""]
    if meta["skipped"]:
        lines += ["Skipped rows:", *(f"- {k}: {v}" for k, v in meta["skipped"].items()), ""]
    if meta["failed"]:
        lines += [
            "Failed runs (retried on the next call):",
            *(f"- {k}: {v}" for k, v in meta["failed"].items()),
            "",
        ]
    overrides = f"overrides of our rows {meta['overrides']}; " if meta["overrides"] else ""
    notes = ", ".join(meta.get("notes", {}))
    lines += run_section(
        [c.split("  ", 1)[0] for c in meta["commands"]],
        date=f"started {meta.get('started', 'n/a')}, updated {meta['updated']}",
        json_name="accuracy.json",
        machine=(meta.get("environment") or {}).get("machine"),
        versions=(meta.get("environment") or {}).get("versions"),
        extra=[
            f"Budget {meta['budget_minutes']:g} min of training wall time per row and run "
            f"({meta['threads']} thread(s) each; the 1-min load average at the start and end of "
            f"each run is in the JSON); seeds {meta['seeds']}; {overrides}status: {meta['status']}."
            + (f" Per-run notes ({notes}): `meta.notes` of the JSON." if notes else "")
        ],
    )
    write_page(path, "\n".join(lines) + "\n" + peer_sections(path), [every])


ROWS_CSV = "accuracy_rows.csv"


def rows_table(results: dict[str, Any]) -> Table:
    """Every (set, row): mean ± std over its runs, as the page shows them."""
    table = Table(
        ROWS_CSV,
        ("set", "row", "E MAE (meV/atom)", "F MAE (meV/Å)", "stress MAE (GPa)", "train min",
         "parameters", "n", "epochs"),
    )  # fmt: skip
    for name, rows in ((n, r) for n, r in results.items() if n != "meta"):
        for row, v in rows.items():
            cells = [fmt_sig3(v[c], v["spread"][c]) for c in COLUMNS[:4]]
            parameters = f"{v['parameters']:.0f}" if v["parameters"] else "n/a"
            epochs = ", ".join(str(r.get("epochs")) for r in v["runs"])  # the CPU a run got
            table.rows.append((name, row, *cells, parameters, v["n"], epochs))
    return table


def headline_rows(results: dict[str, Any]) -> set[tuple[str, str]]:
    """The (set, row) pairs on the page: the unmarked rows, the current mlearn configs
    (:data:`CURRENT_MLEARN`) and, of the other marked rows, ours and mace_torch's lowest F MAE."""
    current = {f"{row} [{variant}]" for row, variant in CURRENT_MLEARN.items()}
    shown = set()
    for name, rows in ((n, r) for n, r in results.items() if n != "meta"):
        shown |= {(name, r) for r in rows if r in ROWS or (name in MLEARN and r in current)}
        for peer in (False, True):
            marked = {
                r: v["force_mae_meV_A"]
                for r, v in rows.items()
                if r not in ROWS and is_peer(r) == peer and v["force_mae_meV_A"] is not None
            }
            if marked:
                shown.add((name, min(marked, key=marked.__getitem__)))
    return shown


def published_lines(results: dict[str, Any], evaluated: Path) -> list[str]:
    """The mlearn sets' published errors: quoted GAP/MTP and the published models run here."""
    sets = [n for n in MLEARN if n in results]
    if not sets:
        return []
    lines = ["## mlearn: published models", ""]
    quoted = [n for n in sets if PUBLISHED.get(n)]
    if quoted:
        lines += [
            "| set | model | E MAE (meV/atom) | F MAE (eV/Å) |",
            "|---|---|---|---|",
            *(
                f"| {n} | {m} | {e:g} | {f:g} |"
                for n in quoted
                for m, (e, f) in PUBLISHED[n].items()
            ),
            "",
            f"Quoted: {PUBLISHED_SOURCE}. NNP, SNAP and qSNAP of the same table (and any stress "
            f"errors): {PUBLISHED_NOT_FOUND}.",
            "",
        ]
    rows = json.loads(evaluated.read_text()) if evaluated.is_file() else {}
    ran = [(n, m, r) for n in sets for m, r in rows.get(n, {}).items()]
    if ran:
        cols = ("energy_mae_meV_atom", "force_mae_meV_A", "stress_mae_GPa")
        lines += [
            "| set | model | E MAE (meV/atom) | F MAE (meV/Å) | stress MAE (GPa) |",
            "|---|---|---|---|---|",
            *(
                f"| {n} | {m} | " + " | ".join(fmt_sig3(r.get(c)) for c in cols) + " |"
                for n, m, r in ran
            ),
            "",
            (
                "The same paper's published SNAP and qSNAP (LAMMPS) and NNP (benchmarks/common/n2p2.py) "
                "potentials, run here on these test sets ([mlearn_published.md](mlearn_published.md)); "
                "not quoted numbers."
            ),
            "",
        ]
    return lines


def plot(results: dict[str, Any], path: Path) -> None:
    """Force MAE per dataset (groups) and row (bars), log scale, with each run's value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in results if n != "meta"]
    if not names:
        return
    rows = [r for r in ROWS if any(r in results[n] for n in names)]
    rows += sorted(
        {
            r
            for n in names
            for r in results[n]
            if r not in ROWS
            and isinstance(results[n][r], dict)
            and "force_mae_meV_A" in results[n][r]
        }
    )  # variant rows, 'row [label]'
    if not any((results[n].get(r) or {}).get("force_mae_meV_A") for n in names for r in rows):
        return  # nothing to draw on a log axis
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(names), 3.2))
    width = 0.8 / len(rows)
    for j, row in enumerate(rows):
        have = [
            (i, n)
            for i, n in enumerate(names)
            if (results[n].get(row) or {}).get("force_mae_meV_A")
        ]
        xs = [i + (j - (len(rows) - 1) / 2) * width for i, _ in have]
        ax.bar(xs, [results[n][row]["force_mae_meV_A"] for _, n in have], width, label=row)
        for x, (_, n) in zip(xs, have, strict=False):
            values = [
                r["force_mae_meV_A"]
                for r in results[n][row]["runs"]
                if r["force_mae_meV_A"] is not None
            ]
            ax.plot([x] * len(values), values, "k.", ms=3)
    ax.set(xticks=range(len(names)), xticklabels=names, yscale="log", ylabel="force MAE (meV/Å)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save(runs: Runs, meta: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    results = assemble(runs, meta)
    meta.update(
        updated=time.strftime("%Y-%m-%d %H:%M"),
        seeds=sorted({r["seed"] for r in runs.runs()}),
        commands=list(
            dict.fromkeys(
                f"{r['command']}  (python: {r['python']})"
                for r in runs.records
                if r["kind"] == "invocation"
            )
        ),
    )
    atomic_write_text(args.out / "accuracy.json", json.dumps(json_safe(results), indent=1))
    write_markdown(results, args.out / "accuracy.md")
    plot(results, args.out / "accuracy.png")
    return results


def report_only(out: Path) -> dict[str, Any]:
    """Rewrite OUT/accuracy.json and .md from OUT/accuracy.jsonl and the last meta (no run)."""
    records = [
        json.loads(line) for line in (out / "accuracy.jsonl").read_text().splitlines() if line
    ]
    settings = next(r for r in records if r["kind"] == "settings")
    meta = json.loads((out / "accuracy.json").read_text())["meta"]
    results = assemble(Runs(out / "accuracy.jsonl", settings), meta)
    atomic_write_text(out / "accuracy.json", json.dumps(json_safe(results), indent=1))
    write_markdown(results, out / "accuracy.md")
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.report_only:
        return report_only(args.out)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(
        ["python", "-m", "benchmarks.accuracy", *(sys.argv[1:] if argv is None else argv)]
    )
    runs = Runs(
        args.out / "accuracy.jsonl",
        {
            "quick": args.quick,
            "budget_minutes": args.budget_minutes,
            "split_seed": args.split_seed,
            "overrides": args.overrides,
        },
    )
    missing = mt.mace_missing() if any(r in MACE_ROWS for r in args.rows) else None
    runs.add(
        {
            "kind": "invocation",
            "command": command,
            "python": sys.executable,
            "mace_missing": missing,
            "datasets": args.datasets,
            "rows": args.rows,
        }
    )
    meta: dict[str, Any] = {
        "budget_minutes": args.budget_minutes,
        "threads": args.threads,
        "split_seed": args.split_seed,
        "quick": args.quick,
        "overrides": args.overrides,
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "environment": environment(),
        "status": "partial",
        "skipped": {},
        "failed": {},
        "data_root": None if args.quick else str(args.data_root),
        "mace_torch_method": __doc__.split("- ``mace_torch``: ")[1]
        .split("\n\n")[0]
        .replace("\n  ", " ")
        .strip(),
        "published": {
            "source": PUBLISHED_SOURCE,
            "not_found": PUBLISHED_NOT_FOUND,
            "columns": ["energy_mae_meV_atom", "force_mae_eV_A"],
            "values": PUBLISHED,
        },
    }
    seeds = [args.seed + k for k in range(args.repeat)]
    with tempfile.TemporaryDirectory(prefix="mlip_unc_acc_") as tmp:
        work = Path(tmp)
        for name in args.datasets:
            spec = dataset_spec(name, args, work)
            for row in args.rows:
                if row in MACE_ROWS and missing:
                    if not any(r["dataset"] == name and r["row"] == row for r in runs.runs()):
                        meta["skipped"][f"{name}/{row}"] = missing
                    continue
                for seed in seeds:
                    variant = (
                        peer_variant(args) if row == "mace_torch" else args.variant
                    )  # the peer's: --mace-stage-two
                    if runs.done(name, row, seed, variant):
                        continue
                    log.info("[%s] %s seed %d: %.3g min", name, row, seed, args.budget_minutes)
                    try:
                        rec = (
                            run_mace_torch(name, seed, spec, args, work)
                            if row == "mace_torch"
                            else run_ours(name, row, seed, spec, args, work)
                        )
                    except Exception as err:  # noqa: BLE001  one failed row must not end a long run
                        log.error(
                            "[%s] %s seed %d failed:\n%s", name, row, seed, traceback.format_exc()
                        )
                        meta["failed"][f"{name}/{row}/seed{seed}"] = (
                            f"{type(err).__name__}: {str(err)[:300]}"
                        )
                        continue
                    runs.add({"kind": "run", "dataset": name, "row": row, "seed": seed, **rec})
                    save(runs, meta, args)
        meta["status"] = "complete" if not meta["skipped"] and not meta["failed"] else "partial"
        results = save(runs, meta, args)
    log.info("results: %s", args.out / "accuracy.md")
    return results


if __name__ == "__main__":
    main()
