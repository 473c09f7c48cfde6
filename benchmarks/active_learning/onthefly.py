"""On-the-fly active learning judged by the oracle calls it saves (3BPA with GFN2-xTB).

``python -m benchmarks.active_learning`` runs the shipped config ``configs/al_xtb_3bpa.yaml``
(strategy ``ours``: xTB is called when the force uncertainty crosses 2x its validation level)
beside the same loop with other triggers, all paired by seed (one seed set, validation set and
seed model per seed):

- ``committee5``: the force spread of a 5-member committee;
- ``periodic``: every n-th monitored frame, n = the median monitored frames per label on the
  kept MD trajectory of the finished ``ours`` runs (so the calls match over the same MD time;
  20 before any has finished), one frame per label and no window after it (:data:`SINGLE`);
- ``random``: each monitored (physical) frame with probability 1/n, likewise;
- ``force_magnitude``: the largest predicted force;
- ``true_error``: the largest true force error (oracle calls for the control not counted).

A **reference model** (the same backbone and recipe trained on 300 oracle frames from MD at
300, 600, 900 and 1200 K, disjoint from the test sets) sits beside the arms. Every model that a
run had at 50, 75, 100, 125 and 150 calls (and its final one) is scored on the oracle-labelled
reference sets (``reference_sets.py``: MD at 300, 600 and 1200 K, a torsion scan): force MAE,
energy MAE, the 95th percentile of the per-frame largest force error. A model is *usable* when
its force MAE is within 1.25x the reference's at 300 and 600 K and 1.5x at 1200 K and on the
scan, and its energy MAE within 2x on every set; the stability part (5 x 10 ps at 600 K and
1200 K, ``stability.py``) is run for the final models with ``--stability``. A run's final model
is its refit from scratch (``on_the_fly.final_refit``); ``--refits`` trains the same refit on
the labels each run had at every milestone (``refits.py``: what a run with that budget hands
over), and those decide the calls to usable.

Each finished run appends one record to ``benchmarks/results/active_learning_otf.jsonl``;
runs already there are skipped, so the work spreads over several invocations. The page is
``benchmarks/results/active_learning.md`` (``onthefly_report.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.active_learning.reference_sets import DEFAULT_OUT as REFERENCE_SETS
from benchmarks.common.pages import environment
from benchmarks.common.records import append_jsonl, read_jsonl

RESULTS = Path("benchmarks/results")
#: ``--quick``: seconds-to-minutes settings for the slow tier (numbers not meaningful)
QUICK = [
    "seed_set.frames=4",
    "seed_set.valid_frames=3",
    "on_the_fly.max_calls=11",
    "on_the_fly.segment_fs=50",
    "on_the_fly.hold_ps=0.05",
    "on_the_fly.final_ps=0.05",
    "on_the_fly.labels_per_update=2",
    "retrain_epochs=2",
    "training.train.epochs=3",
]
ARMS = ("ours", "committee5", "periodic", "random", "force_magnitude", "true_error")
SEEDS = {"ours": 5, "periodic": 5, "random": 5}  # the other arms: 3
MILESTONES = (50, 75, 100, 125, 150)
ENERGY_LIMIT = 2.0
CACHE = Path(os.environ.get("MLIP_UNC_CACHE", "~/.cache/mlip_unc")).expanduser()


@dataclass(frozen=True)
class System:
    """One benchmarked system: its shipped config, reference sets and usable limits.

    Attributes:
        name: ``3bpa`` or ``si``.
        title: how the page names it.
        config: the shipped on-the-fly config.
        full_width: the potential config whose recipe the shipped backbone is checked against.
        sets: the reference sets (``<set>.xyz`` under ``reference_sets``).
        force_limits: per set, the force MAE a usable model may have, x the reference model's.
        reference_sets: where the reference sets' module writes them.
        reference_temperatures: MD temperatures of the reference model's training frames.
        timestep: oracle MD timestep of those frames (fs).
    """

    name: str
    title: str
    config: Path
    full_width: Path
    sets: tuple[str, ...]
    force_limits: dict[str, float]
    reference_sets: Path
    reference_temperatures: tuple[float, ...]
    timestep: float

    @property
    def runs(self) -> str:
        """The JSONL of its runs, under ``--results``."""
        return (
            "active_learning_otf.jsonl"
            if self.name == "3bpa"
            else f"active_learning_otf_{self.name}.jsonl"
        )

    @property
    def references(self) -> str:
        """The JSONL of its reference models, under ``--results``."""
        return self.runs.replace(".jsonl", "_reference.jsonl")


SYSTEMS = {
    "3bpa": System(
        name="3bpa",
        title="3BPA with GFN2-xTB",
        config=Path("configs/al_xtb_3bpa.yaml"),
        full_width=Path("configs/3bpa_equivariant.yaml"),
        sets=("md_300K", "md_600K", "md_1200K", "torsion_scan"),
        force_limits={"md_300K": 1.25, "md_600K": 1.25, "md_1200K": 1.5, "torsion_scan": 1.5},
        reference_sets=REFERENCE_SETS,
        reference_temperatures=(300, 600, 900, 1200),
        timestep=0.5,
    ),
    "si": System(
        name="si",
        title="64-atom Si with the mlearn SNAP potential",
        config=Path("configs/al_snap_si.yaml"),
        full_width=Path("configs/mlearn_equivariant.yaml"),
        sets=("md_300K", "md_1200K", "md_melt", "vacancy", "surface"),
        # near-equilibrium sets as 300 K, the hot, molten and open ones as 1200 K
        force_limits={
            "md_300K": 1.25,
            "md_1200K": 1.5,
            "md_melt": 1.5,
            "vacancy": 1.25,
            "surface": 1.5,
        },
        reference_sets=CACHE / "al_reference" / "si_snap",
        reference_temperatures=(300, 1100, 1900, 2200),
        timestep=1.0,
    ),
}
THREE_BPA = SYSTEMS["3bpa"]
CONFIG, SETS, FORCE_LIMITS = THREE_BPA.config, THREE_BPA.sets, THREE_BPA.force_limits
RUNS, REFERENCE = THREE_BPA.runs, THREE_BPA.references


def arm_overrides(arm: str, every: int) -> list[str]:
    """The ``--set`` overrides of ``arm`` on the shipped config (``every``: the periodic rate)."""
    return {
        "ours": [],
        "committee5": ["committee=5"],
        "periodic": ["on_the_fly.trigger=periodic", f"on_the_fly.every={every}", *SINGLE],
        "random": [
            "on_the_fly.trigger=random",
            f"on_the_fly.probability={1 / every:.6f}",
            *SINGLE,
        ],
        "force_magnitude": ["on_the_fly.trigger=max_force"],
        "true_error": ["on_the_fly.trigger=true_error"],
    }[arm]


#: periodic and random label one frame per flag, with no window after it: the frames after a
#: flag are thrown away when MD goes on from the flagged frame, so a window would let them
#: count (and fire) on frames the run never keeps, and their calls would outrun MD time
SINGLE = ["on_the_fly.window=0", "on_the_fly.labels_per_update=1"]


def periodic_rate(records: Sequence[dict[str, Any]]) -> int:
    """Median monitored frames per label on the kept MD trajectory of the finished ``ours``
    runs (``kept_frames``; all monitored frames for records without it; 20 before any), so
    that periodic and random spend ours' calls over the same MD time."""
    rates = [
        r.get("kept_frames", r["monitored"]) / max(r["calls"] - r["seed_calls"], 1)
        for r in records
        if r["arm"] == "ours" and r.get("monitored")
    ]
    return max(1, int(round(float(np.median(rates))))) if rates else 20


