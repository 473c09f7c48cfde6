"""MACE users' rows of the force-uncertainty benchmark: the same frames, the same lines.

Three rows per dataset (3bpa, ethanol), on the test and OOD frames of
:func:`benchmarks.common.force_frames.dataset_split` (same ``--seed``, same frames as the native rows)
and scored by its functions (``frame_values`` / ``prediction_values`` / ``row_metrics``):

- ``backbone_mace``: configs/<set>_mace.yaml (our MACE backbone under the Bayesian head), trained
  as the native single model (``force_frames.train_config``: wall budget, wall-clock schedule),
  its full posterior fitted after training as the config says, every mode it offers
  (``force_frames.offered_modes``); the default mode is
  ``mlip_unc.models.full_posterior.default_uncertainty_mode``. Training and the posterior fit are
  two steps (training is run with ``model.posterior=diagonal`` and the full fit is
  ``finalize_checkpoint`` with the config's own posterior), so a slow fit never costs a training;
- ``mace_torch_attach``: mace-torch's MACE trained by ``mace_run_train`` under the same budget
  (:mod:`benchmarks.accuracy`'s command and stop rule, seed ``--seed``), then ``mlip-unc attach``
  with its defaults on the training split (it holds out ``--valid-fraction`` 0.1 of those frames,
  random with seed 0, to calibrate; :func:`calibration_overlap` records which, and how many of them
  mace-torch had held out itself), every mode the attached model offers (the default mode first,
  SLOW_MODES after the committee);
- ``mace_torch_committee``: ``--members`` such models (seeds seed..seed+members-1, member 0 =
  the model of the row above), each evaluated by mace-torch's own ``MACECalculator``; score = the
  force std across members (population variance, as :class:`mlip_unc.models.committee.Committee`);
  cost = ``MACECalculator(model_paths=[members])`` E+F over one member's ``MACECalculator`` E+F.

Order: per dataset row (b)'s model, attach and default mode, then the other members (row c);
then row (b)'s slow modes; then row (a) per dataset. Cost ratios are interleaved best-of-3 single-frame timings (``force_frames.time_calls``) over
each model's own plain E+F. Finished trainings, fits, evaluations and timings are appended to
``WORK/steps.jsonl`` and skipped when the command is run again; ``--stop-by HH:MM`` (UTC) starts
no step that would not end before it. The results (metrics only) go to
``OUT/force_uncertainty_mace.json`` and a section of ``OUT/force_uncertainty.md`` between
:data:`BEGIN` and :data:`END` (the rest of the page is kept). A data set without records in
``WORK`` keeps its entry in that JSON, with the run that made it (:func:`carry_over`): a data set
run again in a new ``--work`` leaves the other on the page.

    .venv-mace/bin/python -m benchmarks.peers.mace_rows --datasets 3bpa,ethanol --budget-minutes 8 --threads 1
    .venv-mace/bin/python -m benchmarks.peers.mace_rows --report-only   # the page from the JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.common import force_frames as ff
from benchmarks.common import mace_torch as mt
from benchmarks.common.evaluation import calculator_predictions, read_frames
from benchmarks.common.format import fmt2, fmt3
from benchmarks.common.pages import environment, replace_section
from mlip_unc.train.text_files import json_safe

log = logging.getLogger("mace_rows")
FORWARD = "forward_graph"
"""The cost record's key of :func:`forward_pass` (a record of the forward alone, without the
positions' graph, was keyed ``forward`` and is timed again)."""
REPO = ff.REPO
RESULTS = ff.RESULTS
WORK = REPO / "runs" / "mace_rows"
DATASETS = ("3bpa", "ethanol")
PARTS = ("torch", "backbone")  # torch: rows (b) and (c); backbone: row (a)
BACKBONE, ATTACH, COMMITTEE = "backbone_mace", "mace_torch_attach", "mace_torch_committee"
BEGIN = "<!-- peers/mace_rows: begin (written by python -m benchmarks.peers.mace_rows) -->"
END = "<!-- peers/mace_rows: end -->"
TARGETS = {  # rows (a) and (b) against the committee: key -> (slack below it, lowest, highest)
    "spearman_frame_in_domain": (0.05, None, None),
    "partial_spearman_given_force": (0.05, None, None),
    "auroc_ood": (0.03, None, None),
    "std_over_rmse": (None, 0.5, 2.0),
    "cost_ratio": (None, None, 2.0),
}
SLOW_MODES = (
    "exact",
    "sampled",
    "lowrank",
    "sketch",
)  # row (b): after the committee if not default
MINUTES = {
    "train": None,
    "attach": 15.0,
    "fit": 45.0,
    "eval": 5.0,
    "exact": 35.0,
}  # None: budget + 2


# ================================================================ arguments
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument(
        "--parts", default=",".join(PARTS), help="torch (rows b, c) and/or backbone (row a)"
    )
    p.add_argument("--budget-minutes", type=float, default=8.0, help="wall time per model")
    for flag, default, text in (
        ("--threads", 1, "torch / OMP threads"),
        ("--seed", 0, "seed of the split, of our model and of committee member 0"),
        ("--members", 5, "committee members (seeds seed..seed+members-1)"),
        ("--n-samples", 4, "draws of the sampled mode"),
        ("--timing-frames", 20, "frames timed"),
        ("--max-eval-frames", None, "cap each test set (checks only)"),
    ):
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override, row (a)"
    )
    p.add_argument(
        "--attach-args", default="", help="extra options of mlip-unc attach (checks only)"
    )
    p.add_argument("--stop-by", default=None, help="UTC HH:MM: start no step that would end later")
    p.add_argument(
        "--work", type=Path, default=WORK, help=f"checkpoints and steps (default {WORK})"
    )
    p.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    p.add_argument("--report-only", action="store_true", help="only rewrite the page from the JSON")
    args = p.parse_args(argv)
    args.datasets = [d.strip().lower() for d in args.datasets.split(",") if d.strip()]
    if bad := [d for d in args.datasets if d not in DATASETS]:
        p.error(f"unknown dataset(s) {bad}; choose from {DATASETS}")
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if bad := [x for x in args.parts if x not in PARTS]:
        p.error(f"unknown part(s) {bad}; choose from {PARTS}")
    args.data_root = args.data_root or Path(
        os.environ.get("MLIP_UNC_DATA") or REPO.parent / "shared" / "data"
    )
    args.work = args.work.resolve()  # mace_run_train runs in its own folder
    args.quick = False  # read by force_uncertainty's helpers
    return args


