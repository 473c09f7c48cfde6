"""Uncertainty-driven exploration: does biasing the active-learning MD towards high
epistemic energy variance buy a lower error for the same number of oracle calls?

Setup (EMT copper, EMT is the oracle): per seed, a 32-atom fcc Cu cell; bootstrap frames from
EMT Langevin MD at 300 K (train + valid); one initial model trained on them, shared by every
arm of that seed. Each arm then runs ``--rounds`` rounds of the package's active-learning loop
(:func:`mlip_unc.active.loop.run_active_learning`) from that model: model MD at ``--md-temperature``
(Langevin), every logged frame flagged (absolute threshold 1e-9), the ``top_k`` most uncertain
(FPS-diversified) labelled by EMT, fine-tuning. The arms differ only in ``md.bias``:

- ``none``: plain MD;
- ``variance``: ``E_bias = -k sigma_E^2`` with ``k = kappa / s2_val``;
- ``udd``: ``E_bias = A [exp(-sigma_E^2 / (N B^2)) - 1]`` with ``N B^2 = 9 s2_val`` (saturating at
  sigma_E ~ 3x the validation level) and ``A = 9 kappa`` (the same slope as ``variance`` at small
  sigma_E);

``s2_val = (N * energy_std_per_atom level)^2``: the initial model's validation-set epistemic
energy variance (stored in its checkpoint), so ``kappa`` (eV) is the bias energy at the
validation level (0.1 eV, fixed before any run; not tuned). MD uncertainties in the ``lowrank`` mode.
Training runs are bounded by epochs (``max_minutes`` is only a far safety cap), so a run does not
depend on the machine's load. Every arm makes the same oracle calls (bootstrap frames + ``top_k`` per round).
After each round the model's force MAE is measured on one fixed held-out set of hotter frames
(EMT MD at ``--test-temperature``, the same for all seeds and arms).

Rows: ``bias, seed, round`` (model after that many rounds), ``oracle_calls`` (labels it was
trained on), ``force_mae_meV_A`` (held-out hot set), ``max_label_force_eV_A`` (largest EMT force
component among the frames labelled for that round: a runaway bias shows here),
``mean_sigma_E_visited`` (eV: mean epistemic ``sigma_E`` over the logged MD frames from which
that round's labels were picked, measured by the model that ran the MD; null for round 0).

    python -m benchmarks.exploration --threads 1                      # the committed results
    python -m benchmarks.exploration --quick --out /tmp/exploration   # < 30 s, numbers not meaningful
    python -m benchmarks.exploration --report-only   # rewrite exploration.md from the JSON
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ase.io
import numpy as np
import torch

from benchmarks.common.pages import environment, run_section
from mlip_unc import keys
from mlip_unc.active.data import build_structure, oracle_md, write_frames
from mlip_unc.active.loop import run_active_learning
from mlip_unc.active.oracles import make_oracle
from mlip_unc.active.training import train_model
from mlip_unc.atomic_write import atomic_write_text
from mlip_unc.calculator import UncertaintyCalculator
from mlip_unc.config import ActiveLearningConfig, GenerateSettings, validate
from mlip_unc.train.text_files import write_json

log = logging.getLogger("exploration")
REPO = Path(__file__).resolve().parents[1]
BIASES = ("none", "variance", "udd")
TEST_SEED = 1000  # the held-out hot set: one trajectory for every seed and arm

FULL = {
    "repeat": 2,
    "train_frames": 12,
    "valid_frames": 4,
    "test_frames": 16,
    "rounds": 3,
    "top_k": 4,
    "md_steps": 100,
    "md_interval": 5,
    "epochs": 30,
    "retrain_epochs": 10,
    "hidden": 32,
    "latent_dim": 16,
    "layers": 2,
    "basis": 8,
    "max_minutes": 10.0,
    "posterior": "full",
    "refit_offsets": False,
}
QUICK = {
    "repeat": 1,
    "train_frames": 4,
    "valid_frames": 2,
    "test_frames": 3,
    "rounds": 1,
    "top_k": 2,
    "md_steps": 10,
    "md_interval": 2,
    "epochs": 2,
    "retrain_epochs": 1,
    "hidden": 8,
    "latent_dim": 4,
    "layers": 1,
    "basis": 4,
    "max_minutes": 0.2,
    "posterior": "diagonal",
    "refit_offsets": False,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; quick: 0)")
    p.add_argument("--biases", default=",".join(BIASES))
    p.add_argument(
        "--kappa", type=float, default=0.1, help="bias energy (eV) at the validation-level sigma_E"
    )
    p.add_argument("--md-temperature", type=float, default=600.0, help="K, exploration MD")
    p.add_argument("--train-temperature", type=float, default=300.0, help="K, bootstrap data")
    p.add_argument("--test-temperature", type=float, default=1200.0, help="K, held-out set")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--quick", action="store_true", help="tiny settings (< 30 s; numbers not meaningful)"
    )
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite OUT/exploration.md from OUT/exploration.json",
    )
    p.add_argument(
        "--work", type=Path, default=None, help="run folders (default: a temporary folder)"
    )
    return p.parse_args(argv)


def training_config(s: dict[str, Any], seed: int) -> dict[str, Any]:
    """The demo's training recipe (small energy weight, offsets refit) at the sizes of ``s``."""
    return {
        "seed": seed,
        "dtype": "float64",
        "data": {"r_max": 4.5},
        "model": {
            "backbone": "gin",
            "latent_dim": s["latent_dim"],
            "standardise": False,
            "posterior": s["posterior"],
            "backbone_kwargs": {
                "hidden": s["hidden"],
                "num_layers": s["layers"],
                "num_basis": s["basis"],
            },
        },
        "loss": {"energy_weight": 1e-3, "forces_weight": 1.0},
        "train": {
            "epochs": s["epochs"],
            "batch_size": 8,
            "lr": 5e-3,
            "lr_schedule": "constant",
            "max_minutes": s["max_minutes"],
            "progress": False,
        },
    }


