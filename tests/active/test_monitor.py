import csv

import numpy as np
import pytest
from ase import units
from ase.build import bulk
from ase.io import read
from ase.md.velocitydistribution import thermalize_momenta
from ase.md.verlet import VelocityVerlet

from mlip_unc.active.monitor import CSV_COLUMNS, UncertaintyLimitReached, UncertaintyMonitor


def _md(fake_calc_factory, threshold):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    thermalize_momenta(atoms, temperature_K=600, rng=np.random.default_rng(0))
    calc = fake_calc_factory(atoms.positions.copy(), threshold=threshold)
    atoms.calc = calc
    return atoms, calc, VelocityVerlet(atoms, 2.0 * units.fs)


def test_logs_every_interval_and_writes_flagged_frames(tmp_path, fake_calc_factory):
    atoms, calc, dyn = _md(fake_calc_factory, threshold=0.03)
    monitor = UncertaintyMonitor(atoms, tmp_path / "md.csv", flagged_path=tmp_path / "flag.xyz", dyn=dyn)
    dyn.attach(monitor, interval=5)
    dyn.run(20)
    monitor.close()
    rows = list(csv.DictReader((tmp_path / "md.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 5, 10, 15, 20]
    assert tuple(rows[0]) == CSV_COLUMNS
    assert float(rows[2]["time_ps"]) == pytest.approx(0.02)
    assert all(float(r["etot"]) == pytest.approx(float(r["epot"]) + float(r["ekin"])) for r in rows)
    flagged = read(tmp_path / "flag.xyz", ":")
    assert len(flagged) == monitor.n_flags == sum(int(r["flag"]) for r in rows) > 0
    frame = flagged[-1]
    assert frame.info["max_force_std"] > 0.03 and frame.arrays["forces_std"].shape == (4, 3)
    assert "mlip_forces" in frame.arrays and frame.calc is None  # predictions never pass as labels
    # One model call per MD step: monitoring reuses the cached results.
    assert calc.n_calls == 21


def test_stop_after_max_flags_raises(tmp_path, fake_calc_factory):
    atoms, _, dyn = _md(fake_calc_factory, threshold=1e-6)
    monitor = UncertaintyMonitor(atoms, tmp_path / "md.csv", dyn=dyn, max_flags=3)
    dyn.attach(monitor, interval=2)
    with pytest.raises(UncertaintyLimitReached, match="3 flagged") as err:
        dyn.run(100)
    assert monitor.stop_requested and err.value.step == 4 and monitor.n_flags == 3


def test_stop_flag_mode_only_sets_attribute(tmp_path, fake_calc_factory):
    atoms, _, dyn = _md(fake_calc_factory, threshold=1e-6)
    monitor = UncertaintyMonitor(atoms, tmp_path / "md.csv", dyn=dyn, max_flags=1, on_limit="flag")
    dyn.attach(monitor, interval=1)
    dyn.run(3)
    assert monitor.stop_requested and monitor.n_flags == 4
