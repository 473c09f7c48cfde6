"""Molecular property benchmark: our uncertainty methods and chemprop 2.x, raw and recalibrated.

Datasets ESOL, FreeSolv, Lipophilicity, BACE (pIC50 regression), QM7 and CEP (a seeded random
subset, ``--cep-max``) from ``--data-root`` / ``$MLIP_UNC_DATA`` (default ``../shared/data``,
see its SOURCES.md). Two splits per dataset, each fixed for all seeds and methods so that
every method is scored on the same test molecules: ``random`` (the reference file
``<data root>/splits/<name>.json`` where it exists, else the same recipe, a seeded 80/10/10
``random_split(n, seed=0)``) and ``scaffold`` (Bemis-Murcko, ``scaffold_split(smiles, seed=0)``).
The seed varies the weights and the shuffling.

Methods: ours on one GIN backbone and one training rule (``mlip-unc property train``'s code,
``train_property_model``): ``bgnn`` (Bayesian last layer, homoscedastic noise), ``bgnn_hetero``
(heteroscedastic noise: the package default, chosen from this table, see
:func:`compare_likelihoods`), ``agl``, ``mcdropout``, ``ensemble5``, ``mve``, ``laplace`` (MAP +
full-covariance last-layer Laplace posterior); chemprop through its own CLI
(``chemprop train`` / ``chemprop predict``): ``chemprop_mve`` and ``chemprop_mve_ensemble5``
(five MVE models; total variance = mean of the variances + variance of the means).

Per run, on the test split: rmse, mae, nll, spearman(sigma, |e|), miscalibration area, ENCE,
coverage@95, CRPS, sharpness -- raw, recalibrated by the default recalibrator (one std factor
fitted on the validation split by NLL, ``zscaling``; for chemprop the same fit on its
validation predictions) and by isotonic recalibration; structural calibration = Spearman of
sigma with 1 - max Morgan-Tanimoto similarity to the training molecules and with the latent
kNN distance (ours); training seconds. Every finished (dataset, split, method, seed) run is
appended to ``OUT/molecular.jsonl`` and skipped when present; ``molecular.md`` (acceptance,
default likelihood and overview tables), ``molecular_tables.md`` (every metric of every cell)
and ``molecular.json`` are rewritten after every run (mean +- std over all records of a cell,
with n), the PNG calibration panels at the end (or with ``--report-only``).

    python -m benchmarks.molecular --datasets esol freesolv lipo --seeds 0 1 2  # a full run (hours)
    python -m benchmarks.molecular --report-only     # rewrite the pages from OUT/molecular.jsonl
    python -m benchmarks.molecular --quick --out /tmp/mol_quick   # generated SMILES, < 1 min
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.pages import environment, run_section
from benchmarks.common.records import append_jsonl, read_jsonl, take_lock
from benchmarks.common.tables import Table, write_page
from mlip_unc import keys
from mlip_unc.config import PropertyConfig
from mlip_unc.config import PropertyModelConfig as ModelConfig
from mlip_unc.config import PropertyTrainConfig as TrainConfig
from mlip_unc.data.molecules import load_csv, load_dataset
from mlip_unc.data.splits import load_split, random_split, scaffold_split
from mlip_unc.models.property import predict_graphs
from mlip_unc.train.property import train_property_model
from mlip_unc.train.text_files import write_json
from mlip_unc.uncertainty.calibration import calibration_curve, regression_metrics
from mlip_unc.uncertainty.density import (
    latent_knn_distance,
    structural_calibration,
    tanimoto_max_similarity,
)
from mlip_unc.uncertainty.recalibration import IsotonicRecalibration, ZScaling

REPO = Path(__file__).resolve().parents[1]
STEM = "molecular"
DATASETS = ("esol", "freesolv", "lipo", "bace", "qm7", "cep")
SPLITS = ("random", "scaffold")
OURS: dict[str, dict[str, Any]] = {
    "bgnn": {"method": "bgnn", "likelihood": "homoscedastic"},
    "bgnn_hetero": {"method": "bgnn", "likelihood": "heteroscedastic"},
    "agl": {"method": "agl"},
    "mcdropout": {"method": "mcdropout"},
    "ensemble5": {"method": "ensemble", "ensemble_size": 5},
    "mve": {"method": "mve"},
    "laplace": {"method": "laplace"},
}
CHEMPROP: dict[str, int] = {
    "chemprop_mve": 1,
    "chemprop_mve_ensemble5": 5,
}  # method -> ensemble size
METHODS = (*OURS, *CHEMPROP)
DEFAULT_METHOD = (
    "bgnn_hetero"  # the package default (`mlip-unc property train` without --method), recalibrated
)
REFERENCE = "chemprop_mve"
METRICS = (
    "rmse",
    "mae",
    "nll",
    "spearman",
    "miscalibration_area",
    "ence",
    "coverage_95",
    "crps",
    "sharpness",
)
VARIANTS = ("raw", "recal", "recal_isotonic")
EXTRA = ("struct_cal_tanimoto", "struct_cal_knn", "train_seconds", "epochs_run", "recal_scale")
Task = dict[str, Any]


# ============================================================================ settings
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--splits", nargs="+", default=list(SPLITS), choices=SPLITS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--epochs", type=int, default=40, help="Max epochs per training (ours).")
    p.add_argument(
        "--patience", type=int, default=10, help="Early stopping on validation NLL (ours)."
    )
    p.add_argument(
        "--max-minutes", type=float, default=None, help="Wall-time cap per training (ours)."
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--latent-dim", type=int, default=32)
    p.add_argument("--chemprop-epochs", type=int, default=40)
    p.add_argument("--chemprop-patience", type=int, default=10)
    p.add_argument(
        "--cep-max",
        type=int,
        default=3000,
        help="CEP: seeded random subset of this many molecules.",
    )
    p.add_argument("--knn-k", type=int, default=10)
    p.add_argument("--mc-samples", type=int, default=50, help="MC-dropout passes at prediction.")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (and OMP threads of chemprop)."
    )
    p.add_argument(
        "--chemprop-bin",
        default=None,
        help="chemprop executable (default: `chemprop` on PATH, else runs/.venv-chemprop/bin/chemprop).",
    )
    p.add_argument(
        "--data-root", type=Path, default=None, help="Default: $MLIP_UNC_DATA, else ../shared/data."
    )
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument(
        "--quick",
        action="store_true",
        help="Tiny generated SMILES data, small model, 2 epochs, ours only.",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="Only rewrite md/json/png from OUT/molecular.jsonl.",
    )
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSONL",
        help="Append the runs of other molecular.jsonl files (same settings; e.g. a second process run with "
        "another --out on other datasets) that OUT's file lacks, then rewrite the report.",
    )
    args = p.parse_args(argv)
    if args.data_root is None:
        env = os.environ.get("MLIP_UNC_DATA")
        args.data_root = Path(env) if env else REPO.parent / "shared" / "data"
    given = sys.argv[1:] if argv is None else list(argv)
    if args.quick:
        args.datasets, args.seeds = ["tiny"], args.seeds if "--seeds" in given else [0, 1]
        args.epochs, args.patience, args.hidden, args.layers, args.latent_dim = 2, 0, 16, 2, 8
        args.batch_size, args.mc_samples, args.chemprop_epochs = (
            16,
            10,
            3,
        )  # chemprop: epochs > its 2 warm-up epochs
        if "--methods" not in given:
            args.methods = list(OURS)
    return args


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What must match for a recorded run to be reused."""
    return {
        "quick": args.quick,
        "epochs": args.epochs,
        "patience": args.patience,
        "max_minutes": args.max_minutes,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "hidden": args.hidden,
        "layers": args.layers,
        "latent_dim": args.latent_dim,
        "chemprop_epochs": args.chemprop_epochs,
        "chemprop_patience": args.chemprop_patience,
        "cep_max": args.cep_max,
        "knn_k": args.knn_k,
        "mc_samples": args.mc_samples,
        "recalibration": "zscaling",
        "split_seed": 0,
    }


