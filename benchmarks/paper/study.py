"""Latent-posterior alignment study: training-fraction sweep of bgnn, AGL and interventions.

On the reference split (``<data root>/splits/<dataset>.json``), for each training fraction
(nested subsets of the fixed training set, shuffled by the run's seed), seed and variant, train
the Bayesian GIN property model and record test accuracy, predictive and posterior widths, the
LPA quantities of docs/method.md section 4 and structural calibration (section 7). Each run's
record is appended to ``OUT/paper_study.jsonl`` (default OUT: ``benchmarks/results/paper_study/<dataset>``)
as soon as it finishes; ``--resume`` skips runs already recorded. ``OUT/paper_study.md`` and ``.json``
are rewritten after every run (a partial run still yields a table); the PNGs are drawn at the end (or
with ``--report-only``). ``python -m benchmarks.paper.summary`` puts the datasets' verdicts on one page.

Training length: every run takes ``max(--epochs, --min-steps optimizer steps)`` (cosine learning rate
to zero, final-epoch weights); the committed study uses ``--epochs 20 --min-steps 2000`` so that a
10 % subset gets as many updates as the full set, and ``--interventions-at max`` (the interventions
only at the largest fraction, where claim 2 is judged; bgnn and AGL at every fraction).

Variants: ``bgnn``, ``agl`` (alignment-guided learning, mean form, lambda ramped after a
warm-up), the interventions ``isotropy``, ``anti``, ``rotation`` as trained, and the same
interventions trained with the Bayesian last layer frozen to the posterior of the ``bgnn`` run
of the same seed and fraction (``--frozen-at max``: at the largest fraction only), so that only
the latent geometry differs. Every model is the final epoch of a fixed budget (cosine learning
rate, no early stopping).

Tiny end-to-end check::

    python -m benchmarks.paper.study --dataset esol --fractions 50 100 --seeds 0 --epochs 3 --out /tmp/ps

``--quick`` (CI smoke run, seconds): 40 generated SMILES with a synthetic size-based target and a
fixed random 24/8/8 split instead of a dataset (no data root needed); defaults fractions 50 100,
seed 0, 2 epochs, GIN width 16, 2 layers, d = 8 (each can still be given); needs ``--out``::

    python -m benchmarks.paper.study --quick --out /tmp/ps_quick
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.records import append_jsonl, read_jsonl, take_lock
from benchmarks.paper import lpa as lpa
from benchmarks.paper.report import acceptance, aggregate, render_markdown
from mlip_unc.config import PropertyConfig
from mlip_unc.config import PropertyModelConfig as ModelConfig
from mlip_unc.config import PropertyTrainConfig as TrainConfig
from mlip_unc.data import load_dataset, load_split, training_subset
from mlip_unc.data.molecules import TOY_SMILES, smiles_to_graph
from mlip_unc.data.splits import Split, random_split
from mlip_unc.models.checkpoint import save_checkpoint
from mlip_unc.train.property import model_payload
from mlip_unc.train.text_files import write_json
from mlip_unc.uncertainty import plots

REPO = Path(__file__).resolve().parents[2]
STEM = "paper_study"
VAL_EVAL_EVERY = 5
CPU_S_PER_EPOCH = {"esol": 0.30, "lipo": 1.7, "freesolv": 0.15, "synthetic": 0.01}
"""CPU seconds per epoch on the full training set, measured here (one thread, width 64, 3 layers)."""
Task = dict[str, Any]
QUICK_DATASET = "synthetic"
QUICK_SMILES = list(TOY_SMILES)
QUICK_DEFAULTS = {
    "fractions": [50.0, 100.0],
    "seeds": [0],
    "epochs": 2,
    "hidden": 16,
    "layers": 2,
    "latent_dim": 8,
    "batch_size": 8,
}


def quick_data() -> tuple[dict[int, Any], Split]:
    """--quick: 40 generated molecules, target 0.3 x (SMILES length) + noise, random 24/8/8 split."""
    noise = torch.randn(len(QUICK_SMILES), generator=torch.Generator().manual_seed(0))
    by_row = {}
    for k, smi in enumerate(QUICK_SMILES):
        graph = smiles_to_graph(smi, y=0.3 * len(smi) + 0.1 * float(noise[k]))
        graph.row_id = torch.tensor([k])
        by_row[k] = graph
    return by_row, random_split(len(QUICK_SMILES), (0.6, 0.2, 0.2), seed=0)


def reference_split(dataset: str, data_root: str | Path) -> Split:
    if dataset == QUICK_DATASET:
        return quick_data()[1]
    return load_split(Path(data_root) / "splits" / f"{dataset}.json")


# ============================================================================ settings
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=("lipo", "esol", "freesolv"), default="esol")
    p.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=[10, 25, 50, 75, 100],
        help="Training %% values.",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument(
        "--variants",
        nargs="+",
        default=["bgnn", "agl", *lpa.INTERVENTIONS],
        choices=[v for v in lpa.VARIANTS if not lpa.VARIANTS[v].frozen],
    )
    p.add_argument(
        "--frozen-at",
        choices=("max", "all", "none"),
        default="max",
        help="Fractions at which the interventions are also trained under the frozen bgnn posterior.",
    )
    p.add_argument(
        "--interventions-at",
        choices=("max", "all"),
        default="all",
        help="Fractions at which the interventions are trained as they are (claim 2 uses the largest).",
    )
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument(
        "--min-steps",
        type=int,
        default=0,
        help="Train small fractions for more epochs, up to this many optimizer steps (0: fixed epochs).",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--latent-dim", type=int, default=32)
    p.add_argument(
        "--reg-lambda", type=float, default=1.0, help="lambda_max of AGL and of the interventions."
    )
    p.add_argument(
        "--data-root", type=Path, default=None, help="Default: $MLIP_UNC_DATA, else ../shared/data."
    )
    p.add_argument(
        "--out", type=Path, default=None, help="Default: benchmarks/results/paper_study/<dataset>."
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="bgnn models for the frozen runs (default: runs/paper_study/<dataset>, git-ignored).",
    )
    p.add_argument(
        "--workers", type=int, default=1, help="Parallel runs (processes, one torch thread each)."
    )
    p.add_argument(
        "--resume", action="store_true", help="Skip runs already in OUT/paper_study.jsonl."
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="Only rewrite the report from OUT/paper_study.jsonl.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="40 generated molecules, tiny settings, seconds; needs --out.",
    )
    given = list(sys.argv[1:] if argv is None else argv)
    if "--quick" in given:
        p.set_defaults(**QUICK_DEFAULTS)
    args = p.parse_args(argv)
    if args.quick:
        if not any(a == "--out" or a.startswith("--out=") for a in given):
            p.error("--quick writes to the folder given by --out")
        args.dataset = QUICK_DATASET
        args.work_dir = args.work_dir or args.out / "work"
    if args.data_root is None:
        env = os.environ.get("MLIP_UNC_DATA")
        args.data_root = Path(env) if env else REPO.parent / "shared" / "data"
    if args.out is None:
        args.out = REPO / "benchmarks" / "results" / "paper_study" / args.dataset
    if args.work_dir is None:
        args.work_dir = REPO / "runs" / "paper_study" / args.dataset
    return args


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What must match for a recorded run to be reused (``--resume``)."""
    return {
        "dataset": args.dataset,
        "epochs": args.epochs,
        "min_steps": args.min_steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "hidden": args.hidden,
        "layers": args.layers,
        "latent_dim": args.latent_dim,
        "reg_lambda": args.reg_lambda,
        "agl_form": "mean",
        "keep": "last",
        "scheduler": "cosine",
        "eval_every": VAL_EVAL_EVERY,
        "min_abs_mean_rel": 0.1,
        "knn_k": 10,
    }


