"""``mlip-unc property train|predict``: thin, parse -> config -> library call.

Training options come from ``--config FILE`` (YAML/JSON, sections ``model`` and ``train``, see
``mlip_unc.config.property``), then ``--set section.key=value`` overrides (the same syntax as
every other command), then the shortcut flags (``--method``, ``--seed``, ...).
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
from mlip_unc.config.enums import Calibration, Likelihood, Method

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
_DATASETS = "esol|freesolv|lipo|bace|qm7|cep"


def register(app: typer.Typer) -> None:
    app.add_typer(property_app, name="property")


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "mlip-unc":
        argv[0] = "mlip-unc"
    return shlex.join(argv)


def _data_root(data_root: Path | None) -> Path:
    """``--data-root`` (or ``$MLIP_UNC_DATA``), else the data root of every other command."""
    from mlip_unc.config import default_data_root

    return data_root if data_root is not None else Path(default_data_root())


def _check_inputs(
    data: Path | None, dataset: str | None, root: Path, target_columns: list[str] | None
) -> None:
    """What can be checked before torch loads (reported at once)."""
    if (data is None) == (dataset is None):
        fail("give exactly one of --data FILE.csv and --dataset NAME")
    if data is not None:
        require_files((data, "CSV file"))
        if not target_columns:
            fail("--data needs at least one --target-column")
    elif not root.is_dir():
        fail(
            f"data root not found: '{root}' (--dataset reads it; set --data-root or "
            "$MLIP_UNC_DATA, default ../shared/data)"
        )


def _load_graphs(
    data: Path | None,
    dataset: str | None,
    root: Path,
    smiles_column: str,
    target_columns: list[str] | None,
) -> tuple[list, list[str]]:
    from mlip_unc.data.molecules import MOLECULENET_NAMES, load_csv, load_dataset, load_moleculenet

    if dataset is not None:
        name = dataset.lower()
        if name in MOLECULENET_NAMES and (root / name / "raw").is_dir():
            return load_moleculenet(name, root), [name]  # root given as the MoleculeNet folder
        return load_dataset(name, root), [name]
    assert data is not None and target_columns  # _check_inputs
    return load_csv(data, smiles_column, target_columns), list(target_columns)


def _split(graphs: list, split_file: Path | None, split: str, seed: int) -> Any:
    from mlip_unc.data.splits import load_split, random_split, scaffold_split

    if split not in ("random", "scaffold"):
        raise ValueError(f"--split must be random or scaffold, got {split!r}")
    if split_file is not None:
        rows = load_split(split_file)
    elif split == "scaffold":
        rows = scaffold_split([g.smiles for g in graphs], seed=seed)
    else:
        rows = random_split(len(graphs), seed=seed)
    return rows


def _select(graphs: list, rows: tuple[int, ...]) -> list:
    from mlip_unc.data.errors import DataError

    by_row = {int(g.row_id): g for g in graphs}
    missing = [r for r in rows if r not in by_row]
    if missing:
        raise DataError(f"split rows {missing[:5]} are not in the data ({len(graphs)} valid rows)")
    return [by_row[r] for r in rows]


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
    data: Path | None = typer.Option(None, "--data", help="CSV file with a header row."),
    dataset: str | None = typer.Option(None, "--dataset", help=f"Known set: {_DATASETS}."),
    data_root: Path | None = typer.Option(
        None,
        "--data-root",
        envvar="MLIP_UNC_DATA",
        help="Data root of --dataset (default: $MLIP_UNC_DATA, else ../shared/data).",
    ),
    smiles_column: str = typer.Option(
        "smiles", "--smiles-column", help="Column of --data that holds the SMILES."
    ),
    target_column: list[str] | None = typer.Option(
        None, "--target-column", help="Repeat for several."
    ),
    split: str = typer.Option("random", "--split", help="random | scaffold (80/10/10)."),
    split_file: Path | None = typer.Option(
        None, "--split-file", help='JSON {"train","val","test"} rows.'
    ),
    train_fraction: float = typer.Option(1.0, "--train-fraction", help="Nested training subset."),
    config_file: Path | None = typer.Option(
        None, "--config", help="YAML/JSON config (model, train)."
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
    from mlip_unc.config import ConfigError, PropertyConfig, apply_overrides, load_raw, validate

    root = _data_root(data_root)
    _check_inputs(data, dataset, root, target_column)
    require_files((split_file, "split file"))
    if split not in ("random", "scaffold"):
        fail(f"--split must be random or scaffold, got {split!r}")
    if resume and not (out / "last.pt").is_file():
        fail(
            f"--resume: {out} holds no run to continue (no last.pt there); "
            "drop --resume to start a new run"
        )

    shortcuts = {
        "model.method": method,
        "model.likelihood": likelihood,
        "train.seed": seed,
        "train.epochs": epochs,
        "train.calibration": calibration,
        "train.device": device,
    }
    items = list(overrides or []) + [
        f"{k}={getattr(v, 'value', v)}" for k, v in shortcuts.items() if v is not None
    ]
    if not progress or quiet():
        items.append("train.progress=false")
    try:  # the config is checked before torch loads: its mistakes are reported at once
        raw = load_raw(config_file) if config_file is not None else {}
        config = validate(PropertyConfig, apply_overrides(raw, items, PropertyConfig))
    except (ConfigError, ValueError) as err:
        fail(err)
    from mlip_unc.data.splits import training_subset
    from mlip_unc.train import distributed
    from mlip_unc.train.property import train_property_model
    from mlip_unc.train.text_files import write_json

    set_threads(threads)
    try:
        graphs, names = _load_graphs(data, dataset, root, smiles_column, target_column)
        rows = _split(graphs, split_file, split, config.train.seed)
        train_rows = (
            training_subset(rows.train, train_fraction, config.train.seed)
            if train_fraction < 1
            else rows.train
        )
        parts = [_select(graphs, r) for r in (train_rows, rows.val, rows.test)]
        metadata = {
            "target_names": names,
            "smiles_column": smiles_column,
            "source": str(data) if data is not None else dataset,
            "train_fraction": train_fraction,
            "split": {"train": list(train_rows), "val": list(rows.val), "test": list(rows.test)},
        }
        with (
            distributed.session()
        ):  # under torchrun: data-parallel over its processes; else a no-op
            _, metrics = train_property_model(
                config,
                *parts,
                out_dir=out,
                metadata=metadata,
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
    metrics.update(command=_command_line(), threads=threads, train_fraction=train_fraction)
    write_json(out / "metrics.json", metrics)
    _print_table(metrics)


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
