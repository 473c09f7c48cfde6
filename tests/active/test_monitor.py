import csv

import numpy as np
import pytest
import torch
from ase import units
from ase.build import bulk
from ase.io import read
from ase.md.velocitydistribution import thermalize_momenta
from ase.md.verlet import VelocityVerlet

from mlip_unc.active.monitor import (
    CSV_COLUMNS,
    MDFailed,
    UncertaintyLimitReached,
    UncertaintyMonitor,
    run_md,
)
from mlip_unc.calculator import NonFiniteResultError, UncertaintyCalculator
from mlip_unc.config import MDSettings
from mlip_unc.data.domain import DomainGuard


def _md(fake_calc_factory, threshold):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    thermalize_momenta(atoms, temperature_K=600, rng=np.random.default_rng(0))
    calc = fake_calc_factory(atoms.positions.copy(), threshold=threshold)
    atoms.calc = calc
    return atoms, calc, VelocityVerlet(atoms, 2.0 * units.fs)


def test_logs_every_interval_and_writes_flagged_frames(tmp_path, fake_calc_factory):
    atoms, calc, dyn = _md(fake_calc_factory, threshold=0.03)
    monitor = UncertaintyMonitor(
        atoms, tmp_path / "md.csv", flagged_path=tmp_path / "flag.xyz", dyn=dyn
    )
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


def _guarded_calc(thresholds: dict, *, train_a: float) -> UncertaintyCalculator:
    """A tiny untrained Cu potential whose domain guard was fitted on fcc Cu with lattice ``train_a``."""
    from mlip_unc.models.potential import BayesianPotential, build_backbone

    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=1, r_max=4.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(backbone, [29], 4.0, torch.tensor([-0.01]), init_std=0.3).double()
    guard = DomainGuard.fit([bulk("Cu", "fcc", a=train_a, cubic=True)], 4.0)
    return UncertaintyCalculator(model, uncertainty="exact", thresholds=thresholds, domain=guard)


@pytest.mark.parametrize("case", ["out_of_domain", "uncertainty"])
def test_flag_reason_keeps_out_of_domain_apart_from_sigma(tmp_path, case):
    if case == "out_of_domain":  # trained on a compressed lattice: every MD frame is "stretched"
        calc = _guarded_calc({"max_force_std": 1e3}, train_a=3.2)
    else:  # in domain, but a tiny sigma threshold
        calc = _guarded_calc({"max_force_std": 1e-9}, train_a=3.6)
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.rattle(0.02, seed=0)  # non-zero force variance from the first frame
    thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(0))
    atoms.calc = calc
    dyn = VelocityVerlet(atoms, 1.0 * units.fs)
    with UncertaintyMonitor(
        atoms, tmp_path / "md.csv", flagged_path=tmp_path / "flag.xyz", dyn=dyn
    ) as monitor:
        dyn.attach(monitor, interval=2)
        dyn.run(4)
    rows = list(csv.DictReader((tmp_path / "md.csv").open()))
    ood = case == "out_of_domain"
    assert len(rows) == 3 and all(int(r["flag"]) == 1 and int(r["failed"]) == 0 for r in rows)
    assert all(
        int(r["out_of_domain"]) == ood and int(r["uncertainty_flag"]) == (not ood) for r in rows
    )
    frame = read(tmp_path / "flag.xyz", -1)
    assert frame.info["flag_reason"] == case and frame.info["out_of_domain"] == ood
    if ood:
        assert "stretched" in frame.info["out_of_domain_reason"]


def test_a_failed_frame_is_recorded_and_the_md_stops_cleanly(tmp_path, fake_calc_factory):
    class FailsAfter(fake_calc_factory):
        def calculate(self, atoms=None, properties=None, system_changes=()):
            if self.n_calls >= 5:
                raise NonFiniteResultError(
                    f"non-finite energy for a structure of {len(atoms)} atoms"
                )
            super().calculate(atoms, properties, system_changes)

    start = bulk("Cu", "fcc", a=3.6, cubic=True)
    calc = FailsAfter(start.positions.copy(), threshold=1e3)
    settings = MDSettings(ensemble="nve", temperature=300, steps=20, timestep=1.0, interval=1)
    result = run_md(start, calc, settings, tmp_path / "md", plot=False)  # no exception
    assert result.failure is not None and "non-finite energy" in result.failure
    assert result.steps_done == 4 and not result.stopped_early
    rows = list(csv.DictReader((tmp_path / "md" / "md.csv").open()))
    assert [int(r["failed"]) for r in rows] == [0, 0, 0, 0, 0, 1] and int(rows[-1]["step"]) == 5
    assert np.isnan(float(rows[-1]["epot"])) and result.log["failed"][-1] == 1
    failed = read(tmp_path / "md" / "failed.xyz")
    assert failed.info["step"] == 5 and "non-finite" in failed.info["error"]

    # the monitor's own call fails: MDFailed, with the row recorded first
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.calc = FailsAfter(atoms.positions.copy())
    monitor = UncertaintyMonitor(atoms, tmp_path / "m.csv", timestep=1.0)
    atoms.calc.n_calls = 5
    with pytest.raises(MDFailed, match="MD stopped at step 0: non-finite") as err:
        monitor()
    assert isinstance(err.value.error, NonFiniteResultError) and monitor.stop_requested
    assert monitor.failure and monitor.rows[-1]["failed"] == 1
    monitor.close()


def test_real_calculator_nan_ends_the_run_as_failed(tmp_path):
    calc = _guarded_calc({"max_force_std": 1e3}, train_a=3.6)
    with torch.no_grad():
        calc.model.head.weight_mu.fill_(float("nan"))
    settings = MDSettings(ensemble="nve", temperature=300, steps=5, timestep=1.0, interval=1)
    result = run_md(bulk("Cu", "fcc", a=3.6, cubic=True), calc, settings, tmp_path, plot=False)
    assert (
        result.failure is not None
        and "non-finite energy" in result.failure
        and "4 atoms" in result.failure
    )
    assert result.steps_done == 0 and result.log["failed"].tolist() == [1.0]
