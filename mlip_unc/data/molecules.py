"""Molecular graphs from SMILES (PyG's ``from_smiles`` features) and CSV datasets.

Graphs carry ``x`` (n_atoms, 9) long, ``edge_index`` (2, n_edges), ``edge_attr`` (n_edges, 3)
long, ``y`` (1, n_targets) float32, ``smiles`` (str) and ``row_id`` (1,) long = 0-based
data row of the source CSV (header excluded, original order; the split files index these).

MoleculeNet files use PyG's ``torch_geometric.datasets.MoleculeNet`` layout and column table
(``root/<name>/raw/<csv>``, e.g. ``root/lipo/raw/Lipophilicity.csv``) but are parsed here with
the csv module: nothing is downloaded, nothing is written next to the raw file (PyG would
write ``root/<name>/processed/``; shared data folders are read-only), and every graph keeps
its row index. The graphs equal PyG's (same featuriser, same columns; tested). BACE is a
regression on ``pIC50`` (PyG's BACE uses the binary ``Class`` column).

Data root: the ``root`` argument, else ``$MLIP_UNC_DATA``, else ``../shared/data`` (as every
command); MoleculeNet files live under ``<data root>/moleculenet`` and
QM7/CEP under ``<data root>/molecules_extra``.
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from rdkit import Chem, rdBase
from rdkit.Chem.Scaffolds import MurckoScaffold
from torch_geometric.data import Data
from torch_geometric.datasets import MoleculeNet
from torch_geometric.utils import from_rdmol

from mlip_unc import keys
from mlip_unc.config.property import DATASET_NAMES
from mlip_unc.data.errors import DataError

__all__ = [
    "TOY_SMILES",
    "MOLECULENET_NAMES",
    "DATASET_NAMES",
    "default_data_root",
    "moleculenet_raw_path",
    "smiles_to_graph",
    "load_csv",
    "load_moleculenet",
    "load_dataset",
    "bemis_murcko_scaffold",
]

#: Forty small organic molecules (alkanes, alcohols, amines, acids, aromatics, heterocycles), no
#: labels: the molecules of quick runs (``--quick``) and of the tests, which attach toy targets.
TOY_SMILES: tuple[str, ...] = (
    "C",
    "CC",
    "CCC",
    "CCCC",
    "CCCCC",
    "CCCCCC",
    "CO",
    "CCO",
    "CCCO",
    "CCCCO",
    "CC(C)O",
    "CC(=O)O",
    "CC(=O)C",
    "CCOC",
    "c1ccccc1",
    "Cc1ccccc1",
    "CCc1ccccc1",
    "Oc1ccccc1",
    "c1ccncc1",
    "C1CCCCC1",
    "C1CCCC1",
    "CN",
    "CCN",
    "CCCN",
    "CC#N",
    "C=C",
    "C=CC",
    "CC=CC",
    "ClC",
    "CCCl",
    "FC(F)F",
    "CS",
    "CCS",
    "O=C=O",
    "CC(C)C",
    "CC(C)(C)C",
    "OCCO",
    "NCCN",
    "c1ccoc1",
    "c1ccsc1",
)
_EXTRA: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # name: (path under <data root>, smiles column, target columns)
    "qm7": ("molecules_extra/qm7/qm7.csv", "smiles", ("target",)),
    "cep": ("molecules_extra/cep/cep-processed.csv", "smiles", ("PCE",)),
}
#: The known sets in PyG's MoleculeNet layout (the rest of ``DATASET_NAMES`` are ``_EXTRA``).
MOLECULENET_NAMES: tuple[str, ...] = tuple(n for n in DATASET_NAMES if n not in _EXTRA)
_ALIASES = {"lipophilicity": "lipo", "delaney": "esol", "sampl": "freesolv"}
_BACE_TARGET = "pIC50"

Column = str | int  # header name, or index (negative counts from the end)


# ================================================================ paths
def default_data_root() -> Path:
    """The data root every command uses: ``$MLIP_UNC_DATA`` if set, else ``../shared/data``."""
    from mlip_unc.config.loader import default_data_root as configured

    return Path(configured()).expanduser()


def _canonical_name(name: str, allowed: Sequence[str]) -> str:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in allowed:
        raise DataError(f"unknown dataset '{name}'; known: {list(allowed)}")
    return key


def moleculenet_raw_path(name: str, root: str | Path | None = None) -> Path:
    """``root/<name>/raw/<file>`` as PyG lays it out (root defaults to <data root>/moleculenet)."""
    key = _canonical_name(name, MOLECULENET_NAMES)
    base = Path(root) if root is not None else default_data_root() / "moleculenet"
    return base / key / "raw" / f"{MoleculeNet.names[key][2]}.csv"


# ================================================================ single molecules
def _parse_smiles(smiles: str) -> Chem.Mol | None:
    """RDKit molecule, or ``None`` if unparsable or empty (RDKit's log is silenced here only)."""
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles)
    return mol if mol is not None and mol.GetNumAtoms() > 0 else None