def run_epochs(s: dict[str, Any], n_train: int) -> int:
    """``epochs``, or more for a small training set so that it gets at least ``min_steps`` optimizer steps."""
    batches = math.ceil(n_train / s["batch_size"])
    return max(s["epochs"], math.ceil(s.get("min_steps", 0) / batches))


def base_config(s: dict[str, Any], epochs: int) -> PropertyConfig:
    """The bgnn configuration every variant starts from (small GIN, fixed budget, last epoch).

    The AGL and intervention terms start after ``epochs // 5`` and ramp up over ``epochs // 5``.
    """
    model = ModelConfig(
        method="bgnn",
        hidden=s["hidden"],
        layers=s["layers"],
        latent_dim=s["latent_dim"],
        likelihood="homoscedastic",
    )  # the paper's model (the package default is heteroscedastic)
    train = TrainConfig(
        epochs=epochs,
        batch_size=s["batch_size"],
        lr=s["lr"],
        lr_schedule=s["scheduler"],
        patience=0,
        reg_lambda=s["reg_lambda"],
        eval_every=s["eval_every"],
        progress=False,
    )
    return PropertyConfig(model=model, train=train)


def tasks(args: argparse.Namespace) -> list[Task]:
    """Runs in order: seed-major (a partial run has whole seeds), bgnn first in each cell."""
    top = max(args.fractions)
    out = []
    for seed in args.seeds:
        for fraction in sorted(args.fractions):
            names = [
                v
                for v in lpa.VARIANTS
                if v in args.variants
                and (
                    v not in lpa.INTERVENTIONS or args.interventions_at == "all" or fraction == top
                )
            ]
            if args.frozen_at == "all" or (args.frozen_at == "max" and fraction == top):
                names += [f"{iv}_frozen" for iv in lpa.INTERVENTIONS if iv in args.variants]
            out += [{"variant": v, "fraction": float(fraction), "seed": seed} for v in names]
    return out


