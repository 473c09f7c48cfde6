"""Force uncertainty that carries information: the modes of one model, a 5-member
committee and |F_pred| alone, ranking the same frames.

Per dataset one Bayesian model (configs/<dataset>_equivariant.yaml) and a committee of 5 MAP
models of the same architecture (``model.head=map``, ``train.ensemble=5``), each model and
member under the wall budget ``--budget-minutes``. Rows: each mode the single model offers
(energy, exact, lowrank, sampled; one that raises is skipped: ``meta.skipped``), committee5,
and the baselines that need no posterior: force_magnitude (|F_pred|), latent_distance and
descriptor_distance (distance to the training set, :func:`distance_scores`). Splits: see
:func:`dataset_split`; definitions: the results file.
``--quick``: EMT Cu made here, configs/tiny_emt.yaml, 10 s per model. Results
``OUT/force_uncertainty.{json,md,png}`` after every step; finished steps are appended to
``OUT/force_uncertainty.jsonl`` and skipped when the command is run again.

    python -m benchmarks.force_uncertainty --budget-minutes 10 --threads 1
    python -m benchmarks.force_uncertainty --quick --out /tmp/fu_quick
    python -m benchmarks.force_uncertainty --report-only   # rewrite the page from the JSON

``--part size`` (the rest of the flags are its own): quality at size, boxes of 27 and 343
independent molecules and Si cells of 216 and 1,000 atoms (benchmarks/force_uncertainty_size.py):

    python -m benchmarks.force_uncertainty --part size --budget-minutes 10 --threads 1

The page keeps its tables first; sections that other scripts write onto it (benchmarks/peers:
between ``<!-- peers/NAME: begin ...-->`` and ``<!-- peers/NAME: end -->``) are moved to
``OUT/force_uncertainty_NAME.md`` and linked (:func:`move_peer_sections`).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import ase.io
import numpy as np
import torch
from scipy import stats
from torch_geometric.loader import DataLoader

from benchmarks.common.format import clean, fmt2, fmt3
from benchmarks.common.pages import PEER_SECTION, environment, run_section
from mlip_unc import keys
from mlip_unc.config import PotentialConfig, load_potential_config
from mlip_unc.data import StructureDataset, TypeMap
from mlip_unc.models.checkpoint import load_checkpoint
from mlip_unc.models.committee import load_potential
from mlip_unc.train.evaluate import frame_table, predict
from mlip_unc.train.potential import finalize_checkpoint, run_training
from mlip_unc.train.potential_data import prepare_data
from mlip_unc.uncertainty import density
from mlip_unc.uncertainty import diagnostics as diag

log = logging.getLogger("force_uncertainty")
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DATASETS = ("3bpa", "ethanol", "solvent_xtb")
MODES = ("energy", "exact", "lowrank", "sketch", "sampled")
DISTANCES = (
    "latent_distance",
    "descriptor_distance",
)  # baseline rows: force_magnitude's frames, another score
KNN_K = 10  # nearest training atoms / frames of the distance baselines
ROW_KEYS = (
    "auroc_ood",
    "spearman_frame_in_domain",
    "spearman_frame_pooled",
    "auroc_sigma_over_force",
    "partial_spearman_given_force",
    "std_over_rmse",
    "cost_ratio",
    "force_mae_meV_A",
)
SETTINGS = ("quick", "seed", "budget_minutes", "overrides")  # a resumed run must match these


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument(
        "--budget-minutes", type=float, default=None, help="wall time per model (10; quick: 1/6)"
    )
    p.add_argument(
        "--default-mode",
        default="lowrank",
        help="the mode named 'default' in the results (the calculator's default, auto, is lowrank "
        "on these molecules: mlip_unc.models.full_posterior.LOWRANK_ATOM_DIRECTIONS)",
    )
    for flag, default, text in (
        ("--threads", 1, "torch threads"),
        ("--seed", 0, "seed of weights and split"),
        ("--n-samples", 4, "draws of the sampled mode"),
        ("--timing-frames", 20, "frames timed"),
        ("--max-eval-frames", None, "cap each test set (checks only)"),
    ):
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override, both models"
    )
    p.add_argument(
        "--refit",
        nargs="?",
        const="all",
        default=None,
        metavar="DATASETS",
        help="refit the single model's post-training fits (posterior, domain guard, levels) with this code "
        "and evaluate its modes again; training steps are kept; optionally only these (comma-separated) "
        "of --datasets",
    )
    p.add_argument(
        "--no-committee",
        action="store_true",
        help="skip the committee (its training, committee5 row and timing): the single model's rows only",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite OUT/force_uncertainty.md from OUT/force_uncertainty.json",
    )
    args = parse_with_quick(p, argv, "tiny EMT Cu data made here; needs --out")
    args.datasets = (
        ["cu_emt"] if args.quick else [d.strip().lower() for d in args.datasets.split(",") if d]
    )
    if bad := [d for d in args.datasets if d not in (*DATASETS, "cu_emt")]:
        p.error(f"unknown dataset(s) {bad}; choose from {DATASETS}")
    args.budget_minutes = args.budget_minutes or (10.0 / 60.0 if args.quick else 10.0)
    args.refit = (
        set(args.datasets)
        if args.refit == "all"
        else {d.strip().lower() for d in args.refit.split(",") if d.strip()}
        if args.refit
        else set()
    )
    if bad := args.refit - set(args.datasets):
        p.error(f"--refit {sorted(bad)}: not among --datasets {args.datasets}")
    return args


def parse_with_quick(
    p: argparse.ArgumentParser, argv: list[str] | None, quick_help: str
) -> argparse.Namespace:
    """Add ``--quick`` and ``--out``, parse, and resolve ``--out`` and ``--data-root`` (which ``p`` has)
    the same way in this script and in the ones built on it (--quick needs --out)."""
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out", type=Path, default=None, help=f"results folder (default {RESULTS})")
    args = p.parse_args(argv)
    if args.quick and args.out is None:
        p.error("--quick writes to the folder given by --out")
    args.out = args.out or RESULTS
    args.data_root = args.data_root or Path(
        os.environ.get("MLIP_UNC_DATA") or REPO.parent / "shared" / "data"
    )
    return args


def _write(frames: list, path: Path) -> Path:
    ase.io.write(path, frames, format="extxyz")
    return path


def _molecules(path: Path) -> list:
    """Frames of ``path`` without the one-atom reference frames."""
    return [
        a
        for a in ase.io.read(path, index=":")
        if len(a) > 1 and a.info.get("config_type") != "IsolatedAtom"
    ]


def dataset_split(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``{config, overrides, train, test, ood (or None), energy_key, forces_key}``. 3BPA: 400 of
    train_300K (results/checkpoints/3bpa_split.json if its seed matches) -> the other 100, OOD =
    train_mixedT less repeats of train_300K; ethanol: train -> test_MD, OOD = methanol frames of
    test_eth_meth; solvent_xtb: train_50 -> test (one-atom frames dropped), no OOD."""
    s = args.data_root / "structures"
    cfg = REPO / "configs" / f"{name}_equivariant.yaml"
    split: dict[str, Any] = {
        "config": cfg,
        "overrides": [],
        "energy_key": "energy",
        "forces_key": "forces",
    }
    if name == "cu_emt":
        from ase.build import bulk
        from ase.calculators.emt import EMT

        frames = [
            bulk("Cu", "fcc", a=3.6 * (1.04 if k >= 16 else 1.0), cubic=True).repeat((2, 1, 1))
            for k in range(22)
        ]
        for k, atoms in enumerate(
            frames
        ):  # 16 in-domain (rattle 0.05 A), 6 OOD (0.2 A, 4 % stretched)
            atoms.rattle(0.2 if k >= 16 else 0.05, seed=k)
            atoms.calc = EMT()
            atoms.get_stress()
        split.update(
            config=REPO / "configs" / "tiny_emt.yaml",
            train=_write(frames[:10], work / "train.xyz"),
            test=_write(frames[10:16], work / "test.xyz"),
            ood=_write(frames[16:], work / "ood.xyz"),
        )
    elif name == "3bpa":
        frames = ase.io.read(s / "3BPA" / "train_300K.xyz", index=":")
        saved = RESULTS / "checkpoints" / "3bpa_split.json"
        idx = json.loads(saved.read_text()) if saved.is_file() else {}
        if idx.get("seed") != args.seed or (
            len(idx.get("train", [])),
            len(idx.get("test", [])),
        ) != (400, 100):
            perm = np.random.default_rng(args.seed).permutation(
                len(frames)
            )  # as benchmarks/potential.py
            idx = {"train": sorted(perm[:400].tolist()), "test": sorted(perm[400:500].tolist())}
        seen = {round(a.get_potential_energy(), 6) for a in frames}
        mixed = [
            a
            for a in ase.io.read(s / "3BPA" / "train_mixedT.xyz", index=":")
            if round(a.get_potential_energy(), 6) not in seen
        ]
        split.update(
            train=_write([frames[k] for k in idx["train"]], work / "3bpa_train.xyz"),
            test=_write([frames[k] for k in idx["test"]], work / "3bpa_test.xyz"),
            ood=_write(mixed, work / "3bpa_ood.xyz"),
        )
    elif name == "ethanol":
        methanol = [
            a
            for a in _molecules(s / "ethanol" / "test_eth_meth.xyz")
            if a.info.get("config_type") == "methanol"
        ]
        split.update(
            train=s / "ethanol" / "train.xyz",
            test=s / "ethanol" / "test_MD.xyz",
            ood=_write(methanol, work / "methanol.xyz"),
        )
    else:  # solvent_xtb: configs/solvent_xtb_equivariant.yaml; without it, the 3BPA architecture on its files
        root = s / "solvent_xtb"
        if not cfg.is_file():
            cfg = REPO / "configs" / "3bpa_equivariant.yaml"
            split["overrides"] = [
                "data.isolated_atoms=null",
                "data.energy_key=energy_xtb",
                "data.forces_key=forces_xtb",
            ]
        split.update(
            config=cfg,
            train=root / "solvent_xtb_train_50.xyz",
            ood=None,
            energy_key="energy_xtb",
            forces_key="forces_xtb",
            test=_write(_molecules(root / "solvent_xtb_test.xyz"), work / "solv.xyz"),
        )
    return split