def smiles_to_graph(
    smiles: str, *, y: float | Sequence[float] | torch.Tensor | None = None
) -> Data:
    """SMILES -> PyG graph with ``from_smiles`` features (x (n, 9), edge_attr (e, 3)).

    Args:
        smiles: the molecule (surrounding whitespace is ignored).
        y: optional targets, stored as ``y`` (1, n_targets) float32.

    Raises:
        DataError: unparsable or empty SMILES, or atoms outside PyG's feature vocabulary.
    """
    smiles = smiles.strip()
    mol = _parse_smiles(smiles)
    if mol is None:
        raise DataError(f"invalid SMILES '{smiles}'")
    try:
        data = from_rdmol(mol)  # the featuriser of torch_geometric.utils.from_smiles
    except ValueError as err:
        raise DataError(f"SMILES '{smiles}' has features outside from_smiles' vocabulary") from err
    data[keys.SMILES] = smiles
    if y is not None:
        data[keys.TARGET] = torch.as_tensor(y, dtype=torch.float32).reshape(1, -1)
    return data


def bemis_murcko_scaffold(smiles: str, *, include_chirality: bool = False) -> str:
    """Bemis-Murcko scaffold SMILES (RDKit ``MurckoScaffold``); ``""`` for acyclic molecules.

    Raises:
        DataError: unparsable SMILES.
    """
    mol = _parse_smiles(smiles.strip())
    if mol is None:
        raise DataError(f"invalid SMILES '{smiles}'")
    return MurckoScaffold.MurckoScaffoldSmiles(mol=mol, includeChirality=include_chirality)


# ================================================================ CSV files
def _resolve_column(header: list[str], column: Column, path: Path) -> int:
    """Index of ``column`` (name or index) in ``header``."""
    if isinstance(column, int):
        if not -len(header) <= column < len(header):
            raise DataError(f"'{path}': column index {column} out of range for header {header}")
        return column % len(header)
    names = [h.strip() for h in header]
    if column not in names:
        raise DataError(f"'{path}': no column '{column}'; columns are {names}")
    return names.index(column)


def _parse_target(value: str, column: str, path: Path, line: int) -> float:
    """Float of a CSV cell; empty -> NaN (as PyG)."""
    if not value.strip():
        return math.nan
    try:
        return float(value)
    except ValueError:
        raise DataError(
            f"'{path}', line {line}: column '{column}' is not a number: {value!r}"
        ) from None


def _row_targets(
    row: list[str], header: list[str], target_cols: list[int], path: Path, line: int
) -> list[float]:
    """Targets of one CSV data row; raises ``DataError`` for a ragged row or a non-number."""
    if len(row) != len(header):
        raise DataError(
            f"'{path}', line {line}: {len(row)} fields, header has {len(header)}: {row[:3]}..."
        )
    return [_parse_target(row[c], header[c], path, line) for c in target_cols]


