"""benchmarks/mlearn_surfaces.py on tiny mlearn-layout files made here (EMT Cu bulk and slabs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ase.build
import pytest
from ase.calculators.emt import EMT
from pymatgen.io.ase import AseAtomsAdaptor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import mlearn_surfaces  # noqa: E402

A0 = 3.59  # near EMT copper's lattice constant


def _entry(atoms, group: str, shift_per_atom: float = 0.0) -> dict:
    atoms.calc = EMT()
    energy = atoms.get_potential_energy() + shift_per_atom * len(atoms)
    return {
        "structure": AseAtomsAdaptor.get_structure(atoms).as_dict(),
        "group": group,
        "outputs": {"energy": energy, "forces": atoms.get_forces().tolist()},
    }


def _files(root: Path, shift: float) -> Path:
    """Cu bulk (Elastic) frames and fcc(111) / fcc(100) slabs of 3-6 layers; slab labels + ``shift`` eV/atom."""
    folder = root / "structures" / "mlearn" / "Si"
    folder.mkdir(parents=True)
    bulk = [
        _entry(ase.build.bulk("Cu", "fcc", a=A0 * s, cubic=True), "Elastic")
        for s in (0.99, 1.0, 1.01)
    ]
    slabs = [
        _entry(ase.build.fcc111("Cu", size=(1, 1, k), vacuum=6.0, a=A0), "Surface", shift)
        for k in (3, 4, 6)
    ]
    slabs += [
        _entry(ase.build.fcc100("Cu", size=(1, 1, k), vacuum=6.0, a=A0), "Surface", shift)
        for k in (3, 5)
    ]
    (folder / "training.json").write_text(
        json.dumps(bulk + slabs[:4], default=lambda o: o.tolist())
    )
    (folder / "test.json").write_text(json.dumps(slabs[4:], default=lambda o: o.tolist()))
    return folder


def test_a_per_atom_offset_on_the_slab_labels_is_found_and_leaves_gamma(tmp_path):
    clean = mlearn_surfaces.analyse(_files(tmp_path / "a", 0.0), 5.0, 200, 0)
    shifted = mlearn_surfaces.analyse(_files(tmp_path / "b", -0.1), 5.0, 200, 0)
    assert clean["surface_frames"] == shifted["surface_frames"] == 5
    assert (
        abs(clean["delta_meV_atom"]) < 15.0
    )  # consistent labels: no offset beyond EMT's facet spread
    assert shifted["delta_meV_atom"] == pytest.approx(clean["delta_meV_atom"] - 100.0, abs=1e-6)
    assert shifted["gamma_J_m2"] == pytest.approx(clean["gamma_J_m2"], abs=1e-9)
    assert 0.3 < clean["gamma_J_m2"] < 3.0  # a metal's surface energy, J/m^2
    assert {f["part"] for f in clean["frames"]} == {"training", "test"}
    assert all(f["vacuum_axis"] == 2 and f["gap_A"] > 10.0 for f in clean["frames"])


def test_a_cell_without_vacuum_is_named_not_taken_for_a_slab():
    atoms = ase.build.bulk("Cu", "fcc", a=A0, cubic=True).repeat((1, 1, 3))
    with pytest.raises(ValueError, match=r"here.json entry 7: no vacuum gap"):
        mlearn_surfaces.slab_geometry(atoms, 5.0, "here.json entry 7")
    slab = ase.build.fcc100("Cu", size=(2, 1, 3), vacuum=4.0, a=A0)
    axis, area, gap = mlearn_surfaces.slab_geometry(slab, 5.0, "slab")
    assert (
        axis == 2
        and area == pytest.approx(2 * (A0 / 2**0.5) ** 2)
        and gap == pytest.approx(8.0, abs=1e-6)
    )


def test_main_writes_the_page_with_the_models_biases_beside(tmp_path):
    _files(tmp_path / "data", -0.05)
    out = tmp_path / "out"
    out.mkdir()
    groups = {"Si": {"gin seed 0": {"training": {"Surface": {"energy_mean_error_meV_atom": 40.0}}}}}
    (out / "mlearn_groups.json").write_text(json.dumps(groups))
    res = mlearn_surfaces.main(
        [
            "--data-root",
            str(tmp_path / "data"),
            "--sets",
            "Si",
            "--out",
            str(out),
            "--bootstrap",
            "50",
        ]
    )
    assert res["Si"]["model_training_surface_bias_meV_atom"] == {"gin seed 0": 40.0}
    text = (out / "mlearn_surfaces.md").read_text()
    assert "| Si | 5 |" in text and "gin seed 0 +40.0" in text
    assert json.loads((out / "mlearn_surfaces.json").read_text())["Si"][
        "delta_meV_atom"
    ] == pytest.approx(res["Si"]["delta_meV_atom"])
    assert (out / "mlearn_surfaces.png").stat().st_size > 1000