def run_key(rec: dict[str, Any]) -> tuple[str, float, int]:
    return str(rec["variant"]), float(rec["fraction"]), int(rec["seed"])


def bgnn_path(work_dir: Path, fraction: float, seed: int) -> Path:
    return Path(work_dir) / f"bgnn_f{fraction:g}_s{seed}" / "model.pt"


# ============================================================================ one run (worker)
_STATE: dict[str, Any] = {}


def load_study_data(dataset: str, data_root: str | Path) -> tuple[dict[int, Any], Split]:
    """The graphs of ``dataset`` by row id and its committed split (the quick set: made here)."""
    if dataset == QUICK_DATASET:
        by_row, split = quick_data()
    else:
        by_row = {int(g.row_id): g for g in load_dataset(dataset, data_root)}
        split = load_split(Path(data_root) / "splits" / f"{dataset}.json")
    missing = [r for part in (split.train, split.val, split.test) for r in part if r not in by_row]
    if missing:
        raise ValueError(f"split rows {missing[:5]} are not in the {dataset} data")
    return by_row, split


def init_worker(dataset: str, data_root: str, threads: int) -> None:
    """Per process: one torch thread, the dataset and the split loaded once."""
    torch.set_num_threads(threads)
    by_row, split = load_study_data(dataset, data_root)
    _STATE.update(by_row=by_row, split=split)


def run_one(task: Task, s: dict[str, Any], work_dir: str, top_fraction: float) -> dict[str, Any]:
    """Train one (variant, fraction, seed) and return its record."""
    t0, c0 = time.perf_counter(), time.process_time()
    by_row, split = _STATE["by_row"], _STATE["split"]
    variant, fraction, seed = task["variant"], task["fraction"], task["seed"]
    rows = training_subset(split.train, fraction / 100.0, seed) if fraction < 100 else split.train
    train = [by_row[r] for r in rows]
    val, test = [by_row[r] for r in split.val], [by_row[r] for r in split.test]
    config = lpa.variant_config(base_config(s, run_epochs(s, len(train))), variant, seed)
    frozen = bgnn_path(work_dir, fraction, seed) if lpa.VARIANTS[variant].frozen else None
    model, result = lpa.fit_property_model(
        config, train, val, freeze_posterior=frozen, keep=s["keep"]
    )
    if variant == "bgnn":
        meta = {"n_targets": 1, "train_fraction": fraction}
        save_checkpoint(bgnn_path(work_dir, fraction, seed), model_payload(model, config, meta))
    keep_points = fraction == top_fraction and variant in ("bgnn", "agl")
    record = lpa.study_record(
        model,
        train,
        test,
        min_abs_mean_rel=s["min_abs_mean_rel"],
        knn_k=s["knn_k"],
        keep_points=keep_points,
    )
    last = result.history[-1] if result.history else {}
    tail = (
        result.history[max(0, math.ceil(0.9 * len(result.history)) - 1)] if result.history else {}
    )
    record.update(
        variant=variant,
        fraction=fraction,
        seed=seed,
        epochs_run=result.epochs_run,
        n_steps=result.epochs_run * math.ceil(len(train) / s["batch_size"]),
        regularizer=config.train.regularizer_kind.value,
        intervention=getattr(config.train.intervention, "value", None),
        final_train_nll=last.get("train_nll"),
        final_train_kl_term=last.get("train_kl"),
        train_nll_at_90pct=tail.get(
            "train_nll"
        ),  # convergence check: final - this over the last 10 % of epochs
        final_lambda=last.get("train_lambda"),
        train_seconds=60.0 * result.minutes,
        seconds=time.perf_counter() - t0,
        cpu_seconds=time.process_time() - c0,
    )
    return record