class Steps:
    """Finished steps, one JSON object per line of ``path``; ``get`` returns a step's record."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path, lines = path, (path.read_text().splitlines() if path.is_file() else [])
        parsed = [json.loads(x) for x in lines if x.strip()]
        self.records = {r["step"]: {**r, "line": k} for k, r in enumerate(parsed)}
        self.commands = list(
            dict.fromkeys(
                r["command"]
                for r in parsed
                if r["step"] == "settings" or r["step"].startswith("invocation:")
            )
        )  # every command, in file order
        self.lines = len(parsed)  # records in the file; the next one gets this "line"
        self.get = self.records.get  # step -> its record, or None
        old = self.records.get("settings")
        if old is not None and {k: old[k] for k in SETTINGS} != {k: settings[k] for k in SETTINGS}:
            raise SystemExit(
                f"{path} was made with {old}; use another --out or delete it to start over"
            )
        if old is None:
            self.add("settings", settings)
            self.commands.append(settings["command"])

    def note_command(self, command: str) -> None:
        """Record an invocation whose command line is not yet in the file (a resume, a --refit)."""
        if command not in self.commands:
            self.add(f"invocation:{len(self.commands)}", {"command": command})
            self.commands.append(command)

    def add(self, step: str, record: dict[str, Any]) -> None:
        self.records[step] = clean(
            {"step": step, "time": time.strftime("%Y-%m-%d %H:%M:%S"), **record}
        )
        with self.path.open("a") as handle:
            handle.write(json.dumps(self.records[step]) + "\n")
        self.records[step]["line"], self.lines = (
            self.lines,
            self.lines + 1,
        )  # order in the file: later = newer


def train(
    name: str,
    split: dict[str, Any],
    args: argparse.Namespace,
    steps: Steps,
    ensemble: int,
    folder: str = "force_uncertainty",
) -> Path:
    """Train the single model (``ensemble=1``) or the MAP committee once into
    ``OUT/checkpoints/<folder>/<name>_<tag>``; the step records it."""
    tag = "single" if ensemble == 1 else f"committee{ensemble}"
    out = args.out / "checkpoints" / folder / f"{name}_{tag}"
    if steps.get(f"train:{name}:{tag}"):
        return out
    log.info("[train] %s %s: %.3g min per model", name, tag, args.budget_minutes)
    results = run_training(train_config(split, args, out, ensemble))
    for last in out.rglob("last.pt"):
        last.unlink()
    steps.add(f"train:{name}:{tag}", {"train_minutes": [r.train_minutes for r in results]})
    return out


def train_config(
    split: dict[str, Any], args: argparse.Namespace, out: Path, ensemble: int
) -> PotentialConfig:
    """The config a model of this benchmark is trained with (the committee: ``ensemble`` MAP members)."""
    overrides = [
        f"data_root={args.data_root}",
        f"data.train={split['train']}",
        "data.test=null",
        f"out={out}",
        f"seed={args.seed}",
        f"train.max_minutes={args.budget_minutes}",
        "train.schedule_clock=wall",  # equal wall time: the schedule follows the clock
        "train.progress=false",
        "train.resume=false",
        *split["overrides"],
        *args.overrides,
    ]
    if ensemble > 1:
        overrides += [f"train.ensemble={ensemble}", "model.head=map"]
    return load_potential_config(split["config"], overrides)


def refit(
    name: str, split: dict[str, Any], args: argparse.Namespace, steps: Steps, out: Path
) -> None:
    """``--refit``: the single model's post-training fits made again by this code (the weights are
    kept; the model section must equal the checkpoint's but for the posterior's rank and basis);
    its mode rows are then evaluated again."""
    config = train_config(split, args, out, 1)
    saved = load_checkpoint(out / "model.pt", kind="potential")["metadata"]["training_config"][
        "model"
    ]
    post_training = ("posterior_rank", "posterior_basis")  # read by the fits this refit makes again
    default = type(config.model)().model_dump(
        mode="json"
    )  # keys added since training count at their defaults
    now = {
        k: v
        for k, v in config.to_dict()["model"].items()
        if k not in post_training and (k in saved or v != default.get(k))
    }
    if now != {k: v for k, v in saved.items() if k not in post_training}:
        raise SystemExit(
            f"{name}: the model section changed since training ({saved} -> {now}); not refitted"
        )
    finalize_checkpoint(out / "model.pt", config, prepare_data(config))
    steps.add(f"refit:{name}", {"model": str(out / "model.pt")})
    log.info("[refit] %s: posterior, guard and levels fitted again", name)


def load_frames(
    path: Path | None, model: Any, split: dict[str, Any], limit: int | None
) -> StructureDataset | None:
    m = model.members[0] if hasattr(model, "members") else model
    return (
        None
        if path is None
        else StructureDataset.from_files(
            path,
            m.r_max,
            TypeMap.from_list(m.type_map),
            index=f":{limit or ''}",
            energy_key=split["energy_key"],
            forces_key=split["forces_key"],
            dtype=m.dtype,
        )
    )


def frame_values(
    model: Any, data: StructureDataset, mode: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Per-frame score, error and max |F_pred|; std/RMSE (per component) and force MAE."""
    unc = {"force_magnitude": "none", "committee5": "exact"}.get(mode, mode)
    return prediction_values(
        predict(
            model, data, uncertainty=unc, n_samples=args.n_samples, batch_size=8, seed=args.seed
        ),
        mode,
    )