def load_sets(folder: Path, system: System = THREE_BPA) -> dict[str, list[Any]]:
    """The reference sets (oracle-labelled extxyz) of ``system`` under ``folder``."""
    from mlip_unc.data.readers import read_structures

    missing = [s for s in system.sets if not (folder / f"{s}.xyz").is_file()]
    if missing:
        module = "reference_sets" if system.name == "3bpa" else f"reference_sets_{system.name}"
        raise SystemExit(
            f"reference sets {missing} missing under {folder}: make them with "
            f"`python -m benchmarks.active_learning.{module}`"
        )
    return {s: read_structures(folder / f"{s}.xyz") for s in system.sets}


def score(model: Path, sets: dict[str, list[Any]]) -> dict[str, Any]:
    """Per set: force MAE (meV/A), energy MAE and mean signed energy error (meV: model minus
    oracle) and the 95th percentile of the per-frame largest force-error norm (meV/A) of
    ``model`` (plain energy + forces)."""
    from mlip_unc.calculator import UncertaintyCalculator

    calc = UncertaintyCalculator(str(model), uncertainty="none")
    out: dict[str, Any] = {}
    for name, frames in sets.items():
        f_err, e_err, worst = [], [], []
        for ref in frames:
            atoms = ref.copy()
            atoms.calc = calc
            diff = atoms.get_forces() - ref.get_forces()  # (n, 3)
            f_err.append(np.abs(diff).mean())
            worst.append(np.linalg.norm(diff, axis=1).max())
            e_err.append(atoms.get_potential_energy() - ref.get_potential_energy())
        out[name] = {
            "force_mae": 1000 * float(np.mean(f_err)),
            "energy_mae": 1000 * float(np.mean(np.abs(e_err))),
            "energy_bias": 1000 * float(np.mean(e_err)),
            "p95_max_force_error": 1000 * float(np.percentile(worst, 95)),
        }
    return out