# ============================================================================ records file
def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file; a run recorded twice counts once (the first record)."""
    out: dict[tuple, dict[str, Any]] = {}
    for rec in read_jsonl(path):
        out.setdefault((rec.get("settings", {}).get("dataset"), *run_key(rec)), rec)
    return list(out.values())


def records_for(
    records: list[dict[str, Any]], dataset: str, wanted: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Records of ``dataset``; all must share one setting (``wanted`` when given)."""
    mine = [r for r in records if r.get("settings", {}).get("dataset") == dataset]
    ref = wanted if wanted is not None else (mine[0]["settings"] if mine else None)
    bad = [r for r in mine if r["settings"] != ref]
    if bad:
        diff = {
            k: (bad[0]["settings"].get(k), v)
            for k, v in ref.items()
            if bad[0]["settings"].get(k) != v
        }
        raise SystemExit(
            f"error: {len(bad)} recorded run(s) have other settings {diff} (recorded, expected); "
            "use another --out or remove the JSONL file"
        )
    return mine


# ============================================================================ report
def _header(s: dict[str, Any], records: list[dict[str, Any]], wall: float | None) -> list[str]:
    cpu = [r.get("cpu_seconds", r["seconds"]) for r in records]
    mean_cpu = sum(cpu) / max(len(cpu), 1)
    timing = (
        f"Runs recorded: {len(records)}; CPU seconds per run (one thread) mean {mean_cpu:.1f}, "
        f"total {sum(cpu) / 60:.1f} CPU-min"
    )
    data = (
        f"Dataset: {s['dataset']}, reference split `splits/{s['dataset']}.json` (test set fixed; nested "
        "training subsets shuffled by the run's seed)"
    )
    if s["dataset"] == QUICK_DATASET:
        data = (
            "QUICK smoke run (not a result): 40 generated SMILES with a synthetic size-based target, fixed random "
            "24/8/8 split (nested training subsets shuffled by the run's seed)"
        )
    return [
        "",
        f"{data}. Model: GIN {s['layers']} layers, width {s['hidden']}, latent "
        f"d = {s['latent_dim']}, Bayesian last layer (KL / N_train, homoscedastic noise), {s['epochs']} epochs"
        + (
            f" (more for small fractions: at least {s['min_steps']} optimizer steps)"
            if s.get("min_steps")
            else ""
        )
        + ", batch "
        f"{s['batch_size']}, Adam lr {s['lr']} with cosine decay, final-epoch weights. AGL: mean form, lambda = "
        f"{s['reg_lambda']} after a warm-up of epochs/5 and a ramp of epochs/5; interventions with the same lambda "
        "schedule (rotation: a fixed random orthogonal Q).",
        "",
        timing + (f"; wall time of the last invocation {wall / 60:.1f} min." if wall else "."),
        "",
        (
            "Definitions: epistemic std = sqrt(z^T S z + s_b^2), total std adds the learned noise; mean s = mean "
            "posterior std of the last-layer weights; kappa, A (median over the test points whose |m| = |mu^T z| exceeds "
            "0.1 times the root mean square of m), rho_LPA and ||z||^2 as in docs/method.md section 4; structural "
            "calibration = Spearman of the epistemic std (the total std ranks the same with homoscedastic noise) with the "
            "latent kNN distance (k = 10, standardised latents) and with 1 - max Morgan-Tanimoto similarity to the "
            "training molecules. 'RMSE within 10 %' (interventions) is |ratio - 1| <= 0.10; 'within 5 %' (AGL) is at most "
            "5 % worse. Comparisons use the seeds two cells share."
        ),
        "",
        (
            f"Figures: `{STEM}.png` (LPA decomposition vs training fraction), `{STEM}_calibration_{{bgnn,agl}}.png`, "
            f"`{STEM}_density_knn_{{bgnn,agl}}.png`, `{STEM}_density_tanimoto_{{bgnn,agl}}.png` (largest fraction, "
            "first seed)."
        ),
    ]