def prediction_values(pred: Any, mode: str) -> dict[str, Any]:
    """:func:`frame_values` of predictions already made (``mode``: the row, which picks the score)."""
    table = frame_table(pred)
    score = {"force_magnitude": "forces_pred_max_norm", "energy": "energy_epistemic_std"}.get(
        mode, "forces_max_std"
    )
    err, var = pred.forces_pred - pred.forces_true, pred.forces_epistemic_var  # (n_atoms, 3) each
    return {
        "score": table[score],
        "error": table["forces_mean_error"],
        "force": table["forces_pred_max_norm"],
        "std_over_rmse": None
        if var is None or mode == "force_magnitude"
        else diag.std_over_rmse(var, err),
        "force_mae_meV_A": 1e3 * float(np.mean(np.abs(err))),
    }


@torch.no_grad()
def node_latents(model: Any, data: StructureDataset) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """The single model's per-atom latents under its head (n_atoms, d), atom types and frame
    of each atom (n_atoms,), frames in ``data``'s order."""
    z, types, frame, seen = [], [], [], 0
    for batch in DataLoader(data.graphs, batch_size=16, shuffle=False):
        z.append(model(batch, compute_forces=False)[keys.NODE_LATENT].double())
        types.append(model.atom_types(batch).numpy())
        frame.append(batch.batch.numpy() + seen)
        seen += batch.num_graphs
    return torch.cat(z), np.concatenate(types), np.concatenate(frame)