def load_csv(
    path: str | Path,
    smiles_column: Column,
    target_columns: Column | Sequence[Column],
    *,
    skip_invalid: bool = False,
) -> list[Data]:
    """Graphs from a CSV file with a header row (QM7, CEP, MoleculeNet, users' files).

    Args:
        path: the CSV file.
        smiles_column: header name or index of the SMILES column.
        target_columns: header name(s) or index(es) of the targets (empty cells -> NaN).
        skip_invalid: skip unparsable SMILES with a warning instead of raising.

    Returns:
        One graph per valid data row, in file order; ``row_id`` counts all data rows
        (header and blank lines excluded), so skipped rows leave gaps.

    Raises:
        DataError: missing file or column, ragged row, non-numeric target, or (unless
            ``skip_invalid``) an unparsable SMILES; naming the file, line and SMILES.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"CSV file not found: '{path}'")
    targets = [target_columns] if isinstance(target_columns, (str, int)) else list(target_columns)
    graphs: list[Data] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise DataError(f"'{path}' is empty (no header row)")
        columns = (
            _resolve_column(header, smiles_column, path),
            [_resolve_column(header, c, path) for c in targets],
        )
        row_index = 0
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue  # blank line: not a data row
            line = reader.line_num
            y = _row_targets(row, header, columns[1], path, line)
            try:
                data = smiles_to_graph(row[columns[0]], y=y)
            except DataError as err:
                if not skip_invalid:
                    raise DataError(f"'{path}', line {line}: {err}") from None
                warnings.warn(f"skipping '{path}', line {line}: {err}", stacklevel=2)
            else:
                data[keys.ROW_INDEX] = torch.tensor([row_index], dtype=torch.long)
                graphs.append(data)
            row_index += 1
    if not graphs:
        raise DataError(f"'{path}' has a header but no valid data rows")
    return graphs


# ================================================================ named datasets
def load_moleculenet(name: str, root: str | Path | None = None) -> list[Data]:
    """ESOL, FreeSolv, Lipophilicity or BACE (pIC50 regression) from a local raw CSV.

    Args:
        name: ``esol``, ``freesolv``, ``lipo`` (alias ``lipophilicity``) or ``bace``.
        root: PyG MoleculeNet root holding ``<name>/raw/<file>``; default
            ``<data root>/moleculenet`` (see :func:`default_data_root`).

    Raises:
        DataError: the raw file is missing (nothing is downloaded; the message gives the URL).
    """
    key = _canonical_name(name, MOLECULENET_NAMES)
    raw = moleculenet_raw_path(key, root)
    if not raw.is_file():
        url = MoleculeNet.url.format(MoleculeNet.names[key][1])
        raise DataError(
            f"MoleculeNet '{key}' raw file not found: '{raw}'. Nothing is downloaded; "
            f"place {url} there (root = argument, else $MLIP_UNC_DATA, else ../shared/data)"
        )
    _, _, _, smiles_idx, target_idx = MoleculeNet.names[key]
    target: Column = _BACE_TARGET if key == "bace" else target_idx
    return load_csv(raw, smiles_idx, target)


def load_dataset(name: str, root: str | Path | None = None) -> list[Data]:
    """A known molecular dataset: esol | freesolv | lipo | bace | qm7 | cep.

    Args:
        name: dataset name.
        root: data root containing ``moleculenet/`` and ``molecules_extra/``
            (default: :func:`default_data_root`).
    """
    key = _canonical_name(name, DATASET_NAMES)
    base = Path(root) if root is not None else default_data_root()
    if key in MOLECULENET_NAMES:
        return load_moleculenet(key, base / "moleculenet")
    relative, smiles_column, target_columns = _EXTRA[key]
    return load_csv(base / relative, smiles_column, target_columns)