def write_report(
    out: Path, records: list[dict], s: dict[str, Any], *, pngs: bool, wall: float | None
) -> None:
    """Rewrite OUT/paper_study.md and .json (and the PNGs); the commands shown are those that made the records."""
    command = "\n".join(dict.fromkeys(r["command"] for r in records)) if records else "(no runs)"
    seeds = sorted({int(r["seed"]) for r in records})
    if wall is None and (out / f"{STEM}.json").is_file():  # --report-only: the run's own
        wall = json.loads((out / f"{STEM}.json").read_text(encoding="utf-8")).get("wall_s")
    md = render_markdown(records, command=command, seeds=seeds, header=_header(s, records, wall))
    (out / f"{STEM}.md").write_text(md, encoding="utf-8")
    summary = {
        "command": command,
        "wall_s": wall,  # of the last invocation
        "seeds": seeds,
        "settings": s,
        "n_runs": len(records),
        "rows": aggregate(records),
        "acceptance": acceptance(records),
    }
    write_json(out / f"{STEM}.json", summary)
    if pngs and records:
        draw_figures(out, records)


def draw_figures(out: Path, records: list[dict[str, Any]]) -> None:
    table = [r for r in records if not lpa.VARIANTS[r["variant"]].frozen]
    panels = {
        "epistemic std": "mean_epistemic_std",
        "total std": "mean_std",
        "mean posterior s": "mean_s",
        "kappa": "mean_kappa",
        "||z||^2": "mean_norm2",
    }
    plots.plot_lpa_vs_fraction(table, out / f"{STEM}.png", panels=panels, group_key="variant")
    for variant in ("bgnn", "agl"):
        with_points = sorted(
            (r for r in records if r["variant"] == variant and "points" in r),
            key=lambda r: r["seed"],
        )
        if not with_points:
            continue
        pts, label = with_points[0]["points"], f"{variant} seed {with_points[0]['seed']}"
        plots.plot_calibration_curve(
            pts["mean"],
            pts["std"],
            pts["y_true"],
            out / f"{STEM}_calibration_{variant}.png",
            label=label,
        )
        for proxy, name in (
            ("knn_distance", "latent kNN distance"),
            ("one_minus_tanimoto", "1 - max Tanimoto"),
        ):
            tag = "knn" if proxy == "knn_distance" else "tanimoto"
            plots.plot_std_vs_density(
                pts["epistemic_std"],
                pts[proxy],
                out / f"{STEM}_density_{tag}_{variant}.png",
                proxy_label=f"{name} ({label})",
            )


# ============================================================================ the loop
def run_serial(
    todo: list[Task], call: Callable[[Task], dict], finish: Callable, ready: Callable
) -> list[Task]:
    skipped = []
    for task in todo:
        if ready(task):
            finish(task, call(task))
        else:
            skipped.append(task)
    return skipped


