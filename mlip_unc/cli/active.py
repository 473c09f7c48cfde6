"""``mlip-unc md``, ``flag``, ``active-learn`` and ``demo``: thin, parse -> library call.

    mlip-unc demo                                   # offline, a few minutes, see the report
    mlip-unc md --model model.pt --structure start.xyz --ensemble langevin --temperature 800 \\
        --steps 2000 --timestep 1 --out md_run --max-force-std 2 --relative
    mlip-unc flag --model model.pt --data candidates.xyz --top-k 20 --diverse descriptor --out flagged.xyz
    mlip-unc flag --model model.pt --data long_md.xyz --threshold 3 --relative --workers 4 --scores scores.csv
    mlip-unc active-learn --config configs/al_emt.yaml

Nothing heavy at module level (no torch, data layer or calculator): the library and its
exception classes are imported inside the commands. Progress goes through ``logging``
(set up by the root command's ``-v``/``-q``); ``md`` and ``active-learn`` show tqdm bars on a
terminal unless ``-q`` is given (:func:`_progress`).
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path

import typer

from mlip_unc import keys
from mlip_unc.cli._common import (
    DEFAULT_RELATIVE_THRESHOLD,
    MODEL_DEVICE_HELP,
    fail,
    quiet,
    require_checkpoints,
    require_device,
    require_files,
    require_new_outputs,
    same_file,
    set_threads,
    threads_option,
    user_errors,
)
from mlip_unc.config.enums import ForceUncertaintyMode, MDBias, MDEnsemble

_MODE_HELP = "Force-uncertainty mode (default: auto for a model with a full posterior, else exact)."


class Metric(str, Enum):
    """Ranking score of ``mlip-unc flag``: a calculator property (:mod:`mlip_unc.keys`)."""

    MAX_FORCE_STD = keys.CALC_MAX_FORCE_STD
    ENERGY_STD_PER_ATOM = keys.CALC_ENERGY_STD_PER_ATOM


class Diverse(str, Enum):
    """Feature space of the farthest-point selection (``none``: plain ranking)."""

    NONE = "none"
    DESCRIPTOR = "descriptor"
    LATENT = "latent"


def _progress() -> bool:
    """Progress bars: on a terminal, unless ``-q``."""
    return sys.stderr.isatty() and not quiet()


def register(app: typer.Typer) -> None:
    app.command("md", help="Molecular dynamics with uncertainty monitoring.")(md)
    app.command("flag", help="Rank structures by uncertainty and write those to label.")(flag)
    app.command(
        "active-learn", help="Rounds of MD -> flag -> label -> retrain from a YAML config."
    )(active_learn)
    app.command("demo", help="Offline active-learning demo on EMT copper (a few minutes).")(demo)


_UNITS = {keys.CALC_MAX_FORCE_STD: "eV/Å", keys.CALC_ENERGY_STD_PER_ATOM: "eV/atom"}


def _default_threshold(levels: dict | None, metric: str, option: str) -> tuple[float | None, str]:
    """With no threshold given: ``DEFAULT_RELATIVE_THRESHOLD`` times the checkpoint's
    validation level of ``metric`` (a relative threshold), or ``None`` when the checkpoint
    stores no level; with the sentence that tells the user which (``option`` sets another)."""
    level = (levels or {}).get(metric)
    if level is None:
        return None, (
            f"no threshold given and the checkpoint stores no validation level of {metric}, "
            f"so nothing can be flagged by uncertainty; give {option} ({_UNITS[metric]})"
        )
    factor = DEFAULT_RELATIVE_THRESHOLD
    return factor, (
        f"no threshold given: flagging {metric} above {factor:g}x the checkpoint's validation "
        f"level, {factor * float(level):.4g} {_UNITS[metric]} ({option} sets another)"
    )


def _describe_thresholds(absolute: object, relative: bool) -> str:
    """``max_force_std > 0.1 eV/Å`` for the calculator's absolute thresholds."""
    parts = [
        f"{name} > {getattr(absolute, name):.4g} {unit}"
        for name, unit in _UNITS.items()
        if getattr(absolute, name, None) is not None
    ]
    if not parts:
        return "no threshold: nothing flagged by uncertainty"
    return " or ".join(parts) + (" (relative to the validation level)" if relative else "")


