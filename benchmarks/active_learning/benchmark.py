"""Does the uncertainty save reference calculations? Active learning on 3BPA with GFN2-xTB.

Every strategy runs the package's loop (:func:`mlip_unc.active.loop.run_active_learning`) with
the shipped ``configs/al_xtb_3bpa.yaml``; only what the strategy names changes:

- ``random``: ``selection.metric: random``, no diversity (uniform over the visited MD frames);
- ``force_magnitude``: ``selection.metric: max_force`` (largest predicted ``|F_i|``);
- ``ours``: the shipped config as it is (the default low-rank ``sigma_F``, diverse selection);
- ``ours_biased``: ours with uncertainty-driven MD (``md.bias: udd``; depth 0.9 eV, width such
  that the bias saturates at 3x the initial model's validation ``sigma_E``);
- ``committee5``: 5 models trained on the same data (seeds ``s + 1000 m``), each fine-tuned
  every round; MD, scoring and flags with the committee's force std.

Per seed ``s``: one seed set (oracle MD at 300 K from 3BPA's first DFT geometry, 16 training +
4 validation frames, :func:`seed_data`) and one initial model trained on it, shared by every
single-model strategy (the committee trains its own 5, member 0 being that model); then
``rounds`` rounds of: MD with the current model at the round's temperature (300 -> 1200 K),
``top_k`` of the logged frames labelled by the oracle, a warm-started retraining of fixed
epochs, evaluation on the oracle's reference sets (``benchmarks.active_learning.reference_sets``:
MD at 300, 600 and 1200 K and the torsion scan; every other frame of the MD sets during the
rounds). Each finished round is one JSONL record (resumable: a run continues from its
``state.json``; rounds already recorded are skipped). After the last round the final model runs
:func:`stability` NVT trajectories at 600 and 1200 K (one JSONL record per trajectory).

    python -m benchmarks.active_learning --threads 1                   # all strategies, seeds 0-2
    python -m benchmarks.active_learning --strategies committee5 --seeds 0
    python -m benchmarks.active_learning --quick --out /tmp/al         # 2 tiny rounds, real xTB
    python -m benchmarks.active_learning --report-only                 # rewrite the page
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.pages import environment
from benchmarks.common.records import append_jsonl, read_jsonl, take_lock

log = logging.getLogger("active_learning")
REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "al_xtb_3bpa.yaml"
STRATEGIES = ("random", "force_magnitude", "ours", "ours_biased", "committee5")
REFERENCE_SETS = ("md_300K", "md_600K", "md_1200K", "torsion_scan")
DEFAULT_WORK = (
    Path(os.environ.get("MLIP_UNC_CACHE", "~/.cache/mlip_unc")).expanduser() / "al_runs" / "3bpa"
)
RECORDS = "active_learning.jsonl.gz"  # one gzip member per round
STABILITY_RECORDS = "active_learning_stability.jsonl"
REFIT_RECORDS = "active_learning_refit.jsonl"
UDD_DEPTH = 0.9  # eV: 9 x 0.1 eV, the exploration benchmark's kappa (not tuned here)

FULL: dict[str, Any] = {
    "seed_frames": (16, 4),
    "test_stride": 2,
    "overrides": [],
    "stability": {"temperatures": (600.0, 1200.0), "runs": 3, "steps": 4000, "timestep": 0.5},
}
QUICK: dict[str, Any] = {
    "seed_frames": (4, 2),
    "test_stride": 40,
    "overrides": [
        "rounds=2",
        "retrain_epochs=2",
        "selection.top_k=2",
        "audit=2",
        "md.steps=20",
        "md.interval=5",
        "training.train.epochs=3",
        "training.model.backbone_kwargs.hidden=8",
        "training.model.latent_dim=4",
    ],
    "stability": {"temperatures": (1200.0,), "runs": 1, "steps": 20, "timestep": 0.5},
}


def strategy_overrides(strategy: str, bias_width: float | None = None) -> list[str]:
    """``--set`` overrides of the shipped config that make ``strategy`` (module docstring)."""
    if strategy == "ours":
        return []
    if strategy == "random":
        return ["selection.metric=random", "selection.diverse=false"]
    if strategy == "force_magnitude":
        return ["selection.metric=max_force"]
    if strategy == "committee5":
        return ["committee=5"]
    if strategy == "ours_biased":
        if bias_width is None:
            raise ValueError("ours_biased needs the bias width (from the initial model)")
        return ["md.bias=udd", f"md.bias_strength={UDD_DEPTH}", f"md.bias_width={bias_width:.6g}"]
    raise ValueError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")


def run_overrides(
    strategy: str, seed: int, folder: Path, initial_model: Path | None, settings: dict[str, Any]
) -> list[str]:
    """Every override of one run: the size (``settings``), the seed, the seed set, the test
    sets, the output folder and, for single-model strategies, the shared initial model."""
    items = [*settings["overrides"], f"seed={seed}", f"out={folder / strategy}"]
    items += [f"train_data={folder / 'seed_train.xyz'}", f"valid_data={folder / 'seed_valid.xyz'}"]
    items += [f"test_sets.{name}={folder / f'test_{name}.xyz'}" for name in REFERENCE_SETS]
    if strategy != "committee5" and initial_model is not None:
        items.append(f"model={initial_model}")
    return items


def seed_data(folder: Path, seed: int, settings: dict[str, Any], references: Path) -> None:
    """The seed set of ``seed`` (oracle MD at 300 K, the shipped config's bootstrap with seed
    ``100 + seed``) and the evaluation subsets of the reference sets, written once to ``folder``."""
    from mlip_unc.active.data import build_structure, oracle_md, write_frames
    from mlip_unc.active.oracles import make_oracle
    from mlip_unc.config import load_active_config
    from mlip_unc.data.readers import read_structures

    if not (folder / "seed_valid.xyz").is_file():
        config = load_active_config(CONFIG)
        assert config.bootstrap is not None
        oracle = make_oracle(config.oracle)
        start = build_structure(config.structures)[0]
        n_train, n_valid = settings["seed_frames"]
        boot = config.bootstrap.updated(seed=100 + seed)
        write_frames(folder / "seed_train.xyz", oracle_md(start, oracle, boot, n_frames=n_train))
        valid = oracle_md(start, oracle, boot, n_frames=n_valid, seed=boot.seed + 1)
        write_frames(folder / "seed_valid.xyz", valid)
    for name in REFERENCE_SETS:
        path = folder / f"test_{name}.xyz"
        if not path.is_file():
            frames = read_structures(references / f"{name}.xyz")
            stride = 1 if name == "torsion_scan" else settings["test_stride"]
            write_frames(path, frames[::stride])


def initial_model(folder: Path, seed: int, settings: dict[str, Any]) -> tuple[Path, float]:
    """The initial model of ``seed`` (trained once, shared) and its training CPU seconds."""
    import json

    from mlip_unc.active.training import train_model
    from mlip_unc.config import load_active_config
    from mlip_unc.data.readers import read_structures

    done = folder / "initial_cpu.json"
    path = folder / "initial" / "model.pt"
    if done.is_file() and path.is_file():
        return path, float(json.loads(done.read_text())["cpu_s"])
    config = load_active_config(CONFIG, settings["overrides"])
    cpu = time.process_time()
    path = train_model(
        read_structures(folder / "seed_train.xyz"),
        read_structures(folder / "seed_valid.xyz"),
        config.training,
        folder / "initial",
        seed=seed,
        refit_offsets=config.refit_offsets,
    )
    cpu = time.process_time() - cpu
    done.write_text(json.dumps({"cpu_s": cpu}))
    return path, cpu


def bias_width(model: Path, n_atoms: int) -> float:
    """``B`` of the udd bias: ``N B^2 = 9 s2_val``, ``s2_val`` the initial model's validation
    epistemic energy variance (``(N * energy_std_per_atom level)^2``), ``N = n_atoms``."""
    from mlip_unc.calculator import UncertaintyCalculator

    level = UncertaintyCalculator(model, uncertainty="energy").uncertainty_levels
    s2_val = (n_atoms * float(level["energy_std_per_atom"])) ** 2
    return float(np.sqrt(9.0 * s2_val / n_atoms))


_DROPPED = ("_energy_mae_per_atom", "_mean_energy_std_per_atom")  # derivable or unused


def record(strategy: str, seed: int, row: dict[str, Any], initial_cpu: float) -> dict[str, Any]:
    """The JSONL record of one round: the loop's row without per-frame lists, plus the run's
    keys and the CPU of the shared initial model (charged to every single-model strategy)."""
    out = {
        k: float(f"{v:.6g}") if isinstance(v, float) else v
        for k, v in row.items()
        if not isinstance(v, list) and k != "model" and not k.endswith(_DROPPED)
    }
    out.update(strategy=strategy, seed=seed)
    if strategy != "committee5" and row["round"] == 0:
        out["cpu_initial_train_s"] = initial_cpu
    for key in ("audit_max_force_error", "audit_max_force_std"):
        if key in row:
            out[key] = [round(float(v), 5) for v in row[key]]
    return out


def run_one(
    strategy: str, seed: int, folder: Path, settings: dict[str, Any], out: Path, tag: str
) -> list[dict[str, Any]]:
    """One (strategy, seed) run, resumed where it stopped; appends each new round's record."""
    from mlip_unc.active.loop import run_active_learning
    from mlip_unc.config import load_active_config

    model, cpu = (None, 0.0) if strategy == "committee5" else initial_model(folder, seed, settings)
    width = None
    if strategy == "ours_biased" and model is not None:
        from ase.io import read

        width = bias_width(model, len(read(folder / "seed_train.xyz", 0)))
    items = run_overrides(strategy, seed, folder, model, settings)
    items += strategy_overrides(strategy, width)
    config = load_active_config(CONFIG, items)
    path = out / RECORDS
    seen = {
        r["round"]
        for r in read_jsonl(path)
        if (r["strategy"], r["seed"], r.get("tag")) == (strategy, seed, tag)
    }

    def on_round(row: dict[str, Any]) -> None:
        if row["round"] not in seen:
            extra = {"overrides": items} if row["round"] == 0 else {}
            append_jsonl(path, {**record(strategy, seed, row, cpu), "tag": tag, **extra})

    Path(config.out).mkdir(parents=True, exist_ok=True)
    take_lock(Path(config.out) / ".lock", "active-learning run")  # one invocation per run
    resume = (Path(config.out) / "state.json").is_file()
    return run_active_learning(config, resume=resume, on_round=on_round)