def deadline(stop_by: str | None, now: datetime.datetime | None = None) -> datetime.datetime | None:
    """The next UTC time ``HH:MM`` after ``now`` (None: no deadline)."""
    if not stop_by:
        return None
    now = now or datetime.datetime.now(datetime.UTC)
    hour, minute = (int(x) for x in stop_by.split(":"))
    when = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return when if when > now else when + datetime.timedelta(days=1)


class OutOfTime(Exception):
    """A step would not end before ``--stop-by``; the run stops there, its results partial."""


def check_time(args: argparse.Namespace, kind: str, what: str) -> None:
    """Raise :class:`OutOfTime` when a ``kind`` step (MINUTES) would end after ``--stop-by``."""
    if args.deadline is None:
        return
    minutes = MINUTES[kind] if MINUTES[kind] is not None else args.budget_minutes + 2.0
    end = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=minutes)
    if end > args.deadline:
        raise OutOfTime(f"{what}: ~{minutes:g} min would end after --stop-by {args.stop_by}")


# ================================================================ training
def mace_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """The options that ``force_frames.dataset_spec`` and ``row_config`` read (accuracy's fixed
    MACE_MODEL)."""
    return argparse.Namespace(
        data_root=args.data_root,
        split_seed=args.seed,
        quick=False,
        mace_arch="fixed",
        mace_stage_two=None,
        threads=args.threads,
        budget_minutes=args.budget_minutes,
    )


def mace_spec(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """:func:`~benchmarks.common.force_frames.dataset_spec` of ``name`` (3BPA's split files
    under WORK/name)."""
    work = args.work / name
    work.mkdir(parents=True, exist_ok=True)
    return ff.dataset_spec({"3bpa": "3BPA"}.get(name, name), mace_namespace(args), work)


def train_mace_torch(name: str, seed: int, args: argparse.Namespace, steps: ff.Steps) -> Path:
    """mace-torch's MACE of ``seed`` trained by ``mace_run_train`` for the budget (accuracy.py's
    command and stop rule); returns its ``.model`` (the step records minutes and epochs)."""
    from mlip_unc.config import load_potential_config

    step, work = f"train:{name}:mace_torch:{seed}", args.work / name / f"mace_torch_seed{seed}"
    if (done := steps.get(step)) and Path(done["model"]).is_file():
        return Path(done["model"])
    check_time(args, "train", step)
    log.info("[train] %s mace-torch seed %d: %g min", name, seed, args.budget_minutes)
    spec, ns = mace_spec(name, args), mace_namespace(args)
    raw, source = ff.row_config(spec, "mace_torch", ns)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "cfg.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_potential_config(
        work / "cfg.yaml", [f"data_root={args.data_root}", *spec["overrides"]]
    )
    cmd = mt.mace_command(spec, cfg, seed, work, mt.MACE_MODEL, cfg.train.batch_size)
    threads = str(args.threads)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONUNBUFFERED": "1",
    }
    log_path, load = work / "mace_run_train.log", os.getloadavg()[0]
    seconds = mt.run_mace(cmd, log_path, 60.0 * args.budget_minutes, env)
    epoch = mt.last_epoch(work, swa=False, budget=args.budget_minutes)
    mt.run_mace([*cmd, "--restart_latest", "--max_num_epochs", str(epoch)], log_path, None, env)
    model = next(p for p in (work / "mace.model", *work.rglob("mace.model")) if p.is_file())
    steps.add(
        step,
        {
            "model": str(model),
            "train_minutes": seconds / 60.0,
            "epochs": len(set(mt.epochs_logged(log_path))),
            "best_epoch": epoch,
            "command": shlex.join(cmd),
            "config": f"mace_run_train (r_max, batch size, valid fraction, dtype of {source})",
            "dtype": cfg.dtype.value,
            "mace_model": mt.flags(cmd, (*mt.MACE_MODEL, "batch_size", "valid_fraction")),
            "load_avg": [load, os.getloadavg()[0]],
        },
    )
    return model


def attach(name: str, model: Path, args: argparse.Namespace, steps: ff.Steps) -> Path:
    """``mlip-unc attach`` with its defaults on the training split; the attached checkpoint."""
    step, out = f"attach:{name}", args.work / name / "mace_torch_attached.pt"
    if steps.get(step) and out.is_file():
        return out
    check_time(args, "attach", step)
    train = mace_spec(name, args)["train"]
    cmd = [
        str(Path(sys.executable).parent / "mlip-unc"),
        "attach",
        "--model",
        str(model),
        "--data",
        str(train),
        "--out",
        str(out),
        "--threads",
        str(args.threads),
        "--overwrite",
        *shlex.split(args.attach_args),
    ]
    log.info("[attach] %s: %s", name, shlex.join(cmd))
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        steps.add(
            f"attach_failed:{name}", {"command": shlex.join(cmd), "stderr": proc.stderr[-3000:]}
        )
        raise RuntimeError(f"mlip-unc attach failed ({proc.returncode}): {proc.stderr[-1500:]}")
    meta = attached_metadata(out)
    steps.add(
        step,
        {
            **calibration_overlap(model.parent, meta.get("attach") or {}),
            "command": shlex.join(cmd),
            "seconds": seconds,
            "stdout": proc.stdout.strip().splitlines()[-1:],
            "attach": meta.get("attach"),
            "posterior": meta.get("posterior"),
        },
    )
    return out


