"""Data of property training: the config's ``data`` section -> graphs of the three parts.

:func:`prepare_property_data` reads ``data.csv`` or the known set ``data.dataset`` (under
``data_root``), splits its rows (``data.split_file``, else ``data.split`` seeded by
``train.seed``) and keeps the nested training subset ``data.train_fraction``. What it returns
as metadata is what ``model.pt`` records of the data: the target names, the SMILES column,
the source and the rows of each part, so that a run can be repeated and its test set found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch_geometric.data import Data

from mlip_unc.config import ConfigError, PropertyConfig, SplitKind
from mlip_unc.data.errors import DataError
from mlip_unc.data.molecules import MOLECULENET_NAMES, load_csv, load_dataset, load_moleculenet
from mlip_unc.data.splits import (
    Split,
    load_split,
    random_split,
    scaffold_split,
    training_subset,
)

__all__ = ["PropertyData", "load_molecules", "split_rows", "select_rows", "prepare_property_data"]


@dataclass(frozen=True)
class PropertyData:
    """The graphs of the training, validation and test parts and what ``model.pt`` records
    of them (``metadata``: target_names, smiles_column, source, train_fraction, split)."""

    train: list[Data]
    val: list[Data]
    test: list[Data]
    metadata: dict[str, Any]


def load_molecules(config: PropertyConfig) -> tuple[list[Data], list[str]]:
    """The graphs of ``data.csv`` or ``data.dataset`` and the names of their targets.

    Raises:
        ConfigError: neither or (for a config built without validation) both are given, or
            ``data.csv`` without ``data.target_columns``.
        DataError: a missing file or column, an unknown dataset, a bad row.
    """
    data = config.data
    if (data.csv is None) == (data.dataset is None):
        raise ConfigError("data: give exactly one of data.csv and data.dataset")
    if data.dataset is not None:
        name, root = data.dataset.lower(), config.dataset_root()
        if name in MOLECULENET_NAMES and (root / name / "raw").is_dir():
            return load_moleculenet(name, root), [name]  # root given as the MoleculeNet folder
        return load_dataset(name, root), [name]
    if not data.target_columns:
        raise ConfigError("data.target_columns: data.csv needs at least one target column")
    assert data.csv is not None
    return load_csv(data.csv, data.smiles_column, data.target_columns), list(data.target_columns)


def split_rows(graphs: Sequence[Data], config: PropertyConfig) -> Split:
    """The rows of each part: ``data.split_file``, else a ``data.split`` split seeded by
    ``train.seed``."""
    data, seed = config.data, config.train.seed
    if data.split_file is not None:
        return load_split(data.split_file)
    if data.split is SplitKind.SCAFFOLD:
        return scaffold_split([g.smiles for g in graphs], seed=seed)
    return random_split(len(graphs), seed=seed)


def select_rows(graphs: Sequence[Data], rows: Sequence[int]) -> list[Data]:
    """The graphs of ``rows`` (data rows of the source, ``row_id``), in that order."""
    by_row = {int(g.row_id): g for g in graphs}
    missing = [r for r in rows if r not in by_row]
    if missing:
        raise DataError(f"split rows {missing[:5]} are not in the data ({len(graphs)} valid rows)")
    return [by_row[r] for r in rows]


def prepare_property_data(config: PropertyConfig) -> PropertyData:
    """Read, split and subset the data that ``config.data`` names."""
    graphs, names = load_molecules(config)
    rows = split_rows(graphs, config)
    fraction = config.data.train_fraction
    train_rows = (
        training_subset(rows.train, fraction, config.train.seed) if fraction < 1 else rows.train
    )
    train, val, test = (select_rows(graphs, r) for r in (train_rows, rows.val, rows.test))
    source = config.data.csv if config.data.csv is not None else config.data.dataset
    metadata = {
        "target_names": names,
        "smiles_column": config.data.smiles_column,
        "source": source,
        "train_fraction": fraction,
        "split": {"train": list(train_rows), "val": list(rows.val), "test": list(rows.test)},
    }
    return PropertyData(train, val, test, metadata)