def stability(
    model: Path, temperature: float, run: int, settings: dict[str, Any], reference: Any
) -> dict[str, Any]:
    """One NVT (Langevin, 0.02/fs) trajectory of the model from 3BPA's start geometry; the time
    (ps) of the first unphysical frame (checked every 10 steps): a bond of ``reference`` (the
    oracle-labelled start) longer than 1.5x or shorter than 0.7x its length there, or two atoms
    closer than 0.7 A; ``survived_ps`` equals the run's length when none was seen."""
    from ase import units
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import Stationary, thermalize_momenta

    from benchmarks.active_learning.reference_sets import bonds
    from mlip_unc.calculator import UncertaintyCalculator

    s = settings["stability"]
    atoms = reference.copy()
    pairs = np.asarray(bonds(reference))  # (n_bonds, 2)
    d0 = reference.get_distances(pairs[:, 0], pairs[:, 1])
    atoms.calc = UncertaintyCalculator(model, uncertainty="none")
    rng = np.random.default_rng(10_000 + run)
    thermalize_momenta(atoms, temperature_K=temperature, rng=rng)
    Stationary(atoms)
    dyn = Langevin(
        atoms,
        s["timestep"] * units.fs,
        temperature_K=temperature,
        friction=0.02 / units.fs,
        rng=rng,
    )
    failed_at: float | None = None
    reason = ""
    cpu = time.process_time()
    for step in range(0, s["steps"], 10):
        try:
            dyn.run(10)
        except Exception as err:  # the calculator refused a frame (NaN, coincident atoms)
            failed_at, reason = (step + 10) * s["timestep"] / 1000, type(err).__name__
            break
        ratio = atoms.get_distances(pairs[:, 0], pairs[:, 1]) / d0
        dist = atoms.get_all_distances()[np.triu_indices(len(atoms), 1)]
        if ratio.max() > 1.5 or ratio.min() < 0.7 or dist.min() < 0.7:
            failed_at = (step + 10) * s["timestep"] / 1000
            reason = (
                f"bond ratio {ratio.min():.2f}-{ratio.max():.2f}, min distance {dist.min():.2f}"
            )
            break
    length = s["steps"] * s["timestep"] / 1000
    return {
        "temperature": temperature,
        "run": run,
        "length_ps": length,
        "survived_ps": length if failed_at is None else failed_at,
        "failed": failed_at is not None,
        "reason": reason,
        "cpu_s": time.process_time() - cpu,
    }


