"""Benchmark of the Bayesian interatomic potential: accuracy, force-uncertainty quality, cost.

Uses only the public API (configs in ``configs/``, ``run_training``, ``evaluate_potential``).

1. Accuracy: rMD17 ethanol (train.xyz -> test_MD.xyz) and 3BPA (train_300K: 400 training /
   100 held-out frames, fixed seed; train_mixedT as the hotter out-of-distribution test), for
   each backbone, under a wall-time training budget: energy and force MAE, force-uncertainty
   Spearman (frame level: mean force std vs mean |force error|; and per component) and
   miscalibration area, in the exact mode.
2. Cost and quality on the 27-atom 3BPA frames, single-frame calls as in MD: the time of
   each uncertainty mode (energy, local, sampled_k4, exact) and of a 5-member MAP committee
   of the same backbone (ensemble5) as a ratio to plain energy+forces; beside each, the
   frame-level Spearman(uncertainty, mean |force error|) and the OOD AUROC (held-out 300 K
   frames vs train_mixedT, the mode's uncertainty as the score).

Results: ``benchmarks/results/potential.{json,md,png}``, rewritten after every stage, so a
partial run leaves partial results. Checkpoints: ``benchmarks/results/checkpoints/`` (model.pt
and history.json only; ``--skip-train`` reuses them).

``--quick`` (CI smoke run, < 1 min): EMT-labelled fcc Cu cells made on the spot (4 atoms; 24
training, 8 test, 8 hotter and strained out-of-distribution frames) stand in for both datasets,
``configs/tiny_emt.yaml`` (the equivariant row with a tiny model section), 4 s of training per
model and a fifth of that per committee member; the cost study runs on those frames. Needs ``--out``.

    python -m benchmarks.potential --budget-minutes 30 --threads 1
    python -m benchmarks.potential --quick --out /tmp/potential_quick
    python -m benchmarks.potential --report-only   # rewrite potential.md from potential.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ase.io
import numpy as np
import torch

from benchmarks.common.format import fmt
from benchmarks.common.pages import environment, run_section
from mlip_unc.config import load_potential_config as load_config
from mlip_unc.data import StructureDataset, TypeMap
from mlip_unc.evaluation.evaluate import evaluate_potential, frame_table, predict
from mlip_unc.models.committee import Committee
from mlip_unc.models.loading import load_potential
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.train.potential import run_training
from mlip_unc.uncertainty.calibration import auroc, spearman_corr

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MODES = ("energy", "local", "sampled_k4", "exact", "ensemble5")
DATASETS = ("ethanol", "3bpa")
BACKBONES = ("gin", "equivariant")
QUICK_DATASET = "cu_emt"
QUICK_EQUIVARIANT = [  # --quick: the equivariant row's model section (tiny_emt.yaml has a GIN)
    "model.backbone=equivariant",
    "model.latent_dim=8",
    "model.backbone_kwargs={channels: 8, l_max: 1, num_layers: 1, num_basis: 4, radial_hidden: 8, readout_hidden: [8]}",
]


# ================================================================ arguments and data
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="data root (default: $MLIP_UNC_DATA or ../shared/data next to the repo)",
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="training wall time per model (30; quick: 4 s)",
    )
    parser.add_argument(
        "--ensemble-budget-minutes",
        type=float,
        default=None,
        help="per committee member (default: budget / 5, the same total as one model)",
    )
    parser.add_argument(
        "--budget-for",
        action="append",
        default=[],
        metavar="TAG=MINUTES",
        help="budget of one model, e.g. ethanol_equivariant=28 (repeatable)",
    )
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--backbones", default=",".join(BACKBONES))
    parser.add_argument(
        "--skip-train", action="store_true", help="reuse checkpoints under results/checkpoints"
    )
    parser.add_argument(
        "--no-cost", action="store_true", help="skip the cost/quality study (needs 3bpa)"
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite OUT/potential.md from OUT/potential.json (nothing trained or timed)",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (training and timing)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timing-frames", type=int, default=40, help="3BPA frames timed per mode")
    parser.add_argument(
        "--max-eval-frames", type=int, default=None, help="cap test sets (quick checks)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"results folder (default {RESULTS}; needed with --quick)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny EMT Cu data made here, < 1 min; needs --out"
    )
    args = parser.parse_args(argv)
    if args.quick and args.out is None:
        parser.error("--quick writes to the folder given by --out")
    args.out = args.out or RESULTS
    if args.budget_minutes is None:
        args.budget_minutes = 4.0 / 60.0 if args.quick else 30.0
    args.datasets = [d.strip().lower() for d in args.datasets.split(",") if d.strip()]
    args.backbones = [b.strip().lower() for b in args.backbones.split(",") if b.strip()]
    if args.quick:
        args.datasets = [QUICK_DATASET]
    for name in args.datasets if not args.quick else ():
        if name not in DATASETS:
            parser.error(f"unknown dataset {name!r}; choose from {DATASETS}")
    for name in args.backbones:
        if name not in BACKBONES:
            parser.error(f"unknown backbone {name!r}; choose from {BACKBONES}")
    if args.data_root is None:
        args.data_root = Path(os.environ.get("MLIP_UNC_DATA") or REPO.parent / "shared" / "data")
    if args.ensemble_budget_minutes is None:
        args.ensemble_budget_minutes = args.budget_minutes / 5.0
    try:
        args.budget_for = {
            k.strip(): float(v) for k, v in (item.split("=", 1) for item in args.budget_for)
        }
    except ValueError:
        parser.error("--budget-for takes TAG=MINUTES, e.g. ethanol_equivariant=28")
    return args


def split_3bpa(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """400/100 split of train_300K (numpy seed ``args.seed``), written as extxyz under ``work``.

    train_mixedT repeats some train_300K frames (31 with identical energies); they are dropped
    from the out-of-distribution set, which is written as ``3bpa_mixedT_new.xyz``.
    """
    root = args.data_root / "structures" / "3BPA"
    frames = ase.io.read(root / "train_300K.xyz", index=":")
    perm = np.random.default_rng(args.seed).permutation(len(frames))
    train_idx, test_idx = sorted(perm[:400].tolist()), sorted(perm[400:500].tolist())
    work.mkdir(parents=True, exist_ok=True)
    paths = {"train": work / "3bpa_300K_train400.xyz", "test": work / "3bpa_300K_test100.xyz"}
    ase.io.write(paths["train"], [frames[k] for k in train_idx])
    ase.io.write(paths["test"], [frames[k] for k in test_idx])
    split_file = args.out / "checkpoints" / "3bpa_split.json"
    split_file.parent.mkdir(parents=True, exist_ok=True)
    split_file.write_text(json.dumps({"seed": args.seed, "train": train_idx, "test": test_idx}))
    seen = {round(a.get_potential_energy(), 6) for a in frames}
    mixed = ase.io.read(root / "train_mixedT.xyz", index=":")
    new = [a for a in mixed if round(a.get_potential_energy(), 6) not in seen]
    paths["ood"] = work / "3bpa_mixedT_new.xyz"
    ase.io.write(paths["ood"], new)
    print(
        f"[data] 3BPA: 400 train / 100 held-out 300 K frames; mixedT {len(new)} of {len(mixed)} frames "
        f"(dropped {len(mixed) - len(new)} repeats of train_300K)",
        flush=True,
    )
    return paths


def quick_files(work: Path) -> dict[str, Path]:
    """--quick: rattled 4-atom fcc Cu cells with EMT energies, forces and stress; the OOD set is
    hotter (rattle 0.25 A) and strained by 4 %."""
    from ase.build import bulk
    from ase.calculators.emt import EMT

    def cells(n: int, seed: int, rattle: float, strain: float) -> list:
        rng = np.random.default_rng(seed)
        frames = []
        for k in range(n):
            atoms = bulk(
                "Cu", "fcc", a=3.6 * (1.0 + strain) + 0.03 * rng.standard_normal(), cubic=True
            )
            atoms.rattle(rattle, seed=seed * 1000 + k)
            atoms.calc = EMT()
            atoms.get_stress()
            frames.append(atoms)
        return frames

    work.mkdir(parents=True, exist_ok=True)
    paths = {
        "train": work / "cu_train.xyz",
        "test": work / "cu_test.xyz",
        "ood": work / "cu_ood.xyz",
    }
    for path, frames in zip(
        paths.values(),
        (cells(24, 0, 0.1, 0.0), cells(8, 1, 0.1, 0.0), cells(8, 2, 0.25, 0.04)),
        strict=False,
    ):
        ase.io.write(path, frames)
    print("[data] quick: 24 train / 8 test / 8 OOD EMT Cu cells (4 atoms)", flush=True)
    return paths


def dataset_files(name: str, args: argparse.Namespace, work: Path) -> dict[str, Path]:
    if name == QUICK_DATASET:
        return quick_files(work)
    if name == "ethanol":
        root = args.data_root / "structures" / "ethanol"
        return {"train": root / "train.xyz", "test": root / "test_MD.xyz"}
    return split_3bpa(args, work)


# ================================================================ training
def train_model(
    dataset: str,
    backbone: str,
    files: dict[str, Path],
    args: argparse.Namespace,
    *,
    ensemble: int = 1,
) -> Path:
    """Train (or reuse) one model or a MAP committee; return its output folder."""
    tag = f"{dataset}_{backbone}" + (f"_ensemble{ensemble}" if ensemble > 1 else "")
    out = args.out / "checkpoints" / tag
    done = (out / "ensemble.json") if ensemble > 1 else (out / "model.pt")
    if args.skip_train:
        if not done.is_file():
            raise SystemExit(f"--skip-train: no checkpoint {done}; train it first")
        return out
    minutes = args.ensemble_budget_minutes if ensemble > 1 else args.budget_minutes
    minutes = args.budget_for.get(tag, minutes)
    overrides = [
        f"data_root={args.data_root}",
        f"data.train={files['train']}",
        "data.test=null",
        f"out={out}",
        f"seed={args.seed}",
        f"train.max_minutes={minutes}",
        "train.schedule_clock=wall",  # equal wall time: the schedule follows the clock
        "train.progress=false",
        "train.resume=false",
    ]
    if ensemble > 1:
        overrides += [f"train.ensemble={ensemble}", "model.head=map"]
    config_file = REPO / "configs" / f"{dataset}_{backbone}.yaml"
    if dataset == QUICK_DATASET:
        config_file = REPO / "configs" / "tiny_emt.yaml"
        overrides = (QUICK_EQUIVARIANT if backbone == "equivariant" else []) + overrides
    config = load_config(config_file, overrides)
    print(f"[train] {tag}: {minutes:g} min per model", flush=True)
    run_training(config)
    for last in out.rglob("last.pt"):  # keep the committed checkpoints small
        last.unlink()
    return out


def history_minutes(out: Path) -> float:
    files = sorted(out.glob("member_*/history.json")) or [out / "history.json"]
    return float(sum(json.loads(f.read_text())["train_minutes"] for f in files))


# ================================================================ evaluation
def load_dataset(path: Path, model: Any, limit: int | None) -> StructureDataset:
    first = model.members[0] if isinstance(model, Committee) else model
    index = ":" if limit is None else f":{limit}"
    return StructureDataset.from_files(
        path, first.r_max, TypeMap.from_list(first.type_map), index=index, dtype=first.dtype
    )


def accuracy(model_dir: Path, files: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    model = load_potential(model_dir / "model.pt")
    out: dict[str, Any] = {"train_minutes": history_minutes(model_dir)}
    for split in ("test", "ood"):
        if split not in files:
            continue
        data = load_dataset(files[split], model, args.max_eval_frames)
        metrics = evaluate_potential(model, data, uncertainty="exact", batch_size=8).metrics
        summary = {
            "n_frames": metrics["n_frames"],
            "energy_mae_meV_atom": metrics["energy_mae_meV_atom"],
            "force_mae_meV_A": metrics["forces_mae_meV_A"],
            "force_rmse_meV_A": metrics["forces_rmse_meV_A"],
            "force_spearman": metrics["forces_frame_spearman"],
            "force_spearman_component": metrics["forces_spearman"],
            "force_miscalibration_area": metrics["forces_miscalibration_area"],
            "force_coverage_95": metrics["forces_coverage_95"],
            "energy_spearman": metrics["energy_spearman"],
            "energy_miscalibration_area": metrics["energy_miscalibration_area"],
        }
        if split == "test":
            out.update(summary)
        else:
            out["ood"] = summary
    return out


def _mode_call(model: Any, mode: str):
    if mode == "plain":
        return lambda g: model(g, compute_forces=True)
    if mode in ("energy", "local", "ensemble5"):
        return lambda g: model(g, compute_forces=True, uncertainty="energy")
    if mode == "sampled_k4":
        gen = torch.Generator().manual_seed(0)
        return lambda g: model(g, uncertainty="sampled", n_samples=4, generator=gen)
    return lambda g: model(g, uncertainty="exact")


def time_modes(
    model: BayesianPotential,
    committee: Committee,
    graphs: list,
    args: argparse.Namespace,
    repeats: int = 3,
) -> dict[str, float]:
    """Milliseconds per single-frame call: the best of ``repeats`` calls per frame (robust to
    other processes on a shared CPU), median over frames; modes interleaved frame by frame."""
    calls = {m: _mode_call(model, m) for m in ("plain", "energy", "local", "sampled_k4", "exact")}
    calls["ensemble5"] = _mode_call(committee, "ensemble5")
    for call in calls.values():  # warm-up
        call(graphs[0])
    times: dict[str, list[float]] = {m: [] for m in calls}
    for graph in graphs[: args.timing_frames]:
        for mode, call in calls.items():
            best = math.inf
            for _ in range(repeats):
                start = time.perf_counter()
                call(graph)
                best = min(best, time.perf_counter() - start)
            times[mode].append(1e3 * best)
    return {m: statistics.median(v) for m, v in times.items()}


def _scores(model: Any, data: StructureDataset, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Frame scores of ``mode`` and the frame mean |force error| of the same prediction."""
    unc = {
        "energy": "energy",
        "local": "energy",
        "sampled_k4": "sampled",
        "exact": "exact",
        "ensemble5": "exact",
    }[mode]
    table = frame_table(predict(model, data, uncertainty=unc, n_samples=4, batch_size=8))
    score = {
        "energy": table["energy_epistemic_std"],
        "local": table["local_energy_max_std"],
        "sampled_k4": table["forces_mean_std"],
        "exact": table["forces_mean_std"],
        "ensemble5": table["forces_mean_std"],
    }[mode]
    return score, table["forces_mean_error"]