def descriptors(data: StructureDataset) -> np.ndarray:
    """Interatomic-distance histogram of each frame (n_frames, bins; periodic images counted)."""
    return density.structure_descriptor(
        [
            ase.Atoms(
                positions=g[keys.POSITIONS].double().numpy(),
                cell=(g[keys.CELL].reshape(3, 3).double().numpy() if keys.CELL in g else None),
                pbc=(g[keys.PBC].reshape(3).numpy() if keys.PBC in g else False),
            )
            for g in data.graphs
        ]
    )


def distance_scores(
    model: Any, train: StructureDataset, sets: dict[str, StructureDataset]
) -> dict[str, Any]:
    """Frame scores from the distance to the training set (every frame of ``data.train``):
    latent_distance = max over atoms of the mean distance to the KNN_K nearest training atoms of
    the same element in the single model's per-atom latents (standardised per element);
    descriptor_distance = mean distance to the KNN_K nearest training frames in the
    interatomic-distance histogram (both: mlip_unc.uncertainty.density). ``{row: {part: (n,)}}``."""
    z_train, t_train, _ = node_latents(model, train)
    d_train = descriptors(train)
    out: dict[str, Any] = {row: {} for row in DISTANCES}
    for part, data in sets.items():
        z, types, frame = node_latents(model, data)
        atom = density.atom_latent_knn_distance(z, types, z_train, t_train, k=KNN_K)  # (n_atoms,)
        out["latent_distance"][part] = np.full(len(data), -np.inf)
        np.maximum.at(out["latent_distance"][part], frame, atom)
        out["descriptor_distance"][part] = density.descriptor_knn_distance(
            descriptors(data), d_train, k=min(KNN_K, len(d_train))
        )
    return out


def row_metrics(
    ind: dict[str, Any], ood: dict[str, Any] | None, cost_ratio: float | None
) -> dict[str, Any]:
    """One result row (ROW_KEYS) from in-domain and OOD frame values (None: no OOD set)."""
    args = [ind[k] for k in ("score", "error", "force")] + (
        [ood[k] for k in ("score", "error", "force")] if ood else []
    )
    row = {
        **diag.frame_ranking(*args),
        "std_over_rmse": ind["std_over_rmse"],
        "cost_ratio": cost_ratio,
        "force_mae_meV_A": ind["force_mae_meV_A"],
    }
    return clean({k: row[k] for k in ROW_KEYS})