def calibration_overlap(mace_work: Path, attach_meta: dict[str, Any]) -> dict[str, Any]:
    """Which training-split frames ``attach`` calibrated on (its defaults' split, recomputed as
    :func:`mlip_unc.posthoc.attach.attach_uncertainty` draws it) and how many of them mace-torch
    held out for its own validation (``mace_valid_indices_*.txt`` of ``mace_work``)."""
    from mlip_unc.data import random_split
    from mlip_unc.posthoc.attach import _subset

    n, fraction = attach_meta.get("n_train"), attach_meta.get("valid_fraction")
    if not n or not fraction or attach_meta.get("valid"):
        return {}
    total = n + round(fraction * n / (1.0 - fraction))  # the training file's multi-atom frames
    seed, limit = attach_meta.get("seed", 0), attach_meta.get("n_valid")
    split = random_split(total, (1.0 - fraction, fraction, 0.0), seed=seed)
    if len(split.train) != n:  # not the split attach drew: say nothing rather than guess
        return {}
    valid = sorted(_subset(list(split.val) + list(split.test), limit, seed))
    files = sorted(mace_work.glob("mace_valid_indices_*.txt"))
    mace_valid = {int(x) for x in files[0].read_text().split()} if files else set()
    return {
        "calibration_frames": valid,
        "n_train_file": total,
        "n_mace_valid": len(mace_valid),
        "calibration_in_mace_valid": len(set(valid) & mace_valid),
    }


def attached_metadata(path: Path) -> dict[str, Any]:
    """The metadata that ``attach`` (or ``finalize_checkpoint``) wrote into a checkpoint."""
    from mlip_unc.models.checkpoint import load_checkpoint

    return load_checkpoint(path, kind="potential").get("metadata") or {}


