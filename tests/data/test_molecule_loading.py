"""SMILES graphs, CSV loading (errors, skipping), MoleculeNet without downloads."""

from __future__ import annotations

import csv
import shutil
import socket
from pathlib import Path

import pytest
import torch
from torch_geometric.datasets import MoleculeNet
from torch_geometric.utils import from_smiles

from mlip_unc import keys
from mlip_unc.data import (
    DataError,
    bemis_murcko_scaffold,
    default_data_root,
    load_csv,
    load_dataset,
    load_moleculenet,
    load_split,
    moleculenet_raw_path,
    smiles_to_graph,
)


@pytest.fixture()
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly on any download attempt or socket connection."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(MoleculeNet, "download", refuse)
    monkeypatch.setattr("torch_geometric.datasets.molecule_net.download_url", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize("smiles", ["CCO", "c1ccccc1O", "C[C@H](N)C(=O)O", "[Na+].[Cl-]"])
def test_smiles_graph_equals_pyg_from_smiles(smiles: str) -> None:
    ours, ref = smiles_to_graph(smiles, y=[1.0, 2.0]), from_smiles(smiles)
    assert ours[keys.NODE_FEATURES].shape[1] == 9 and ours[keys.EDGE_FEATURES].shape[1] == 3
    for key in (keys.NODE_FEATURES, keys.EDGE_INDEX, keys.EDGE_FEATURES):
        assert torch.equal(ours[key], ref[key])
    assert ours[keys.TARGET].shape == (1, 2) and ours[keys.TARGET].dtype == torch.float32
    assert ours[keys.SMILES] == smiles


@pytest.mark.parametrize("smiles", ["C1CC", "not_a_smiles", ""])
def test_invalid_smiles_raises(smiles: str) -> None:
    with pytest.raises(DataError, match="invalid SMILES"):
        smiles_to_graph(smiles)


def test_scaffold() -> None:
    assert bemis_murcko_scaffold("Cc1ccccc1CCO") == "c1ccccc1"
    assert bemis_murcko_scaffold("CCCO") == ""


def _write_csv(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    return path


@pytest.fixture()
def small_csv(tmp_path: Path) -> Path:
    rows = [
        ["name", "smiles", "logS", "other"],
        ["a, b", "CCO", "1.5", "x"],
        ["b", "C1CC", "2.0", "y"],
        ["c", "c1ccccc1", "", "z"],
        ["d", "CCN", "-3", "w"],
    ]
    return _write_csv(tmp_path / "mols.csv", rows)


def test_csv_invalid_smiles_names_file_line_and_smiles(small_csv: Path) -> None:
    with pytest.raises(DataError, match=r"mols.csv', line 3: invalid SMILES 'C1CC'"):
        load_csv(small_csv, "smiles", "logS")


def test_csv_skip_invalid_warns_and_keeps_row_indices(small_csv: Path) -> None:
    with pytest.warns(UserWarning, match=r"mols.csv', line 3: invalid SMILES 'C1CC'"):
        graphs = load_csv(small_csv, "smiles", ["logS"], skip_invalid=True)
    assert [g[keys.ROW_INDEX].item() for g in graphs] == [0, 2, 3]
    assert [g[keys.SMILES] for g in graphs] == ["CCO", "c1ccccc1", "CCN"]
    assert torch.isnan(graphs[1][keys.TARGET]).all() and graphs[2][keys.TARGET].item() == -3.0


def test_csv_bad_columns_and_values(tmp_path: Path, small_csv: Path) -> None:
    with pytest.raises(DataError, match=r"no column 'pIC50'"):
        load_csv(small_csv, "smiles", "pIC50")
    bad = _write_csv(tmp_path / "bad.csv", [["smiles", "y"], ["CCO", "1"], ["CC", "abc"]])
    with pytest.raises(DataError, match=r"bad.csv', line 3: column 'y' is not a number"):
        load_csv(bad, "smiles", "y")
    with pytest.raises(DataError, match="not found"):
        load_csv(tmp_path / "absent.csv", "smiles", "y")


def test_missing_raw_file_never_downloads(tmp_path: Path, no_network) -> None:
    with pytest.raises(DataError, match=r"esol/raw/delaney-processed.csv.*Nothing is downloaded"):
        load_moleculenet("esol", tmp_path)


def test_default_root_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLIP_UNC_DATA", str(tmp_path))
    assert default_data_root() == tmp_path
    expected = tmp_path / "moleculenet/lipo/raw/Lipophilicity.csv"
    assert moleculenet_raw_path("Lipophilicity") == expected
    monkeypatch.delenv("MLIP_UNC_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # not a data root
    assert default_data_root() == Path("../shared/data")  # the root every command uses


# ---------------------------------------------------------------- shared data
@pytest.mark.data
def test_esol_local_rows_match_split_file(data_root: Path, no_network) -> None:
    graphs = load_moleculenet("esol", data_root / "moleculenet")
    assert len(graphs) == 1128
    assert [g[keys.ROW_INDEX].item() for g in graphs] == list(range(1128))
    split = load_split(data_root / "splits/esol.json", n=len(graphs))
    assert len(split) == 1128
    with (data_root / "moleculenet/esol/raw/delaney-processed.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert graphs[0][keys.SMILES] == rows[1][-1].strip()
    assert graphs[0][keys.TARGET].item() == pytest.approx(float(rows[1][-2]))
    assert graphs[split.test[0]][keys.SMILES] == rows[1 + split.test[0]][-1].strip()


@pytest.mark.data
def test_esol_equals_pyg_moleculenet(data_root: Path, tmp_path: Path, no_network) -> None:
    raw = tmp_path / "esol" / "raw"
    raw.mkdir(parents=True)
    shutil.copy(data_root / "moleculenet/esol/raw/delaney-processed.csv", raw)
    reference = MoleculeNet(str(tmp_path), "esol")  # processes the copy; download refused
    ours = load_moleculenet("ESOL", tmp_path)
    assert len(ours) == len(reference) == 1128
    for k in (0, 1, 500, 1127):
        for key in (keys.NODE_FEATURES, keys.EDGE_INDEX, keys.EDGE_FEATURES, keys.TARGET):
            assert torch.equal(ours[k][key], reference[k][key])


@pytest.mark.data
def test_bace_is_pic50_regression(data_root: Path, no_network) -> None:
    graphs = load_dataset("bace", data_root)
    assert len(graphs) == 1513
    assert graphs[0][keys.TARGET].item() == pytest.approx(9.1549015)
    assert {round(g[keys.TARGET].item(), 3) for g in graphs[:50]} - {0.0, 1.0}


@pytest.mark.data
def test_freesolv_and_qm7(data_root: Path, no_network) -> None:
    freesolv = load_dataset("freesolv", data_root)
    assert len(freesolv) == 642 and freesolv[0][keys.TARGET].item() == pytest.approx(-11.01)
    qm7 = load_dataset("qm7", data_root)
    assert len(qm7) == 6834 and qm7[0][keys.TARGET].item() == pytest.approx(-417.96)