#: what ``md`` writes into its --out folder (:func:`mlip_unc.active.monitor.run_md`)
MD_FILES = ("md.traj", "md.csv", "flagged.xyz", "failed.xyz", "md.png")


def _require_new_md_run(out: Path, structure: Path, overwrite: bool) -> list[Path]:
    """Fail at once when ``out`` holds an earlier MD run (unless ``overwrite``) or when the
    starting structure is one of the files the run writes; returns the earlier run's files."""
    earlier = [out / name for name in MD_FILES if (out / name).exists()]
    for path in earlier:
        if same_file(path, structure):
            fail(
                f"--structure '{structure}' is a file that md writes into --out '{out}' "
                "(--overwrite does not allow this); choose another --out"
            )
    if earlier and not overwrite:
        fail(
            f"--out '{out}' already holds an MD run ({', '.join(p.name for p in earlier)}); "
            "choose another --out or replace it with --overwrite"
        )
    return earlier


_THRESHOLD_HELP = (
    "Flag threshold; eV/Å (absolute) or a multiple of the checkpoint's validation level "
    f"(--relative). Default: {DEFAULT_RELATIVE_THRESHOLD:g}x the validation level when the "
    "checkpoint stores one."
)


def md(
    model: Path = typer.Option(..., "--model", "-m", help="Checkpoint (model.pt)."),
    structure: Path = typer.Option(
        ..., "--structure", "-s", help="Starting structure (any ASE-readable file)."
    ),
    index: int = typer.Option(-1, "--index", help="Frame of STRUCTURE to start from."),
    ensemble: MDEnsemble = typer.Option(
        MDEnsemble.LANGEVIN, "--ensemble", help="nve (velocity Verlet) or langevin (NVT)."
    ),
    temperature: float = typer.Option(
        300.0, "--temperature", "-T", help="K (initial velocities; Langevin target)."
    ),
    steps: int = typer.Option(1000, "--steps", "-n", help="MD steps."),
    timestep: float = typer.Option(1.0, "--timestep", help="fs."),
    friction: float = typer.Option(0.01, "--friction", help="Langevin friction, 1/fs."),
    interval: int = typer.Option(10, "--interval", help="Log/trajectory every N steps."),
    out: Path = typer.Option(Path("md_run"), "--out", "-o", help="Output folder."),
    overwrite: bool = typer.Option(
        False, "--overwrite", metavar="", help="Replace an MD run already in OUT."
    ),
    uncertainty: ForceUncertaintyMode | None = typer.Option(
        None, "--uncertainty", "-u", help=_MODE_HELP
    ),
    max_force_std: float | None = typer.Option(None, "--max-force-std", help=_THRESHOLD_HELP),
    energy_std_per_atom: float | None = typer.Option(
        None,
        "--energy-std-per-atom",
        help="Flag threshold on the epistemic energy std, eV/atom (or relative).",
    ),
    relative: bool = typer.Option(
        False, "--relative", metavar="", help="Thresholds are multiples of the validation level."
    ),
    max_flags: int | None = typer.Option(
        None, "--max-flags", help="Stop after this many flagged frames."
    ),
    bias: MDBias = typer.Option(
        MDBias.NONE, "--bias", help="Bias MD towards high epistemic energy variance."
    ),
    bias_strength: float | None = typer.Option(
        None, "--bias-strength", help="k (1/eV, variance) or A (eV, udd)."
    ),
    bias_width: float | None = typer.Option(
        None, "--bias-width", help="B (eV/atom^1/2), udd only."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the velocities and Langevin noise."),
    device: str = typer.Option("cpu", "--device", help=MODEL_DEVICE_HELP),
    threads: int = threads_option(),
) -> None:
    """Run MD; writes OUT/md.traj, md.csv (energies, temperature, uncertainties), flagged.xyz, md.png.

    Without --max-force-std and --energy-std-per-atom, frames are flagged above
    DEFAULT_RELATIVE_THRESHOLD times the validation level stored in the checkpoint (said in the
    output), or, for a checkpoint without levels, not at all (said too)."""
    from mlip_unc.config import ConfigError, MDSettings, validate

    require_checkpoints([model])  # before torch: mistakes reported at once
    require_files((structure, "structure file"))
    earlier = _require_new_md_run(out, structure, overwrite)
    for option, value in (
        ("--max-force-std", max_force_std),
        ("--energy-std-per-atom", energy_std_per_atom),
    ):
        if value is not None and not value > 0:
            fail(f"{option} must be a positive number, got {value}")
    try:
        settings = validate(
            MDSettings,
            dict(
                ensemble=ensemble.value,
                temperature=temperature,
                steps=steps,
                timestep=timestep,
                interval=interval,
                friction=friction,
                max_flags=max_flags,
                seed=seed,
                bias=bias.value,
                bias_strength=bias_strength,
                bias_width=bias_width,
            ),
            resolve=False,
        )
    except (ConfigError, ValueError) as err:
        fail(err)
    from mlip_unc.active.biased_md import biased_calculator
    from mlip_unc.active.monitor import run_md
    from mlip_unc.calculator import LEVELS_KEY, UncertaintyCalculator
    from mlip_unc.data.readers import read_structures
    from mlip_unc.models.checkpoint import load_checkpoint

    set_threads(threads)
    require_device(device)
    try:
        start = read_structures(  # positions only: an md.traj frame is a fine start
            structure,
            index=index,
            require_energy=False,
            require_forces=False,
            accept_predicted=True,
        )[0]
        payload = load_checkpoint(model, kind="potential")
        levels = (payload.get("metadata") or {}).get(LEVELS_KEY) or {}
        thresholds = {
            keys.CALC_MAX_FORCE_STD: max_force_std,
            keys.CALC_ENERGY_STD_PER_ATOM: energy_std_per_atom,
            "relative": relative,
        }
        if max_force_std is None and energy_std_per_atom is None:
            factor, note = _default_threshold(levels, keys.CALC_MAX_FORCE_STD, "--max-force-std")
            typer.echo(note)
            thresholds = {keys.CALC_MAX_FORCE_STD: factor, "relative": True} if factor else {}
        calc = UncertaintyCalculator(
            payload,
            device=device,
            uncertainty=uncertainty.value if uncertainty else None,
            seed=seed,
            thresholds=thresholds,
        )
        for path in earlier:  # --overwrite: no file of the earlier run stays beside the new one
            path.unlink()
        result = run_md(
            start,
            biased_calculator(calc, settings),
            settings,
            out,
            reference_level=levels.get(keys.CALC_MAX_FORCE_STD),
            progress=_progress(),
        )
    except user_errors() as err:
        fail(err)
    log = result.log
    stop = " (stopped: --max-flags reached)" if result.stopped_early else ""
    criteria = _describe_thresholds(calc.thresholds, bool(thresholds.get("relative")))
    typer.echo(
        f"{result.steps_done} steps{stop}; {len(result.flagged)} of {len(log['step'])} logged "
        f"frames flagged ({criteria})"
    )
    typer.echo(
        f"max force std: mean {log['max_force_std'].mean():.4g}, max {log['max_force_std'].max():.4g} eV/Å; "
        f"temperature mean {log['temperature'].mean():.0f} K"
    )
    plot = f", {result.plot}" if result.plot else ""
    typer.echo(f"wrote {result.trajectory}, {result.csv}, {result.flagged_path}{plot}")


def flag(
    model: Path = typer.Option(..., "--model", "-m", help="Checkpoint (model.pt)."),
    data: Path = typer.Option(..., "--data", "-d", help="Candidate structures (extxyz, ...)."),
    top_k: int | None = typer.Option(
        None, "--top-k", "-k", min=1, help="Keep the K most uncertain."
    ),
    threshold: float | None = typer.Option(
        None,
        "--threshold",
        min=0.0,
        help="Keep those with score above X. Without --top-k and --threshold: "
        f"{DEFAULT_RELATIVE_THRESHOLD:g}x the checkpoint's validation level (--relative).",
    ),
    relative: bool = typer.Option(
        False, "--relative", metavar="", help="--threshold is a multiple of the validation level."
    ),
    metric: Metric = typer.Option(Metric.MAX_FORCE_STD, "--metric", help="Ranking score."),
    diverse: Diverse = typer.Option(
        Diverse.NONE, "--diverse", help="Farthest-point selection (needs --top-k)."
    ),
    uncertainty: ForceUncertaintyMode | None = typer.Option(
        None, "--uncertainty", "-u", help=_MODE_HELP
    ),
    out: Path = typer.Option(
        Path("flagged.xyz"),
        "--out",
        "-o",
        help="Selected structures (extxyz; a model's predictions under mlip_* names, never as "
        "labels).",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", metavar="", help="Replace OUT (and --scores) if they exist."
    ),
    workers: int = typer.Option(
        1, "--workers", min=1, help="Processes scoring chunks of DATA in parallel (same result)."
    ),
    chunk_size: int = typer.Option(
        256, "--chunk-size", min=1, help="Frames per chunk (DATA is streamed; memory stays flat)."
    ),
    scores: Path | None = typer.Option(
        None, "--scores", help="Write every frame's scores (CSV, file order)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampled mode's draws."),
    device: str = typer.Option("cpu", "--device", help=MODEL_DEVICE_HELP),
    threads: int = threads_option(" Per worker with --workers > 1 (0: 1)."),
) -> None:
    """Rank DATA by uncertainty, write the selected structures (with their scores in info) to OUT.

    Without --top-k and --threshold: the structures above DEFAULT_RELATIVE_THRESHOLD times the
    checkpoint's validation level of the metric (said in the output); a checkpoint without
    levels is an error that asks for one of them."""
    if diverse is not Diverse.NONE and top_k is None:
        fail(ValueError("--diverse picks --top-k structures; give --top-k"))
    require_checkpoints([model])  # before torch: mistakes reported at once
    require_files((data, "candidate structures"))
    require_new_outputs([(out, "--out"), (scores, "--scores")], [data, model], overwrite=overwrite)
    import functools

    import ase.io

    from mlip_unc.active.screening import screen_file
    from mlip_unc.calculator import LEVELS_KEY, UncertaintyCalculator
    from mlip_unc.data.provenance import without_predicted_labels
    from mlip_unc.models.checkpoint import load_checkpoint

    if workers == 1:
        set_threads(threads)
    require_device(device)
    try:
        if top_k is None and threshold is None:
            metadata = load_checkpoint(model, kind="potential").get("metadata") or {}
            levels = metadata.get(LEVELS_KEY)
            threshold, note = _default_threshold(levels, metric.value, "--top-k or --threshold")
            if threshold is None:
                fail(note)
            typer.echo(note)
            relative = True
        make_calc = functools.partial(
            UncertaintyCalculator,
            model,
            device=device,
            seed=seed,
            uncertainty=uncertainty.value if uncertainty else None,
        )
        result = screen_file(
            data,
            make_calc,
            metric=metric.value,
            top_k=top_k,
            threshold=threshold,
            relative=relative,
            diverse=diverse.value,
            workers=workers,
            chunk_size=chunk_size,
            threads_per_worker=threads or 1,
            scores_csv=scores,
            progress=_progress(),
        )
    except user_errors() as err:
        fail(err)
    selected = [without_predicted_labels(atoms) for atoms in result.selected]  # md.traj's
    out.parent.mkdir(parents=True, exist_ok=True)
    ase.io.write(out, selected, format="extxyz")
    values = result.stats[metric.value]
    typer.echo(
        f"{result.n_frames} structures; {metric.value}: mean {values['mean']:.4g}, max {values['max']:.4g}"
    )
    for atoms in selected[:10]:
        typer.echo(
            f"  #{atoms.info['source_index']:<6} {metric.value} = {atoms.info[metric.value]:.4g}"
        )
    if len(selected) > 10:
        typer.echo(f"  ... {len(selected) - 10} more")
    typer.echo(f"wrote {len(selected)} structures to {out}")


def active_learn(
    config: Path = typer.Option(
        ..., "--config", "-c", help="Active-learning YAML (see configs/al_emt.yaml)."
    ),
    overrides: list[str] | None = typer.Option(
        None, "--set", "-s", help="Override, e.g. --set rounds=3."
    ),
    out: Path | None = typer.Option(None, "--out", help="Output folder (overrides 'out')."),
    resume: bool = typer.Option(
        False, "--resume", metavar="", help="Continue the run in OUT where it stopped."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", metavar="", help="Replace a run already in OUT."
    ),
    threads: int = threads_option(),
) -> None:
    """MD -> flag -> label with the oracle -> retrain, in rounds or on the fly (mode:
    on_the_fly: the oracle is called when a monitored frame crosses the threshold); writes
    OUT/report.md.

    Every finished stage is committed to OUT/state.json and every oracle label to OUT/labels/, so
    a killed run continues with --resume without labelling a structure twice."""
    from mlip_unc.config import ConfigError, load_active_config

    items = list(overrides or [])
    if out is not None:
        items.append(f"out={out}")
    try:  # the config is checked before torch loads: its mistakes are reported at once
        cfg = load_active_config(config, items)
    except (ConfigError, ValueError) as err:
        fail(err)
    from mlip_unc.active.loop import run_active_learning
    from mlip_unc.active.oracles import OracleError

    set_threads(threads)
    if cfg.mode == "on_the_fly":
        from mlip_unc.active.onthefly import run_on_the_fly

        try:
            result = run_on_the_fly(cfg, resume=resume, overwrite=overwrite, progress=_progress())
        except user_errors(OracleError, FileExistsError) as err:
            fail(err)
        last = result.rows[-1]
        updates = sum(not r.get("refit") for r in result.rows) - 1
        typer.echo(
            f"{result.ended}: {result.calls} oracle calls, {updates} model updates"
            + (", refit from scratch" if last.get("refit") else "")
            + f", {last['md_ps']:.2f} ps of MD up to {last['temperature']:g} K; validation force "
            f"MAE {1000 * last['valid_force_mae']:.1f} meV/Å, energy MAE "
            f"{1000 * last['valid_energy_mae']:.1f} meV"
        )
        typer.echo(f"model: {result.model}; report: {Path(cfg.out) / 'report.md'}")
        return
    try:
        rows = run_active_learning(cfg, resume=resume, overwrite=overwrite, progress=_progress())
    except user_errors(OracleError, FileExistsError) as err:
        fail(err)
    for row in rows:
        rmse = row.get("test_force_rmse")
        typer.echo(
            f"round {row['round']}: {row['n_train']} training structures"
            + (f", test force RMSE {rmse:.4g} eV/Å" if rmse is not None else "")
            + (f", {row['n_flagged']} flagged" if "n_flagged" in row else "")
        )


def demo(
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder (default ./mlip-unc-demo-<time>)."
    ),
    quick: bool = typer.Option(
        False, "--quick", metavar="", help="Tiny settings (seconds; numbers not meaningful)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the data, training and MD."),
    threads: int = threads_option(),
) -> None:
    """Train on 300 K EMT copper, run hot MD, flag, label with EMT, retrain, compare: fully offline."""
    import dataclasses

    from mlip_unc.active.demo import DemoSettings, run_demo, summary

    settings = DemoSettings.quick() if quick else DemoSettings()
    settings = dataclasses.replace(settings, seed=seed)
    set_threads(threads)
    typer.echo(
        "mlip-unc demo: EMT copper stands in for DFT" + (" (quick settings)" if quick else "")
    )
    result = run_demo(out, settings=settings)
    typer.echo(summary(result))
