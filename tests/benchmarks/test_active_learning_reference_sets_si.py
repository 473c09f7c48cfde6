"""The Si reference sets of the active-learning benchmark (``reference_sets_si.py``: the cells,
every set built once with a stand-in oracle, its manifest and ``--verify``; fast: no LAMMPS, no
mlearn files)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ase.calculators.lj import LennardJones
from ase.io import read

from benchmarks.active_learning import reference_sets
from benchmarks.active_learning import reference_sets_si as rsi


def lj_si() -> LennardJones:
    """A stand-in oracle for Si: Lennard-Jones with its minimum at the diamond bond length."""
    bond = rsi.LATTICE * np.sqrt(3) / 4
    return LennardJones(sigma=bond / 2 ** (1 / 6), epsilon=0.2, rc=5.0, smooth=True)


def test_cells_of_the_reference_sets():
    crystal = rsi.crystal()
    assert len(crystal) == 64 and len(rsi.vacancy_cell()) == 63
    assert rsi.min_distance([crystal]) == pytest.approx(rsi.LATTICE * np.sqrt(3) / 4)
    slab = rsi.surface_cell(10.0)
    assert len(slab) == 64 and slab.pbc.all()
    assert slab.cell.lengths()[2] == pytest.approx(np.ptp(slab.positions[:, 2]) + 10.0)
    assert rsi.min_distance([slab]) == pytest.approx(rsi.min_distance([crystal]))


def test_oracle_min_distance_from_the_manifest():
    manifest = {"sets": {"md_300K": {"min_distance": 2.1}, "md_melt": {"min_distance": 1.9}}}
    assert rsi.oracle_min_distance(manifest) == 1.9
    assert rsi.oracle_min_distance(manifest, ["md_300K"]) == 2.1
    with pytest.raises(ValueError, match="holds none"):
        rsi.oracle_min_distance({"sets": {}})


def test_build_makes_every_set_once_and_records_it(tmp_path, capsys):
    out = tmp_path / "refs"
    manifest = rsi.build(out, rsi.QUICK, rsi.SETS, oracle=lj_si())
    for name in rsi.SETS:
        entry = manifest["sets"][name]
        frames = read(out / f"{name}.xyz", ":")
        assert entry["frames"] == len(frames) and entry["sha256"] == reference_sets.sha256(
            out / f"{name}.xyz"
        )
        assert entry["min_distance"] == pytest.approx(rsi.min_distance(frames), abs=1e-4)
        assert frames[0].get_forces().shape == (entry["atoms"], 3)
    assert manifest["sets"]["md_300K"]["frames"] == rsi.QUICK.n_frames
    vacancy = read(out / "vacancy.xyz", ":")
    assert len(vacancy) == rsi.QUICK.n_defect_frames + 1 and len(vacancy[0]) == 63
    assert vacancy[0].info["relaxed"] is True
    assert json.loads((out / "manifest.json").read_text()) == manifest
    rsi.build(out, rsi.QUICK, rsi.SETS, oracle=lj_si())  # resumable: nothing made again
    assert capsys.readouterr().out.count("up to date") == len(rsi.SETS)
    record = tmp_path / "record.json"
    record.write_text(json.dumps(manifest))
    rsi.main(["--verify", "--out", str(out), "--record", str(record)])
    (out / "surface.xyz").write_text("changed")
    with pytest.raises(SystemExit, match="surface"):
        rsi.main(["--verify", "--out", str(out), "--record", str(record)])


def test_unknown_set_is_named():
    with pytest.raises(ValueError, match="unknown set 'dimer'"):
        rsi.frames_of("dimer", lj_si(), rsi.QUICK)