def quality(
    model: BayesianPotential, committee: Committee, files: dict[str, Path], args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    test = load_dataset(files["test"], model, args.max_eval_frames)
    ood = load_dataset(files["ood"], model, args.max_eval_frames)
    out = {}
    for mode in MODES:
        target = committee if mode == "ensemble5" else model
        s_in, e_in = _scores(target, test, mode)
        s_out, e_out = _scores(target, ood, mode)
        scores, errors = np.concatenate([s_in, s_out]), np.concatenate([e_in, e_out])
        labels = np.concatenate([np.zeros(len(s_in)), np.ones(len(s_out))])
        out[mode] = {
            "spearman": spearman_corr(scores, errors),
            "spearman_in_domain": spearman_corr(s_in, e_in),
            "auroc": auroc(scores, labels),
            "force_mean_error_meV_A": 1e3 * float(np.mean(errors)),
        }
        print(f"[quality] {mode}: {out[mode]}", flush=True)
    return out


def cost_and_quality(
    backbone: str, files: dict[str, Path], args: argparse.Namespace
) -> dict[str, Any]:
    dataset = QUICK_DATASET if args.quick else "3bpa"
    single = args.out / "checkpoints" / f"{dataset}_{backbone}"
    ens_dir = train_model(dataset, backbone, files, args, ensemble=5)
    model = load_potential(single / "model.pt")
    committee = load_potential(ens_dir)
    graphs = load_dataset(files["test"], model, None).graphs
    ms = time_modes(model, committee, graphs, args)
    print(f"[cost] {backbone}: {ms}", flush=True)
    return {
        "ms": ms,
        "ratio": {m: ms[m] / ms["plain"] for m in MODES},
        "quality": quality(model, committee, files, args),
        "ensemble_train_minutes": history_minutes(ens_dir),
    }


# ================================================================ reporting
def answer(cost: dict[str, Any]) -> str:
    """Which mode reaches committee-level flagging quality at the lowest cost (per backbone)."""
    lines = []
    for backbone, entry in cost.items():
        ratio, qual = entry["ratio"], entry["quality"]
        ref = qual["ensemble5"]
        ok = [
            m
            for m in MODES[:-1]
            if qual[m]["auroc"] >= ref["auroc"] - 0.02
            and qual[m]["spearman"] >= ref["spearman"] - 0.05
        ]
        ref_text = (
            f"ensemble5 costs {ratio['ensemble5']:.2f}x (Spearman {ref['spearman']:.2f}, "
            f"AUROC {ref['auroc']:.2f})"
        )
        if ok:
            best = min(ok, key=lambda m: ratio[m])
            q = qual[best]
            lines.append(
                f"{backbone}: '{best}' reaches committee-level flagging at {ratio[best]:.2f}x plain "
                f"E+F (Spearman {q['spearman']:.2f}, AUROC {q['auroc']:.2f}); {ref_text}."
            )
        else:
            best = max(MODES[:-1], key=lambda m: qual[m]["auroc"])
            q = qual[best]
            lines.append(
                f"{backbone}: no single-model mode reaches committee level (within 0.02 AUROC and "
                f"0.05 Spearman); the best, '{best}', costs {ratio[best]:.2f}x (Spearman "
                f"{q['spearman']:.2f}, AUROC {q['auroc']:.2f}); {ref_text}."
            )
    return " ".join(lines)


def write_markdown(results: dict[str, Any], path: Path) -> None:
    lines = [
        "# Bayesian interatomic potential: benchmark",
        "",
        *(
            [
                "QUICK run: EMT Cu cells made on the spot, tiny models; a smoke test, not a result.",
                "",
            ]
            if results.get("quick")
            else []
        ),
        "## Accuracy and force-uncertainty quality (exact mode)",
        "",
        (
            "| dataset | backbone | train min | E MAE (meV/atom) | F MAE (meV/A) | F Spearman frame | "
            "F Spearman comp. | F miscal. area | F cov. 95 | E Spearman |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset, per_backbone in results["datasets"].items():
        for backbone, m in per_backbone.items():
            rows = [(dataset, m)] + ([(f"{dataset} mixedT (OOD)", m["ood"])] if "ood" in m else [])
            for label, r in rows:
                lines.append(
                    f"| {label} | {backbone} | {fmt(m.get('train_minutes'), '{:.1f}')} | "
                    f"{fmt(r.get('energy_mae_meV_atom'))} | {fmt(r.get('force_mae_meV_A'), '{:.1f}')} | "
                    f"{fmt(r.get('force_spearman'))} | {fmt(r.get('force_spearman_component'))} | "
                    f"{fmt(r.get('force_miscalibration_area'), '{:.3f}')} | {fmt(r.get('force_coverage_95'))} | "
                    f"{fmt(r.get('energy_spearman'))} |"
                )
    if results.get("cost_ratio"):
        lines += [
            "",
            "",
            f"## Cost and flagging quality on {results.get('cost_frames', '27-atom 3BPA frames')}",
            "",
            "Time per single-frame call as a ratio to plain energy+forces (best of 3 calls per frame, "
            "median over frames, modes interleaved). Spearman: frame score vs frame mean |force error| on "
            + (
                "test + OOD frames (in-domain only in brackets). AUROC: test (0) vs OOD (1)."
                if results.get("quick")
                else "held-out 300 K + mixedT frames (in-domain only in brackets). AUROC: held-out 300 K (0) vs mixedT (1)."
            ),
            "",
            "| backbone | mode | cost ratio | ms | Spearman (in-domain) | AUROC |",
            "|---|---|---|---|---|---|",
        ]
        for backbone, ratios in results["cost_ratio"].items():
            for mode in MODES:
                q = results["quality"][backbone][mode]
                lines.append(
                    f"| {backbone} | {mode} | {ratios[mode]:.2f} | {results['cost_ms'][backbone][mode]:.1f} | "
                    f"{q['spearman']:.2f} ({q['spearman_in_domain']:.2f}) | {q['auroc']:.2f} |"
                )
        lines += [
            "",
            "Plain energy+forces: "
            + ", ".join(f"{b} {results['cost_ms'][b]['plain']:.1f} ms" for b in results["cost_ms"])
            + ".",
            "",
        ]
        lines += ["**Answer.** " + results["answer"], ""]
    lines += [
        (
            "Definitions: energy = closed-form epistemic energy std; local = max per-atom std "
            "sqrt(z_a^T S z_a) (same forward pass as energy); sampled_k4 = mean force std from 4 "
            "posterior draws sharing one forward pass; exact = mean exact force std (d backward "
            "passes); ensemble5 = mean force std across 5 MAP models of the same backbone."
        ),
        "",
    ]
    env = results.get("environment", {})
    budget = (
        f"Seed {results['seed']}; {results['threads']} torch thread(s); training budget "
        f"{results['budget_minutes']:g} min per model (wall time, shared CPU), "
        f"{results['ensemble_budget_minutes']:g} min per committee member"
        + "".join(f"; {tag}: {m:g} min" for tag, m in results.get("budget_for", {}).items())
        + f"; status: {results['status']}."
    )
    lines += run_section(
        results["command"],
        date=f"started {results['started']}",
        json_name="potential.json",
        machine=env.get("machine"),
        load_avg=env.get("load_avg"),
        versions=env.get("versions"),
        extra=[budget],
    )
    lines.append("")
    path.write_text("\n".join(lines))


def plot(results: dict[str, Any], path: Path) -> None:
    if not results.get("cost_ratio"):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    colours = dict(zip(MODES, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for backbone, marker in zip(results["cost_ratio"], "os", strict=False):
        for mode in MODES:
            x = results["cost_ratio"][backbone][mode]
            q = results["quality"][backbone][mode]
            for ax, key in zip(axes, ("auroc", "spearman"), strict=False):
                ax.scatter(
                    x, q[key], marker=marker, color=colours[mode], label=f"{backbone} {mode}"
                )
    for ax, label in zip(
        axes, ("OOD AUROC (300 K vs mixedT)", "Spearman(score, force error)"), strict=False
    ):
        ax.set_xscale("log")
        ax.set_xticks([1, 2, 5, 10, 20, 50])
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("cost / plain energy+forces")
        ax.set_ylabel(label)
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".potential.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, default=float))
    os.replace(tmp, out / "potential.json")
    write_markdown(results, out / "potential.md")
    plot(results, out / "potential.png")


# ================================================================ main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.report_only:
        results = json.loads((args.out / "potential.json").read_text())
        write_markdown(results, args.out / "potential.md")
        return results
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="  %(message)s")  # the trainer's per-epoch lines
    results: dict[str, Any] = {
        "command": shlex.join(
            ["python", "-m", "benchmarks.potential", *(sys.argv[1:] if argv is None else argv)]
        ),
        "seed": args.seed,
        "threads": args.threads,
        "budget_minutes": args.budget_minutes,
        "ensemble_budget_minutes": args.ensemble_budget_minutes,
        "budget_for": args.budget_for,
        "data_root": None if args.quick else str(args.data_root),
        "quick": args.quick,
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "environment": environment(),
        "status": "running",
        "datasets": {},
    }
    work = Path(tempfile.mkdtemp(prefix="mlip_unc_potential_bench_"))  # derived data files
    try:
        files = {name: dataset_files(name, args, work) for name in args.datasets}
        run_all(args, files, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"results: {args.out / 'potential.md'}")
    return results


def run_all(
    args: argparse.Namespace, files: dict[str, dict[str, Path]], results: dict[str, Any]
) -> None:
    """Train/evaluate every dataset and backbone, then the cost study; save after each stage."""
    for dataset in args.datasets:
        for backbone in args.backbones:
            model_dir = train_model(dataset, backbone, files[dataset], args)
            results["datasets"].setdefault(dataset, {})[backbone] = accuracy(
                model_dir, files[dataset], args
            )
            print(
                f"[accuracy] {dataset} {backbone}: {results['datasets'][dataset][backbone]}",
                flush=True,
            )
            save(results, args.out)
    cost_set = QUICK_DATASET if args.quick else "3bpa"
    if cost_set in args.datasets and not args.no_cost:
        cost = {}
        results["cost_frames"] = (
            "4-atom EMT Cu cells (quick)" if args.quick else "27-atom 3BPA frames"
        )
        for backbone in args.backbones:
            cost[backbone] = cost_and_quality(backbone, files[cost_set], args)
            results["cost_ratio"] = {b: c["ratio"] for b, c in cost.items()}
            results["cost_ms"] = {b: c["ms"] for b, c in cost.items()}
            results["quality"] = {b: c["quality"] for b, c in cost.items()}
            results["ensemble_train_minutes"] = {
                b: c["ensemble_train_minutes"] for b, c in cost.items()
            }
            results["answer"] = answer(cost)
            save(results, args.out)
    results["status"] = "complete"
    save(results, args.out)


if __name__ == "__main__":
    main()