def final_model(strategy: str, folder: Path) -> Path | None:
    """The last model of a finished run (member 0 for the committee: one model's cost); None
    while the run is not finished."""
    import json

    state = folder / strategy / "state.json"
    if not state.is_file():
        return None
    data = json.loads(state.read_text())
    rounds = data["rounds"]
    finished = len(rounds) >= data["config"].get("rounds", 0) or any(
        r.get("model") is None for r in rounds
    )
    models = [r["model"] for r in rounds if r.get("model")]
    return Path(models[-1]) if models and finished else None


def run_stability(
    strategy: str, seed: int, folder: Path, settings: dict[str, Any], out: Path, tag: str
) -> None:
    """The final model's stability trajectories not yet recorded (one record each)."""
    from mlip_unc.data.readers import read_structures

    model = final_model(strategy, folder)
    if model is None:
        return
    path = out / STABILITY_RECORDS
    done = {
        (r["temperature"], r["run"])
        for r in read_jsonl(path)
        if (r["strategy"], r["seed"], r.get("tag")) == (strategy, seed, tag)
    }
    reference = read_structures(folder / "seed_train.xyz")[0]
    for temperature in settings["stability"]["temperatures"]:
        for run in range(settings["stability"]["runs"]):
            if (temperature, run) in done:
                continue
            row = stability(model, temperature, run, settings, reference)
            append_jsonl(path, {**row, "strategy": strategy, "seed": seed, "tag": tag})


