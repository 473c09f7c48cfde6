"""On-disk sets: items equal the in-memory graphs, corruption is refused, training matches."""

from __future__ import annotations

import json
import pickle

import ase
import ase.io
import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from typer.testing import CliRunner

from mlip_unc.cli import app
from mlip_unc.config import potential_config_from_dict
from mlip_unc.data import DataError, StructureDataset, TypeMap
from mlip_unc.data.ondisk import OnDiskDataset, OnDiskStore, is_store
from mlip_unc.data.ondisk_write import convert_files
from mlip_unc.train.potential import train_potential
from mlip_unc.train.potential_data import prepare_data

R_MAX = 4.0


def _labelled(atoms: ase.Atoms, stress: bool = True) -> ase.Atoms:
    atoms.calc = EMT()
    labels = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces()}
    if stress and atoms.pbc.any():
        labels["stress"] = atoms.get_stress()
    atoms.calc = SinglePointCalculator(atoms, **labels)
    return atoms


def _frames(n: int = 12) -> list[ase.Atoms]:
    """Rattled Cu/Al cells of two sizes, a non-periodic cluster, an isolated Cu and Al atom."""
    frames = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True) * ((1, 1, 2) if k % 3 == 0 else (1, 1, 1))
        if k % 2:
            atoms[0].symbol = "Al"
        atoms.rattle(0.08, seed=k)
        frames.append(_labelled(atoms))
    cluster = ase.Atoms("Cu3", positions=[[0, 0, 0], [2.5, 0, 0], [0, 2.5, 0.3]])
    frames.append(_labelled(cluster))
    frames += [_labelled(ase.Atoms(s, positions=[[0, 0, 0]])) for s in ("Cu", "Al")]
    return frames


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ondisk")
    ase.io.write(root / "train.xyz", _frames())
    convert_files(root / "train.xyz", root / "train.mlipdb", r_max=R_MAX)
    return root


def _assert_same_graph(g, h) -> None:
    assert set(g.keys()) == set(h.keys())
    for key in g.keys():  # noqa: SIM118 (iterating a Data gives (key, value) pairs)
        a, b = g[key], h[key]
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), key
        else:
            assert a == b, key


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_items_equal_the_in_memory_dataset_read_in_chunks(data, dtype):
    memory = StructureDataset.from_files(data / "train.xyz", R_MAX, dtype=dtype)
    disk = OnDiskDataset(data / "train.mlipdb", dtype=dtype)
    assert (
        len(disk) == len(memory) == 15 and disk.type_map == memory.type_map and disk.r_max == R_MAX
    )
    chunked = [g for chunk in disk.chunks(4) for g in chunk]
    assert len(chunked) == len(memory)
    for g, h, c in zip(memory, disk, chunked, strict=False):
        _assert_same_graph(g, h)
        _assert_same_graph(g, c)
    sub = disk.subset([3, 0])  # a view keeps the order asked for, no graph is copied
    _assert_same_graph(sub[0], memory[3])
    _assert_same_graph(pickle.loads(pickle.dumps(sub))[1], memory[0])  # DataLoader workers
    # another type map (e.g. a model's) renumbers the types
    wide = OnDiskDataset(data / "train.mlipdb", type_map=TypeMap((1, 13, 29)))
    assert wide[1]["atom_type"].tolist() == [1] + [2] * 3
    with pytest.raises(DataError, match=r"element Al.*train.xyz', frame 1 is not in the type map"):
        OnDiskDataset(data / "train.mlipdb", type_map=TypeMap((29,)))[1]
    atoms = disk.store.atoms(5)  # the structure with its labels
    ref = ase.io.read(data / "train.xyz", 5)
    assert (
        np.allclose(atoms.positions, ref.positions)
        and atoms.get_potential_energy() == ref.get_potential_energy()
    )
    assert np.allclose(atoms.get_stress(), ref.get_stress())


def _corrupt_copy(data, tmp_path):
    import shutil

    target = tmp_path / "copy.mlipdb"
    shutil.copytree(data / "train.mlipdb", target)
    return target


def test_corrupted_or_truncated_sets_raise_clear_errors(data, tmp_path):
    store = _corrupt_copy(data, tmp_path)
    OnDiskStore(store).verify()  # intact
    path = store / "positions.bin"
    raw = path.read_bytes()
    path.write_bytes(raw[:-24])  # truncated
    with pytest.raises(DataError, match="positions.bin has .* bytes, expected .*truncated"):
        OnDiskStore(store)
    flipped = bytearray(raw)
    flipped[100] ^= 0xFF
    path.write_bytes(bytes(flipped))  # same size, different content
    with pytest.raises(DataError, match="positions.bin fails its checksum"):
        OnDiskStore(store).verify()
    edges = np.fromfile(store / "edge_index.bin", dtype="<i4")
    edges[:2] = 10_000
    edges.tofile(store / "edge_index.bin")
    with pytest.raises(DataError, match=r"'.*train.xyz', frame 0: stored edges point outside"):
        OnDiskDataset(store)[0]
    offsets = np.fromfile(store / "atom_offset.bin", dtype="<i8")
    offsets[3] = offsets[2]
    offsets.tofile(store / "atom_offset.bin")
    with pytest.raises(DataError, match="atom_offset is not increasing at item 2"):
        OnDiskStore(store)
    (store / "forces.bin").unlink()
    with pytest.raises(DataError, match="forces.bin is missing"):
        OnDiskStore(store)
    meta = json.loads((store / "meta.json").read_text())
    (store / "meta.json").write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(DataError, match="format version 99 is not supported"):
        OnDiskStore(store)
    (store / "meta.json").write_text("{not json")
    with pytest.raises(DataError, match="corrupted metadata"):
        OnDiskStore(store)
    (store / "meta.json").unlink()
    with pytest.raises(DataError, match="not an on-disk data set"):
        OnDiskStore(store)
    assert not is_store(store)