def backbone_split(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """force_uncertainty's split of ``name`` with configs/<name>_mace.yaml as the config."""
    split = ff.dataset_split(name, args, args.work / name)
    return {**split, "config": REPO / "configs" / f"{name}_mace.yaml"}


def train_backbone(name: str, args: argparse.Namespace, steps: ff.Steps) -> Path:
    """Row (a): the MACE-backbone model trained (posterior fitted in :func:`fit_backbone`)."""
    from mlip_unc.train.potential import run_training

    step, out = f"train:{name}:backbone", args.work / name / "backbone_mace"
    if steps.get(step) and (out / "model.pt").is_file():
        return out
    check_time(args, "train", step)
    split = backbone_split(name, args)
    diagonal = argparse.Namespace(
        **{**vars(args), "overrides": [*args.overrides, "model.posterior=diagonal"]}
    )
    config = ff.train_config(split, diagonal, out, 1)  # the full posterior: fit_backbone
    log.info("[train] %s backbone mace: %g min", name, args.budget_minutes)
    load = os.getloadavg()[0]
    result = run_training(config)[0]
    for last in out.rglob("last.pt"):
        last.unlink()
    steps.add(
        step,
        {
            "train_minutes": result.train_minutes,
            "epochs": len(result.history),
            "best_epoch": result.best_epoch,
            "stop_reason": result.stop_reason,
            "config": str(split["config"].relative_to(REPO)),
            "load_avg": [load, os.getloadavg()[0]],
        },
    )
    return out


def fit_backbone(name: str, out: Path, args: argparse.Namespace, steps: ff.Steps) -> None:
    """Row (a)'s post-training fits with the config's own posterior (``finalize_checkpoint``);
    done again after a new training or when the config's ``model.posterior_valid_frames``
    changed (the evaluations after it follow)."""
    from mlip_unc.train.potential import finalize_checkpoint
    from mlip_unc.train.potential_data import prepare_data

    step = f"fit:{name}:backbone"
    config = ff.train_config(backbone_split(name, args), args, out, 1)
    valid_frames = config.model.posterior_valid_frames
    if (
        (done := steps.get(step))
        and done["line"] > steps.get(f"train:{name}:backbone")["line"]
        and done.get("valid_frames") == valid_frames  # absent before the option: all frames
    ):
        return
    check_time(args, "fit", step)
    log.info("[fit] %s backbone mace: posterior %s", name, config.model.posterior.value)
    start = time.perf_counter()
    finalize_checkpoint(out / "model.pt", config, prepare_data(config))
    post = attached_metadata(out / "model.pt").get("posterior")
    record = {"seconds": time.perf_counter() - start, "posterior": post}
    steps.add(step, {**record, "valid_frames": valid_frames})


# ================================================================ evaluation
def eval_modes(
    name: str,
    row: str,
    model_path: Path,
    args: argparse.Namespace,
    steps: ff.Steps,
    after: str,
    defer: tuple[str, ...] = (),
) -> None:
    """Every mode the model in ``model_path`` offers but ``defer`` (the slow ``exact``, left for a
    later call), default first, on the split's test and OOD frames (one step each, redone when
    older than the step ``after``); then the interleaved cost of the modes evaluated so far over the
    model's plain E+F (with mace-torch's own calculator timed beside it for row b)."""
    from mlip_unc.models.full_posterior import default_uncertainty_mode
    from mlip_unc.models.loading import load_potential

    model = load_potential(model_path)
    split = ff.dataset_split(name, args, args.work / name)
    sets = {
        part: data
        for part in ("in", "ood")
        if (
            data := ff.load_frames(
                split["test" if part == "in" else "ood"], model, split, args.max_eval_frames
            )
        )
        is not None
    }
    modes, skipped = ff.offered_modes(model, sets["in"].graphs[0], args)
    default = default_uncertainty_mode(model)
    if default not in modes:  # a default outside force_frames.MODES (e.g. one that picks a mode)
        model(sets["in"].graphs[0], compute_forces=True, uncertainty=default)
        modes.append(default)
    fresh = steps.get(after)["line"]
    record = {"offered": modes, "skipped": skipped, "default": default}
    if (
        (m := steps.get(f"modes:{name}:{row}")) is None
        or m["line"] < fresh
        or any(m.get(k) != v for k, v in record.items())
    ):
        steps.add(f"modes:{name}:{row}", record)
    todo = [m for m in modes if m not in defer or m == default]
    for mode in sorted(todo, key=lambda m: (m != default, m == "exact")):  # exact (slow) last
        step = f"eval:{name}:{row}:{mode}"
        if (done := steps.get(step)) and done["line"] > fresh:
            continue
        check_time(args, "exact" if mode == "exact" else "eval", step)
        start = time.perf_counter()
        record = {part: ff.frame_values(model, data, mode, args) for part, data in sets.items()}
        steps.add(step, {**record, "seconds": time.perf_counter() - start})
        log.info("[eval] %s %s %s done", name, row, mode)
    distance_baselines(name, row, model, split, sets, steps, fresh)
    step = f"cost:{name}:{row}"
    timed = [m for m in modes if steps.get(f"eval:{name}:{row}:{m}")]
    if (
        (done := steps.get(step))
        and done["line"] > fresh
        and done.get("modes") == timed
        and FORWARD in done["ms"]  # older records lack the floor's forward pass
    ):
        return
    check_time(args, "eval", step)
    import torch

    gen = torch.Generator().manual_seed(args.seed)
    graphs = sets["in"].graphs[: args.timing_frames]
    calls = {
        ("plain" if m == "none" else m): (
            lambda k, m=m: model(
                graphs[k],
                compute_forces=True,
                uncertainty=m,
                n_samples=args.n_samples,
                generator=gen,
            )
        )
        for m in ("none", *timed)
    }
    calls[FORWARD] = lambda k: forward_pass(model, graphs[k])  # the floor's f
    if row == ATTACH:  # the same MACE model in mace-torch's own calculator, for reference
        frames = test_atoms(split["test"], split, len(graphs))
        calc = mace_calculator(
            [steps.get(f"train:{name}:mace_torch:{args.seed}")["model"]], steps, name
        )
        calls["mace_calculator"] = lambda k: calc.calculate(frames[k], ["energy", "forces"], [])
    ms = ff.time_calls(calls, list(range(len(graphs))))
    vectors = backward_vectors(model, graphs, default)
    steps.add(step, {"ms": ms, "n_frames": len(graphs), "modes": timed, "vectors": vectors})


def distance_baselines(
    name: str,
    row: str,
    model: Any,
    split: dict[str, Any],
    sets: dict[str, Any],
    steps: ff.Steps,
    fresh: int,
) -> None:
    """The native rows' distance-to-training baselines (``ff.distance_scores``: the model's own
    per-atom latents and an interatomic-distance histogram, against every frame of the split's
    training file, which both rows train on) for the frames of ``sets``; one step, redone when
    older than the step at line ``fresh``."""
    step = f"distance:{name}:{row}"
    if (done := steps.get(step)) and done["line"] > fresh:
        return
    train = ff.load_frames(split["train"], model, split, None)
    scores = ff.distance_scores(model, train, sets)  # {baseline: {part: (n,)}}
    steps.add(
        step,
        {b: {p: np.asarray(v).tolist() for p, v in parts.items()} for b, parts in scores.items()},
    )
    log.info("[eval] %s %s distance baselines done", name, row)


def backward_vectors(model: Any, graphs: list, mode: str) -> int:
    """Backward vectors one call of ``mode`` takes on the largest of ``graphs``: the mean forces
    and the sigma directions (``rank + 1`` low-rank, 2 sketched; a backbone's own energies ride on
    the mean's vector)."""
    from mlip_unc.models.full_posterior import auto_keeps_lowrank

    rank, n_max = int(model.posterior_rank), max(int(g.num_nodes) for g in graphs)
    lowrank = mode == "lowrank" or (mode == "auto" and auto_keeps_lowrank(n_max, rank))
    return rank + 1 if lowrank else 2


def forward_pass(model: Any, graph: Any) -> None:
    """What an E+F call runs before its backward pass: the latents (and a backbone's own
    energies) with the positions' autograd graph recorded."""
    import torch

    with torch.enable_grad():
        model._state(graph, forces=True, stress=False)


def floor(cost: dict[str, Any] | None) -> float | None:
    """What the default mode's backward vectors allow over plain E+F: ``(f + K b) / (f + b)``
    with ``f`` the forward pass (:func:`forward_pass`), ``b`` = plain E+F - ``f`` and ``K`` the
    vectors."""
    ms, k = (cost or {}).get("ms") or {}, (cost or {}).get("vectors")
    if not k or FORWARD not in ms or not ms.get("plain"):
        return None
    f, b = ms[FORWARD], ms["plain"] - ms[FORWARD]
    return (f + k * b) / (f + b)


def test_atoms(path: Path | str, split: dict[str, Any], limit: int | None) -> list:
    """The frames of ``path`` as ASE atoms with float64 labels (the frames ``load_frames`` reads)."""
    spec = {
        "energy_key": split["energy_key"],
        "forces_key": split["forces_key"],
        "stress_key": None,
    }
    return read_frames(Path(path), spec)[:limit]


def mace_calculator(models: list[str], steps: ff.Steps, name: str) -> Any:
    """mace-torch's ``MACECalculator`` of ``models`` (a committee for several) in their dtype."""
    from mace.calculators import MACECalculator

    dtype = next(
        r["dtype"] for s, r in steps.records.items() if s.startswith(f"train:{name}:mace_torch:")
    )
    return MACECalculator(
        model_paths=models if len(models) > 1 else models[0], device="cpu", default_dtype=dtype
    )


def save_predictions(pred: Any, path: Path) -> Path:
    """The array fields of a :class:`~mlip_unc.evaluation.predictions.Predictions` as ``.npz``."""
    arrays = {f.name: getattr(pred, f.name) for f in dataclasses.fields(pred)}
    np.savez_compressed(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def load_predictions(path: Path) -> Any:
    from mlip_unc.evaluation.predictions import Predictions

    with np.load(path) as data:
        return Predictions(**{k: data[k] for k in data.files})


def committee_predictions(members: list[Any]) -> Any:
    """One Predictions from the members' (same frames): mean energy and forces, population
    variance across members as the epistemic variances (mlip_unc's Committee convention)."""
    energy = np.stack([m.energy_pred for m in members])  # (M, n_frames)
    forces = np.stack([m.forces_pred for m in members])  # (M, n_atoms, 3)
    return dataclasses.replace(
        members[0],
        energy_pred=energy.mean(0),
        forces_pred=forces.mean(0),
        energy_epistemic_var=energy.var(0),
        forces_epistemic_var=forces.var(0),
    )


def predict_member(name: str, seed: int, args: argparse.Namespace, steps: ff.Steps) -> None:
    """One committee member's energies and forces on the test and OOD frames by ``MACECalculator``."""
    step = f"predict:{name}:mace_torch:{seed}"
    if (done := steps.get(step)) and done["line"] > steps.get(f"train:{name}:mace_torch:{seed}")[
        "line"
    ]:
        return
    check_time(args, "eval", step)
    split = ff.dataset_split(name, args, args.work / name)
    calc = mace_calculator([steps.get(f"train:{name}:mace_torch:{seed}")["model"]], steps, name)
    spec = {
        "energy_key": split["energy_key"],
        "forces_key": split["forces_key"],
        "stress_key": None,
    }
    files = {}
    for part in ("in", "ood"):
        if (path := split["test" if part == "in" else "ood"]) is not None:
            pred = calculator_predictions(calc, test_atoms(path, split, args.max_eval_frames), spec)
            files[part] = str(
                save_predictions(pred, args.work / name / f"mace_torch_seed{seed}_{part}.npz")
            )
    steps.add(step, {"files": files})


def eval_committee(name: str, seeds: list[int], args: argparse.Namespace, steps: ff.Steps) -> None:
    """Row (c) from the members predicted so far (redone when a member was added), and its cost."""
    done = [s for s in seeds if steps.get(f"predict:{name}:mace_torch:{s}")]
    if len(done) < 2:
        return
    step = f"eval:{name}:{COMMITTEE}"
    if (old := steps.get(step)) and old["members"] == done:
        pass
    else:
        files = [steps.get(f"predict:{name}:mace_torch:{s}")["files"] for s in done]
        record = {
            part: ff.prediction_values(
                committee_predictions([load_predictions(Path(f[part])) for f in files]),
                "committee5",
            )
            for part in files[0]
        }
        steps.add(step, {**record, "members": done})
    step = f"cost:{name}:{COMMITTEE}"
    if (old := steps.get(step)) and old["members"] == done:
        return
    check_time(args, "eval", step)
    split = ff.dataset_split(name, args, args.work / name)
    models = [steps.get(f"train:{name}:mace_torch:{s}")["model"] for s in done]
    single, committee = (
        mace_calculator(models[:1], steps, name),
        mace_calculator(models, steps, name),
    )
    frames = test_atoms(split["test"], split, args.timing_frames)
    calls = {
        "plain": lambda k: single.calculate(frames[k], ["energy", "forces"], []),
        "committee": lambda k: committee.calculate(frames[k], ["energy", "forces"], []),
    }
    steps.add(
        step,
        {
            "ms": ff.time_calls(calls, list(range(len(frames)))),
            "n_frames": len(frames),
            "members": done,
        },
    )


# ================================================================ results
def ratios(cost: dict[str, Any] | None) -> dict[str, float]:
    """Each timed call over the record's plain E+F."""
    ms = (cost or {}).get("ms") or {}
    return {k: v / ms["plain"] for k, v in ms.items() if k != "plain"} if ms.get("plain") else {}


def assemble(steps: ff.Steps, args: argparse.Namespace, status: str) -> dict[str, Any]:
    """``{"meta": ..., dataset: {"rows": {row: metrics}, "defaults": {group: row}, ...}}``."""
    settings = steps.get("settings") or {}
    results: dict[str, Any] = {
        "meta": {
            "command": settings.get("command"),
            "commands": steps.commands,
            "started": settings.get("started"),
            "updated": time.strftime("%Y-%m-%d %H:%M"),
            "status": status,
            "seed": settings.get("seed"),
            "budget_minutes": settings.get("budget_minutes"),
            "threads": settings.get("threads"),
            "members_requested": settings.get("members"),
            "environment": environment(),
            "notes": list(getattr(args, "notes", [])),
        }
    }
    for name in DATASETS:  # every data set with records, also those this invocation skipped
        rows, defaults, info = {}, {}, {}
        for group in (BACKBONE, ATTACH):
            ratio = ratios(steps.get(f"cost:{name}:{group}"))
            modes = steps.get(f"modes:{name}:{group}") or {}
            for step, rec in steps.records.items():
                if step.startswith(f"eval:{name}:{group}:"):
                    mode = step.rsplit(":", 1)[1]
                    rows[f"{group}:{mode}"] = ff.row_metrics(
                        rec["in"], rec.get("ood"), ratio.get(mode)
                    )
            if modes and (rec := steps.get(f"eval:{name}:{group}:{modes['default']}")):
                # the trivial baselines on the same predictions: max over atoms of |F_pred|, and
                # the distances to the training set (not timed)
                dist = steps.get(f"distance:{name}:{group}") or {}
                scores = {
                    "force_magnitude": {p: rec[p]["force"] for p in ("in", "ood") if p in rec},
                    **{b: dist[b] for b in ff.DISTANCES if b in dist},
                }
                for baseline, score in scores.items():
                    rows[f"{group}:{baseline}"] = ff.row_metrics(
                        *(
                            {**rec[p], "score": score[p], "std_over_rmse": None}
                            if p in rec and p in score
                            else None
                            for p in ("in", "ood")
                        ),
                        1.0 if baseline == "force_magnitude" else None,
                    )
            if modes:
                defaults[group] = f"{group}:{modes['default']}"
                cost = steps.get(f"cost:{name}:{group}") or {}
                info[group] = {
                    "offered": modes["offered"],
                    "skipped": modes["skipped"],
                    "cost_ms": cost.get("ms"),
                    "backward_vectors": cost.get("vectors"),
                    "cost_floor": floor(cost),
                }
        if rec := steps.get(f"eval:{name}:{COMMITTEE}"):
            cost = steps.get(f"cost:{name}:{COMMITTEE}")
            ratio = (
                ratios(cost).get("committee")
                if cost and cost["members"] == rec["members"]
                else None
            )
            rows[COMMITTEE] = ff.row_metrics(rec["in"], rec.get("ood"), ratio)
            info[COMMITTEE] = {"members": rec["members"], "cost_ms": (cost or {}).get("ms")}
        trained = {
            s.split(":")[3]: {k: r.get(k) for k in ("train_minutes", "epochs", "best_epoch")}
            for s, r in steps.records.items()
            if s.startswith(f"train:{name}:mace_torch:")
        }
        info["mace_torch_training"] = trained
        if (r := steps.get(f"train:{name}:mace_torch:{args.seed}")) is not None:
            info["mace_torch_flags"] = r.get("mace_model")
        if a := steps.get(f"attach:{name}"):
            info["attach"] = {
                "command": a["command"],
                "seconds": a["seconds"],
                **{
                    k: a.get(k)
                    for k in ("n_train_file", "n_mace_valid", "calibration_in_mace_valid")
                },
                **{
                    k: (a.get("attach") or {}).get(k)
                    for k in (
                        "n_train",
                        "n_fit",
                        "n_valid",
                        "valid_fraction",
                        "seed",
                        "mace_errors",
                    )
                },
                "posterior": {
                    k: (a.get("posterior") or {}).get(k)
                    for k in (
                        "alpha2_forces",
                        "alpha2_energy",
                        "lambda",
                        "rank",
                        "basis",
                        "valid_nll_forces",
                    )
                },
            }
        if b := steps.get(f"train:{name}:backbone"):
            info["backbone_training"] = {
                k: b.get(k) for k in ("train_minutes", "epochs", "best_epoch", "config")
            }
        if f := steps.get(f"fit:{name}:backbone"):
            post = f.get("posterior") or {}
            info["backbone_fit"] = {
                "seconds": f["seconds"],
                **{k: post.get(k) for k in ("lowrank_rank", "probes", "fit_seconds")},
            }
        gaps = {
            group: ff.paired_gap(single["in"], committee["in"], seed=args.seed)
            for group, row in defaults.items()
            if (single := steps.get(f"eval:{name}:{row}"))
            and (committee := steps.get(f"eval:{name}:{COMMITTEE}"))
        }
        if gaps:
            info["paired_bootstrap"] = gaps
        if rows:
            results[name] = {
                "rows": rows,
                "defaults": defaults,
                "acceptance": {
                    g: acceptance(rows.get(d), rows.get(COMMITTEE)) for g, d in defaults.items()
                },
                **info,
            }
    return json_safe(results)


def acceptance(row: dict[str, Any] | None, committee: dict[str, Any] | None) -> dict[str, Any]:
    """The target lines (TARGETS) for a default row against the committee: value, bounds, miss
    (0 = met, None = not measured)."""
    out = {}
    for key, (slack, low, high) in TARGETS.items():
        ref = (committee or {}).get(key)
        lo = ref - slack if slack is not None and ref is not None else low
        v = (row or {}).get(key)
        if v is None or (slack is not None and ref is None):
            miss = None
        else:
            miss = max(
                0.0, lo - v if lo is not None else 0.0, v - high if high is not None else 0.0
            )
        out[key] = {"value": v, "low": lo, "high": high, "miss": miss}
    return out


def section(results: dict[str, Any]) -> list[str]:
    """The page section (markdown lines) from the results JSON."""
    meta = results["meta"]
    lines = [
        "## MACE users' rows",
        "",
        "Same test and OOD frames as the native rows above (seed "
        f"{meta.get('seed')}), scored by the same functions. `{BACKBONE}:<mode>`: configs/<set>_mace.yaml (our MACE "
        "backbone + Bayesian head, full posterior fitted after training); `mace_torch_attach:<mode>`: mace-torch's "
        "MACE trained by `mace_run_train`, then `mlip-unc attach` with its defaults; `mace_torch_committee`: "
        "mace-torch MACE models of seeds 0.. (member 0 = the attached model's), score = max over atoms of the "
        "force std across members, cost = mace-torch's `MACECalculator(model_paths=[members])` E+F / one member's "
        "E+F. The other rows' cost: the model's mode / its own plain E+F (interleaved best-of-3, median over "
        "frames). (default) marks `default_uncertainty_mode(model)`; `<group>:force_magnitude`: the "
        "trivial baseline, max over atoms of that model's |F_pred| on the same frames; "
        "`<group>:latent_distance` and `<group>:descriptor_distance`: the native rows' distances to the "
        "training set (that model's per-atom latents; the interatomic-distance histogram), scored "
        "against that model's errors (not timed).",
        "",
    ]
    for name, entry in ((n, e) for n, e in results.items() if n != "meta"):
        members = (entry.get(COMMITTEE) or {}).get("members") or []
        lines += [
            f"### {name}",
            "",
            "| row | " + " | ".join(ff.ROW_KEYS) + " |",
            "|---" * (len(ff.ROW_KEYS) + 1) + "|",
        ]
        for row, r in entry["rows"].items():
            label = row + (" (default)" if row in entry["defaults"].values() else "")
            if row == COMMITTEE:
                label = f"{COMMITTEE} ({len(members)} members)"
            lines.append(f"| {label} | " + " | ".join(fmt2(r.get(k)) for k in ff.ROW_KEYS) + " |")
        lines.append("")
        req = meta.get("members_requested")
        if row_c := entry.get(COMMITTEE):
            partial = (
                f" (partial: {len(members)} of {req} members)" if req and len(members) < req else ""
            )
            lines.append(
                f"Committee: seeds {members}{partial}; ms per frame {fmt_ms(row_c.get('cost_ms'))}."
            )
        else:
            lines.append(f"Committee: not evaluated (fewer than 2 of {req} members trained).")
        tm = entry.get("mace_torch_training") or {}
        if tm:
            lines.append(
                "mace-torch training (seed: minutes to the last validation, epochs, kept epoch): "
                + "; ".join(
                    f"{s}: {fmt2(v.get('train_minutes'))}, {v.get('epochs')}, {v.get('best_epoch')}"
                    for s, v in tm.items()
                )
                + f"; flags {entry.get('mace_torch_flags')}."
            )
        if a := entry.get("attach"):
            p = a.get("posterior") or {}
            lines.append(
                f"Attach: `{shorten(a['command'])}` ({fmt2(a['seconds'])} s); posterior on "
                f"{a.get('n_fit')} of {a.get('n_train')} training-split frames, calibrated on {a.get('n_valid')} frames "
                f"held out of the training split by attach (random, --valid-fraction {a.get('valid_fraction')}, seed "
                f"{a.get('seed')}; of them {a.get('calibration_in_mace_valid')} were among the {a.get('n_mace_valid')} "
                "frames that mace_run_train held out for its validation, the rest were MACE training frames); "
                f"alpha_F^2 {fmt3(p.get('alpha2_forces'))}; offered modes "
                f"{(entry.get(ATTACH) or {}).get('offered')}, ms per frame {fmt_ms((entry.get(ATTACH) or {}).get('cost_ms'))}."
            )
        if b := entry.get("backbone_training"):
            f = entry.get("backbone_fit") or {}
            lines.append(
                f"Backbone MACE: {b.get('config')}, trained {fmt2(b.get('train_minutes'))} min ({b.get('epochs')} epochs, best "
                f"{b.get('best_epoch')}); after training {fmt2(f.get('seconds'))} s, of them the posterior "
                f"fit {fmt2(f.get('fit_seconds'))} s (rank {f.get('lowrank_rank')}, "
                f"{f.get('probes') or 'no'} probes); offered modes {(entry.get(BACKBONE) or {}).get('offered')}, ms per frame "
                f"{fmt_ms((entry.get(BACKBONE) or {}).get('cost_ms'))}."
            )
        for group in (BACKBONE, ATTACH):
            offered = (entry.get(group) or {}).get("offered")
            if offered is None:
                lines.append(f"{group}: not run.")
                continue
            if missing := [m for m in offered if f"{group}:{m}" not in entry["rows"]]:
                lines.append(f"{group}: offered but not evaluated (out of time): {missing}.")
            cost = entry["rows"]
            if untimed := [
                m
                for m in offered
                if f"{group}:{m}" in cost and cost[f"{group}:{m}"].get("cost_ratio") is None
            ]:
                lines.append(f"{group}: evaluated but not timed: {untimed}.")
            info = entry.get(group) or {}
            if (bound := info.get("cost_floor")) is not None:
                ms = info.get("cost_ms") or {}
                lines.append(
                    f"{group}: the default's floor (f + K b) / (f + b) = {bound:.2f} with K = "
                    f"{info.get('backward_vectors')} backward vectors, forward f = {ms[FORWARD]:.3g} "
                    f"ms and one backward b = {ms['plain'] - ms[FORWARD]:.3g} ms (plain E+F - f): "
                    "cost <= 2 needs b / f <= 1 / (K - 2), or fewer vectors."
                )
        lines += [
            "",
            f"Acceptance (default row vs {COMMITTEE}: Spearmans >= committee - 0.05, AUROC >= committee - 0.03, std/RMSE in [0.5, 2], cost <= 2):",
        ]
        for group, acc_lines in entry.get("acceptance", {}).items():
            parts = []
            for key, a in acc_lines.items():
                result = (
                    "n/a"
                    if a.get("miss") is None
                    else "met"
                    if a["miss"] == 0
                    else f"missed by {a['miss']:.2g}"
                )
                parts.append(
                    f"{key} {fmt3(a.get('value'))} [{fmt3(a.get('low'))}, {fmt3(a.get('high'))}]: {result}"
                )
            lines.append(f"- {entry['defaults'][group]}: " + "; ".join(parts) + ".")
        for group, default in entry["defaults"].items():
            ours = entry["rows"].get(default) or {}
            key = "spearman_frame_in_domain"
            if ahead := [
                f"{b} {fmt2(r[key])}"
                for b in ("force_magnitude", *ff.DISTANCES)
                if (r := entry["rows"].get(f"{group}:{b}"))
                and r.get(key) is not None
                and ours.get(key) is not None
                and r[key] > ours[key]
            ]:
                lines.append(
                    f"- {default}: trivial baselines that rank in-domain frames better than it "
                    f"({fmt2(ours[key])}): {', '.join(ahead)}."
                )
        for group, gaps in (entry.get("paired_bootstrap") or {}).items():
            lines += [
                f"- {entry['defaults'][group]} - {COMMITTEE}, paired bootstrap over the in-domain "
                "frames (1000 resamples): "
                + "; ".join(
                    f"{k} gap {g['gap']:+.3f}, std {g['std']:.3f}, resamples within the slack "
                    f"{100 * g['p_within_slack']:.0f} %"
                    for k, g in gaps.items()
                )
                + "."
            ]
        if run := entry.get("run"):
            lines += ["", f"{name} is kept from an earlier run. " + run_line(run)]
        lines.append("")
    return [*lines, run_line(meta), *(f"- {n}" for n in meta.get("notes") or [])]


def run_line(meta: dict[str, Any]) -> str:
    """The commands, times, load average and versions of the run that ``meta`` describes."""
    env = meta.get("environment") or {}
    return (
        "Run: "
        + "; ".join(f"`{c}`" for c in meta.get("commands") or [])
        + f". Started {meta.get('started')}, updated {meta.get('updated')}; "
        f"status {meta.get('status')}; {meta.get('budget_minutes'):g} min per model, {meta.get('threads')} thread(s); "
        f"load average {env.get('load_avg')}; {env.get('machine')}; versions {env.get('versions')}. "
        "Records: force_uncertainty_mace.json."
    )


def shorten(command: str) -> str:
    """A command line with the repository and work-folder prefixes dropped."""
    return command.replace(str(REPO) + "/", "")


def fmt_ms(ms: dict[str, float] | None) -> str:
    return "n/a" if not ms else "{" + ", ".join(f"{k}: {v:.3g}" for k, v in ms.items()) + "}"


def write_section(path: Path, lines: list[str]) -> None:
    """This section of ``path`` (between BEGIN and END), before the metatrain peer's section when
    the page has one; the rest of the page kept."""
    from benchmarks.peers.metatrain import BEGIN as PEER_BEGIN

    replace_section(path, BEGIN, END, lines, before=PEER_BEGIN)


def carry_over(results: dict[str, Any], path: Path) -> dict[str, Any]:
    """``results`` with the data sets it lacks taken from the records at ``path`` (an earlier run in
    another work folder), each with the ``run`` (meta) that made it: a run of one data set keeps
    the others on the page."""
    if not path.is_file():
        return results
    old = json.loads(path.read_text())
    kept = {
        name: {**old[name], "run": old[name].get("run") or old["meta"]}
        for name in DATASETS
        if name in old and name not in results
    }
    merged = {**results, **kept}
    return {"meta": merged.pop("meta"), **{n: merged[n] for n in DATASETS if n in merged}}


def save(steps: ff.Steps, args: argparse.Namespace, status: str) -> dict[str, Any]:
    results = carry_over(assemble(steps, args, status), args.out / "force_uncertainty_mace.json")
    (args.out / "force_uncertainty_mace.json").write_text(json.dumps(results, indent=1))
    write_section(args.out / "force_uncertainty.md", section(results))
    return results


# ================================================================ main
def run_torch(name: str, args: argparse.Namespace, steps: ff.Steps) -> None:
    """Rows (b) and (c) of one dataset: model 0, attach, its default row, then the members."""
    seeds = [args.seed + k for k in range(args.members)]
    model = train_mace_torch(name, seeds[0], args, steps)
    attached = attach(name, model, args, steps)
    predict_member(name, seeds[0], args, steps)
    eval_modes(name, ATTACH, attached, args, steps, after=f"attach:{name}", defer=SLOW_MODES)
    save(steps, args, "partial")
    for seed in seeds[1:]:
        train_mace_torch(name, seed, args, steps)
        predict_member(name, seed, args, steps)
        eval_committee(name, seeds, args, steps)
        save(steps, args, "partial")


def run_deferred(name: str, args: argparse.Namespace, steps: ff.Steps) -> None:
    """Row (b)'s deferred modes (SLOW_MODES) and their cost."""
    _deferred(
        name, ATTACH, args.work / name / "mace_torch_attached.pt", f"attach:{name}", args, steps
    )


def _deferred(
    name: str, row: str, model: Path, after: str, args: argparse.Namespace, steps: ff.Steps
) -> None:
    """Every mode of ``row`` still missing (SLOW_MODES included) once ``after`` is done."""
    if steps.get(after) and model.is_file():
        eval_modes(name, row, model, args, steps, after=after)
        save(steps, args, "partial")


def run_backbone(name: str, args: argparse.Namespace, steps: ff.Steps) -> None:
    """Row (a) of one dataset: training, the posterior fit, every mode but SLOW_MODES."""
    out = train_backbone(name, args, steps)
    fit_backbone(name, out, args, steps)
    eval_modes(
        name,
        BACKBONE,
        out / "model.pt",
        args,
        steps,
        after=f"fit:{name}:backbone",
        defer=SLOW_MODES,
    )
    save(steps, args, "partial")


def run_backbone_deferred(name: str, args: argparse.Namespace, steps: ff.Steps) -> None:
    """Row (a)'s deferred modes (SLOW_MODES) and their cost."""
    model = args.work / name / "backbone_mace" / "model.pt"
    _deferred(name, BACKBONE, model, f"fit:{name}:backbone", args, steps)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    if args.report_only:
        results = json.loads((args.out / "force_uncertainty_mace.json").read_text())
        write_section(args.out / "force_uncertainty.md", section(results))
        return results
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    args.deadline, args.notes = deadline(args.stop_by), []
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(
        ["python", "-m", "benchmarks.peers.mace_rows", *(sys.argv[1:] if argv is None else argv)]
    )
    settings = {
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "quick": False,
        "seed": args.seed,
        "budget_minutes": args.budget_minutes,
        "overrides": args.overrides,
        "threads": args.threads,
        "members": args.members,
        "data_root": str(args.data_root),
    }
    steps = ff.Steps(args.work / "steps.jsonl", settings)
    steps.note_command(command)
    status = "complete"
    try:
        for part, run in (
            ("torch", run_torch),
            ("torch", run_deferred),
            ("backbone", run_backbone),
            ("backbone", run_backbone_deferred),
        ):
            if part in args.parts:
                for name in args.datasets:
                    run(name, args, steps)
    except OutOfTime as err:
        status = "partial"
        args.notes.append(f"stopped: {err}")
        log.warning("stopped: %s", err)
    results = save(steps, args, status)
    log.info("results: %s (%s)", args.out / "force_uncertainty.md", status)
    return results


if __name__ == "__main__":
    main()