def _row_rank_corr(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row pair of ``x, y (r, n)``: Pearson of the average ranks
    (as scipy.stats.spearmanr); NaN for a constant row."""
    rx, ry = (stats.rankdata(v, axis=1) for v in (x, y))
    rx, ry = rx - rx.mean(1, keepdims=True), ry - ry.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(1) / np.sqrt((rx**2).sum(1) * (ry**2).sum(1))


def paired_gap(
    single: dict[str, Any], committee: dict[str, Any], *, resamples: int = 1000, seed: int = 0
) -> dict[str, dict[str, float]]:
    """How far the single model's in-domain Spearmans sit from the committee's, with the frames' noise.

    Both rows are resampled with the same frame indices (paired bootstrap over the in-domain frames;
    each row ranks its own errors). Per key: ``gap`` = single - committee on all frames, ``std`` of
    the resampled gaps, ``p_within_slack`` = fraction of resamples with gap >= -slack (the slack
    of that key in TARGETS). The resamples are ranked all at once (one matrix per row and
    quantity).
    """
    rng = np.random.default_rng(seed)
    rows = [
        {k: np.asarray(v[k], float) for k in ("score", "error", "force")}
        for v in (single, committee)
    ]
    draws = rng.integers(
        0, rows[0]["score"].size, (resamples, rows[0]["score"].size)
    )  # (resamples, n)
    full = [
        (
            diag.spearman(v["score"], v["error"]),
            diag.partial_spearman(v["score"], v["error"], v["force"]),
        )
        for v in rows
    ]
    boot = []
    for v in rows:
        s, e, f = (v[k][draws] for k in ("score", "error", "force"))  # (resamples, n) each
        r_se, r_sf, r_ef = _row_rank_corr(s, e), _row_rank_corr(s, f), _row_rank_corr(e, f)
        denom = (1.0 - r_sf**2) * (1.0 - r_ef**2)
        with np.errstate(invalid="ignore", divide="ignore"):
            partial = np.where(
                denom > 1e-12, np.clip((r_se - r_sf * r_ef) / np.sqrt(denom), -1.0, 1.0), np.nan
            )
        boot.append((r_se, partial))
    out = {}
    for j, key in enumerate(("spearman_frame_in_domain", "partial_spearman_given_force")):
        gaps = boot[0][j] - boot[1][j]
        gaps = gaps[np.isfinite(gaps)]
        out[key] = {
            "gap": float(full[0][j] - full[1][j]),
            "std": float(gaps.std()),
            "p_within_slack": float(np.mean(gaps >= -TARGETS[key][0])),
        }
    return out


def offered_modes(
    model: Any, graph: Any, args: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    """Modes the model runs on one frame, and why the others were skipped."""
    ok, skipped = [], {}
    for mode in MODES:
        try:
            model(graph, compute_forces=True, uncertainty=mode, n_samples=args.n_samples)
            ok.append(mode)
        except Exception as err:  # noqa: BLE001  a mode the model does not offer (yet)
            skipped[mode] = f"{type(err).__name__}: {err}"
    return ok, skipped


def time_calls(calls: dict[str, Any], graphs: list, repeats: int = 3) -> dict[str, float]:
    """Median over frames of the best of ``repeats`` single-frame calls (ms), calls interleaved."""
    for call in calls.values():
        call(graphs[0])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in calls}
    for graph in graphs:
        for name, call in calls.items():
            timed = functools.partial(call, graph)
            times[name].append(1e3 * min(timeit.repeat(timed, number=1, repeat=repeats)))
    return {name: statistics.median(v) for name, v in times.items()}


def run_dataset(name: str, args: argparse.Namespace, steps: Steps, work: Path) -> None:
    split = dataset_split(name, args, work)
    single_dir = train(name, split, args, steps, 1)
    if name in args.refit:
        refit(name, split, args, steps, single_dir)
    single = load_potential(single_dir / "model.pt")
    committee = (
        None
        if getattr(args, "no_committee", False)
        else load_potential(train(name, split, args, steps, 5))
    )
    test = load_frames(split["test"], single, split, args.max_eval_frames)
    ood = load_frames(split["ood"], single, split, args.max_eval_frames)
    modes, skipped = offered_modes(single, test.graphs[0], args)
    if not steps.get(f"modes:{name}"):
        steps.add(
            f"modes:{name}",
            {"offered": modes, "skipped": skipped, "n_test": len(test), "n_ood": len(ood or [])},
        )
    refitted = (steps.get(f"refit:{name}") or {}).get("line", -1)
    sets, distances = {p: d for p, d in (("in", test), ("ood", ood)) if d is not None}, None
    committee_rows = [] if committee is None else ["committee5"]
    for row in [*modes, *committee_rows, "force_magnitude", *DISTANCES]:
        if (done := steps.get(f"eval:{name}:{row}")) and not (
            row in modes and done["line"] < refitted
        ):
            continue
        if (
            row in DISTANCES
        ):  # the single model's errors and |F_pred| (force_magnitude's record), another score
            distances = distances or distance_scores(
                single, load_frames(split["train"], single, split, None), sets
            )
            plain = steps.get(f"eval:{name}:force_magnitude")
            record = {part: {**plain[part], "score": distances[row][part]} for part in sets}
        else:
            model = committee if row == "committee5" else single
            record = {part: frame_values(model, data, row, args) for part, data in sets.items()}
        steps.add(f"eval:{name}:{row}", record)
        log.info("[eval] %s %s done", name, row)
    if (timed := steps.get(f"cost:{name}")) is None or timed[
        "line"
    ] < refitted:  # a refit may change the modes' cost
        gen = torch.Generator().manual_seed(args.seed)
        calls = {
            m: (
                lambda g, m=m: single(
                    g, compute_forces=True, uncertainty=m, n_samples=args.n_samples, generator=gen
                )
            )
            for m in ("none", *modes)
        }
        if committee is not None:
            calls["committee5"] = lambda g: committee(g, compute_forces=True, uncertainty="exact")
        graphs = test.graphs[: args.timing_frames]
        ms = {"plain" if k == "none" else k: v for k, v in time_calls(calls, graphs).items()}
        steps.add(
            f"cost:{name}",
            {"ms": ms, "n_frames": len(graphs), "atoms": [int(g.num_atoms) for g in graphs]},
        )


def assemble(steps: Steps, args: argparse.Namespace, status: str) -> dict[str, Any]:
    """The results JSON: ``{"meta": ..., dataset: {"default": name, name: row}}``."""
    settings = steps.get("settings") or {}
    no_committee = getattr(args, "no_committee", False)
    meta = {k: settings.get(k) for k in ("command", "started", *SETTINGS, "threads", "data_root")}
    meta.update(
        status=status,
        updated=time.strftime("%Y-%m-%d %H:%M"),
        environment=environment(),
        default_mode=args.default_mode,
        committee_budget_minutes_per_member=None if no_committee else args.budget_minutes,
        skipped={},
        train_minutes={},
        cost_ms={},
        notes=["--no-committee: no committee trained, no committee5 row"] if no_committee else [],
        refitted={},
        commands=steps.commands,
    )
    results: dict[str, Any] = {"meta": meta}
    for name in args.datasets:
        cost = (steps.get(f"cost:{name}") or {}).get("ms") or {}
        ratio = {
            **{k: v / cost["plain"] for k, v in cost.items()},
            "force_magnitude": 1.0,
        }  # plain E+F = 1
        rows = {
            step.split(":", 2)[2]: row_metrics(
                rec["in"], rec.get("ood"), ratio.get(step.split(":", 2)[2])
            )
            for step, rec in steps.records.items()
            if step.startswith(f"eval:{name}:")
        }
        if not rows:
            continue
        default = next(
            (m for m in (args.default_mode, "exact", "sampled", "energy") if m in rows),
            "committee5",
        )
        if default != args.default_mode:
            meta["notes"].append(
                f"{name}: default mode {args.default_mode!r} not offered; {default!r} reported as default"
            )
        results[name] = {"default": default, **rows}
        meta["skipped"][name] = (steps.get(f"modes:{name}") or {}).get("skipped", {})
        meta["train_minutes"][name] = {
            t: step["train_minutes"]
            for t in ("single", "committee5")
            if (step := steps.get(f"train:{name}:{t}"))
        }
        meta["cost_ms"][name] = cost or None
        if refitted := steps.get(f"refit:{name}"):
            meta["refitted"][name] = refitted["time"]
        single_in, committee_in = (steps.get(f"eval:{name}:{r}") for r in (default, "committee5"))
        if single_in and committee_in and default != "committee5":
            meta.setdefault("paired_bootstrap", {})[name] = paired_gap(
                single_in["in"], committee_in["in"], seed=args.seed
            )
        single = args.out / "checkpoints" / "force_uncertainty" / f"{name}_single" / "model.pt"
        if single.is_file():  # the single model's posterior as evaluated: full or not, rank, basis
            meta.setdefault("posterior", {})[name] = load_checkpoint(single, kind="potential")[
                "config"
            ].get("posterior")
    return results


def _posterior_text(post: dict[str, Any]) -> str:
    if not post.get("full"):
        return "diagonal (variational)"
    return f"full, basis {post.get('basis', 'shared')}, lowrank rank {post.get('rank')}"


TARGETS = {  # the default row's targets: key -> (slack below committee5, lowest, highest)
    "spearman_frame_in_domain": (0.05, None, None),
    "partial_spearman_given_force": (0.05, 0.3, None),
    "auroc_ood": (0.03, None, None),
    "std_over_rmse": (None, 0.5, 2.0),
    "cost_ratio": (None, None, 2.0),
}


def target_bounds(key: str, committee_value: float | None) -> tuple[float | None, float | None]:
    """The target's ``(lowest, highest)`` for ``key`` (TARGETS): the floor or committee5 - slack,
    whichever is higher; None where the target has no such side."""
    slack, low, high = TARGETS[key]
    ref = None if slack is None or committee_value is None else committee_value - slack
    return max((x for x in (low, ref) if x is not None), default=None), high


def acceptance(entry: dict[str, Any]) -> list[str]:
    """The targets (TARGETS) for the default row, each 'met' or 'missed by' how much."""
    d, c = entry.get(entry["default"], {}), entry.get("committee5", {})
    out = []
    for key in TARGETS:
        (low, high), v = target_bounds(key, c.get(key)), d.get(key)
        miss = (
            None
            if v is None
            else max(
                0.0, low - v if low is not None else 0.0, v - high if high is not None else 0.0
            )
        )
        result = "n/a" if miss is None else f"missed by {miss:.2g}" if miss > 0 else "met"
        out.append(f"- {key} = {fmt3(v)}, target [{fmt3(low)}, {fmt3(high)}]: {result}")
    return out


def gap_lines(gaps: dict[str, dict[str, float]] | None) -> list[str]:
    """The paired bootstrap of the Spearman gaps (paired_gap) as markdown lines."""
    if not gaps:
        return []
    return [
        "",
        "Default - committee5 on the same in-domain frames, paired bootstrap (1000 resamples of the frames):",
        *(
            f"- {k}: gap {g['gap']:+.3f}, bootstrap std {g['std']:.3f}; resamples within the slack "
            f"(gap >= -{TARGETS[k][0]:g}): {100 * g['p_within_slack']:.0f} %"
            for k, g in gaps.items()
        ),
    ]


def _minutes(train: dict[str, list[float]] | None) -> str:
    """Training minutes per model, two decimals (the JSON keeps them exact)."""
    return (
        "; ".join(f"{k} {', '.join(f'{m:.2f}' for m in v)}" for k, v in (train or {}).items())
        or "n/a"
    )


def write_markdown(results: dict[str, Any], path: Path) -> None:
    """The page: one table of every data set's rows first, then per data set its notes and the
    default row's acceptance, the quality at size (force_uncertainty_size.py), definitions and
    the run. Peer sections found on the page move to their own pages, linked here."""
    meta = results["meta"]
    commands = meta.get("commands") or [meta["command"]]
    names = [n for n in results if n != "meta"]
    peers = move_peer_sections(path)
    from benchmarks.force_uncertainty_size import size_section  # it imports this module

    size = size_section(path.parent)
    links = ", ".join(f"[{title}]({page})" for title, page in peers)
    lines = [
        "# Force uncertainty: modes vs a committee vs |F_pred|",
        "",
        "Per data set, each mode of one Bayesian model, a 5-member committee and the baselines on the "
        "same frames ((default) = the mode the results call default); notes, acceptance, definitions "
        "and the run below the table"
        + (
            "; quality at size (boxes of molecules, Si cells): [below](#quality-at-size)"
            if size
            else ""
        )
        + (f"; peers' rows on the same frames: {links}" if links else "")
        + ".",
        "",
        "| set | row | " + " | ".join(ROW_KEYS) + " |",
        "|---" * (len(ROW_KEYS) + 2) + "|",
    ]
    for name in names:
        entry = results[name]
        lines += [
            f"| {name} | {row}{' (default)' if row == entry['default'] else ''} | "
            + " | ".join(fmt2(r[k]) for k in ROW_KEYS)
            + " |"
            for row, r in entry.items()
            if row != "default"
        ]
    lines += ["", "## Per data set"]
    for name in names:
        entry = results[name]
        cost = meta["cost_ms"].get(name) or {}
        post = meta.get("posterior", {}).get(name)
        lines += [
            "",
            f"**{name}** (default: {entry['default']}): plain E+F {fmt2(cost.get('plain'))} ms per frame "
            f"(this set's in-domain frames); skipped modes: {meta['skipped'].get(name) or 'none'}; "
            f"training minutes: {_minutes(meta['train_minutes'].get(name))}"
            + (f"; single model's posterior: {_posterior_text(post)}" if post else "")
            + ".",
            *(
                [
                    f"The single model's posterior, domain guard and levels were fitted again (`--refit`) "
                    f"on {meta['refitted'][name]}, by the code of that day; its mode rows were evaluated "
                    "after that, and every row's cost was timed again (interleaved). Training and "
                    "committee steps are from the first run."
                ]
                if meta.get("refitted", {}).get(name)
                else []
            ),
            "",
            f"Acceptance of the default row ({entry['default']}; committee5 - slack):",
            *acceptance(entry),
            *gap_lines(meta.get("paired_bootstrap", {}).get(name)),
        ]
    if size:
        lines += ["", *size]
    env = meta.get("environment") or {}
    lines += [
        "",
        "## Definitions",
        "",
        (
            "Frame score = max over atoms of the force std sqrt(sum_c Var F_ac) (energy mode: the epistemic energy "
            "std; force_magnitude: max over atoms of |F_pred|; latent_distance: max over atoms of the mean distance "
            f"to the {KNN_K} nearest training atoms of the same element in the single model's per-atom latents, "
            f"standardised per element; descriptor_distance: mean distance to the {KNN_K} nearest training frames in "
            "an interatomic-distance histogram; training = every frame of data.train; the baselines are not timed "
            "but |F_pred| = plain E+F); frame error = mean over atoms of |F_pred - F_true|. "
            "auroc_ood: in-domain (0) vs OOD (1) frames by the score; auroc_sigma_over_force: the same with score / "
            "max |F_pred|; partial_spearman_given_force: in-domain score vs error with the frame max |F_pred| "
            "partialled out (ranks); std_over_rmse: sqrt(mean epistemic Var F) / RMSE per component, in-domain; "
            "cost_ratio: median over frames of the best of 3 single-frame calls / plain E+F, interleaved "
            "(committee5 = 5 members); force MAE per component, in-domain. Paired bootstrap: default - committee5 "
            "on the same in-domain frames, 1000 resamples of the frames."
        ),
        "",
    ]
    lines += run_section(
        commands,
        date=f"started {meta['started']}, updated {meta['updated']}",
        json_name="force_uncertainty.json",
        machine=env.get("machine"),
        load_avg=env.get("load_avg"),
        versions=env.get("versions"),
        extra=[
            f"Seed {meta['seed']}; {meta['threads']} torch thread(s); {meta['budget_minutes']:g} min "
            f"per model and per committee member (wall time, shared CPU); status: {meta['status']}."
            + (f" {len(meta['notes'])} note(s) in the JSON." if meta["notes"] else ""),
            *(
                []
                if env
                else [
                    "Load average and versions: not recorded (this run predates their "
                    "recording); each data set's cost ratios come from one run of interleaved "
                    "calls. The peers' pages record theirs."
                ]
            ),
        ],
    )
    path.write_text("\n".join(lines) + "\n")


PEER_TITLE = re.compile(r"^## (?P<title>.+)$", re.MULTILINE)


def peer_page(path: Path, name: str) -> Path:
    """Where the peer section ``name`` of the page ``path`` lives: ``force_uncertainty_NAME.md``."""
    return path.with_name(f"{path.stem}_{name.replace('.', '_')}.md")


def move_peer_sections(path: Path) -> list[tuple[str, str]]:
    """Move the sections that other scripts write onto ``path`` (between ``<!-- peers/NAME:
    begin ...-->`` and ``<!-- peers/NAME: end -->``, benchmarks/peers) to their own pages beside it
    (:func:`peer_page`; a section on ``path`` replaces the one on its page: it is newer), so
    that the page stays short; ``[(title, file name)]`` of every peer page there, for the links.
    A peer page is the section as written, under a title line and a link back."""
    text = path.read_text() if path.is_file() else ""
    for match in PEER_SECTION.finditer(text):
        name = match.group("name")
        peer_page(path, name).write_text(
            f"# {path.stem}: peer section `{name}`\n\n"
            f"Written by benchmarks/peers ({name}) onto [{path.name}]({path.name}), moved here by "
            f"benchmarks/force_uncertainty.py (the native rows are there).\n\n{match.group(0)}\n"
        )
    out = []
    for page in sorted(path.parent.glob(f"{path.stem}_*.md")):
        if section := PEER_SECTION.search(page.read_text()):
            title = PEER_TITLE.search(section.group(0))
            out.append((title.group("title") if title else section.group("name"), page.name))
    return out


def plot(steps: Steps, results: dict[str, Any], path: Path) -> None:
    """sigma_F vs |error| per frame: one panel per dataset (rows) and result row (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    if not (names := [n for n in results if n != "meta"]):
        return
    columns = max(len(results[n]) - 1 for n in names)
    with plt.rc_context({"font.size": 7}):
        fig, axes = plt.subplots(
            len(names), columns, figsize=(2.6 * columns, 2.4 * len(names)), squeeze=False
        )
        for i, name in enumerate(names):
            for j, row in enumerate(r for r in results[name] if r != "default"):
                ax, record = axes[i, j], steps.get(f"eval:{name}:{row}")
                for part, colour in (("in", "tab:blue"), ("ood", "tab:orange")):
                    if record.get(part):
                        x, y = (
                            np.asarray(record[part][k], dtype=float) for k in ("score", "error")
                        )
                        ax.scatter(
                            x,
                            y,
                            s=4,
                            alpha=0.6,
                            color=colour,
                            label="in-domain" if part == "in" else "OOD",
                        )
                ax.set(
                    xscale="log",
                    yscale="log",
                    title=f"{name}: {row}",
                    xlabel="frame score",
                    ylabel="mean |F err| (eV/A)",
                )
                for axis in (ax.xaxis, ax.yaxis):  # labels at 1, 2, 5 x 10^k only
                    axis.set(
                        major_locator=LogLocator(subs=(1, 2, 5)),
                        major_formatter=FormatStrFormatter("%.2g"),
                        minor_formatter=NullFormatter(),
                    )
            for j in range(len(results[name]) - 1, columns):
                axes[i, j].axis("off")
        axes[0, 0].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)


def save(steps: Steps, args: argparse.Namespace, status: str) -> dict[str, Any]:
    results = assemble(steps, args, status)
    tmp = args.out / ".force_uncertainty.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    os.replace(tmp, args.out / "force_uncertainty.json")
    write_markdown(results, args.out / "force_uncertainty.md")
    plot(steps, results, args.out / "force_uncertainty.png")
    return results


def split_part(argv: list[str]) -> tuple[str, list[str]]:
    """``--part modes|size`` (default modes) and the other arguments."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--part", choices=("modes", "size"), default="modes")
    known, rest = p.parse_known_args(argv)
    return known.part, rest


def main(argv: list[str] | None = None) -> dict[str, Any]:
    part, rest = split_part(sys.argv[1:] if argv is None else argv)
    if part == "size":  # boxes of molecules and large cells: benchmarks/force_uncertainty_size.py
        from benchmarks import force_uncertainty_size

        return force_uncertainty_size.main(rest)
    argv = rest
    args = parse_args(argv)
    if args.report_only:
        results = json.loads((args.out / "force_uncertainty.json").read_text())
        write_markdown(results, args.out / "force_uncertainty.md")
        return results
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", "benchmarks.force_uncertainty", *argv])
    settings = {
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "quick": args.quick,
        "seed": args.seed,
        "budget_minutes": args.budget_minutes,
        "overrides": args.overrides,
        "threads": args.threads,
        "data_root": None if args.quick else str(args.data_root),
        "committee": not args.no_committee,
    }
    steps = Steps(args.out / "force_uncertainty.jsonl", settings)
    steps.note_command(command)
    with tempfile.TemporaryDirectory(prefix="mlip_unc_fu_") as work:
        for name in args.datasets:
            run_dataset(name, args, steps, Path(work))
            save(steps, args, "partial")
    results = save(steps, args, "complete")
    log.info("results: %s", args.out / "force_uncertainty.md")
    return results


if __name__ == "__main__":
    main()
