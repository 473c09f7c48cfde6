"""``mlip-unc demo``: uncertainty-driven active learning on EMT copper, offline, in minutes.

1. Reference data: Langevin MD of a 32-atom fcc Cu cell at 300 K with ASE's EMT (the stand-in
   for DFT): training and validation frames from two independent trajectories, and a
   held-out *hot* test set from EMT MD at 1200 K (never used for training).
2. Train a small Bayesian potential (geometric GIN + Bayesian energy head) on the 300 K data;
   the validation set gives the training-level uncertainty (stored in the checkpoint).
3. Run MD with the trained potential at 1200 K, far outside the training data, under an
   :class:`~mlip_unc.active.monitor.UncertaintyMonitor`: the uncertainty rises, frames over the
   thresholds are flagged, the run stops after ``max_flags`` of them.
4. Label the most uncertain flagged frames (diverse selection) with EMT, add them to the
   data, continue training the model on the enlarged set (fine-tuning).
5. Control: continue training the same model for as long on the 300 K data only, so that the
   effect of the new data is told apart from the effect of training longer.
6. Compare force error and uncertainty on the hot test set: before, after, control.

``--out DIR`` receives ``report.md``, ``demo.png``, ``numbers.json``, the data
(``data/*.xyz``), the training runs, the MD log (``md_hot/``) and the final checkpoint
``model.pt`` (``UncertaintyCalculator(DIR / "model.pt")`` loads it).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ase import Atoms

from mlip_unc import keys
from mlip_unc.active.data import build_structure, oracle_md, split_labelled, write_frames
from mlip_unc.active.evaluation import evaluate_structures
from mlip_unc.active.loop import label_selected, select_flagged
from mlip_unc.active.monitor import MDResult, run_md
from mlip_unc.active.oracles import make_oracle
from mlip_unc.active.training import train_model
from mlip_unc.config import GenerateSettings, MDSettings, SelectionSettings
from mlip_unc.train.text_files import write_json

__all__ = ["DemoSettings", "DemoResult", "run_demo", "default_out_dir", "summary"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoSettings:
    """Sizes of the demo; :meth:`quick` is the seconds-long variant used by the tests."""

    repeat: int = 2  # (repeat x repeat x repeat) conventional fcc cells: 32 atoms
    train_frames: int = 60
    valid_frames: int = 15
    test_frames: int = 20
    train_temperature: float = 300.0
    hot_temperature: float = 1200.0
    md_steps: int = 400
    md_timestep: float = 1.0
    md_interval: int = 5
    max_flags: int = 20
    top_k: int = 15
    max_label_force: float = 10.0
    thresholds: dict[str, Any] = field(
        default_factory=lambda: {
            keys.CALC_MAX_FORCE_STD: 1.3,
            keys.CALC_ENERGY_STD_PER_ATOM: 2.0,
            "relative": True,
        }
    )
    epochs: int = 60
    retrain_epochs: int = 30
    max_minutes: float = 1.2  # per training run: a cap for very busy machines
    control: bool = True
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "backbone": "gin",
            "backbone_kwargs": {"hidden": 32, "num_layers": 2, "num_basis": 8},
            "latent_dim": 16,
        }
    )
    r_max: float = 4.5
    seed: int = 0

    @classmethod
    def quick(cls) -> DemoSettings:
        return cls(
            train_frames=12,
            valid_frames=4,
            test_frames=4,
            md_steps=40,
            md_interval=5,
            max_flags=6,
            top_k=4,
            epochs=3,
            retrain_epochs=2,
            max_minutes=0.3,
            control=False,
            model={
                "backbone": "gin",
                "latent_dim": 4,
                "backbone_kwargs": {"hidden": 8, "num_layers": 1, "num_basis": 4},
            },
        )

    def training(self) -> dict[str, Any]:
        """The training config (a ``mlip-unc train`` mapping without files)."""
        return {
            "seed": self.seed,
            "dtype": "float64",
            "data": {"r_max": self.r_max},
            # A small energy weight and unstandardised noise: with equal weights the per-atom energy
            # NLL (noise of a few meV/atom) dominates the gradient at initialisation and the forces
            # are not learned in a few epochs. The energy offsets are refit after training.
            "model": {**self.model, "standardise": False},
            "loss": {"energy_weight": 1e-3, "forces_weight": 1.0},
            "train": {
                "epochs": self.epochs,
                "batch_size": 8,
                "lr": 5e-3,
                "lr_schedule": "constant",
                "max_minutes": self.max_minutes,
                "progress": False,
            },
        }


@dataclass
class DemoResult:
    out: Path
    model: Path
    report: Path
    numbers: dict[str, Any]
    seconds: float


def default_out_dir() -> Path:
    """``./mlip-unc-demo-YYYYmmdd-HHMMSS``."""
    return Path(f"mlip-unc-demo-{time.strftime('%Y%m%d-%H%M%S')}")


@dataclass
class _Data:
    cell: Atoms
    train: list[Atoms]
    valid: list[Atoms]
    hot_test: list[Atoms]


def _make_data(s: DemoSettings, emt: Any, out: Path) -> _Data:
    cell = build_structure(
        {
            "bulk": "Cu",
            "crystalstructure": "fcc",
            "a": 3.61,
            "cubic": True,
            "repeat": [s.repeat] * 3,
        }
    )[0]
    cold = GenerateSettings(temperature=s.train_temperature, frames=s.train_frames, seed=s.seed)
    hot = GenerateSettings(temperature=s.hot_temperature, frames=s.test_frames, seed=s.seed + 2)
    data = _Data(
        cell=cell,
        train=oracle_md(cell, emt, cold),
        valid=oracle_md(cell, emt, cold, n_frames=s.valid_frames, seed=s.seed + 1),
        hot_test=oracle_md(cell, emt, hot),
    )
    for name, frames in (
        ("train_300K", data.train),
        ("valid_300K", data.valid),
        ("test_hot", data.hot_test),
    ):
        write_frames(out / "data" / f"{name}.xyz", frames)
    return data


def _evaluate(model: Path, s: DemoSettings, data: _Data) -> dict[str, dict[str, float]]:
    from mlip_unc.calculator import UncertaintyCalculator

    calc = UncertaintyCalculator(model, thresholds=s.thresholds, seed=s.seed)
    return {
        "valid": evaluate_structures(calc, data.valid),
        "hot": evaluate_structures(calc, data.hot_test),
    }


def _hot_md(model: Path, s: DemoSettings, data: _Data, out: Path) -> tuple[MDResult, Any]:
    from mlip_unc.calculator import UncertaintyCalculator

    calc = UncertaintyCalculator(model, thresholds=s.thresholds, seed=s.seed)
    md = MDSettings(
        ensemble="langevin",
        temperature=s.hot_temperature,
        steps=s.md_steps,
        timestep=s.md_timestep,
        interval=s.md_interval,
        max_flags=s.max_flags,
        seed=s.seed,
    )
    level = (calc.uncertainty_levels or {}).get(keys.CALC_MAX_FORCE_STD)
    result = run_md(
        data.cell,
        calc,
        md,
        out / "md_hot",
        reference_level=level,
        title=f"MD at {s.hot_temperature:.0f} K with the {s.train_temperature:.0f} K model",
    )
    return result, calc


def run_demo(out: str | Path | None = None, *, settings: DemoSettings | None = None) -> DemoResult:
    """Run the demo into ``out`` (default :func:`default_out_dir`); see the module docstring.

    Progress goes to ``logging`` (INFO); :func:`summary` formats the result for the user.
    """
    from mlip_unc.active.report import write_demo_report

    s = settings or DemoSettings()
    out = Path(out) if out is not None else default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str, t0: float) -> float:
        timings[name] = time.monotonic() - t0
        return time.monotonic()

    t0 = time.monotonic()
    emt = make_oracle("emt")
    data = _make_data(s, emt, out)
    t0 = lap("data", t0)
    log.info(
        "[1/5] EMT data: %d training + %d validation frames at %.0f K, %d held-out test frames at %.0f K "
        "(%d Cu atoms each)",
        len(data.train),
        len(data.valid),
        s.train_temperature,
        len(data.hot_test),
        s.hot_temperature,
        len(data.cell),
    )

    model0 = train_model(
        data.train, data.valid, s.training(), out / "initial", seed=s.seed, refit_offsets=True
    )
    before = _evaluate(model0, s, data)
    t0 = lap("train", t0)
    log.info(
        "[2/5] trained on %.0f K data: force RMSE %.3f eV/Å (validation), %.3f eV/Å (hot test)",
        s.train_temperature,
        before["valid"]["force_rmse"],
        before["hot"]["force_rmse"],
    )

    md, calc0 = _hot_md(model0, s, data, out)
    t0 = lap("md", t0)
    n_md = len(md.log["step"])
    level = (calc0.uncertainty_levels or {}).get(keys.CALC_MAX_FORCE_STD, float("nan"))
    stop = (
        f", stopped at step {md.steps_done} after {s.max_flags} flags" if md.stopped_early else ""
    )
    log.info(
        "[3/5] MD at %.0f K with the model: %d of %d monitored frames flagged%s; max force std up to "
        "%.3f eV/Å (training level %.3f)",
        s.hot_temperature,
        len(md.flagged),
        n_md,
        stop,
        md.log[keys.CALC_MAX_FORCE_STD].max(),
        level,
    )

    selection = SelectionSettings(top_k=s.top_k, diverse=True, max_label_force=s.max_label_force)
    labelled, n_dropped = label_selected(select_flagged(md.flagged, selection), emt, selection)
    if labelled:
        write_frames(out / "data" / "labelled_hot.xyz", labelled)
    new_train, new_valid = split_labelled(labelled, 0.2, np.random.default_rng(s.seed))
    model1 = train_model(
        data.train + new_train,
        data.valid + new_valid,
        s.training(),
        out / "retrained",
        init_from=model0,
        epochs=s.retrain_epochs,
        refit_offsets=True,
    )
    after = _evaluate(model1, s, data)
    t0 = lap("retrain", t0)
    dropped = (
        f" ({n_dropped} dropped: reference force > {s.max_label_force} eV/Å)" if n_dropped else ""
    )
    log.info(
        "[4/5] labelled %d flagged frames with EMT%s; trained %d more epochs on %d frames",
        len(labelled),
        dropped,
        s.retrain_epochs,
        len(data.train) + len(new_train),
    )

    control = None
    if s.control:
        model_c = train_model(
            data.train,
            data.valid,
            s.training(),
            out / "control",
            init_from=model0,
            epochs=s.retrain_epochs,
            refit_offsets=True,
        )
        control = _evaluate(model_c, s, data)
        t0 = lap("control", t0)
        log.info(
            "[5/5] control: %d more epochs on the %.0f K data only",
            s.retrain_epochs,
            s.train_temperature,
        )
    else:
        log.info("[5/5] control run skipped")

    shutil.copyfile(model1, out / "model.pt")
    numbers = {
        "n_atoms": len(data.cell),
        "n_train": len(data.train),
        "n_valid": len(data.valid),
        "n_test_hot": len(data.hot_test),
        "n_md_frames": n_md,
        "n_flagged": len(md.flagged),
        "n_labelled": len(labelled),
        "n_dropped": n_dropped,
        "n_train_after": len(data.train) + len(new_train),
        "md_steps_done": md.steps_done,
        "md_stopped_early": md.stopped_early,
        "md_max_force_std_max": float(md.log[keys.CALC_MAX_FORCE_STD].max()),
        "training_level_max_force_std": level,
        "training_level_energy_std_per_atom": (calc0.uncertainty_levels or {}).get(
            keys.CALC_ENERGY_STD_PER_ATOM
        ),
        "thresholds": {
            keys.CALC_MAX_FORCE_STD: calc0.thresholds.max_force_std,
            keys.CALC_ENERGY_STD_PER_ATOM: calc0.thresholds.energy_std_per_atom,
        },
        "temperatures": {"train": s.train_temperature, "hot": s.hot_temperature},
        "before": before,
        "after": after,
        "control": control,
        "timings_s": timings,
        "checks": _checks(before, after, control),
        "uncertainty_mode": calc0.uncertainty,
    }
    numbers["seconds"] = time.monotonic() - start
    report = write_demo_report(numbers, out, md_plot=md.plot)
    write_json(out / "numbers.json", numbers)
    return DemoResult(
        out=out,
        model=out / "model.pt",
        report=report,
        numbers=numbers,
        seconds=time.monotonic() - start,
    )


def _checks(before: dict, after: dict, control: dict | None) -> dict[str, bool]:
    """The claims of the demo, each measured (true or false, never assumed)."""
    checks = {
        "hot_uncertainty_above_training_level_before": before["hot"]["mean_max_force_std"]
        > before["valid"]["mean_max_force_std"],
        "hot_force_error_lower_after": after["hot"]["force_rmse"] < before["hot"]["force_rmse"],
        "hot_uncertainty_lower_after": after["hot"]["mean_max_force_std"]
        < before["hot"]["mean_max_force_std"],
    }
    if control is not None:
        checks["hot_force_error_lower_than_control"] = (
            after["hot"]["force_rmse"] < control["hot"]["force_rmse"]
        )
        checks["hot_uncertainty_lower_than_control"] = (
            after["hot"]["mean_max_force_std"] < control["hot"]["mean_max_force_std"]
        )
    return checks


def _proportionality_note(numbers: dict[str, Any]) -> list[str]:
    """A warning line when the force std is the same fraction of the force RMS on both sets."""
    cold = numbers["before"]["valid"]["relative_force_std"]
    hot = numbers["before"]["hot"]["relative_force_std"]
    if abs(hot - cold) > 0.1 * cold:
        return []
    return [
        f"Note: the mean max force std is {100 * cold:.1f} % of the force RMS at "
        f"{numbers['temperatures']['train']:.0f} K and {100 * hot:.1f} % hot: it follows the force "
        "magnitude here (see report.md)."
    ]


def summary(result: DemoResult) -> str:
    """The key numbers as printed by ``mlip-unc demo``."""
    n = result.numbers
    stages = [("before", "before"), ("after", "after AL")] + (
        [("control", "control")] if n.get("control") else []
    )
    hot = {label: n[key]["hot"] for key, label in stages}
    valid = {label: n[key]["valid"] for key, label in stages}

    def row(name: str, values: list[float], digits: str) -> str:
        return f"  {name:<30}" + "".join(f"{v:>12{digits}}" for v in values)

    temps = n["temperatures"]
    lines = [
        "",
        f"Held-out hot test set: {n['n_test_hot']} EMT frames at {temps['hot']:.0f} K (never trained on).",
        "  " + " " * 30 + "".join(f"{label:>12}" for label in hot),
        row("force RMSE (eV/Å)", [m["force_rmse"] for m in hot.values()], ".3f"),
        row("mean max force std (eV/Å)", [m["mean_max_force_std"] for m in hot.values()], ".3f"),
        row(
            f"  same on {temps['train']:.0f} K validation",
            [m["mean_max_force_std"] for m in valid.values()],
            ".3f",
        ),
        row(
            "energy std (meV/atom)",
            [1e3 * m["mean_energy_std_per_atom"] for m in hot.values()],
            ".2f",
        ),
        row("energy MAE (meV/atom)", [1e3 * m["energy_mae_per_atom"] for m in hot.values()], ".2f"),
        row(
            "mean max force std / force RMS",
            [m["relative_force_std"] for m in hot.values()],
            ".4f",
        ),
        row(
            f"  same on {temps['train']:.0f} K validation",
            [m["relative_force_std"] for m in valid.values()],
            ".4f",
        ),
        f"Hot MD with the first model: {n['n_flagged']} of {n['n_md_frames']} monitored frames flagged "
        f"(training level of max force std {n['training_level_max_force_std']:.3f} eV/Å, "
        f"threshold {n['thresholds']['max_force_std']:.3f}); {n['n_labelled']} labelled with EMT.",
        "'after AL' = trained on with the labelled hot frames; 'control' = trained as long on 300 K data only.",
        *_proportionality_note(n),
        "Checks: "
        + "; ".join(
            f"{k.replace('_', ' ')}: {'yes' if v else 'NO'}" for k, v in n["checks"].items()
        ),
        f"Report: {result.report}  (plots: demo.png, md_hot/md.png; data: data/; numbers: numbers.json)",
        f"Final model: {result.model}  ->  UncertaintyCalculator('{result.model}')",
        f"Done in {result.seconds:.0f} s.",
    ]
    return "\n".join(lines)
