"""A test set that holds training or validation frames is said to be no held-out test."""

from __future__ import annotations

import logging

import ase.io
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator

from mlip_unc.config import potential_config_from_dict
from mlip_unc.train.potential_data import overlap_warning, prepare_data, select_part


def _cells(n: int, seed: int) -> list:
    frames = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms.rattle(0.05, seed=seed + k)
        atoms.calc = EMT()
        energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
        frames.append(atoms)
    return frames


def _config(tmp_path, test):
    return potential_config_from_dict(
        {
            "seed": 0,
            "out": str(tmp_path / "run"),
            "data": {
                "train": str(tmp_path / "train.xyz"),
                "test": str(test),
                "valid_fraction": 0.25,
                "r_max": 4.0,
            },
            "model": {"backbone": "gin", "backbone_kwargs": {"hidden": 8, "num_layers": 1}},
        }
    )


def test_overlapping_test_frames_are_counted_and_named(tmp_path, caplog):
    train = _cells(8, seed=0)
    ase.io.write(tmp_path / "train.xyz", train)
    ase.io.write(tmp_path / "fresh.xyz", _cells(3, seed=100))
    ase.io.write(tmp_path / "mixed.xyz", [*_cells(2, seed=100), train[5], train[0]])
    ase.io.write(tmp_path / "same.xyz", train)
    with caplog.at_level(logging.WARNING, logger="mlip_unc"):
        prepare_data(_config(tmp_path, tmp_path / "fresh.xyz"))
    assert "test frames" not in caplog.text
    for name, count in (("mixed.xyz", "2 of 4"), ("same.xyz", "8 of 8")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mlip_unc"):
            data = prepare_data(_config(tmp_path, tmp_path / name))
        assert f"{count} test frames in '{tmp_path / name}' are also training or validation" in (
            caplog.text
        )
        assert data.test is not None and len(data.test) == int(count.split()[-1])
    test = select_part(_config(tmp_path, "mixed.xyz"), str(tmp_path / "mixed.xyz"), forces=False)
    fitted = select_part(_config(tmp_path, "mixed.xyz"), str(tmp_path / "train.xyz"))
    warning = overlap_warning(test.multi_atom(), [fitted], "mixed.xyz") or ""
    assert warning.startswith("2 of 4 test frames in 'mixed.xyz'") and "(frames 2, 3)" in warning
