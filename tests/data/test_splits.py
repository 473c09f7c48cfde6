"""Random, scaffold and nested training splits; split JSON files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlip_unc.data import (
    DataError,
    Split,
    bemis_murcko_scaffold,
    load_dataset,
    load_split,
    random_split,
    save_split,
    scaffold_split,
    training_subset,
)

SCAFFOLDS = ["c1ccccc1", "C1CCCCC1", "c1ccncc1", "C1CCOC1", "c1ccc2ccccc2c1", "c1ccsc1", "C1CC1"]
SUBSTITUENTS = ["C", "CC", "O", "N", "Cl", "F", "OC", "CCC"]


def _smiles_list() -> list[str]:
    smiles = [sub + scaf for k, scaf in enumerate(SCAFFOLDS) for sub in SUBSTITUENTS[: 3 + k]]
    return smiles + ["CCO", "CCCC", "CC(=O)O"]


def _check_partition(split: Split, n: int) -> None:
    parts = [set(split.train), set(split.val), set(split.test)]
    assert sum(len(p) for p in parts) == n and set().union(*parts) == set(range(n))


def test_random_split_sizes_and_reproducible() -> None:
    split = random_split(642, (0.8, 0.1, 0.1), seed=0)
    assert (len(split.train), len(split.val), len(split.test)) == (514, 64, 64)
    _check_partition(split, 642)
    assert split == random_split(642, seed=0) and split != random_split(642, seed=1)
    with pytest.raises(DataError, match="sum to 1"):
        random_split(10, (0.5, 0.1, 0.1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scaffold_split_shares_no_scaffold(seed: int) -> None:
    smiles = _smiles_list()
    split = scaffold_split(smiles, (0.6, 0.2, 0.2), seed=seed)
    _check_partition(split, len(smiles))
    scaffolds = [
        {bemis_murcko_scaffold(smiles[k]) for k in part}
        for part in (split.train, split.val, split.test)
    ]
    train, val, test = scaffolds
    assert not (train & val or train & test or val & test)
    assert len(split.train) <= 0.6 * len(smiles) and len(split.test) > 0


def test_scaffold_split_invalid_smiles() -> None:
    with pytest.raises(DataError, match=r"molecule 1: invalid SMILES 'C1CC'"):
        scaffold_split(["CCO", "C1CC"])


def test_training_subsets_are_nested() -> None:
    train = random_split(200, seed=3).train
    subsets = [set(training_subset(train, f, seed=7)) for f in (0.05, 0.1, 0.25, 0.5, 1.0)]
    assert [len(s) for s in subsets] == [8, 16, 40, 80, 160]
    assert all(small <= large for small, large in zip(subsets, subsets[1:], strict=False))
    assert subsets[-1] == set(train)
    assert set(training_subset(list(reversed(train)), 0.25, seed=7)) == subsets[2]
    assert set(training_subset(train, 0.25, seed=8)) != subsets[2]


def test_split_json_round_trip(tmp_path: Path) -> None:
    split = random_split(50, seed=4)
    path = tmp_path / "split.json"
    save_split(path, split, n=50)
    assert load_split(path, n=50) == split
    assert set(json.loads(path.read_text())) == {"train", "val", "test"}


@pytest.mark.parametrize(
    "content, n, match",
    [
        ({"train": [0, 1], "val": [1], "test": [2]}, None, r"index 1 is in both 'train' and 'val'"),
        ({"train": [0, 1.5], "val": [], "test": []}, None, r"'train' contains a non-integer"),
        ({"train": [0, 9], "val": [], "test": []}, 5, r"'train' index 9 is out of range for n=5"),
        ({"train": [0], "test": [1]}, None, r"missing \['val'\]"),
        ({"train": [0, 0], "val": [], "test": []}, None, r"index 0 more than once"),
        ({"train": [-1], "val": [], "test": []}, None, r"out of range"),
    ],
)
def test_bad_split_files_name_the_file(tmp_path: Path, content, n, match) -> None:
    path = tmp_path / "bad_split.json"
    path.write_text(json.dumps(content))
    with pytest.raises(DataError, match="bad_split.json': .*" + match):
        load_split(path, n=n)


def test_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{train: ")
    with pytest.raises(DataError, match="broken.json': invalid JSON"):
        load_split(path)


# ---------------------------------------------------------------- shared data
@pytest.mark.data
@pytest.mark.parametrize("name, n", [("esol", 1128), ("freesolv", 642), ("lipo", 4200)])
def test_random_split_reproduces_reference_files(data_root: Path, name: str, n: int) -> None:
    assert random_split(n, seed=0) == load_split(data_root / "splits" / f"{name}.json", n=n)


@pytest.mark.data
def test_esol_scaffold_split(data_root: Path) -> None:
    smiles = [g.smiles for g in load_dataset("esol", data_root)]
    split = scaffold_split(smiles, seed=0)
    _check_partition(split, len(smiles))
    train = {bemis_murcko_scaffold(smiles[k]) for k in split.train}
    assert not train & {bemis_murcko_scaffold(smiles[k]) for k in split.test}
