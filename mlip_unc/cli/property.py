"""``mlip-unc property train|predict``: thin, parse -> config -> library call.

Training options left unset take the values of ``--config FILE`` (YAML/JSON) or of the
defaults in :mod:`mlip_unc.train.config`.
"""

from __future__ import annotations

import csv
import shlex
import sys
from pathlib import Path
from typing import Any, Optional

import torch
import typer

from mlip_unc.data.errors import DataError
from mlip_unc.data.molecules import DATASET_NAMES, MOLECULENET_NAMES, load_csv, load_dataset, load_moleculenet
from mlip_unc.data.molecules import smiles_to_graph
from mlip_unc.data.splits import Split, load_split, random_split, scaffold_split, training_subset
from mlip_unc.models.property import PropertyPredictor
from mlip_unc.train.checkpoint import CheckpointError
from mlip_unc.train.config import (
    AGLForm,
    DType,
    Intervention,
    Method,
    ModelConfig,
    PropertyConfig,
    Scheduler,
    StopMetric,
    TrainConfig,
    load_config,
)
from mlip_unc.train.trainer import train_property_model, write_json

property_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Molecular property models.")

_ERRORS = (CheckpointError, DataError, ValueError, FileNotFoundError)
_TABLE_KEYS = (
    "rmse", "mae", "nll", "spearman", "miscalibration_area", "ence", "coverage_95", "crps",
    "sharpness", "mean_std", "mean_epistemic_std", "mean_aleatoric_std",
)


def _d(name: str, note: str = "") -> str:
    """Help text naming the config default of ``name`` (model or train section)."""
    for cls in (ModelConfig, TrainConfig):
        if name in cls.__dataclass_fields__:
            value = getattr(cls, name, None)
            value = getattr(value, "value", value)
            return f"{note} (default {value})".strip() if value is not None else note or "(default: by method)"
    raise KeyError(name)


def register(app: typer.Typer) -> None:
    app.add_typer(property_app, name="property")


def _fail(err: Exception) -> None:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(code=1)


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "mlip-unc":
        argv[0] = "mlip-unc"
    return shlex.join(argv)


def _load_graphs(data: Path | None, dataset: str | None, root: Path | None, smiles_column: str,
                 target_columns: list[str] | None) -> tuple[list, list[str]]:
    if (data is None) == (dataset is None):
        raise ValueError("give exactly one of --data FILE.csv and --dataset NAME")
    if dataset is not None:
        name = dataset.lower()
        if root is not None and name in MOLECULENET_NAMES and (root / name / "raw").is_dir():
            return load_moleculenet(name, root), [name]  # root given as the MoleculeNet folder
        return load_dataset(name, root), [name]
    if not target_columns:
        raise ValueError("--data needs at least one --target-column")
    return load_csv(data, smiles_column, target_columns), list(target_columns)


def _split(graphs: list, split_file: Path | None, split: str, seed: int) -> Split:
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
    by_row = {int(g.row_id): g for g in graphs}
    missing = [r for r in rows if r not in by_row]
    if missing:
        raise DataError(f"split rows {missing[:5]} are not in the data ({len(graphs)} valid rows)")
    return [by_row[r] for r in rows]


def _print_table(metrics: dict[str, Any]) -> None:
    typer.echo(f"{'test metric':<22}{'value':>12}")
    for key in _TABLE_KEYS:
        if key in metrics:
            typer.echo(f"{key:<22}{metrics[key]:>12.4f}")
    typer.echo(f"{'train_seconds':<22}{metrics['train_seconds']:>12.1f}")