def refit_final(
    strategy: str, seed: int, folder: Path, settings: dict[str, Any], out: Path, tag: str
) -> None:
    """The data without the training protocol: a model trained from scratch, as the initial
    one (the shipped config's epochs and rate), on the final training and validation frames of
    a finished run, evaluated on the reference sets; one record in ``REFIT_RECORDS``."""
    from mlip_unc.active.evaluation import evaluate_structures
    from mlip_unc.active.training import train_model
    from mlip_unc.calculator import UncertaintyCalculator
    from mlip_unc.config import load_active_config
    from mlip_unc.data.readers import read_structures

    model = final_model(strategy, folder)
    path = out / REFIT_RECORDS
    done = {(r["strategy"], r["seed"], r.get("tag")) for r in read_jsonl(path)}
    if model is None or (strategy, seed, tag) in done:
        return
    config = load_active_config(CONFIG, settings["overrides"])
    train = read_structures(model.parent / "train.xyz")
    valid = read_structures(model.parent / "valid.xyz")
    cpu = time.process_time()
    scratch = train_model(
        train,
        valid,
        config.training,
        folder / f"refit_{strategy}",
        seed=seed,
        refit_offsets=config.refit_offsets,
    )
    row: dict[str, Any] = {"strategy": strategy, "seed": seed, "tag": tag, "n_train": len(train)}
    row["cpu_train_s"] = time.process_time() - cpu
    calc = UncertaintyCalculator(scratch)
    for name in REFERENCE_SETS:
        metrics = evaluate_structures(calc, read_structures(folder / f"test_{name}.xyz"))
        row.update(
            {f"{name}_force_mae": metrics["force_mae"], f"{name}_energy_mae": metrics["energy_mae"]}
        )
    append_jsonl(path, row)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2 tiny rounds (numbers not meaningful)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=None, help=f"run folders (default {DEFAULT_WORK})")
    p.add_argument("--references", type=Path, default=None, help="oracle reference sets")
    p.add_argument("--no-stability", action="store_true", help="skip the stability runs")
    p.add_argument(
        "--refit-only",
        action="store_true",
        help="only train from scratch on the final data of finished runs (refit records)",
    )
    p.add_argument("--report-only", action="store_true", help="only rewrite the page")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import torch

    from benchmarks.active_learning.reference_sets import DEFAULT_OUT
    from benchmarks.active_learning.report import write_report

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    settings = QUICK if args.quick else FULL
    tag = "quick" if args.quick else "full"
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        torch.set_num_threads(args.threads)
        work = args.work or (DEFAULT_WORK.parent / "3bpa_quick" if args.quick else DEFAULT_WORK)
        references = args.references or DEFAULT_OUT
        command = "python -m benchmarks.active_learning " + shlex.join(sys.argv[1:])
        append_jsonl(
            args.out / "active_learning_runs.jsonl",
            {
                "command": command,
                "tag": tag,
                "started": time.strftime("%Y-%m-%d %H:%M"),
                **environment(),
            },
        )
        for seed in [int(s) for s in args.seeds.split(",")]:
            folder = work / f"seed_{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            seed_data(folder, seed, settings, references)
            for strategy in args.strategies.split(","):
                if args.refit_only:
                    refit_final(strategy, seed, folder, settings, args.out, tag)
                    continue
                log.info("seed %d, %s", seed, strategy)
                run_one(strategy, seed, folder, settings, args.out, tag)
                if not args.no_stability:
                    run_stability(strategy, seed, folder, settings, args.out, tag)
    write_report(args.out, tag)


if __name__ == "__main__":
    main()