def bias_settings(bias: str, kappa: float, s2_val: float, n_atoms: int) -> dict[str, Any]:
    """``md.bias*`` of an arm (module docstring), from the validation-level variance ``s2_val``."""
    if bias == "none":
        return {"bias": "none"}
    if bias == "variance":
        return {"bias": "variance", "bias_strength": kappa / s2_val}
    return {
        "bias": "udd",
        "bias_strength": 9.0 * kappa,
        "bias_width": float(np.sqrt(9.0 * s2_val / n_atoms)),
    }


def force_mae_meV(model: str | Path, frames: list) -> float:
    """Mean absolute force-component error (meV/A) of ``model`` on labelled ``frames``."""
    calc = UncertaintyCalculator(model, uncertainty="none")
    errors = [
        np.abs(calc.get_property("forces", a.copy()) - a.get_forces()).ravel() for a in frames
    ]
    return 1e3 * float(np.concatenate(errors).mean())


def visited_sigma(md_dir: Path, n_atoms: int) -> float:
    """Mean epistemic ``sigma_E`` (eV) over the logged frames of one MD run (``md.csv``)."""
    with (md_dir / "md.csv").open() as handle:
        values = [
            float(r["energy_std_per_atom"]) * n_atoms
            for r in csv.DictReader(handle)
            if r["failed"] == "0"
        ]
    return float(np.mean(values)) if values else float("nan")