def run_parallel(
    todo: list[Task],
    workers: int,
    initargs: tuple,
    submit_args: tuple,
    finish: Callable,
    ready: Callable,
) -> list[Task]:
    """A small dependency-aware scheduler: a frozen run waits for its bgnn run."""
    pending, running = list(todo), {}
    with ProcessPoolExecutor(
        workers, mp_context=get_context("spawn"), initializer=init_worker, initargs=initargs
    ) as pool:
        try:
            while pending or running:
                while len(running) < workers and (
                    task := next((t for t in pending if ready(t)), None)
                ):
                    pending.remove(task)
                    running[pool.submit(run_one, task, *submit_args)] = task
                if not running:  # nothing runnable: a bgnn model is missing
                    return pending
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    finish(running.pop(fut), fut.result())
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return []


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    command = shlex.join(
        ["python", "-m", "benchmarks.paper.study", *(sys.argv[1:] if argv is None else argv)]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    jsonl = args.out / f"{STEM}.jsonl"
    if args.report_only:
        records = records_for(read_records(jsonl), args.dataset, None)
        write_report(
            args.out,
            records,
            records[0]["settings"] if records else settings(args),
            pngs=True,
            wall=None,
        )
        print(f"wrote {args.out / STEM}.md from {len(records)} record(s)")
        return
    existing = read_records(jsonl)
    if existing and not args.resume:
        raise SystemExit(
            f"error: {jsonl} exists; pass --resume to continue it or choose another --out"
        )
    s = settings(args)
    records = records_for(existing, args.dataset, s)
    lock = args.out / f".{STEM}.lock"
    take_lock(lock, owner="benchmarks.paper.study")
    try:
        run_study(args, s, records, jsonl, command)
    finally:
        lock.unlink(missing_ok=True)


def run_study(
    args: argparse.Namespace, s: dict[str, Any], records: list[dict], jsonl: Path, command: str
) -> None:
    done = {run_key(r) for r in records}
    todo = [t for t in tasks(args) if run_key(t) not in done]
    n_full = len(reference_split(args.dataset, args.data_root).train)
    cost = {  # relative cost of a run: epochs x (fraction + validation overhead), in full-data epochs
        f: run_epochs(s, round(f / 100 * n_full)) / args.epochs * (f / 100.0 + 0.02)
        for f in args.fractions
    }
    scale = args.epochs * CPU_S_PER_EPOCH[args.dataset] * (args.hidden / 64) ** 2 * args.layers / 3
    prior = sum(cost[t["fraction"]] for t in todo) * scale / max(1, args.workers) / 60
    print(
        f"{len(todo)} run(s) to do ({len(done)} already recorded), {args.workers} worker(s); prior estimate "
        f"{prior:.0f} min on free cores, longer on busy ones (refined after each run)",
        flush=True,
    )
    t_start, spent = time.perf_counter(), {"cost": 0.0}

    def finish(task: Task, record: dict[str, Any]) -> None:
        record.update(settings=s, command=command)
        append_jsonl(jsonl, record)
        records.append(record)
        done.add(run_key(record))
        spent["cost"] += cost[task["fraction"]]
        left = sum(cost[t["fraction"]] for t in todo if run_key(t) not in done)
        eta = (time.perf_counter() - t_start) / spent["cost"] * left / 60  # at the pace so far
        print(
            f"[{len(done)}] {task['variant']:<16} {task['fraction']:>4g} % seed {task['seed']}: "
            f"rmse {record['rmse']:.3f} epi std {record['mean_epistemic_std']:.3f} s {record['mean_s']:.3f} "
            f"kappa {record['mean_kappa']:.3f} ({record['seconds']:.1f} s, {record['cpu_seconds']:.1f} CPU s); "
            f"estimated time left {eta:.1f} min",
            flush=True,
        )
        write_report(args.out, records, s, pngs=False, wall=time.perf_counter() - t_start)

    def ready(task: Task) -> bool:
        if not lpa.VARIANTS[task["variant"]].frozen:
            return True
        key = ("bgnn", task["fraction"], task["seed"])
        return key in done and bgnn_path(args.work_dir, task["fraction"], task["seed"]).exists()

    submit_args = (s, str(args.work_dir), float(max(args.fractions)))
    initargs = (args.dataset, str(args.data_root), 1)
    if args.workers <= 1:
        init_worker(*initargs)
        skipped = run_serial(todo, lambda t: run_one(t, *submit_args), finish, ready)
    else:
        skipped = run_parallel(todo, args.workers, initargs, submit_args, finish, ready)
    for t in skipped:
        print(
            f"skipped {t}: no bgnn model at {bgnn_path(args.work_dir, t['fraction'], t['seed'])}",
            flush=True,
        )
    write_report(args.out, records, s, pngs=True, wall=time.perf_counter() - t_start)
    print(f"wrote {args.out / STEM}.md, .json, .png ({len(records)} runs)")


if __name__ == "__main__":
    main()