def usable(errors: dict[str, Any], reference: dict[str, Any], system: System = THREE_BPA) -> bool:
    """The error part of "usable": force MAE within the system's ``force_limits`` x and energy
    MAE within :data:`ENERGY_LIMIT` x the reference model's on every set."""
    return all(
        errors[s]["force_mae"] <= system.force_limits[s] * reference[s]["force_mae"]
        and errors[s]["energy_mae"] <= ENERGY_LIMIT * reference[s]["energy_mae"]
        for s in system.sets
    )


def milestone_models(rows: Sequence[dict[str, Any]]) -> dict[int, str]:
    """The model a run had at each of :data:`MILESTONES` calls it reached, and at its end."""
    out = {}
    for m in MILESTONES:
        before = [r for r in rows if r["calls"] <= m]
        if before and rows[-1]["calls"] >= m:
            out[m] = before[-1]["model"]
    out[int(rows[-1]["calls"])] = rows[-1]["model"]
    return out


def broken_labels(
    out: Path, model: Path, seed_frames: int, system: System = THREE_BPA
) -> tuple[int, int]:
    """(labelled frames that break the geometry rules, labelled frames) of a run: the final
    model's training frames beyond the seed set, checked again with the run's guard."""
    from mlip_unc.active.data import build_structure
    from mlip_unc.active.guard import GeometryGuard
    from mlip_unc.config import load_active_config
    from mlip_unc.data.readers import read_structures

    config = load_active_config(system.config)
    guard = GeometryGuard.from_structure(build_structure(config.structures)[0], config.guard)
    labels = read_structures(model.parent / "train.xyz")[seed_frames:]
    return sum(guard.check(a) is not None for a in labels), len(labels)