def tasks(args: argparse.Namespace) -> list[Task]:
    """Seed-major (a partial run holds whole seeds of the earlier datasets), then dataset, split, method."""
    return [
        {"dataset": d, "split": sp, "method": m, "seed": s}
        for s in args.seeds
        for d in args.datasets
        for sp in args.splits
        for m in args.methods
    ]


def run_key(rec: dict[str, Any]) -> tuple[str, str, str, int]:
    return str(rec["dataset"]), str(rec["split"]), str(rec["method"]), int(rec["seed"])


# ============================================================================ data
TINY_CHAINS = ("C", "CC", "CCC", "CC(C)")
TINY_RINGS = (
    "c1ccccc1",
    "C1CCCCC1",
    "c1ccncc1",
    "c1ccsc1",
    "c1ccoc1",
    "C1CCC1",
    "C1CCOC1",
    "C1CCNCC1",
    "c1ccc2ccccc2c1",
    "C1CC1",
    "c1cncnc1",
    "C1CCCC1",
    "c1cc[nH]c1",
    "C1CCSC1",
    "O=C1CCCC1",
    "C1CCOCC1",
)
TINY_TAILS = ("", "O", "N", "Cl", "F", "C(=O)O", "OC", "C#N", "S", "C(C)C")


def tiny_csv(path: Path) -> Path:
    """A generated CSV (smiles, y) of 120 small molecules, y = RDKit Crippen logP (deterministic):
    4 chains x 10 substituents (one acyclic scaffold) and 16 ring systems x 5 (16 scaffolds)."""
    from rdkit import Chem
    from rdkit.Chem import Crippen

    rows = []
    pairs = [(h, t) for h in TINY_CHAINS for t in TINY_TAILS] + [
        (h, t) for h in TINY_RINGS for t in TINY_TAILS[:5]
    ]
    for head, tail in pairs:
        mol = Chem.MolFromSmiles(head + tail)
        rows.append((Chem.MolToSmiles(mol), f"{Crippen.MolLogP(mol):.4f}"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["smiles", "y"])
        writer.writerows(rows)
    return path


def load_graphs(name: str, args: argparse.Namespace, work: Path) -> list:
    """All graphs of ``name`` (CEP: a seeded random subset of ``--cep-max`` rows), in row order."""
    if name == "tiny":
        return load_csv(tiny_csv(work / "tiny.csv"), "smiles", "y")
    graphs = load_dataset(name, args.data_root)
    if name == "cep" and len(graphs) > args.cep_max:
        keep = np.sort(np.random.default_rng(0).choice(len(graphs), args.cep_max, replace=False))
        graphs = [graphs[int(k)] for k in keep]
    return graphs


def make_split(name: str, kind: str, graphs: list, data_root: Path) -> tuple[list, list, list, str]:
    """(train, val, test, description) of one fixed split of ``graphs``."""
    if kind == "scaffold":
        rows = scaffold_split([g[keys.SMILES] for g in graphs], seed=0)
        how = "scaffold_split(seed=0), 80/10/10"
    else:
        ref = data_root / "splits" / f"{name}.json"
        if ref.is_file():
            by_row = {int(g[keys.ROW_INDEX]): k for k, g in enumerate(graphs)}
            split = load_split(ref)
            rows = type(split)(
                *(tuple(by_row[r] for r in getattr(split, p)) for p in ("train", "val", "test"))
            )
            how = f"reference file splits/{name}.json"
        else:
            rows = random_split(len(graphs), seed=0)
            how = "random_split(n, seed=0), 80/10/10"
    parts = [[graphs[k] for k in getattr(rows, p)] for p in ("train", "val", "test")]
    return parts[0], parts[1], parts[2], how


def _y(graphs: list) -> np.ndarray:
    return torch.cat([g[keys.TARGET] for g in graphs]).double().numpy()[:, 0]


# ============================================================================ metrics (pure helpers)
def evaluate(val: dict[str, np.ndarray], test: dict[str, np.ndarray]) -> dict[str, Any]:
    """Raw, zscaling- and isotonic-recalibrated test metrics; both recalibrators fitted on ``val``.

    ``val`` / ``test``: ``{"mean", "std", "y"}`` arrays (n,). Returns ``{"raw": {...},
    "recal": {...}, "recal_isotonic": {...}, "recal_scale", "isotonic_scale", "val_nll_raw",
    "val_nll_recal"}``.
    """
    z = ZScaling().fit(val["mean"], val["std"], val["y"], nan_policy="omit")
    iso = IsotonicRecalibration().fit(val["mean"], val["std"], val["y"], nan_policy="omit")
    out: dict[str, Any] = {}
    for name, factor in (("raw", 1.0), ("recal", z.scale), ("recal_isotonic", iso.scale)):
        out[name] = regression_metrics(
            test["mean"], factor * test["std"], test["y"], nan_policy="omit"
        )
    out.update(
        recal_scale=z.scale,
        isotonic_scale=iso.scale,
        val_nll_raw=regression_metrics(val["mean"], val["std"], val["y"], nan_policy="omit")["nll"],
        val_nll_recal=regression_metrics(
            val["mean"], z.scale * val["std"], val["y"], nan_policy="omit"
        )["nll"],
    )
    return out


def mixture(means: np.ndarray, variances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of an equal-weight Gaussian mixture: means, variances (M, n) -> (n,), (n,)."""
    mean = means.mean(0)
    var = variances.mean(0) + means.var(0)
    return mean, np.sqrt(np.maximum(var, 0.0))


def mean_std(values: Sequence[float]) -> dict[str, float | int]:
    """``{"mean", "std" (ddof 1; 0 for one value), "n"}`` of the finite values (NaN mean if none)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    return {
        "mean": float(v.mean()),
        "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "n": int(v.size),
    }


def aggregate(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, split, method): mean/std/n over every record (repeats included)."""
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        cells.setdefault(run_key(r)[:3], []).append(r)
    order = {m: k for k, m in enumerate(METHODS)}
    rows = []
    for (d, sp, m), recs in sorted(
        cells.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 99))
    ):
        row: dict[str, Any] = {
            "dataset": d,
            "split": sp,
            "method": m,
            "n": len(recs),
            "seeds": sorted(int(r["seed"]) for r in recs),
        }
        for v in VARIANTS:
            row[v] = {k: mean_std([r[v][k] for r in recs if v in r]) for k in METRICS}
        for k in EXTRA:
            row[k] = mean_std([r.get(k) for r in recs])
        rows.append(row)
    return rows


def acceptance(
    rows: list[dict[str, Any]],
    datasets: Sequence[str] = DATASETS,
    *,
    split: str = "random",
    ours: str = DEFAULT_METHOD,
    ref_variant: str = "raw",
) -> dict[str, Any]:
    """'The recalibrated default beats chemprop MVE's miscalibration area and NLL on at least 4 of
    6 datasets at equal or better RMSE', from the aggregated rows of one split.

    Equal or better RMSE: our mean RMSE <= chemprop's + the standard error of the difference of the
    two means (sqrt(s1^2/n1 + s2^2/n2)); with one seed each that is a plain <=.
    """
    by = {(r["dataset"], r["split"], r["method"]): r for r in rows}
    per, wins, measured = {}, 0, 0
    for d in datasets:
        a, b = by.get((d, split, ours)), by.get((d, split, REFERENCE))
        if a is None or b is None:
            per[d] = {"measured": False}
            continue
        measured += 1
        ra, rb = a["raw"]["rmse"], b["raw"]["rmse"]
        se = math.sqrt(ra["std"] ** 2 / max(ra["n"], 1) + rb["std"] ** 2 / max(rb["n"], 1))
        cells = {}
        for k in ("miscalibration_area", "nll", "rmse"):
            x, y = a["recal"][k]["mean"], b[ref_variant][k]["mean"]
            cells[k] = {"ours": x, "chemprop": y, "diff": x - y}
        ok_rmse = ra["mean"] <= rb["mean"] + se
        ok = cells["miscalibration_area"]["diff"] < 0 and cells["nll"]["diff"] < 0 and ok_rmse
        wins += int(ok)
        per[d] = {
            "measured": True,
            "beats": ok,
            "rmse_equal_or_better": ok_rmse,
            "rmse_tolerance": se,
            "n_ours": a["n"],
            "n_chemprop": b["n"],
            **cells,
        }
    need = math.ceil(4 * len(datasets) / 6)  # 4 of the 6 datasets (scaled for --quick's one)
    verdict = (
        "met"
        if wins >= need
        else ("not met" if wins + (len(datasets) - measured) < need else "undetermined")
    )
    return {
        "split": split,
        "ours": f"{ours} (recalibrated)",
        "reference": f"{REFERENCE} ({ref_variant})",
        "wins": wins,
        "measured": measured,
        "needed": need,
        "of": len(datasets),
        "verdict": verdict,
        "per_dataset": per,
    }


# ============================================================================ one run
class Context:
    """Per-invocation cache: graphs and splits per dataset, Tanimoto similarities per split."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self._graphs: dict[str, list] = {}
        self._splits: dict[tuple[str, str], tuple[list, list, list, str]] = {}
        self._tanimoto: dict[tuple[str, str], np.ndarray] = {}

    def split(self, dataset: str, kind: str) -> tuple[list, list, list, str]:
        if dataset not in self._graphs:
            self._graphs[dataset] = load_graphs(dataset, self.args, self.work)
        if (dataset, kind) not in self._splits:
            self._splits[dataset, kind] = make_split(
                dataset, kind, self._graphs[dataset], self.args.data_root
            )
        return self._splits[dataset, kind]

    def one_minus_tanimoto(self, dataset: str, kind: str) -> np.ndarray:
        if (dataset, kind) not in self._tanimoto:
            train, _, test, _ = self.split(dataset, kind)
            sim = tanimoto_max_similarity(
                [g[keys.SMILES] for g in test], [g[keys.SMILES] for g in train]
            )
            self._tanimoto[dataset, kind] = 1.0 - sim
        return self._tanimoto[dataset, kind]


def our_config(method: str, s: dict[str, Any], seed: int) -> PropertyConfig:
    """The configuration of one of our methods: small GIN, early stopping on validation NLL, best weights."""
    spec = dict(OURS[method])
    model = ModelConfig(
        hidden=s["hidden"],
        layers=s["layers"],
        latent_dim=s["latent_dim"],
        mc_samples=s["mc_samples"],
        **spec,
    )
    train = TrainConfig(
        epochs=s["epochs"],
        batch_size=s["batch_size"],
        lr=s["lr"],
        patience=s["patience"] or None,
        max_minutes=s["max_minutes"],
        seed=seed,
        calibration="zscaling",
        progress=False,
    )
    return PropertyConfig(model=model, train=train)


def run_ours(task: Task, ctx: Context, s: dict[str, Any]) -> dict[str, Any]:
    train, val, test, _ = ctx.split(task["dataset"], task["split"])
    config = our_config(task["method"], s, task["seed"])
    with tempfile.TemporaryDirectory(dir=ctx.work) as tmp:
        predictor, metrics = train_property_model(
            config, train, val, test, out_dir=tmp, metadata={"target_names": [task["dataset"]]}
        )
    model = predictor.model
    out_v = predict_graphs(model, val)
    out_t, z_train = predict_graphs(model, test, latent=True), latents(model, train)
    arr = {
        "val": {
            "mean": out_v[keys.PREDICTION][:, 0],
            "std": out_v[keys.PREDICTION_VAR][:, 0].clamp_min(0).sqrt(),
            "y": _y(val),
        },
        "test": {
            "mean": out_t[keys.PREDICTION][:, 0],
            "std": out_t[keys.PREDICTION_VAR][:, 0].clamp_min(0).sqrt(),
            "y": _y(test),
        },
    }
    arr = {
        k: {n: np.asarray(v.double().numpy() if torch.is_tensor(v) else v) for n, v in d.items()}
        for k, d in arr.items()
    }
    rec = evaluate(arr["val"], arr["test"])
    knn = latent_knn_distance(
        out_t[keys.LATENT].double(), z_train.double(), k=min(s["knn_k"], len(train))
    )
    rec.update(
        struct_cal_knn=structural_calibration(arr["test"]["std"], knn),
        recal_scale_stored=(metrics["recalibration"]["scale"] or [None])[0],
        epochs_run=metrics["epochs_run"],
        best_epoch=metrics["best_epoch"],
        train_seconds=metrics["train_seconds"],
        mean_epistemic_std=float(
            np.sqrt(out_t[keys.EPISTEMIC_VAR][:, 0].clamp_min(0).double().numpy()).mean()
        ),
    )
    return _finish(rec, arr["test"], task, ctx)


@torch.no_grad()
def latents(model: torch.nn.Module, graphs: list, batch_size: int = 256) -> torch.Tensor:
    """Head inputs (n, d) in eval mode: ``model.latent`` (one pass, also for MC dropout), else the
    predictive's LATENT (ensembles: the first member's)."""
    if not hasattr(model, "latent"):
        return predict_graphs(model, graphs, batch_size=batch_size, latent=True)[keys.LATENT]
    from torch_geometric.data import Batch

    was = model.training
    model.eval()
    try:
        return torch.cat(
            [
                model.latent(Batch.from_data_list(graphs[k : k + batch_size]))
                for k in range(0, len(graphs), batch_size)
            ]
        )
    finally:
        model.train(was)


def _finish(
    rec: dict[str, Any], test: dict[str, np.ndarray], task: Task, ctx: Context
) -> dict[str, Any]:
    """Structural calibration with Tanimoto, sizes and (first seed) the per-point test arrays."""
    train, val, tst, how = ctx.split(task["dataset"], task["split"])
    rec["struct_cal_tanimoto"] = structural_calibration(
        test["std"], ctx.one_minus_tanimoto(task["dataset"], task["split"])
    )
    rec.update(n_train=len(train), n_val=len(val), n_test=len(tst), split_rule=how)
    if task["seed"] == min(ctx.args.seeds):
        rec["points"] = {k: [round(float(x), 6) for x in test[k]] for k in ("y", "mean", "std")}
    return rec


def chemprop_bin(args: argparse.Namespace) -> str | None:
    """The chemprop executable, or None when it is not installed."""
    if args.chemprop_bin:
        return args.chemprop_bin
    found = shutil.which("chemprop")
    local = REPO / "runs" / ".venv-chemprop" / "bin" / "chemprop"
    return found or (str(local) if local.exists() else None)


def _write_csv(path: Path, rows: list[tuple[str, Any, str]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["smiles", "y", "split"])
        writer.writerows(rows)


def run_chemprop(task: Task, ctx: Context, s: dict[str, Any]) -> dict[str, Any]:
    """``chemprop train -t regression-mve`` (ensemble of M) on the same split, then ``chemprop predict``."""
    exe = chemprop_bin(ctx.args)
    if exe is None:
        raise RuntimeError(
            "chemprop is not installed (pip install 'mlip-unc[chemprop]' or --chemprop-bin)"
        )
    train, val, test, _ = ctx.split(task["dataset"], task["split"])
    m = CHEMPROP[task["method"]]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(ctx.args.threads),
        "MKL_NUM_THREADS": str(ctx.args.threads),
    }
    with tempfile.TemporaryDirectory(dir=ctx.work) as tmp:
        tmp = Path(tmp)
        rows = [
            (g[keys.SMILES], f"{float(g[keys.TARGET][0, 0]):.8g}", part)
            for part, graphs in (("train", train), ("val", val), ("test", test))
            for g in graphs
        ]
        _write_csv(tmp / "data.csv", rows)
        with (tmp / "predict.csv").open(
            "w", newline=""
        ) as handle:  # SMILES only: chemprop writes column y
            csv.writer(handle).writerows([["smiles"]] + [[r[0]] for r in rows if r[2] != "train"])
        common = ["--accelerator", "cpu", "--devices", "1", "-n", "0", "-s", "smiles"]
        train_cmd = [
            exe,
            "train",
            "-i",
            str(tmp / "data.csv"),
            "--target-columns",
            "y",
            "--splits-column",
            "split",
            "-t",
            "regression-mve",
            "--epochs",
            str(s["chemprop_epochs"]),
            "--patience",
            str(s["chemprop_patience"]),
            "--pytorch-seed",
            str(task["seed"]),
            "--data-seed",
            str(task["seed"]),
            "--ensemble-size",
            str(m),
            "--remove-checkpoints",
            "-o",
            str(tmp / "model"),
            *common,
        ]
        t0 = time.perf_counter()
        _call(train_cmd, env)
        train_seconds = time.perf_counter() - t0
        pred_cmd = [
            exe,
            "predict",
            "-i",
            str(tmp / "predict.csv"),
            "--model-paths",
            str(tmp / "model"),
            "--uncertainty-method",
            "mve",
            "-o",
            str(tmp / "preds.csv"),
            *common,
        ]
        _call(pred_cmd, env)
        means, variances = _chemprop_predictions(tmp / "preds.csv", m)
    parts = np.array([r[2] for r in rows if r[2] != "train"])
    mean, std = mixture(means, variances)
    arr = {
        p: {"mean": mean[parts == p], "std": std[parts == p], "y": _y(g)}
        for p, g in (("val", val), ("test", test))
    }
    rec = evaluate(arr["val"], arr["test"])
    rec.update(
        train_seconds=train_seconds,
        chemprop_command=shlex.join(train_cmd[1:]).replace(str(tmp), "TMP"),
        chemprop_version=_chemprop_version(exe),
    )
    return _finish(rec, arr["test"], task, ctx)


def _call(cmd: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(cmd[:2])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )


def _chemprop_predictions(path: Path, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-model means and variances (M, n) from chemprop predict's CSV (``_individual`` for M > 1)."""
    import pandas as pd

    if m == 1:
        df = pd.read_csv(path)
        return df[["y"]].to_numpy().T, df[["y_unc"]].to_numpy().T
    df = pd.read_csv(path.with_name(path.stem + "_individual" + path.suffix))
    mean_cols = [c for c in df.columns if c.startswith("y_model_")]
    unc_cols = [c for c in df.columns if c.startswith("y_unc_model_")]
    if len(mean_cols) != m or len(unc_cols) != m:
        raise RuntimeError(f"{path}: expected {m} per-model columns, found {list(df.columns)}")
    return df[mean_cols].to_numpy().T, df[unc_cols].to_numpy().T


@functools.cache
def _chemprop_version(exe: str) -> str:
    python = Path(exe).with_name("python")
    try:
        out = subprocess.run(
            [str(python), "-c", "import chemprop; print(chemprop.__version__)"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


# ============================================================================ records file
def check_settings(records: list[dict[str, Any]], wanted: dict[str, Any]) -> None:
    bad = [r for r in records if r.get("settings") != wanted]
    if bad:
        diff = {
            k: (bad[0].get("settings", {}).get(k), v)
            for k, v in wanted.items()
            if bad[0].get("settings", {}).get(k) != v
        }
        raise SystemExit(
            f"error: {len(bad)} recorded run(s) have other settings {diff} (recorded, now); "
            "use another --out or the recorded settings"
        )


# ============================================================================ default likelihood
# The property model's default likelihood, read off the table: ``bgnn`` (one learned sigma_n)
# against ``bgnn_hetero`` (sigma_n(x) from the latent) on every (dataset, split) where both ran:
# recalibrated NLL and miscalibration area, raw Spearman(sigma, |error|) and RMSE, means over
# seeds; a tie at the shown digits counts for neither.
HOMO, HETERO = "bgnn", "bgnn_hetero"
# (metric, variant, better): the columns the choice is made on
CRITERIA: tuple[tuple[str, str, str], ...] = (
    ("nll", "recal", "lower"),
    ("miscalibration_area", "recal", "lower"),
    ("spearman", "raw", "higher"),
    ("rmse", "raw", "lower"),
)


def compare_likelihoods(
    rows: list[dict[str, Any]], homo: str = HOMO, hetero: str = HETERO
) -> dict[str, Any]:
    """Per (dataset, split) the two means and the winner of each criterion; totals per criterion.

    Args:
        rows: the aggregated rows of ``molecular.json`` (``dataset, split, method, n`` and
            ``{variant: {metric: {"mean": ...}}}``).

    Returns:
        ``{"cells": [{dataset, split, n: [n_homo, n_hetero], metric: {homo, hetero, winner}}],
        "wins": {metric: {homo: k, hetero: k, "of": n_cells}}}``.
    """
    others = {(r["dataset"], r["split"]): r for r in rows if r["method"] == hetero}
    cells, wins = [], {m: {homo: 0, hetero: 0, "of": 0} for m, _, _ in CRITERIA}
    for a in (r for r in rows if r["method"] == homo and (r["dataset"], r["split"]) in others):
        b = others[a["dataset"], a["split"]]
        cell: dict[str, Any] = {"dataset": a["dataset"], "split": a["split"], "n": [a["n"], b["n"]]}
        for metric, variant, better in CRITERIA:
            x, y = a[variant][metric]["mean"], b[variant][metric]["mean"]
            if x is None or y is None:
                continue
            sign = 1.0 if better == "lower" else -1.0
            winner = (
                None if round(x, 3) == round(y, 3) else (homo if sign * (x - y) < 0 else hetero)
            )
            cell[metric] = {homo: x, hetero: y, "winner": winner}
            wins[metric]["of"] += 1
            if winner:
                wins[metric][winner] += 1
        cells.append(cell)
    return {"homo": homo, "hetero": hetero, "cells": cells, "wins": wins}


def render_likelihoods(result: dict[str, Any], default: str) -> list[str]:
    """Markdown lines: the totals, the package default, and one table row per cell."""
    homo, hetero, wins = result["homo"], result["hetero"], result["wins"]
    if not result["cells"]:
        return [f"No (dataset, split) with both {homo} and {hetero} recorded yet."]
    total = "; ".join(
        f"{m} ({v}, {b}): {hetero} better in {wins[m][hetero]}, {homo} in {wins[m][homo]} "
        f"of {wins[m]['of']}"
        for m, v, b in CRITERIA
    )
    lines = [
        f"{hetero} (heteroscedastic) vs {homo} (homoscedastic), means over seeds per (dataset, split): {total}.",
        "",
        f"`mlip-unc property train` (method bgnn) uses the likelihood of the **{default}** row.",
        "",
        "| dataset | split | n | "
        + " | ".join(f"{m} ({v}) {homo} / {hetero}" for m, v, _ in CRITERIA)
        + " |",
        "|---|---|---|" + "---|" * len(CRITERIA),
    ]
    for c in result["cells"]:
        parts = []
        for m, _, _ in CRITERIA:
            if m not in c:
                parts.append("n/a")
                continue
            x, y, w = c[m][homo], c[m][hetero], c[m]["winner"]
            parts.append(
                f"{'**' if w == homo else ''}{x:.3f}{'**' if w == homo else ''} / "
                f"{'**' if w == hetero else ''}{y:.3f}{'**' if w == hetero else ''}"
            )
        lines.append(
            f"| {c['dataset']} | {c['split']} | {c['n'][0]} / {c['n'][1]} | "
            + " | ".join(parts)
            + " |"
        )
    return lines


# ============================================================================ report
def _cell(stat: dict[str, Any], digits: int = 3) -> str:
    if not stat or stat["n"] == 0 or not math.isfinite(stat["mean"]):
        return "n/a"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


_COLUMNS = (
    ("rmse", "RMSE"),
    ("mae", "MAE"),
    ("nll", "NLL"),
    ("spearman", "ρ(σ, \\|e\\|)"),
    ("miscalibration_area", "miscal. area"),
    ("ence", "ENCE"),
    ("coverage_95", "cov@95"),
)


TABLES_CSV = f"{STEM}_tables.csv"


def cells_table(rows: list[dict[str, Any]]) -> Table:
    """Every metric of every (dataset, split) and method, raw and recalibrated, mean ± std over
    the seeds as the page showed them."""
    head = ("dataset", "split", "method", "n", *[c[1].replace("\\|", "|") for c in _COLUMNS],
            "ρ(σ, 1−Tanimoto)", "ρ(σ, latent kNN)", "σ factor", "train s")  # fmt: skip
    table = Table(TABLES_CSV, head)
    for r in rows:
        for variant, label in (("raw", "raw"), ("recal", "recal.")):
            cells = [_cell(r[variant][k]) for k, _ in _COLUMNS]
            extra = (
                [_cell(r["struct_cal_tanimoto"]), _cell(r["struct_cal_knn"])]
                if variant == "raw"
                else ["", ""]
            )
            extra += [
                _cell(r["recal_scale"], 2) if variant == "recal" else "",
                _cell(r["train_seconds"], 1) if variant == "raw" else "",
            ]
            method = f"{r['method']} ({label})"
            table.rows.append((r["dataset"], r["split"], method, r["n"], *cells, *extra))
    return table


def render_cells(
    out: Path,
    records: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    datasets: list[str],
    pngs: bool,
) -> tuple[list[str], Table]:
    """molecular_tables.md without its settings: one line per (dataset, split), its figure,
    and the table of every metric (a CSV beside the page)."""
    every = cells_table(rows)
    lines = [
        "# Molecular property benchmark: every (dataset, split)",
        "",
        "| dataset | split | split rule | train/val/test | methods | seeds (n) | figure |",
        "|---|---|---|---|---|---|---|",
    ]
    figures = []
    for d in datasets:
        for sp in SPLITS:
            sub = [r for r in rows if r["dataset"] == d and r["split"] == sp]
            if not sub:
                continue
            rec = next(r for r in records if r["dataset"] == d and r["split"] == sp)
            sizes = f"{rec['n_train']} / {rec['n_val']} / {rec['n_test']}"
            png = f"{STEM}_calibration_{d}_{sp}.png"
            drawn = pngs or (out / png).exists()  # at the end of an invocation, or --report-only
            seeds = "/".join(str(n) for n in dict.fromkeys(r["n"] for r in sub))
            lines.append(
                f"| {d} | {sp} | {rec.get('split_rule', '')} | {sizes} | {len(sub)} | {seeds} | "
                + (f"[{d} {sp}](#calibration-{d}-{sp}) |" if drawn else "n/a |")
            )
            if drawn:
                figures += [f"### Calibration {d} {sp}", "", f"![calibration {d} {sp}]({png})", ""]
    lines += [
        "",
        every.link(
            "Every metric of every (dataset, split) and method, raw and recalibrated, mean ± "
            "std over the seeds"
        ),
        "",
        *figures,
    ]
    return lines, every


def missing_runs(planned: list[Task], records: list[dict[str, Any]]) -> list[tuple]:
    done = {run_key(r) for r in records}
    return [run_key(t) for t in planned if run_key(t) not in done]


def _summarise_missing(missing: list[tuple]) -> list[str]:
    by: dict[tuple[str, str], list[str]] = {}
    for d, sp, m, seed in missing:
        by.setdefault((d, m), []).append(f"{sp}/{seed}")
    return [f"  - {d} {m}: {', '.join(v)}" for (d, m), v in sorted(by.items())]


def repeated_splits(records: list[dict[str, Any]]) -> list[str]:
    """Datasets whose scaffold split has the test set of their random split: a scaffold and a random
    record of the same method and seed hold the same test targets in the same order (on CEP every
    molecule is its own Bemis-Murcko scaffold, so the scaffold split is the seed-0 permutation)."""
    points = {
        (r["dataset"], r["split"], r["method"], r["seed"]): r["points"]["y"]
        for r in records
        if "points" in r
    }
    return sorted(
        {
            d
            for (d, sp, m, seed), y in points.items()
            if sp == "scaffold" and points.get((d, "random", m, seed)) == y
        }
    )


def write_report(
    out: Path,
    records: list[dict],
    s: dict[str, Any],
    planned: list[Task],
    *,
    pngs: bool,
    wall: float | None = None,
) -> dict[str, Any]:
    rows = aggregate(records)
    datasets = list(
        dict.fromkeys([t["dataset"] for t in planned] + [r["dataset"] for r in records])
    )
    names = DATASETS if not s["quick"] else datasets
    accept = [
        acceptance(rows, names, split=sp, ref_variant=v) for sp in SPLITS for v in ("raw", "recal")
    ]
    accept_homo = [
        acceptance(rows, names, split=sp, ours="bgnn") for sp in SPLITS
    ]  # the default until 2026-12-04
    likelihoods = compare_likelihoods(rows)
    missing = missing_runs(planned, records)
    commands = list(dict.fromkeys(r["command"] for r in records))
    summary = {
        "commands": commands,
        "settings": s,
        "n_runs": len(records),
        "partial": bool(missing),
        "missing": [list(k) for k in missing],
        "rows": rows,
        "acceptance": accept,
        "acceptance_homoscedastic": accept_homo,
        "likelihood": likelihoods,
        "scaffold_equals_random": repeated_splits(records),
    }
    write_json(out / f"{STEM}.json", summary)
    md = ["# Molecular property benchmark: uncertainty raw and recalibrated, ours and chemprop", ""]
    md += [
        "## Acceptance",
        "",
        *render_acceptance_table([*accept, *accept_homo]),
        "",
        (
            f"Claim: the recalibrated default ({DEFAULT_METHOD} + zscaling fitted on validation) beats "
            "chemprop MVE's miscalibration area and NLL on at least 4 of 6 datasets at equal or better "
            "RMSE, against chemprop MVE as it comes (raw) and recalibrated the same way; the bgnn rows "
            f"are the homoscedastic model (the default before the choice below). Per-dataset margins: "
            f"`{STEM}.json` (`acceptance`)."
        ),
        "",
    ]
    if missing:
        md += [
            (
                f"**Partial**: {len(records)} run(s) recorded, {len(missing)} of the {len(planned)} planned run(s) "
                "missing (dataset method: split/seed):"
            ),
            *_summarise_missing(missing),
            "",
        ]
    not_planned = [d for d in DATASETS if d not in datasets]
    if not_planned and not s["quick"]:
        md += [f"Not run at all yet: {', '.join(not_planned)}.", ""]
    if summary["scaffold_equals_random"]:
        md += [
            (
                f"**Scaffold = random** on {', '.join(summary['scaffold_equals_random'])}: its scaffold and random "
                "runs of the same method and seed have the same test targets in the same order, so its scaffold "
                "cells repeat its random ones (each molecule its own Bemis-Murcko scaffold: the scaffold split "
                "reduces to the seed-0 permutation) and it counts in both splits' tallies above."
            ),
            "",
        ]
    md += ["## Default likelihood", "", *render_likelihoods(likelihoods, DEFAULT_METHOD), ""]
    for key, label in OVERVIEW:
        md += [f"## {label}, mean over seeds", "", *render_overview(rows, key), ""]
    md += [
        f"Every metric of every (dataset, split), raw and recalibrated, with its spread: "
        f"[{STEM}_tables.md]({STEM}_tables.md).",
        "",
        *run_section(
            commands,
            date=_dates(records),
            json_name=f"{STEM}.json` and `{STEM}.jsonl",
            machine=_first(records, "environment", "machine"),
            versions=_first(records, "environment", "versions") or _torch_versions(records),
            extra=[_runs_line(records, wall)],
        ),
    ]
    tables, every = render_cells(out, records, rows, datasets, pngs)
    tables += ["## Columns and settings", "", *_setup_lines(s, records), ""]
    (out / f"{STEM}.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    write_page(out / f"{STEM}_tables.md", "\n".join(tables), [every])
    if pngs:
        draw_figures(out, records)
    return summary


OVERVIEW = (  # (metric, heading) of the overview tables (recalibrated; RMSE does not change)
    ("nll", "NLL, recalibrated"),
    ("miscalibration_area", "Miscalibration area, recalibrated"),
    ("rmse", "RMSE"),
)


def render_overview(rows: list[dict[str, Any]], key: str) -> list[str]:
    """One row per (dataset, split), one column per method: the recalibrated mean of ``key``."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cells = {(r["dataset"], r["split"], r["method"]): r["recal"][key]["mean"] for r in rows}
    lines = [
        "| dataset | split | " + " | ".join(methods) + " |",
        "|---|---|" + "---|" * len(methods),
    ]
    for d, sp in dict.fromkeys((r["dataset"], r["split"]) for r in rows):
        values = [cells.get((d, sp, m)) for m in methods]
        lines.append(
            f"| {d} | {sp} | " + " | ".join("" if v is None else f"{v:.3f}" for v in values) + " |"
        )
    return lines


def render_acceptance_table(accepted: list[dict[str, Any]]) -> list[str]:
    """One row per (split, ours, reference): datasets beaten of those measured, and the verdict."""
    lines = [
        "| split | ours | reference | datasets beaten | needed | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for acc in accepted:
        beaten = ", ".join(d for d, c in acc["per_dataset"].items() if c.get("beats")) or "none"
        lines.append(
            f"| {acc['split']} | {acc['ours']} | {acc['reference']} | {acc['wins']} of "
            f"{acc['measured']} ({beaten}) | {acc['needed']} of {acc['of']} | **{acc['verdict']}** |"
        )
    return lines


def _first(records: list[dict[str, Any]], *keys: str) -> Any:
    """The first record's value at ``keys`` (None when no record has it)."""
    for r in records:
        node: Any = r
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


def _torch_versions(records: list[dict[str, Any]]) -> dict[str, str] | None:
    """The torch versions the records name (older records hold nothing else)."""
    torches = sorted({r["torch"] for r in records if r.get("torch")})
    return {"torch": ", ".join(torches)} if torches else None


def _dates(records: list[dict[str, Any]]) -> str | None:
    stamps = sorted(r["date"] for r in records if r.get("date"))
    return f"{stamps[0]} - {stamps[-1]}" if stamps else None


def _runs_line(records: list[dict[str, Any]], wall: float | None) -> str:
    wall_min = sum(r.get("seconds", 0.0) for r in records) / 60
    cpu = [r["cpu_seconds"] for r in records if "cpu_seconds" in r]
    runs = f"Runs: {len(records)}, {wall_min:.1f} min of wall time in all"
    if cpu:
        runs += f" ({len(cpu)} with CPU time recorded: {sum(cpu) / 60:.1f} CPU-min, chemprop's processes included)"
    return runs + (f"; this invocation {wall / 60:.1f} min." if wall else ".")


def _setup_lines(s: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    versions = sorted({r.get("chemprop_version") for r in records if r.get("chemprop_version")})
    cap = f", at most {s['max_minutes']} min per training" if s["max_minutes"] else ""
    rule = (
        f"Training rule (ours): GIN {s['layers']} layers, width {s['hidden']}, latent d = {s['latent_dim']}, batch "
        f"{s['batch_size']}, Adam lr {s['lr']} with the plateau schedule, at most {s['epochs']} epochs, early stopping "
        f"on validation NLL with patience {s['patience']} epochs, the best-validation-NLL weights kept{cap}; "
        f"ensemble5 = 5 such models trained together; mcdropout p = 0.1, {s['mc_samples']} passes; agl = the "
        "package's AGL (mean form, lambda 1 after a warm-up of epochs/5 and a ramp of epochs/5). Chemprop: `chemprop "
        f"train -t regression-mve` with its defaults (D-MPNN), at most {s['chemprop_epochs']} epochs, patience "
        f"{s['chemprop_patience']}, on the same split rows (chemprop {', '.join(versions) or 'not run'}); its train "
        "seconds are the wall time of the `chemprop train` process, start-up included."
    )
    recal = (
        "Recalibration ('recal.'): one std factor (zscaling) fitted on the validation split by Gaussian NLL (the "
        "default of `mlip-unc property train`), applied to the test stds; for chemprop the same fit on its validation "
        "predictions. Isotonic recalibration is in the JSON (`recal_isotonic`). A scalar factor leaves RMSE, MAE and "
        "all Spearman columns unchanged. ρ(σ, 1−Tanimoto) and ρ(σ, latent kNN): structural calibration (docs/method.md "
        "§7): Spearman of the test σ with 1 − max Morgan-Tanimoto similarity to the training set and with the mean "
        f"distance to the k = {s['knn_k']} nearest training latents (ours only); positive = σ grows where data are "
        "sparse. Cells: mean ± std (ddof 1) over the n recorded runs. A blank cell in a 'recal.' row is the raw row's "
        "value (the structural-calibration Spearmans and the train seconds do not change with the factor); σ factor is "
        "blank in raw rows (no factor); ρ(σ, latent kNN) is n/a for chemprop (its latents are not read)."
    )
    full = (
        "Full-covariance last-layer posterior: `laplace` is one (MAP training, then the closed-form full-covariance "
        "Gaussian posterior of the last layer, prior precision by marginal likelihood). The variational `bgnn` head "
        "of the property model is mean-field only; a full-covariance posterior for it is not offered by the property "
        "model (the potential has one, `posthoc/posterior.py`)."
    )
    return [rule, "", recal, "", full]


def draw_figures(out: Path, records: list[dict[str, Any]]) -> None:
    """Per (dataset, split): calibration curves of every method (first recorded seed), raw and recalibrated."""
    from matplotlib.figure import Figure

    groups: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: r["seed"]):
        if "points" in r:
            groups.setdefault((r["dataset"], r["split"]), {}).setdefault(r["method"], r)
    for (d, sp), by_method in groups.items():
        fig = Figure(figsize=(9.0, 4.4))
        axes = fig.subplots(1, 2)
        for ax, variant in zip(axes, ("raw", "recal"), strict=False):
            ax.plot([0, 1], [0, 1], "k--", lw=1)
            for m, r in by_method.items():
                pts = r["points"]
                factor = 1.0 if variant == "raw" else r["recal_scale"]
                exp, obs = calibration_curve(
                    pts["mean"], np.asarray(pts["std"]) * factor, pts["y"], nan_policy="omit"
                )
                ax.plot(exp, obs, lw=1.5, label=f"{m} ({r[variant]['miscalibration_area']:.3f})")
            ax.set(
                title=f"{d} {sp}: {'raw' if variant == 'raw' else 'recalibrated (zscaling)'}",
                xlabel="expected proportion in interval",
                ylabel="observed proportion",
                xlim=(0, 1),
                ylim=(0, 1),
            )
            ax.legend(fontsize=6, loc="upper left", title="method (miscal. area)", title_fontsize=6)
        fig.tight_layout()
        fig.savefig(out / f"{STEM}_calibration_{d}_{sp}.png", dpi=110)


# ============================================================================ the loop
def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    command = shlex.join(
        ["python", "-m", "benchmarks.molecular", *(sys.argv[1:] if argv is None else argv)]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    jsonl, s = args.out / f"{STEM}.jsonl", settings(args)
    records = read_jsonl(jsonl)
    planned = tasks(args)
    if args.merge:
        merge_records(args.merge, jsonl, records, args.out / f".{STEM}.lock")
    if args.report_only or args.merge:
        summary = write_report(
            args.out, records, records[0]["settings"] if records else s, planned, pngs=True
        )
        print(f"wrote {args.out / STEM}.md from {len(records)} record(s)")
        return summary
    check_settings(records, s)
    lock = args.out / f".{STEM}.lock"
    take_lock(lock, owner="benchmarks.molecular")
    torch.set_num_threads(args.threads)
    work = Path(
        tempfile.mkdtemp(prefix="molecular_")
    )  # temporary checkpoints and CSVs, removed at the end
    try:
        return run_all(args, s, records, planned, jsonl, command, work)
    finally:
        lock.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def merge_records(
    sources: Sequence[Path], jsonl: Path, records: list[dict[str, Any]], lock: Path
) -> int:
    """Append to ``jsonl`` (and ``records``) every run of ``sources`` it lacks; the settings must
    match the recorded ones. Returns the number appended."""
    take_lock(lock, owner="benchmarks.molecular --merge")  # not while a run writes to the same file
    try:
        done = {run_key(r) for r in records}
        added = 0
        for path in sources:
            incoming = read_jsonl(path)
            if not incoming:
                raise SystemExit(f"error: {path} holds no runs")
            check_settings(incoming, records[0]["settings"] if records else incoming[0]["settings"])
            for rec in incoming:
                if run_key(rec) not in done:
                    append_jsonl(jsonl, rec)
                    records.append(rec)
                    done.add(run_key(rec))
                    added += 1
        print(f"merged {added} run(s) into {jsonl}", flush=True)
        return added
    finally:
        lock.unlink(missing_ok=True)


def _cpu() -> float:
    """CPU seconds of this process and its finished children (chemprop's processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_all(
    args: argparse.Namespace,
    s: dict[str, Any],
    records: list[dict],
    planned: list[Task],
    jsonl: Path,
    command: str,
    work: Path,
) -> dict[str, Any]:
    done = {run_key(r) for r in records}
    todo = [t for t in planned if run_key(t) not in done]
    if any(t["method"] in CHEMPROP for t in todo) and chemprop_bin(args) is None:
        print(
            "chemprop is not installed: the chemprop rows are skipped (pip install 'mlip-unc[chemprop]')",
            flush=True,
        )
        todo = [t for t in todo if t["method"] not in CHEMPROP]
    print(
        f"{len(todo)} run(s) to do ({len(planned) - len(todo)} of {len(planned)} planned already recorded or "
        "skipped)",
        flush=True,
    )
    ctx, t_start = Context(args, work), time.perf_counter()
    for k, task in enumerate(todo, start=1):
        t0, c0 = time.perf_counter(), _cpu()
        try:
            rec = (run_chemprop if task["method"] in CHEMPROP else run_ours)(task, ctx, s)
        except (
            RuntimeError
        ) as err:  # a failed chemprop call: reported, not recorded, the rest goes on
            print(f"run {run_key(task)} failed: {err}", flush=True)
            continue
        rec.update(
            task,
            settings=s,
            command=command,
            seconds=time.perf_counter() - t0,
            cpu_seconds=_cpu() - c0,
            torch=torch.__version__,
            date=time.strftime("%Y-%m-%d %H:%M"),
            environment=environment(),
        )
        append_jsonl(jsonl, rec)
        records.append(rec)
        print(
            f"[{k}/{len(todo)}] {task['dataset']} {task['split']} {task['method']} seed {task['seed']}: "
            f"rmse {rec['raw']['rmse']:.3f} nll {rec['raw']['nll']:.3f}->{rec['recal']['nll']:.3f} "
            f"miscal {rec['raw']['miscalibration_area']:.3f}->{rec['recal']['miscalibration_area']:.3f} "
            f"({rec['seconds']:.1f} s; {(time.perf_counter() - t_start) / 60:.1f} min so far)",
            flush=True,
        )
        write_report(args.out, records, s, planned, pngs=False, wall=time.perf_counter() - t_start)
    summary = write_report(
        args.out, records, s, planned, pngs=True, wall=time.perf_counter() - t_start
    )
    print(f"wrote {args.out / STEM}.md, .json, .jsonl and PNGs ({len(records)} runs)", flush=True)
    return summary


if __name__ == "__main__":
    main()