def test_convert_is_atomic_and_names_the_bad_frame(tmp_path):
    frames = _frames(3)
    frames[2].positions[0, 0] = np.nan
    ase.io.write(tmp_path / "bad.xyz", frames)
    with pytest.raises(DataError, match=r"bad.xyz', frame 2"):
        convert_files(tmp_path / "bad.xyz", tmp_path / "bad.mlipdb", r_max=R_MAX)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.xyz"]  # no set, no temporary folder
    (tmp_path / "bad.xyz").write_text("3\ncomment\nCu 0 0 0\n")  # the file ends inside the frame
    with pytest.raises(
        DataError, match=r"bad.xyz', frame 0 \(line 1\): the file ends inside the frame"
    ):
        convert_files(tmp_path / "bad.xyz", tmp_path / "bad.mlipdb", r_max=R_MAX)


def _config(train, out, **data):
    return potential_config_from_dict(
        {
            "seed": 0,
            "out": str(out),
            "data": {"train": str(train), "valid_fraction": 0.25, "r_max": R_MAX, **data},
            "model": {
                "backbone": "gin",
                "backbone_kwargs": {"hidden": 8, "num_layers": 1},
                "latent_dim": 4,
            },
            "train": {"epochs": 2, "batch_size": 2, "lr": 0.02, "progress": False},
        }
    )


@pytest.mark.parametrize("references", ["auto", "least_squares"])
def test_prepared_statistics_match_the_in_memory_path(data, tmp_path, references):
    kw = {}
    mem = prepare_data(
        _config(data / "train.xyz", tmp_path / "a").updated(
            model={"reference_energies": references}, **kw
        )
    )
    disk = prepare_data(
        _config(data / "train.mlipdb", tmp_path / "b").updated(
            model={"reference_energies": references}
        )
    )
    assert isinstance(disk.train, OnDiskDataset) and len(disk.train) == len(mem.train)
    assert (
        disk.type_map == mem.type_map
        and disk.reference_energies.keys() == mem.reference_energies.keys()
    )
    for z, e in mem.reference_energies.items():
        assert disk.reference_energies[z] == pytest.approx(e, rel=1e-9, abs=1e-9)
    for name in ("energy_shift", "energy_std", "force_rms", "avg_num_neighbors"):
        assert getattr(disk, name) == pytest.approx(getattr(mem, name), rel=1e-9, abs=1e-12), name
    for g, h in zip(mem.valid, disk.valid, strict=False):
        _assert_same_graph(g, h)


def test_two_epochs_from_the_set_give_the_same_loss_as_from_extxyz(data, tmp_path):
    a = train_potential(_config(data / "train.xyz", tmp_path / "xyz"))
    b = train_potential(_config(data / "train.mlipdb", tmp_path / "db"))
    assert len(a.history) == len(b.history) == 2
    for row_a, row_b in zip(a.history, b.history, strict=False):
        for key in ("train_loss", "valid_loss"):
            assert row_b[key] == pytest.approx(row_a[key], rel=1e-6), key
    wrong = _config(data / "train.mlipdb", tmp_path / "c", r_max=3.0)
    with pytest.raises(DataError, match="converted with r_max 4.0, not 3.0"):
        prepare_data(wrong)


def test_cli_convert_and_eval_accept_the_set(data, tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli.mlipdb"
    result = runner.invoke(
        app, ["convert", "--data", str(data / "train.xyz"), "--out", str(out), "--r-max", "4.0"]
    )
    assert result.exit_code == 0, result.output
    assert "15 frames" in result.output and is_store(out)
    result = runner.invoke(
        app, ["convert", "--data", str(data / "train.xyz"), "--out", str(out), "--r-max", "4"]
    )
    assert result.exit_code == 1 and "--overwrite" in result.output
    model = train_potential(
        _config(data / "train.xyz", tmp_path / "m").updated(train={"epochs": 1})
    ).model_path
    metrics = {}
    for name, source in (("xyz", data / "train.xyz"), ("db", out)):
        result = runner.invoke(
            app,
            [
                "eval",
                "-m",
                str(model),
                "--data",
                str(source),
                "-u",
                "energy",
                "--index",
                "0:12",
                "--out",
                str(tmp_path / f"{name}.json"),
                "--predictions",
                str(tmp_path / f"{name}.xyz"),
            ],
        )
        assert result.exit_code == 0, result.output
        metrics[name] = json.loads((tmp_path / f"{name}.json").read_text())
    for key in ("n_frames", "energy_mae_meV_atom", "forces_mae_meV_A"):
        assert metrics["db"][key] == pytest.approx(metrics["xyz"][key], rel=1e-9), key
    pred_a, pred_b = ase.io.read(tmp_path / "xyz.xyz", ":"), ase.io.read(tmp_path / "db.xyz", ":")
    assert [a.info["mlip_unc_energy"] for a in pred_a] == pytest.approx(
        [b.info["mlip_unc_energy"] for b in pred_b]
    )