def run_arm(
    arm: str,
    seed: int,
    work: Path,
    sets: Callable[[], dict[str, list[Any]]],
    every: int,
    extra: Sequence[str] = (),
    system: System = THREE_BPA,
) -> dict[str, Any]:
    """One run of ``arm`` with ``seed``; arms other than ``ours`` start from the seed set,
    label cache and (one model) the seed model of ``ours`` with the same seed."""
    from mlip_unc.active.onthefly import run_on_the_fly
    from mlip_unc.config import load_active_config

    out = work / f"{arm}_s{seed}"
    overrides = [f"out={out}", f"seed={seed}", f"seed_set.seed={seed}", f"md.seed={seed}"]
    overrides += [*arm_overrides(arm, every), *extra]
    base = work / f"ours_s{seed}"
    if arm != "ours":
        seed_model = _seed_model(base)
        if seed_model is None:
            raise SystemExit(f"{arm} seed {seed}: run ours seed {seed} first (its seed set)")
        if not (out / "state.json").is_file():
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(base / "data", out / "data")
            shutil.copytree(base / "labels", out / "labels")
        if arm != "committee5":
            overrides.append(f"model={seed_model}")
    config = load_active_config(system.config, overrides)
    wall = time.monotonic()
    result = run_on_the_fly(config, resume=(out / "state.json").is_file())

    state = json.loads((out / "state.json").read_text())
    rows = result.rows
    seed_calls = int(rows[0]["calls"])
    scored = {str(m): score(Path(p), sets()) for m, p in milestone_models(rows).items()}
    tuned = [r for r in rows if not r.get("refit")][-1]  # the final model before the refit
    broken, labelled = broken_labels(out, result.model, _seed_size(out), system)
    return {
        "system": system.name,
        "arm": arm,
        "seed": seed,
        "ended": result.ended,
        "calls": result.calls,
        "seed_calls": seed_calls,
        "updates": len(rows) - 1,
        "md_ps": rows[-1]["md_ps"],
        "top_temperature": rows[-1]["temperature"],
        "monitored": rows[-1].get("monitored"),
        "kept_frames": rows[-1].get("kept_frames"),
        "geometry_stops": rows[-1]["geometry_stops"],
        "rescue_labels": sum(int(r.get("rescue", False)) for r in rows),
        "control_calls": rows[-1].get("control_calls", 0),
        "labelled": labelled,
        "broken_labelled": broken,
        "first_segment_broke": state.get("first_segment_broke"),
        "cpu_model_s": sum(r.get("cpu_md_s", 0) + r.get("cpu_train_s", 0) for r in rows),
        "cpu_oracle_s": state.get("cpu_seed_s", 0) + sum(r.get("cpu_oracle_s", 0) for r in rows),
        "wall_s": time.monotonic() - wall,
        "curve": [
            {k: r[k] for k in ("calls", "md_ps", "temperature", "valid_force_mae")} for r in rows
        ],
        "errors": scored,
        "errors_before_refit": score(Path(tuned["model"]), sets())
        if rows[-1].get("refit")
        else None,
        "every": every if arm in ("periodic", "random") else None,
        "environment": environment(),
    }


def _seed_model(base: Path) -> Path | None:
    """The seed model of the run in ``base`` (its first row: ``update_0``, or the ``model``
    it was given), or None before it has one."""

    state = base / "state.json"
    rows = json.loads(state.read_text()).get("updates", []) if state.is_file() else []
    return Path(rows[0]["model"]) if rows and Path(rows[0]["model"]).is_file() else None


def _share_labels(source: Path, out: Path) -> None:
    """Start a variant's run with the label cache of the shipped config's run of the same seed
    (oracle results of identical structures: the seed set's oracle MD is not paid twice)."""
    if (source / "labels").is_dir() and not (out / "labels").exists():
        shutil.copytree(source / "labels", out / "labels")


def _seed_size(out: Path) -> int:
    """Frames in a run's seed training set."""
    from mlip_unc.data.readers import read_structures

    return len(read_structures(out / "data" / "train.xyz"))