@property_app.command("train")
def train(
    out: Path = typer.Option(..., "--out", help="Output folder (model.pt, metrics.json, history.json)."),
    data: Optional[Path] = typer.Option(None, "--data", help="CSV file with a header row."),
    dataset: Optional[str] = typer.Option(None, "--dataset", help=f"Known set: {'|'.join(DATASET_NAMES)}."),
    data_root: Optional[Path] = typer.Option(None, "--data-root", envvar="MLIP_UNC_DATA", help="Data root."),
    smiles_column: str = typer.Option("smiles", "--smiles-column"),
    target_column: Optional[list[str]] = typer.Option(None, "--target-column", help="Repeat for several."),
    method: Optional[Method] = typer.Option(None, "--method", help=_d("method")),
    split: str = typer.Option("random", "--split", help="random | scaffold (80/10/10)."),
    split_file: Optional[Path] = typer.Option(None, "--split-file", help='JSON {"train","val","test"} rows.'),
    seed: Optional[int] = typer.Option(None, "--seed", help=_d("seed", "Model, shuffling and split seed.")),
    config_file: Optional[Path] = typer.Option(None, "--config", help="YAML/JSON config file."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help=_d("calibration", "none | zscaling | isotonic, fitted on validation.")),
    epochs: Optional[int] = typer.Option(None, "--epochs", help=_d("epochs")),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help=_d("batch_size")),
    lr: Optional[float] = typer.Option(None, "--lr", help=_d("lr")),
    hidden: Optional[int] = typer.Option(None, "--hidden", help=_d("hidden")),
    layers: Optional[int] = typer.Option(None, "--layers", help=_d("layers")),
    latent_dim: Optional[int] = typer.Option(None, "--latent-dim", help=_d("latent_dim")),
    dropout: Optional[float] = typer.Option(None, "--dropout", help="Backbone dropout (default 0.1 for mcdropout, else 0)."),
    prior_std: Optional[float] = typer.Option(None, "--prior-std", help=_d("prior_std")),
    init_std: Optional[float] = typer.Option(None, "--init-std", help=_d("init_std")),
    likelihood: Optional[str] = typer.Option(None, "--likelihood", help="homoscedastic | heteroscedastic (default heteroscedastic for mve/ensemble)."),
    beta: Optional[float] = typer.Option(None, "--beta", help=_d("beta")),
    kl_anneal_epochs: Optional[int] = typer.Option(None, "--kl-anneal-epochs", help=_d("kl_anneal_epochs")),
    patience: Optional[int] = typer.Option(None, "--patience", help=_d("patience")),
    stop_metric: Optional[StopMetric] = typer.Option(None, "--stop-metric", help=_d("stop_metric")),
    scheduler: Optional[Scheduler] = typer.Option(None, "--scheduler", help=_d("scheduler")),
    ensemble_size: Optional[int] = typer.Option(None, "--ensemble-size", help=_d("ensemble_size")),
    dtype: Optional[DType] = typer.Option(None, "--dtype", help=_d("dtype")),
    threads: int = typer.Option(1, "--threads", help="torch CPU threads (small graphs: 1 is fastest)."),
    agl_form: Optional[AGLForm] = typer.Option(None, "--agl-form", help="AGL term for --method agl (default mean)."),
    reg_lambda: Optional[float] = typer.Option(None, "--reg-lambda", help=_d("reg_lambda")),
    intervention: Optional[Intervention] = typer.Option(None, "--intervention"),
    train_fraction: float = typer.Option(1.0, "--train-fraction", help="Nested training subset."),
    freeze_posterior_from: Optional[Path] = typer.Option(None, "--freeze-posterior-from"),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUT/checkpoint.pt."),
    stop_after: Optional[int] = typer.Option(None, "--stop-after", hidden=True),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Train a property model; write OUT/model.pt and OUT/metrics.json; print test metrics."""
    torch.set_num_threads(threads)
    try:
        base = load_config(config_file) if config_file is not None else PropertyConfig()
        method_value = method or base.model.method
        config = base.with_overrides(
            method=method_value, seed=seed, calibration=calibration, epochs=epochs, batch_size=batch_size,
            lr=lr, hidden=hidden, layers=layers, latent_dim=latent_dim, dropout=dropout,
            prior_std=prior_std, init_std=init_std, likelihood=likelihood, beta=beta,
            kl_anneal_epochs=kl_anneal_epochs, patience=patience, stop_metric=stop_metric,
            scheduler=scheduler, ensemble_size=ensemble_size, dtype=dtype, reg_lambda=reg_lambda,
            intervention=intervention, progress=progress,
            regularizer=f"agl_{agl_form.value}" if agl_form is not None else None,
        )
        graphs, names = _load_graphs(data, dataset, data_root, smiles_column, target_column)
        rows = _split(graphs, split_file, split, config.train.seed)
        train_rows = training_subset(rows.train, train_fraction, config.train.seed) if train_fraction < 1 else rows.train
        parts = [_select(graphs, r) for r in (train_rows, rows.val, rows.test)]
        metadata = {
            "target_names": names, "smiles_column": smiles_column,
            "source": str(data) if data is not None else dataset, "train_fraction": train_fraction,
            "split": {"train": list(train_rows), "val": list(rows.val), "test": list(rows.test)},
        }
        _, metrics = train_property_model(
            config, *parts, out_dir=out, metadata=metadata, resume=resume, stop_after=stop_after,
            freeze_posterior=freeze_posterior_from,
        )
    except _ERRORS as err:
        _fail(err)
    if metrics is None:
        typer.echo(f"stopped after {stop_after} epoch(s); continue with --resume")
        return
    metrics.update(command=_command_line(), threads=threads, train_fraction=train_fraction)
    write_json(out / "metrics.json", metrics)
    _print_table(metrics)


def _read_smiles(path: Path, column: str) -> list[str]:
    if not path.is_file():
        raise DataError(f"CSV file not found: '{path}'")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or column not in [f.strip() for f in reader.fieldnames]:
            raise DataError(f"'{path}': no column '{column}'; columns are {reader.fieldnames}")
        key = next(f for f in reader.fieldnames if f.strip() == column)
        return [row[key] for row in reader if any((v or "").strip() for v in row.values())]


@property_app.command("predict")
def predict(
    model: Path = typer.Option(..., "--model", help="Training output folder or its model.pt."),
    data: Path = typer.Option(..., "--data", help="CSV file with a SMILES column."),
    out: Path = typer.Option(..., "--out", help="Output CSV."),
    smiles_column: Optional[str] = typer.Option(None, "--smiles-column", help="Default: as in training."),
    batch_size: int = typer.Option(256, "--batch-size"),
    threads: int = typer.Option(1, "--threads"),
) -> None:
    """Predict mean, std, epistemic_std and aleatoric_std for every SMILES of a CSV file."""
    torch.set_num_threads(threads)
    try:
        predictor = PropertyPredictor.load(model)
        column = smiles_column or predictor.metadata.get("smiles_column") or "smiles"
        smiles = _read_smiles(data, column)
        graphs = []
        for line, smi in enumerate(smiles, start=2):
            try:
                graphs.append(smiles_to_graph(smi))
            except DataError as err:
                raise DataError(f"'{data}', line {line}: {err}") from None
        result = predictor.predict(graphs, batch_size=batch_size)
    except _ERRORS as err:
        _fail(err)
    names = predictor.metadata.get("target_names") or ["target"]
    fields = ("mean", "std", "epistemic_std", "aleatoric_std")
    header = ["smiles"] + (list(fields) if len(names) == 1 else [f"{n}_{f}" for n in names for f in fields])
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for i, smi in enumerate(smiles):
            values = [f"{result[f][i, t]:.6g}" for t in range(len(names)) for f in fields]
            writer.writerow([smi.strip(), *values])
    typer.echo(f"wrote {len(smiles)} predictions to {out}")
