"""``mlip-unc train`` and ``mlip-unc eval``: interatomic potentials; thin, parse -> config -> library.

    mlip-unc train --config configs/ethanol_gin.yaml --set train.epochs=3 --set seed=1
    mlip-unc eval --model runs/ethanol_gin/model.pt --data test_MD.xyz --uncertainty exact \\
        --per-frame frames.csv --predictions predictions.xyz --out metrics.json

``--data`` reads extxyz, CIF, POSCAR and JSON lists in mlearn's layout (``.json``, whose
``virial_stress`` becomes the ``stress`` label in ASE's convention), or an on-disk set written by

    mlip-unc convert --data train.extxyz --out train.mlipdb --r-max 5.0

(graphs built once and read lazily; accepted by ``train`` as ``data.train`` / ``valid`` / ``test``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import cast

import typer

from mlip_unc.cli._common import (
    DEVICE_HELP,
    fail,
    interrupted,
    quiet,
    require_checkpoints,
    require_files,
    require_new_outputs,
    set_threads,
    threads_option,
    user_errors,
)
from mlip_unc.config.enums import UncertaintyMode

ACCEPT_PREDICTED_HELP = (
    "Take labels that a model predicted (the energy, forces and stress in md.traj) as "
    "references; without it they are refused."
)


_ENERGY_KEY_HELP = "Energy label: an info key or the calculator's energy (extxyz)."
_FORCES_KEY_HELP = "Forces label: a per-atom array or the calculator's forces (extxyz)."


def register(app: typer.Typer) -> None:
    app.command("train", help="Train a Bayesian interatomic potential from a YAML config.")(train)
    app.command("eval", help="Evaluate a trained potential on a structure file.")(evaluate)
    app.command("convert", help="Convert structure files into an on-disk set (graphs built once).")(
        convert
    )


def train(
    config: Path = typer.Option(..., "--config", "-c", help="YAML config (see configs/)."),
    overrides: list[str] | None = typer.Option(
        None, "--set", "-s", help="Override a config key, e.g. --set train.epochs=3 (repeatable)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Output folder (overrides 'out')."),
    resume: bool = typer.Option(False, "--resume", metavar="", help="Continue from OUT/last.pt."),
    overwrite: bool = typer.Option(
        False, "--overwrite", metavar="", help="Replace a run already in OUT."
    ),
    threads: int = threads_option(),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
) -> None:
    """Train; writes OUT/model.pt (best on validation, once calibrated), OUT/last.pt and
    OUT/history.json. Ctrl-C leaves OUT/last.pt and no model.pt, and says how to resume."""
    from mlip_unc.config import ConfigError, load_potential_config

    items = list(overrides or [])
    if out is not None:
        items.append(f"out={out}")
    if resume:
        items.append("train.resume=true")
    if overwrite:
        items.append("train.overwrite=true")
    if device is not None:
        items.append(f"train.device={device}")
    if quiet():
        items.append("train.progress=false")
    try:  # the config is checked before torch loads: its mistakes are reported at once
        cfg = load_potential_config(config, items)
    except (ConfigError, ValueError) as err:
        fail(err)
    if resume:
        _require_run(Path(cfg.out))
    from mlip_unc.train import distributed
    from mlip_unc.train.potential import run_training

    set_threads(threads)
    try:
        with (
            distributed.session()
        ):  # under torchrun: data-parallel over its processes; else a no-op
            results, main = run_training(cfg), distributed.is_main()
    except user_errors(FileExistsError) as err:
        fail(err)
    except KeyboardInterrupt as err:  # model.pt is written only once complete
        interrupted(err, finalise=True)
    if not main:  # rank 0 reports
        return
    for result in results:
        typer.echo(
            f"model: {result.model_path} (epoch {result.best_epoch}, {result.stop_reason}, "
            f"{result.train_minutes:.2f} min)"
        )


def _require_run(out: Path) -> None:
    """``--resume`` needs a run to continue: OUT/last.pt (or a committee member's)."""
    if not ((out / "last.pt").is_file() or any(out.glob("member_*/last.pt"))):
        fail(
            f"--resume: {out} holds no run to continue (no last.pt there); "
            "drop --resume to start a new run"
        )


_TABLE = (
    ("energy_mae_meV_atom", "energy MAE (meV/atom)"),
    ("energy_rmse_meV_atom", "energy RMSE (meV/atom)"),
    ("energy_mae_meV", "energy MAE (meV)"),
    ("energy_rmse_meV", "energy RMSE (meV)"),
    ("forces_mae_meV_A", "force MAE (meV/A)"),
    ("forces_rmse_meV_A", "force RMSE (meV/A)"),
    ("stress_mae_GPa", "stress MAE (GPa, periodic frames)"),
    ("stress_rmse_GPa", "stress RMSE (GPa, periodic frames)"),
    ("energy_nll", "energy NLL (eV)"),
    ("energy_spearman", "energy Spearman(std, |err|)"),
    ("energy_miscalibration_area", "energy miscalibration area"),
    ("energy_coverage_95", "energy 95% coverage"),
    ("forces_nll", "force NLL (eV/A, per component)"),
    ("forces_spearman", "force Spearman(std, |err|), per component"),
    ("forces_frame_spearman", "force Spearman, frame mean std vs mean |err|"),
    ("forces_miscalibration_area", "force miscalibration area"),
    ("forces_coverage_95", "force 95% coverage"),
    ("forces_std_vs_pred_spearman", "Spearman(force std, |F_pred|), per atom"),
    ("forces_std_vs_pred_frame_spearman", "Spearman(force std, |F_pred|), frame max"),
    ("forces_partial_spearman_given_force", "partial Spearman(std, |err| given |F_pred|)"),
    ("forces_std_over_rmse", "force std/RMSE (epistemic, per component)"),
)


def _no_value(key: str, metrics: dict) -> str:
    """What a row without a number says instead of ``nan``: why it has none."""
    from mlip_unc.uncertainty.calibration import MIN_RANK_PAIRS
    from mlip_unc.uncertainty.diagnostics import MIN_PARTIAL_PAIRS

    if "spearman" not in key:
        return "n/a"
    frame_rows = {  # rank correlations over frames; the others rank atoms or components
        "energy_spearman": MIN_RANK_PAIRS,
        "forces_frame_spearman": MIN_RANK_PAIRS,
        "forces_std_vs_pred_frame_spearman": MIN_RANK_PAIRS,
        "forces_partial_spearman_given_force": MIN_PARTIAL_PAIRS,
    }
    if metrics["n_frames"] < frame_rows.get(key, 0):
        return f"n/a (fewer than {frame_rows[key]} structures)"
    return "n/a (a constant, or nothing left to correlate)"


def _print_metrics(metrics: dict) -> None:
    typer.echo(f"{metrics['n_frames']} frames, {metrics['n_atoms']} atoms")
    for key, label in _TABLE:
        if key in metrics:
            value = metrics[key]
            shown = (
                _no_value(key, metrics) if value is None or math.isnan(value) else f"{value:.4g}"
            )
            typer.echo(f"  {label:<48} {shown}")


def evaluate(
    model: list[Path] = typer.Option(
        ..., "--model", "-m", help="Checkpoint (model.pt) or run folder; repeat for a committee."
    ),
    data: Path = typer.Option(
        ...,
        "--data",
        "-d",
        help="Structure file (extxyz, mlearn JSON, CIF, ...) or on-disk set (mlip-unc convert).",
    ),
    energy_key: str = typer.Option("energy", "--energy-key", help=_ENERGY_KEY_HELP),
    forces_key: str = typer.Option("forces", "--forces-key", help=_FORCES_KEY_HELP),
    stress_key: str = typer.Option(
        "stress",
        "--stress-key",
        help="Stress label; the convention follows the name (e.g. virial_stress_kbar).",
    ),
    index: str = typer.Option(":", "--index", help="ASE-style frame selection, e.g. 0:100."),
    uncertainty: UncertaintyMode | None = typer.Option(
        None,
        "--uncertainty",
        "-u",
        help="Uncertainty mode (default: the model's, as md, flag and the calculator: auto "
        "for a model with a full posterior, else exact).",
    ),
    n_samples: int = typer.Option(
        4, "--n-samples", min=2, help="Posterior draws of the sampled mode."
    ),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="Structures per model call."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampled mode's draws."),
    per_frame: Path | None = typer.Option(None, "--per-frame", help="Write a per-frame CSV."),
    predictions: Path | None = typer.Option(
        None,
        "--predictions",
        "--out-xyz",
        help="Write the structures with predicted energy, forces, stress and variances (extxyz, keys mlip_unc_*).",
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the metrics as JSON."),
    accept_predicted: bool = typer.Option(
        False, "--accept-predicted-labels", metavar="", help=ACCEPT_PREDICTED_HELP
    ),
    threads: int = threads_option(),
) -> None:
    """Energy (per atom and total), force and stress errors and calibration on DATA."""
    require_checkpoints(model, run_folders=True)  # before torch: mistakes reported at once
    require_files((data, "structure file"))
    require_new_outputs(  # existing outputs are replaced; the inputs never
        [(out, "--out"), (per_frame, "--per-frame"), (predictions, "--predictions")],
        [data, *model],
        overwrite=True,
    )
    import torch

    from mlip_unc.data import TypeMap
    from mlip_unc.data.datasets import select_frames
    from mlip_unc.evaluation.evaluate import (
        evaluate_potential,
        write_frame_csv,
        write_predictions_xyz,
    )
    from mlip_unc.models.committee import Committee
    from mlip_unc.models.full_posterior import default_uncertainty_mode
    from mlip_unc.models.loading import load_potential
    from mlip_unc.models.potential import BayesianPotential
    from mlip_unc.train.text_files import write_json

    set_threads(threads)
    try:
        potential = load_potential(model)
        first = (
            cast(BayesianPotential, potential.members[0])
            if isinstance(potential, Committee)
            else potential
        )
        label_keys = {"energy": energy_key, "forces": forces_key, "stress": stress_key}
        # a structure file, or an on-disk set whose graphs are read lazily (mlip-unc convert)
        frames = select_frames(
            data,
            r_max=first.r_max,
            index=index,
            label_keys=label_keys,
            accept_predicted=accept_predicted,
        )
        dataset = frames.dataset(TypeMap.from_list(first.type_map), dtype=first.dtype)
        # one default across commands: the model's mode, as in md, flag and the calculator
        mode = uncertainty.value if uncertainty else default_uncertainty_mode(potential)
        report = evaluate_potential(
            potential,
            dataset,
            uncertainty=mode,
            n_samples=n_samples,
            batch_size=batch_size,
            seed=seed,
            progress=not quiet() and sys.stderr.isatty(),
        )
    except user_errors() as err:
        fail(err)
    metrics = {
        **report.metrics,
        "uncertainty": mode,
        "data": str(data),
        "model": [str(m) for m in model],
        "threads": torch.get_num_threads(),
    }
    _print_metrics(report.metrics)
    pred = report.predictions
    missing_e, missing_f = int((~pred.has_energy).sum()), int((~pred.has_forces).sum())
    if missing_e or missing_f:  # never skip frames silently
        typer.echo(
            f"warning: of {pred.n_frames} frames in {data}, {missing_e} have no energy and {missing_f} "
            "no forces; their errors are not in the metrics (predictions are in --per-frame and "
            "--predictions)",
            err=True,
        )
    metrics.update(n_frames_without_energy=missing_e, n_frames_without_forces=missing_f)
    if out is not None:
        write_json(out, metrics)
        typer.echo(f"metrics: {out}")
    if per_frame is not None:
        write_frame_csv(report.frames, per_frame)
        typer.echo(f"per-frame table: {per_frame}")
    if predictions is not None:
        write_predictions_xyz(frames.structures(), pred, predictions)
        typer.echo(f"predictions: {predictions}")


def convert(
    data: list[Path] = typer.Option(
        ..., "--data", "-d", help="Structure file(s) (extxyz streamed; repeatable)."
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="The on-disk set to write (a folder, e.g. train.mlipdb)."
    ),
    r_max: float = typer.Option(
        ..., "--r-max", help="Cutoff of the neighbour lists, Angstrom (the model's r_max)."
    ),
    energy_key: str = typer.Option("energy", "--energy-key", help=_ENERGY_KEY_HELP),
    forces_key: str = typer.Option("forces", "--forces-key", help=_FORCES_KEY_HELP),
    stress_key: str | None = typer.Option(
        None,
        "--stress-key",
        help="Stress label (default: 'stress' when present); convention follows the name.",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", metavar="", help="Replace OUT if it exists."
    ),
    accept_predicted: bool = typer.Option(
        False, "--accept-predicted-labels", metavar="", help=ACCEPT_PREDICTED_HELP
    ),
) -> None:
    """Build the graphs of DATA once and store them in OUT (streamed; written atomically)."""
    if r_max <= 0:
        fail(ValueError(f"--r-max must be positive, got {r_max}"))
    require_files(*((path, "structure file") for path in data))
    from mlip_unc.data.ondisk_write import convert_files

    try:
        store = convert_files(
            data,
            out,
            r_max=r_max,
            energy_key=energy_key,
            forces_key=forces_key,
            stress_key=stress_key,
            overwrite=overwrite,
            progress=not quiet() and sys.stderr.isatty(),
            accept_predicted=accept_predicted,
        )
    except user_errors(FileExistsError) as err:
        fail(err)
    labels = {k: int(store.array(f"has_{k}").sum()) for k in ("energy", "forces", "stress")}
    typer.echo(
        f"wrote {out}: {store.n_frames} frames, {store.n_atoms} atoms, {store.n_edges} edges, "
        f"elements {store.type_map.symbols}, r_max {store.r_max}; labelled frames: "
        + ", ".join(f"{k} {v}" for k, v in labels.items())
    )