def reference_model(
    work: Path,
    sets: dict[str, list[Any]],
    frames: int,
    extra: Sequence[str] = (),
    recipe: str = "shipped",
    system: System = THREE_BPA,
    subset: int | None = None,
) -> dict[str, Any]:
    """A model trained the plain way on ``frames`` oracle frames from MD at
    the system's ``reference_temperatures`` (100 fs apart; seeds 100+, disjoint from the test sets) and 12
    validation frames from their own trajectories, with the oracle's isolated atoms.
    ``recipe``: ``shipped`` (the backbone and training of the shipped AL config) or
    ``full_width`` (the model, loss and training of the system's ``full_width`` config), on the
    same frames. ``subset``: the shipped recipe on that many frames drawn at random (seed 0)
    from the pool, the plain way of spending that many calls (recipe ``shipped_subset``)."""
    from mlip_unc.active.data import build_structure, write_frames
    from mlip_unc.active.onthefly import _training
    from mlip_unc.active.oracles import make_oracle
    from mlip_unc.active.seed import seed_frames
    from mlip_unc.active.training import train_model
    from mlip_unc.config import SeedSettings, load_active_config
    from mlip_unc.config.loader import load_raw
    from mlip_unc.data.readers import read_structures

    config = load_active_config(system.config, [f"out={work / 'reference'}", *extra])
    out = work / "reference"
    cpu = time.process_time()
    pool_file = out / "data" / "train.xyz"
    cost_file = out / "data" / "oracle_cpu.json"  # the pool's labelling cost, kept for reuse
    if pool_file.is_file():
        train = read_structures(pool_file)
        valid = read_structures(out / "data" / "valid.xyz")
    else:
        settings = SeedSettings(
            temperatures=list(system.reference_temperatures),
            frames=frames,
            valid_frames=12,
            spacing_fs=100,
            timestep=system.timestep,
            seed=100,
        )
        start = build_structure(config.structures)[0]
        train, valid = seed_frames(start, make_oracle(config.oracle), settings)
        write_frames(out / "data" / "valid.xyz", valid)
        write_frames(pool_file, train)
        cost_file.write_text(json.dumps({"cpu_oracle_s": time.process_time() - cpu}))
    # a reused pool costs what its first labelling cost (null when that was not recorded)
    cpu_oracle = json.loads(cost_file.read_text())["cpu_oracle_s"] if cost_file.is_file() else None
    folder = out / f"model_{recipe}"
    if subset is not None:
        if subset > len(train):
            raise SystemExit(f"--reference-subsets: {subset} > the pool's {len(train)} frames")
        picked = np.sort(np.random.default_rng(0).choice(len(train), subset, replace=False))
        train = [train[int(i)] for i in picked]
        recipe, folder = "shipped_subset", out / f"model_shipped_{subset}"
    training = _training(config, out, train)
    if recipe == "full_width":
        full = load_raw(system.full_width)
        training = {
            **training,
            "model": {
                **full["model"],
                **{
                    k: v
                    for k, v in training["model"].items()
                    if k in ("reference_energies", "refit_offsets")
                },
            },
            "loss": full["loss"],
            "train": full["train"],
        }
    cpu = time.process_time()
    model = train_model(train, valid, training, folder, seed=0)
    return {
        "system": system.name,
        "recipe": recipe,
        "frames": len(train),
        "errors": score(model, sets),
        "cpu_model_s": time.process_time() - cpu,
        "cpu_oracle_s": cpu_oracle,
        "model": str(model),
        "environment": environment(),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--arms",
        default=",".join(("ours", "reference", *ARMS[1:], "full_width")),
        help="comma-separated, in run order (reference, full_width: the reference models)",
    )
    p.add_argument("--seeds", type=int, default=None, help="seeds per arm (default 5 or 3)")
    p.add_argument("--system", choices=sorted(SYSTEMS), default="3bpa")
    p.add_argument("--work", type=Path, default=None, help="run folders (default: the cache)")
    p.add_argument("--results", type=Path, default=RESULTS, help="JSONL records and the page")
    p.add_argument("--reference-sets", type=Path, default=None, help="default: the cache")
    p.add_argument("--reference-frames", type=int, default=300)
    p.add_argument(
        "--reference-subsets",
        default="",
        help="comma-separated frame counts: the reference recipe on that many random pool frames",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny settings (slow-tier test)")
    p.add_argument("--report-only", action="store_true", help="rewrite the page from the JSONL")
    p.add_argument(
        "--trigger-check",
        action="store_true",
        help="only the share of oracle frames over the σ threshold for finished ours runs",
    )
    p.add_argument(
        "--variant",
        default=None,
        help="name of a variant of the shipped config (its own run folders and page rows)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of the shipped config for --variant (repeatable)",
    )
    p.add_argument(
        "--refits",
        action="store_true",
        help="only the refits from scratch of the finished runs' labels at each milestone "
        "(of --arms, when given)",
    )
    p.add_argument(
        "--refit-milestones",
        default=",".join(map(str, MILESTONES)),
        help="comma-separated milestones (calls) of --refits",
    )
    p.add_argument(
        "--stability",
        action="store_true",
        help="only the stability MD of the finished runs' final models and the reference model "
        "(of --arms, when given)",
    )
    p.add_argument(
        "--stability-temperatures",
        default="600,1200",
        help="comma-separated NVT temperatures (K) of --stability (5 x 10 ps each)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    from benchmarks.active_learning.onthefly_report import write_page

    args = parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]  # in run order; the default names every arm
    system = SYSTEMS[args.system]
    command = "python -m benchmarks.active_learning " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    runs, refs = args.results / system.runs, args.results / system.references
    work = args.work or CACHE / "al_otf" / system.name
    if bool(args.variant) != bool(args.set):
        raise SystemExit("--variant and --set go together (a named variant of the config)")
    default_work = work
    if args.variant:
        work = work / f"variant_{args.variant}"

    def page() -> Path:
        return write_page(args.results, command)

    if args.report_only:  # the page names the command of the newest record, not this one
        print(write_page(args.results, ""))
        return
    import torch

    torch.set_num_threads(args.threads)
    args.results.mkdir(parents=True, exist_ok=True)
    extra = [*(QUICK if args.quick else []), *args.set]
    if args.stability:
        from benchmarks.active_learning import stability

        base = stability.QUICK if args.quick else stability.Stability()
        protocol = stability.Stability(
            temperatures=tuple(float(t) for t in args.stability_temperatures.split(",")),
            runs=base.runs,
            length_ps=base.length_ps,
        )
        stability.run_stability(
            system.config,
            system.name,
            args.results,
            system.runs,
            system.references,
            work,
            command,
            protocol,
            extra,
            args.variant,
            arms,
        )
        page()
        return

    @functools.cache
    def sets() -> dict[str, list[Any]]:  # read when first needed: they may still be made
        return load_sets(args.reference_sets or system.reference_sets, system)

    if args.refits:
        from benchmarks.active_learning.refits import run_refits

        run_refits(
            system.config,
            system.name,
            args.results,
            system.runs,
            work,
            sets,
            score,
            [int(m) for m in args.refit_milestones.split(",")],
            command,
            arms,
            extra,
        )
        page()
        return
    if args.trigger_check:
        from benchmarks.active_learning.trigger_check import run_trigger_check
        from mlip_unc.config import load_active_config

        threshold = load_active_config(system.config, extra).on_the_fly.threshold
        run_trigger_check(args.results, system.runs, work, sets(), threshold, command, args.variant)
        page()
        return

    for seed in range(max(SEEDS.values())):
        for arm in arms:
            if arm in ("reference", "full_width") and args.variant:
                raise SystemExit("--variant: the reference models are the shipped config's")
            if arm in ("reference", "full_width"):
                recipe = "shipped" if arm == "reference" else "full_width"
                if not any(r.get("recipe", "shipped") == recipe for r in read_jsonl(refs)):
                    print(f"{system.name}: reference model ({recipe}) ...", flush=True)
                    record = reference_model(
                        work, sets(), args.reference_frames, extra, recipe, system
                    )
                    append_jsonl(refs, {**record, "command": command})
                    page()
                if arm == "reference":
                    for n in [int(s) for s in args.reference_subsets.split(",") if s]:
                        done = read_jsonl(refs)
                        if any(
                            r.get("recipe") == "shipped_subset" and r["frames"] == n for r in done
                        ):
                            continue
                        print(f"{system.name}: reference recipe on {n} pool frames ...", flush=True)
                        record = reference_model(
                            work, sets(), args.reference_frames, extra, "shipped", system, n
                        )
                        append_jsonl(refs, {**record, "command": command})
                        page()
                continue
            n_seeds = args.seeds or SEEDS.get(arm, 3)
            mine = [r for r in read_jsonl(runs) if r.get("variant") == args.variant]
            if seed >= n_seeds or (arm, seed) in {(r["arm"], r["seed"]) for r in mine}:
                continue
            print(f"{system.name}: {arm} seed {seed} ...", flush=True)
            if args.variant and arm == "ours":
                _share_labels(default_work / f"ours_s{seed}", work / f"ours_s{seed}")
            every = periodic_rate(mine)
            record = run_arm(arm, seed, work, sets, every, extra, system)
            append_jsonl(runs, {**record, "variant": args.variant, "command": command})
            page()
