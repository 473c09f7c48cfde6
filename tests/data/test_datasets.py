"""open_dataset / select_frames: one path from a structure file or an on-disk set to a dataset."""

from __future__ import annotations

import ase
import ase.io
import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator

from mlip_unc import keys
from mlip_unc.data import DataError, TypeMap
from mlip_unc.data.datasets import open_dataset, select_frames
from mlip_unc.data.ondisk import OnDiskDataset
from mlip_unc.data.ondisk_write import convert_files

R_MAX = 4.0


def _labelled(atoms: ase.Atoms, forces: bool = True) -> ase.Atoms:
    atoms.calc = EMT()
    labels = {"energy": atoms.get_potential_energy()}
    if forces:
        labels["forces"] = atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, **labels)
    return atoms


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """6 rattled Cu/Al cells with an isolated Cu atom at position 2, as a file and as a set."""
    root = tmp_path_factory.mktemp("open")
    frames = []
    for k in range(6):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        if k % 2:
            atoms[0].symbol = "Al"
        atoms.rattle(0.08, seed=k)
        frames.append(_labelled(atoms))
    frames.insert(2, _labelled(ase.Atoms("Cu", positions=[[0, 0, 0]])))
    ase.io.write(root / "train.xyz", frames)
    convert_files(root / "train.xyz", root / "train.mlipdb", r_max=R_MAX)
    return root


_COMPARED = (keys.POSITIONS, keys.EDGE_INDEX, keys.ATOM_TYPE, keys.ENERGY, keys.FORCES)


@pytest.mark.parametrize(
    "index, expected", [(":", [0, 1, 3, 4, 5, 6]), ("1:6", [1, 3, 4, 5]), ("-1", [6])]
)
def test_a_file_and_its_set_give_the_same_dataset(files, index, expected):
    """The one-atom frame (2) is dropped; the frame indices are those of the file."""
    type_map = TypeMap((13, 29))
    kw = {"r_max": R_MAX, "type_map": type_map, "index": index, "multi_atom": True}
    memory = open_dataset(files / "train.xyz", **kw)
    disk = open_dataset(files / "train.mlipdb", **kw)
    assert isinstance(disk, OnDiskDataset) and not isinstance(memory, OnDiskDataset)
    assert len(memory) == len(disk) == len(expected)
    for g, h, frame in zip(memory, disk, expected, strict=True):
        for key in _COMPARED:
            assert torch.equal(g[key], h[key]), key
        assert int(g[keys.FRAME_INDEX]) == int(h[keys.FRAME_INDEX]) == frame


def test_selection_keeps_frame_indices_elements_and_structures(files):
    for path in (files / "train.xyz", files / "train.mlipdb"):
        selection = select_frames(path, r_max=R_MAX)
        assert np.array_equal(selection.sizes(), [4, 4, 1, 4, 4, 4, 4])
        multi = selection.multi_atom()
        assert list(multi.indices) == [0, 1, 3, 4, 5, 6]
        assert multi.elements() == {13, 29} and selection.subset([2]).elements() == {29}
        structures = multi.structures()
        assert [len(a) for a in structures] == [4] * 6
        assert structures[2].get_potential_energy() == pytest.approx(
            ase.io.read(files / "train.xyz", index=3).get_potential_energy()
        )


def test_a_set_converted_otherwise_names_the_convert_option(files):
    with pytest.raises(DataError, match="--r-max 5.0"):
        select_frames(files / "train.mlipdb", r_max=5.0)
    with pytest.raises(DataError, match="--energy-key free_energy"):
        select_frames(files / "train.mlipdb", r_max=R_MAX, label_keys={"energy": "free_energy"})


def test_required_labels_are_checked_in_files_and_sets(files, tmp_path):
    frames = [_labelled(bulk("Cu", "fcc", a=3.6, cubic=True), forces=k != 1) for k in range(3)]
    ase.io.write(tmp_path / "partial.xyz", frames)
    convert_files(tmp_path / "partial.xyz", tmp_path / "partial.mlipdb", r_max=R_MAX)
    for name in ("partial.xyz", "partial.mlipdb"):
        assert len(select_frames(tmp_path / name, r_max=R_MAX)) == 3  # nothing required
        with pytest.raises(DataError, match="frame 1"):
            select_frames(tmp_path / name, r_max=R_MAX, required={"forces": True})
    with pytest.raises(DataError, match="bad frame index"):
        select_frames(files / "train.mlipdb", r_max=R_MAX, index="9")