def run_seed(
    seed: int,
    biases: list[str],
    s: dict[str, Any],
    args: argparse.Namespace,
    work: Path,
    test_file: Path,
    test: list,
    done: Any,
) -> list[dict[str, Any]]:
    """The arms ``biases`` of one seed; ``done(rows)`` is called after each arm (results written)."""
    emt = make_oracle("emt")
    cu = {
        "bulk": "Cu",
        "crystalstructure": "fcc",
        "a": 3.61,
        "cubic": True,
        "repeat": [s["repeat"]] * 3,
    }
    cell = build_structure(cu)[0]
    boot = GenerateSettings(
        temperature=args.train_temperature,
        frames=s["train_frames"],
        interval=10,
        timestep=2.0,
        equilibration=100,
        seed=10 * seed,
    )
    train = oracle_md(cell, emt, boot)
    valid = oracle_md(cell, emt, boot, n_frames=s["valid_frames"], seed=10 * seed + 1)
    root = work / f"seed_{seed}"
    files = {
        "train": write_frames(root / "train.xyz", train),
        "valid": write_frames(root / "valid.xyz", valid),
    }
    model0 = train_model(
        train,
        valid,
        training_config(s, seed),
        root / "initial",
        seed=seed,
        refit_offsets=s["refit_offsets"],
    )
    level = UncertaintyCalculator(model0).uncertainty_levels[
        "energy_std_per_atom"
    ]  # eV/atom, epistemic
    s2_val = (level * len(cell)) ** 2
    log.info(
        "seed %d: initial model on %d + %d frames, validation sigma_E %.4g eV",
        seed,
        len(train),
        len(valid),
        np.sqrt(s2_val),
    )
    rows = []
    for bias in biases:
        t0 = time.monotonic()
        md = {
            "ensemble": "langevin",
            "temperature": args.md_temperature,
            "steps": s["md_steps"],
            "timestep": 1.0,
            "interval": s["md_interval"],
            "seed": seed,
            **bias_settings(bias, args.kappa, s2_val, len(cell)),
        }
        config = validate(
            ActiveLearningConfig,
            {
                "out": str(root / bias),
                "oracle": "emt",
                "structures": cu,
                "model": str(model0),
                "train_data": str(files["train"]),
                "valid_data": str(files["valid"]),
                "test_data": str(test_file),
                "training": training_config(s, seed),
                "rounds": s["rounds"],
                "retrain_epochs": s["retrain_epochs"],
                "refit_offsets": s["refit_offsets"],
                "uncertainty": "lowrank",
                "md": md,
                "seed": seed,
                "thresholds": {
                    keys.CALC_MAX_FORCE_STD: 1e-9
                },  # every frame is a candidate: the same budget in every arm
                # no max_label_force: every label is kept, so every arm trains on the same number of frames
                "selection": {"top_k": s["top_k"], "diverse": True, "max_label_force": None},
            },
            resolve=False,
        )
        history = run_active_learning(config, overwrite=True)
        calls = len(train) + len(valid)
        for r, row in enumerate(history):
            sigma = visited_sigma(root / bias / f"round_{r - 1}" / "md_0", len(cell)) if r else None
            labelled = (
                ase.io.read(root / bias / f"round_{r - 1}" / "labelled.xyz", ":") if r else []
            )
            rows.append(
                {
                    "bias": bias,
                    "seed": seed,
                    "round": r,
                    "oracle_calls": calls,
                    "force_mae_meV_A": force_mae_meV(row["model"], test),
                    "mean_sigma_E_visited": sigma,
                    "max_label_force_eV_A": max(
                        (float(np.abs(a.get_forces()).max()) for a in labelled), default=None
                    ),
                    "n_train": row["n_train"],
                    "bias_settings": {k: v for k, v in md.items() if "bias" in k},
                }
            )
            calls += row.get("n_labelled", 0) + row.get("n_dropped", 0)
        log.info(
            "seed %d, bias %s: force MAE %s meV/A (rounds 0..%d), %.0f s",
            seed,
            bias,
            [round(r["force_mae_meV_A"], 1) for r in rows if r["bias"] == bias],
            s["rounds"],
            time.monotonic() - t0,
        )
        done([r for r in rows if r["bias"] == bias])
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread over seeds per (bias, round)."""
    out = []
    for bias in dict.fromkeys(r["bias"] for r in rows):
        for rnd in sorted({r["round"] for r in rows}):
            group = [r for r in rows if r["bias"] == bias and r["round"] == rnd]
            mae = [r["force_mae_meV_A"] for r in group]
            sig = [
                r["mean_sigma_E_visited"] for r in group if r["mean_sigma_E_visited"] is not None
            ]
            out.append(
                {
                    "bias": bias,
                    "round": rnd,
                    "oracle_calls": group[0]["oracle_calls"],
                    "n_seeds": len(group),
                    "force_mae_meV_A_mean": statistics.fmean(mae),
                    "force_mae_meV_A_std": statistics.stdev(mae) if len(mae) > 1 else 0.0,
                    "mean_sigma_E_visited_mean": statistics.fmean(sig) if sig else None,
                    "max_label_force_eV_A_max": max(
                        (
                            r["max_label_force_eV_A"]
                            for r in group
                            if r["max_label_force_eV_A"] is not None
                        ),
                        default=None,
                    ),
                }
            )
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Uncertainty-driven exploration: EMT Cu active learning, with and without the bias",
        "",
        "A toy: the active-learning job on a real oracle (3BPA with GFN2-xTB; random, |F|, our "
        "σ, biased MD and a committee) is measured in [active_learning.md](active_learning.md).",
        "",
        (
            "| bias | round | oracle calls | force MAE, meV/Å (mean ± std over seeds) | mean σ_E visited, meV "
            "| max label force, eV/Å |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        sig = (
            "–"
            if r["mean_sigma_E_visited_mean"] is None
            else f"{1e3 * r['mean_sigma_E_visited_mean']:.2f}"
        )
        top = (
            "–" if r["max_label_force_eV_A_max"] is None else f"{r['max_label_force_eV_A_max']:.1f}"
        )
        lines.append(
            f"| {r['bias']} | {r['round']} | {r['oracle_calls']} | "
            f"{r['force_mae_meV_A_mean']:.1f} ± {r['force_mae_meV_A_std']:.1f} | {sig} | {top} |"
        )
    lines += ["", "Per seed (force MAE, meV/Å, rounds 0..R):", ""]
    for bias in dict.fromkeys(r["bias"] for r in result["rows"]):
        for seed in result["seeds"]:
            maes = [
                f"{r['force_mae_meV_A']:.1f}"
                for r in result["rows"]
                if r["bias"] == bias and r["seed"] == seed
            ]
            lines.append(f"- {bias}, seed {seed}: {', '.join(maes)}")
    env = result.get("environment", {})
    lines += [
        "",
        result["description"],
        "",
        *run_section(
            result["command"],
            date=result.get("date"),
            json_name="exploration.json",
            machine=env.get("machine"),
            load_avg=env.get("load_avg"),
            versions=env.get("versions") or {"torch": result["torch"]},
            extra=[f"Settings: `{result['settings']}`; {result['seconds']:.0f} s in all."],
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.report_only:
        result = json.loads((args.out / "exploration.json").read_text())
        atomic_write_text(args.out / "exploration.md", markdown(result))
        return result
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    s = QUICK if args.quick else FULL
    seeds = [int(x) for x in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    biases = [b for b in args.biases.split(",") if b]
    unknown = set(biases) - set(BIASES)
    if unknown:
        raise SystemExit(f"--biases: unknown {sorted(unknown)}; choose from {BIASES}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="exploration_") as tmp:
        work = args.work or Path(tmp)
        cell = build_structure(
            {
                "bulk": "Cu",
                "crystalstructure": "fcc",
                "a": 3.61,
                "cubic": True,
                "repeat": [s["repeat"]] * 3,
            }
        )[0]
        hot = GenerateSettings(
            temperature=args.test_temperature,
            frames=s["test_frames"],
            interval=10,
            timestep=2.0,
            equilibration=100,
            seed=TEST_SEED,
        )
        test = oracle_md(cell, make_oracle("emt"), hot)
        test_file = write_frames(work / "test_hot.xyz", test)
        command = "python -m benchmarks.exploration " + shlex.join(
            argv if argv is not None else sys.argv[1:]
        )
        same = {
            "seeds": seeds,
            "biases": biases,
            "quick": args.quick,
            "kappa_eV": args.kappa,
            "settings": s,
            "temperatures_K": {
                "train": args.train_temperature,
                "md": args.md_temperature,
                "test": args.test_temperature,
            },
        }
        rows, spent = previous_rows(args.out / "exploration.json", same)
        result: dict[str, Any] = {}

        def write(new: list[dict[str, Any]]) -> None:
            rows.extend(new)
            complete = {(r["seed"], r["bias"]) for r in rows} >= {
                (x, b) for x in seeds for b in biases
            }
            result.update(
                report(
                    command.strip(),
                    same,
                    rows,
                    spent + time.monotonic() - start,
                    complete,
                    cell,
                    test,
                )
            )
            args.out.mkdir(parents=True, exist_ok=True)
            write_json(args.out / "exploration.json", result)
            atomic_write_text(args.out / "exploration.md", markdown(result))

        finished = {(r["seed"], r["bias"]) for r in rows}
        for seed in seeds:
            todo = [b for b in biases if (seed, b) not in finished]
            if todo:
                run_seed(seed, todo, s, args, work, test_file, test, write)
        if not result:  # everything was in the file already
            write([])
    log.info("wrote %s (%.0f s)", args.out / "exploration.md", result["seconds"])
    return result


def previous_rows(path: Path, same: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """Rows (and seconds) of an unfinished run of the same settings in ``path``: finished arms are
    not run again (each seed's initial model is retrained, deterministically, for the others)."""
    if not path.is_file():
        return [], 0.0
    old = json.loads(path.read_text())
    if old.get("complete", True) or any(old.get(k) != v for k, v in same.items()):
        return [], 0.0
    log.info("continuing %s: %d rows kept", path, len(old["rows"]))
    return list(old["rows"]), float(old["seconds"])


def report(
    command: str,
    same: dict[str, Any],
    rows: list[dict[str, Any]],
    seconds: float,
    complete: bool,
    cell: Any,
    test: list,
) -> dict[str, Any]:
    s, temps, kappa = same["settings"], same["temperatures_K"], same["kappa_eV"]
    return {
        "command": command,
        **same,
        "complete": complete,
        "n_atoms": len(cell),
        "n_test": len(test),
        "rows": rows,
        "summary": summary(rows),
        "seconds": seconds,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "environment": environment(),
        "description": (
            f"{len(cell)}-atom fcc Cu, EMT oracle. Bootstrap {s['train_frames']} + {s['valid_frames']} "
            f"frames at {temps['train']:.0f} K; {s['rounds']} rounds of {s['md_steps']} MD steps at "
            f"{temps['md']:.0f} K, {s['top_k']} labels per round; force MAE on {len(test)} held-out "
            f"EMT frames at {temps['test']:.0f} K. kappa = {kappa} eV "
            "(bias energy at the validation-level sigma_E)."
            + ("" if complete else " UNFINISHED: rerun the command to add the missing arms.")
        ),
    }


if __name__ == "__main__":
    main()
