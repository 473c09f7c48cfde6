"""``mlip-unc property train|predict``: thin, parse -> config -> library call.

Training options come from ``--config FILE`` (YAML/JSON, sections ``data``, ``model`` and
``train``, see ``mlip_unc.config.property``), then ``--set section.key=value`` overrides (the
same syntax as every other command), then the shortcut flags (``--data``, ``--method``,
``--seed``, ...), each of which sets one config key (``--data`` and ``--dataset`` also clear
the other source).
"""

from __future__ import annotations

import csv
import shlex
import sys
from pathlib import Path
from typing import Any

import typer

from mlip_unc.cli._common import (
    DEVICE_HELP,
    Group,
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
from mlip_unc.config.enums import Calibration, Likelihood, Method, SplitKind
from mlip_unc.config.property import DATASET_NAMES, PropertyConfig

property_app = typer.Typer(
    cls=Group, no_args_is_help=True, add_completion=False, help="Molecular property models."
)

_TABLE_KEYS = (
    "rmse",
    "mae",
    "nll",
    "spearman",
    "miscalibration_area",
    "ence",
    "coverage_95",
    "crps",
    "sharpness",
    "mean_std",
    "mean_epistemic_std",
    "mean_aleatoric_std",
)
_ONE_SOURCE = "give exactly one of --data FILE.csv and --dataset NAME"


def register(app: typer.Typer) -> None:
    app.add_typer(property_app, name="property")


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "mlip-unc":
        argv[0] = "mlip-unc"
    return shlex.join(argv)


def _check_data(config: PropertyConfig) -> None:
    """What can be checked of the data before torch loads (reported at once)."""
    data = config.data
    if data.csv is None and data.dataset is None:
        fail(f"{_ONE_SOURCE} (data.csv or data.dataset in a config)")
    if data.csv is not None:
        require_files((Path(data.csv), "CSV file"))
        if not data.target_columns:
            fail("--data needs at least one --target-column (data.target_columns)")
    elif not (root := config.dataset_root()).is_dir():
        fail(
            f"data root not found: '{root}' (--dataset reads it; set --data-root or "
            "$MLIP_UNC_DATA, default ../shared/data)"
        )
    if data.split_file is not None:
        require_files((Path(data.split_file), "split file"))


def _print_table(metrics: dict[str, Any]) -> None:
    """Test metrics, raw and recalibrated side by side when a recalibrator was fitted."""
    raw = metrics.get("uncalibrated")
    if raw is None:
        typer.echo(f"{'test metric':<22}{'value':>12}  (not recalibrated)")
    else:
        typer.echo(f"{'test metric':<22}{'raw':>12}{'recalibrated':>14}")
    for key in _TABLE_KEYS:
        if key in metrics:
            typer.echo(
                f"{key:<22}{(raw or metrics)[key]:>12.4f}"
                + (f"{metrics[key]:>14.4f}" if raw else "")
            )
    recal = metrics.get("recalibration") or {}
    if recal.get("scale"):
        factors = ", ".join(f"{v:.4g}" for v in recal["scale"])
        typer.echo(
            f"recalibration: {recal['kind']}, std factor {factors} (fitted on the validation split)"
        )
    typer.echo(f"{'train_seconds':<22}{metrics['train_seconds']:>12.1f}")


@property_app.command("train")
def train(
    out: Path = typer.Option(
        ..., "--out", help="Output folder (model.pt, metrics.json, history.json)."
    ),
    data: Path | None = typer.Option(
        None, "--data", help="Shortcut for data.csv: a CSV file with a header row."
    ),
    dataset: str | None = typer.Option(
        None,
        "--dataset",
        help=f"Shortcut for data.dataset, a known set: {'|'.join(DATASET_NAMES)}.",
    ),
    data_root: Path | None = typer.Option(
        None,
        "--data-root",
        help="Shortcut for data_root, where --dataset is read (default: $MLIP_UNC_DATA, "
        "else ../shared/data).",
    ),
    smiles_column: str | None = typer.Option(
        None,
        "--smiles-column",
        help="Shortcut for data.smiles_column: the column of --data with the SMILES (default "
        "smiles).",
    ),
    target_column: list[str] | None = typer.Option(
        None, "--target-column", help="Shortcut for data.target_columns; repeat for several."
    ),
    split: SplitKind | None = typer.Option(
        None, "--split", help="Shortcut for data.split, 80/10/10 (default random)."
    ),
    split_file: Path | None = typer.Option(
        None,
        "--split-file",
        help='Shortcut for data.split_file: JSON {"train","val","test"} rows.',
    ),
    train_fraction: float | None = typer.Option(
        None, "--train-fraction", help="Shortcut for data.train_fraction: a nested training subset."
    ),
    config_file: Path | None = typer.Option(
        None, "--config", help="YAML/JSON config (data, model, train)."
    ),
    overrides: list[str] | None = typer.Option(
        None,
        "--set",
        "-s",
        help="Override a config key, e.g. --set model.hidden=64 --set train.lr=3e-4.",
    ),
    method: Method | None = typer.Option(
        None, "--method", help="Shortcut for --set model.method=... (default bgnn)."
    ),
    likelihood: Likelihood | None = typer.Option(
        None, "--likelihood", help="Shortcut for model.likelihood."
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Shortcut for train.seed: model, shuffling, split."
    ),
    epochs: int | None = typer.Option(None, "--epochs", help="Shortcut for train.epochs."),
    calibration: Calibration | None = typer.Option(
        None, "--calibration", help="Shortcut for train.calibration."
    ),
    freeze_posterior_from: Path | None = typer.Option(
        None,
        "--freeze-posterior-from",
        help="Copy the Bayesian last layer's posterior from this model.pt and keep it fixed "
        "(bgnn/agl; the latents are trained under it).",
    ),
    resume: bool = typer.Option(False, "--resume", metavar="", help="Continue from OUT/last.pt."),
    overwrite: bool = typer.Option(
        False, "--overwrite", metavar="", help="Replace a run already in OUT."
    ),
    stop_after: int | None = typer.Option(None, "--stop-after", hidden=True),
    progress: bool = typer.Option(
        True, "--progress/--no-progress", metavar="", help="Progress bar on a terminal."
    ),
    threads: int = threads_option(),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
) -> None:
    """Train a property model; write OUT/model.pt and OUT/metrics.json; print test metrics."""
    from mlip_unc.config import ConfigError, apply_overrides, apply_values, load_raw, validate

    if data is not None and dataset is not None:
        fail(_ONE_SOURCE)
    shortcuts: dict[str, Any] = {
        "data_root": data_root,
        "data.smiles_column": smiles_column,
        "data.target_columns": target_column or None,
        "data.split": split,
        "data.split_file": split_file,
        "data.train_fraction": train_fraction,
        "model.method": method,
        "model.likelihood": likelihood,
        "train.seed": seed,
        "train.epochs": epochs,
        "train.calibration": calibration,
        "train.device": device,
    }
    values = {k: _plain(v) for k, v in shortcuts.items() if v is not None}
    if data is not None or dataset is not None:  # the source flag replaces the config's source
        values.update({"data.csv": _plain(data), "data.dataset": dataset})
    if not progress or quiet():
        values["train.progress"] = False
    try:  # the config is checked before torch loads: its mistakes are reported at once
        raw = load_raw(config_file) if config_file is not None else {}
        raw = apply_values(apply_overrides(raw, overrides or [], PropertyConfig), values)
        config = validate(PropertyConfig, raw)
    except (ConfigError, ValueError) as err:
        fail(err)
    _check_data(config)
    if resume and not (out / "last.pt").is_file():
        fail(
            f"--resume: {out} holds no run to continue (no last.pt there); "
            "drop --resume to start a new run"
        )
    from mlip_unc.train import distributed
    from mlip_unc.train.property import run_property_training
    from mlip_unc.train.text_files import write_json

    set_threads(threads)
    try:
        with (
            distributed.session()
        ):  # under torchrun: data-parallel over its processes; else a no-op
            _, metrics = run_property_training(
                config,
                out_dir=out,
                resume=resume,
                overwrite=overwrite,
                stop_after=stop_after,
                freeze_posterior=freeze_posterior_from,
            )
            main = distributed.is_main()
    except user_errors(FileExistsError) as err:
        fail(err)
    except KeyboardInterrupt as err:  # model.pt is written only once calibrated
        interrupted(err, finalise=False)
    if not main:  # rank 0 reports and writes metrics.json
        return
    if metrics is None:
        typer.echo(f"stopped after {stop_after} epoch(s); continue with --resume")
        return
    fraction = config.data.train_fraction
    metrics.update(command=_command_line(), threads=threads, train_fraction=fraction)
    write_json(out / "metrics.json", metrics)
    _print_table(metrics)


def _plain(value: Any) -> Any:
    """A flag's value as a config holds it: an Enum's value, a path as text, a list."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return list(value)
    return getattr(value, "value", value)


def _read_smiles(path: Path, column: str) -> list[str]:
    from mlip_unc.data.errors import DataError

    if not path.is_file():
        raise DataError(f"CSV file not found: '{path}'")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or column not in [f.strip() for f in reader.fieldnames]:
            raise DataError(f"'{path}': no column '{column}'; columns are {reader.fieldnames}")
        key = next(f for f in reader.fieldnames if f.strip() == column)
        smiles = [row[key] for row in reader if any((v or "").strip() for v in row.values())]
    if not smiles:
        raise DataError(f"'{path}' has a header but no data rows: nothing to predict")
    return smiles


@property_app.command("predict")
def predict(
    model: Path = typer.Option(..., "--model", help="Training output folder or its model.pt."),
    data: Path = typer.Option(..., "--data", help="CSV file with a SMILES column."),
    out: Path = typer.Option(..., "--out", help="Output CSV."),
    overwrite: bool = typer.Option(
        False, "--overwrite", metavar="", help="Replace OUT if it exists."
    ),
    smiles_column: str | None = typer.Option(
        None, "--smiles-column", help="Default: as in training."
    ),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Molecules per model call."),
    recalibrate: bool = typer.Option(
        True,
        "--recalibrate/--no-recalibrate",
        metavar="",
        help="Apply the recalibrator stored at training (default) or report the raw stds.",
    ),
    threads: int = threads_option(),
) -> None:
    """Predict mean, std, epistemic_std and aleatoric_std for every SMILES of a CSV file.

    The stds are recalibrated with the factor fitted on the validation split at training
    (``--no-recalibrate``: the raw model's); models saved without one are reported as such.
    """
    require_checkpoints([model], run_folders=True)  # before torch: mistakes reported at once
    require_files((data, "CSV file"))
    require_new_outputs([(out, "--out")], [data, model], overwrite=overwrite)
    from mlip_unc.data.errors import DataError
    from mlip_unc.data.molecules import smiles_to_graph
    from mlip_unc.models.factory import PropertyPredictor

    set_threads(threads)
    try:
        predictor = PropertyPredictor.load(model)
        if not predictor.calibrators:
            typer.echo(
                "note: this model is not recalibrated (no recalibrator in the checkpoint); raw stds"
            )
        elif not recalibrate:
            predictor.calibrators = None
            typer.echo("raw stds (--no-recalibrate)")
        else:
            kinds = sorted({type(c).__name__ for c in predictor.calibrators})
            typer.echo(
                f"stds recalibrated ({', '.join(kinds)}, fitted on the validation split at training)"
            )
        column = smiles_column or predictor.metadata.get("smiles_column") or "smiles"
        smiles = _read_smiles(data, column)
        graphs = []
        for line, smi in enumerate(smiles, start=2):
            try:
                graphs.append(smiles_to_graph(smi))
            except DataError as err:
                raise DataError(f"'{data}', line {line}: {err}") from None
        result = predictor.predict(graphs, batch_size=batch_size)
        unseen = predictor.unseen_elements(graphs)  # None: the checkpoint does not record them
    except user_errors() as err:
        fail(err)
    names = predictor.metadata.get("target_names") or ["target"]
    fields = ("mean", "std", "epistemic_std", "aleatoric_std")
    header = ["smiles"] + (
        list(fields) if len(names) == 1 else [f"{n}_{f}" for n in names for f in fields]
    )
    header += [] if unseen is None else ["unseen_elements"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for i, smi in enumerate(smiles):
            values = [f"{result[f][i, t]:.6g}" for t in range(len(names)) for f in fields]
            flags = [] if unseen is None else [" ".join(unseen[i])]
            writer.writerow([smi.strip(), *values, *flags])
    typer.echo(f"wrote {len(smiles)} predictions to {out}")
    note = _unseen_note(unseen)
    if note is not None:
        typer.echo(note, err=note.startswith("warning"))


def _unseen_note(unseen: list[list[str]] | None) -> str | None:
    """The line on molecules with elements absent from the training set (column
    ``unseen_elements``), whose stds do not account for them; None when there are none."""
    if unseen is None:
        return (
            "note: this model does not record its training elements (saved before they were "
            "recorded), so molecules with elements it never saw are not flagged"
        )
    flagged = [symbols for symbols in unseen if symbols]
    if not flagged:
        return None
    elements = ", ".join(sorted({s for symbols in flagged for s in symbols}))
    return (
        f"warning: {len(flagged)} of {len(unseen)} molecules hold elements absent from the "
        f"training set ({elements}): extrapolations that their std does not account for "
        "(column unseen_elements)"
    )
