"""The ASE contract of UncertaintyCalculator, on a tiny untrained model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ase import Atoms, units
from ase.build import bulk
from ase.calculators.calculator import PropertyNotImplementedError
from ase.calculators.fd import calculate_numerical_forces, calculate_numerical_stress
from ase.calculators.test import gradient_test
from ase.md.velocitydistribution import thermalize_momenta
from ase.md.verlet import VelocityVerlet
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.calculator import (
    NonFiniteResultError,
    ThresholdError,
    Thresholds,
    UncertaintyCalculator,
)
from mlip_unc.data import TypeMap, atoms_to_graph
from mlip_unc.data.domain import CoincidentAtomsError, DomainGuard
from mlip_unc.data.errors import DataError
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.committee import Committee
from mlip_unc.models.potential import BayesianPotential

R_MAX = 4.0


def tiny_model(dtype=torch.float64, seed=0) -> BayesianPotential:
    torch.manual_seed(seed)
    backbone = build_backbone(
        "gin", num_types=2, r_max=R_MAX, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(backbone, [8, 29], R_MAX, torch.tensor([-1.0, -3.0]), init_std=0.3)
    return model.to(dtype)


@pytest.fixture
def cu() -> Atoms:
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.rattle(0.05, seed=1)
    return atoms


def training_cells() -> list[Atoms]:
    """Rattled Cu cells: the 'training data' of the domain guard."""
    cells = []
    for seed in range(4):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms.rattle(0.05, seed=seed + 10)
        cells.append(atoms)
    return cells


@pytest.fixture
def guarded_checkpoint(tmp_path) -> Path:
    """tiny_model() saved with a domain guard fitted on training_cells() in its metadata."""
    guard = DomainGuard.fit(training_cells(), R_MAX)
    path = tmp_path / "guarded.pt"
    tiny_model().save(path, metadata={"domain": guard.to_dict()})
    return path


@pytest.fixture
def calc() -> UncertaintyCalculator:
    return UncertaintyCalculator(tiny_model(), thresholds={"max_force_std": 1e-3})


def test_gradient_test_forces_match_energy_differences(cu, calc):
    cu.calc = calc
    f_analytic, f_numeric = gradient_test(cu, indices=[0, 2])  # ends at eps = 1e-8
    assert np.abs(f_numeric - f_analytic).max() < 1e-5
    f_numeric = calculate_numerical_forces(cu, eps=1e-4)
    assert np.abs(f_numeric - cu.get_forces()).max() < 1e-7


def test_stress_matches_strain_derivative(cu, calc):
    cu.calc = calc
    stress = cu.get_stress()
    assert stress.shape == (6,)
    assert np.allclose(stress, calculate_numerical_stress(cu, eps=1e-5), atol=1e-8)


ORDERS = [
    ("forces", "max_force_std", "energy_std", "stress"),
    ("max_force_std", "forces", "stress", "energy"),
    ("energy_std", "forces", "forces_std", "energy"),
    ("energy", "stress", "forces_var", "flag"),
]


@pytest.mark.parametrize(
    "mode", ["auto", "lowrank", "sketch", "exact", "sampled", "energy", "none"]
)
@pytest.mark.parametrize("order", ORDERS)
def test_one_model_call_per_structure_in_any_order(cu, mode, order):
    """Whatever ASE asks first, the backbone runs once per new structure; the rest is cached."""
    model = tiny_model()
    if mode in ("auto", "lowrank", "sketch"):
        d = model.posterior_width
        model.set_full_posterior(0.5 * torch.eye(d), torch.tensor([1.0, 1.0, 0.01, 0.01]))
    calc = UncertaintyCalculator(model, uncertainty=mode)
    forwards = []
    # backbone passes over this structure (the isolated-atom reference, cached once, is not one)
    calc.model.backbone.register_forward_hook(
        lambda _m, _i, z: forwards.append(1) if z.shape[0] == len(cu) else None
    )
    cu.calc = calc
    for step in range(2):
        for name in order:
            if name in calc.implemented_properties:
                calc.get_property(name, cu)
        cu.get_forces(), cu.get_potential_energy()
        assert calc.n_model_calls == step + 1 and len(forwards) == step + 1
        cu.positions[0, 0] += 0.01
    served = set(calc.results)
    assert {"energy", "forces", "stress"} <= served
    if mode in ("auto", "lowrank", "sketch", "exact", "sampled"):
        assert {"forces_std", "max_force_std", "stress_std", "energy_std"} <= served
    elif mode == "energy":
        assert "energy_std" in served and "forces_std" not in served


FORCE_MODES = ["exact", "sampled", "lowrank", "sketch", "auto"]


@pytest.mark.parametrize("mode", FORCE_MODES)
def test_every_listed_property_is_reachable(cu, mode, guarded_checkpoint):
    model = tiny_model()
    calc = UncertaintyCalculator(
        guarded_checkpoint, uncertainty=mode, thresholds=Thresholds(max_force_std=1e-6)
    )
    n = len(cu)
    shapes = {
        "forces": (n, 3),
        "forces_std": (n, 3),
        "forces_var": (n, 3),
        "forces_epistemic_var": (n, 3),
        "energies": (n,),
        "energies_std": (n,),
        "stress": (6,),
        "stress_var": (6,),
        "stress_std": (6,),
        "stress_epistemic_var": (6,),
    }
    assert calc.implemented_properties == UncertaintyCalculator.implemented_properties
    for name in UncertaintyCalculator.implemented_properties:
        value = calc.get_property(name, cu)
        assert np.shape(value) == shapes.get(name, ()), name
    r = calc.results
    assert set(r) == set(UncertaintyCalculator.implemented_properties)
    assert r["free_energy"] == r["energy"] and r["flag"] is True and r["uncertainty_flag"] is True
    assert r["out_of_domain"] is False and r["out_of_domain_reason"] == ""
    assert np.allclose(r["energies"].sum(), r["energy"])
    # totals = epistemic + aleatoric, numerically, with the model's own noise
    sigma_e2, sigma_f2 = model.energy_noise.item() ** 2, model.force_noise.item() ** 2
    assert r["energy_aleatoric_var"] == pytest.approx(n * sigma_e2)
    assert r["energy_var"] == pytest.approx(r["energy_epistemic_var"] + r["energy_aleatoric_var"])
    assert r["energy_std"] ** 2 == pytest.approx(r["energy_var"])
    assert np.allclose(r["forces_var"], r["forces_epistemic_var"] + sigma_f2, rtol=1e-12, atol=0)
    assert (
        np.allclose(r["forces_std"] ** 2, r["forces_var"]) and r["forces_epistemic_var"].max() > 0
    )
    assert (
        np.allclose(r["stress_var"], r["stress_epistemic_var"])
        and r["stress_epistemic_var"].max() > 0
    )
    assert np.allclose(r["stress_std"] ** 2, r["stress_var"])
    # max_force_std is EPISTEMIC (the flagging score): the noise would add sqrt(3) sigma_f everywhere
    assert r["max_force_std"] == pytest.approx(np.sqrt(r["forces_epistemic_var"].sum(1)).max())
    assert r["max_force_std"] < np.sqrt(r["forces_var"].sum(1)).max()


@pytest.mark.parametrize("mode", FORCE_MODES)
def test_totals_use_the_models_noise_variances_with_a_full_posterior(cu, mode):
    model = tiny_model()
    if not hasattr(model, "set_full_posterior"):
        pytest.skip("the model has no full posterior yet")
    d = model.latent_dim
    factor = torch.linalg.cholesky(
        0.05 * torch.eye(d, dtype=torch.float64) + 0.01
    ).T  # Sigma = F^T F
    model.set_full_posterior(factor, torch.tensor([2.0, 3.0, 4e-4, 0.09], dtype=torch.float64))
    calc = UncertaintyCalculator(model, uncertainty=mode)
    calc.get_property("stress_var", cu)
    r = calc.results
    batch = Batch.from_data_list([atoms_to_graph(cu, R_MAX, TypeMap.from_list(model.type_map))])
    noise = model.noise_variances(batch)
    assert np.allclose(r["forces_var"] - r["forces_epistemic_var"], noise[keys.FORCES].numpy())
    assert r["energy_aleatoric_var"] == pytest.approx(noise[keys.ENERGY].item())
    assert r["energy_var"] == pytest.approx(r["energy_epistemic_var"] + r["energy_aleatoric_var"])
    assert r["forces_epistemic_var"].max() > 0 and r["stress_epistemic_var"].max() > 0


def test_stress_variance_is_the_models_in_voigt_order(cu):
    model = tiny_model()
    calc = UncertaintyCalculator(model, uncertainty="exact")
    var = calc.get_property("stress_epistemic_var", cu)
    graph = atoms_to_graph(cu, R_MAX, TypeMap.from_list(model.type_map))
    full = model(Batch.from_data_list([graph]), compute_stress=True, uncertainty="exact")[
        keys.STRESS_VAR
    ][0]
    full = full.detach().numpy()  # (3, 3)
    assert np.allclose(
        var, [full[0, 0], full[1, 1], full[2, 2], full[1, 2], full[0, 2], full[0, 1]]
    )
    molecule = Atoms("O2", positions=[[0, 0, 0], [0, 0, 1.2]])
    with pytest.raises(PropertyNotImplementedError, match="periodic"):
        calc.get_property("stress_var", molecule)
    calc.calculate(molecule)  # default properties: no stress-like ones without a periodic cell
    assert "stress_var" not in calc.results and "forces_var" in calc.results


def test_committee_with_stress(cu):
    members = [tiny_model(seed=0), tiny_model(seed=1), tiny_model(seed=2)]
    calc = UncertaintyCalculator(Committee(members).eval(), uncertainty="exact")
    assert "alignment" not in calc.implemented_properties
    calc.get_property("stress_var", cu)  # one call computes everything cheaper with it
    r = calc.results
    singles = [UncertaintyCalculator(m, uncertainty="none") for m in members]
    stresses = np.stack([c.get_property("stress", cu) for c in singles])  # (M, 6)
    forces = np.stack([c.get_property("forces", cu) for c in singles])  # (M, n, 3)
    assert np.allclose(r["stress"], stresses.mean(0)) and np.allclose(r["forces"], forces.mean(0))
    assert (
        np.allclose(r["stress_epistemic_var"], stresses.var(0))
        and r["stress_epistemic_var"].max() > 0
    )
    assert np.allclose(r["stress_var"], r["stress_epistemic_var"])
    sigma_f2 = np.mean([m.force_noise.item() ** 2 for m in members])
    assert np.allclose(r["forces_epistemic_var"], forces.var(0))
    assert np.allclose(r["forces_var"], forces.var(0) + sigma_f2)
    assert r["energies_std"].shape == (len(cu),) and r["energy_var"] > r["energy_epistemic_var"]


def test_sampled_mode_is_reproducible_and_close_to_exact(cu):
    model = tiny_model()
    a = UncertaintyCalculator(model, uncertainty="sampled", n_samples=4, seed=3)
    b = UncertaintyCalculator(model, uncertainty="sampled", n_samples=4, seed=3)
    assert np.array_equal(a.get_property("forces_var", cu), b.get_property("forces_var", cu))
    big = UncertaintyCalculator(model, uncertainty="sampled", n_samples=400, seed=3)
    exact = UncertaintyCalculator(model, uncertainty="exact")
    ratio = big.get_property("forces_var", cu).sum() / exact.get_property("forces_var", cu).sum()
    assert ratio == pytest.approx(1.0, abs=0.2)


def test_default_properties_and_thread_count_untouched(cu):
    threads = torch.get_num_threads()
    calc = UncertaintyCalculator(tiny_model())
    molecule = Atoms("OCu", positions=[[0, 0, 0], [0, 0, 1.9]])
    calc.calculate(molecule)  # properties=None: everything but stress (not periodic)
    assert "stress" not in calc.results and "forces_std" in calc.results
    calc.calculate(cu)
    assert calc.results["stress"].shape == (6,)
    assert torch.get_num_threads() == threads


def test_float32_agrees_with_float64(cu):
    model = tiny_model()
    e64 = UncertaintyCalculator(model, dtype=torch.float64)
    e32 = UncertaintyCalculator(model, dtype="float32")
    assert e32.dtype == torch.float32 and model.dtype == torch.float64  # caller's model untouched
    assert e32.get_property("energy", cu) == pytest.approx(e64.get_property("energy", cu), abs=1e-4)
    assert np.allclose(e32.get_property("forces", cu), e64.get_property("forces", cu), atol=1e-4)


def test_unknown_element_named_and_modes_restrict_properties(cu):
    calc = UncertaintyCalculator(tiny_model(), uncertainty="energy")
    with pytest.raises(DataError, match="element Au"):
        calc.get_property("energy", bulk("Au"))
    assert (
        "forces_std" not in calc.implemented_properties
        and "energy_std" in calc.implemented_properties
    )
    with pytest.raises(PropertyNotImplementedError):
        calc.get_property("forces_std", cu)
    molecule = Atoms("O2", positions=[[0, 0, 0], [0, 0, 1.2]])
    with pytest.raises(PropertyNotImplementedError, match="periodic"):
        calc.get_property("stress", molecule)
    none = UncertaintyCalculator(tiny_model(), uncertainty="none")
    assert none.implemented_properties == ["energy", "free_energy", "forces", "stress", "energies"]
    assert "flag" in UncertaintyCalculator.implemented_properties  # class list untouched


def test_thresholds_absolute_and_relative(tmp_path, cu):
    model = tiny_model()
    loose = UncertaintyCalculator(
        model, thresholds={"max_force_std": 1e3, "energy_std_per_atom": 1e3}
    )
    assert loose.get_property("flag", cu) is False
    with pytest.raises(ThresholdError, match="uncertainty_levels"):
        UncertaintyCalculator(model, thresholds=Thresholds(max_force_std=2.0, relative=True))
    with pytest.raises(ThresholdError, match="needs uncertainty"):
        UncertaintyCalculator(model, uncertainty="energy", thresholds={"max_force_std": 0.1})
    model.save(
        tmp_path / "m.pt",
        metadata={"uncertainty_levels": {"max_force_std": 0.01, "energy_std_per_atom": 0.002}},
    )
    rel = UncertaintyCalculator(
        tmp_path / "m.pt", thresholds={"max_force_std": 3.0, "relative": True}
    )
    assert (
        rel.thresholds.max_force_std == pytest.approx(0.03)
        and rel.thresholds.energy_std_per_atom is None
    )
    energy_only = UncertaintyCalculator(
        model, uncertainty="energy", thresholds={"energy_std_per_atom": 1e-9}
    )
    assert energy_only.get_property("flag", cu) is True
    assert "forces" in energy_only.results and "forces_std" not in energy_only.results  # one pass


@pytest.mark.parametrize("mode", ["exact", "energy", "none"])
def test_domain_guard_from_the_checkpoint(guarded_checkpoint, mode):
    calc = UncertaintyCalculator(guarded_checkpoint, uncertainty=mode)
    assert isinstance(calc.domain, DomainGuard) and "out_of_domain" in calc.implemented_properties
    for atoms in training_cells():  # the training structures themselves are in domain
        assert calc.get_property("out_of_domain", atoms) is False
        assert (
            calc.results["out_of_domain_reason"] == "" and calc.results.get("flag", False) is False
        )
    close = training_cells()[0]
    close.positions[1] = close.positions[0] + [0.1, 0.0, 0.0]
    assert calc.get_property("out_of_domain", close) is True
    assert (
        "short_pair" in calc.results["out_of_domain_reason"]
        and "atoms 0 and 1" in calc.results["out_of_domain_reason"]
    )
    assert calc.results.get("flag", True) is True  # flagged without any sigma threshold
    stretched = training_cells()[1]
    stretched.set_cell(stretched.cell * 1.25, scale_atoms=True)
    calc.calculate(stretched, ["energy"])  # computed with the energy, whatever was asked
    assert (
        calc.results["out_of_domain"] is True
        and "stretched" in calc.results["out_of_domain_reason"]
    )
    if mode != "none":
        assert calc.results["flag"] is True and calc.results["uncertainty_flag"] is False


def test_domain_guard_argument_and_its_absence(cu):
    guard = DomainGuard.fit(training_cells(), R_MAX)
    calc = UncertaintyCalculator(tiny_model(), domain=guard.to_dict())
    assert calc.domain == guard and calc.get_property("out_of_domain", cu) is False
    plain = UncertaintyCalculator(tiny_model())
    assert "out_of_domain" not in plain.implemented_properties
    with pytest.raises(PropertyNotImplementedError):
        plain.get_property("out_of_domain", cu)
    far = UncertaintyCalculator(tiny_model(), domain=DomainGuard.fit(training_cells(), R_MAX + 1.0))
    assert far.get_property("out_of_domain", cu) is False  # the guard's own neighbour list


@pytest.mark.parametrize("guarded", [False, True])
def test_coincident_atoms_raise_before_the_model_runs(cu, guarded, guarded_checkpoint):
    calc = UncertaintyCalculator(guarded_checkpoint if guarded else tiny_model())
    cu.positions[2] = cu.positions[3] + [0.0, 0.004, 0.0]
    with pytest.raises(CoincidentAtomsError, match=r"atoms 2 \(Cu\) and 3 \(Cu\)") as err:
        calc.get_property("energy", cu)
    assert isinstance(err.value, ValueError) and calc.n_model_calls == 0 and not calc.results
    with pytest.raises(ValueError, match="coincident"):
        calc.latent(cu)


def test_non_finite_results_raise_naming_the_property(cu):
    model = tiny_model()
    with torch.no_grad():
        model.head.weight_mu[0, 0] = float("nan")
    calc = UncertaintyCalculator(model, uncertainty="exact")
    with pytest.raises(NonFiniteResultError, match=r"non-finite energy.* 4 atoms"):
        calc.get_property("energy", cu)
    assert not calc.results  # nothing cached
    model = tiny_model()
    with torch.no_grad():
        model.head.weight_rho[0, 0] = float("nan")  # finite means, non-finite variances
    calc = UncertaintyCalculator(model, uncertainty="exact")
    with pytest.raises(NonFiniteResultError, match=r"non-finite energy_var, energy_std") as err:
        calc.get_property("forces_var", cu)
    assert "forces_var" in str(err.value) and "forces," not in str(err.value)


# Velocity Verlet at 0.5 fs on a smooth potential: |E_tot(t) - E_tot(0)| stays below 1e-5 eV/atom
# over 200 steps (observed: ~2e-8 eV/atom, while E_pot itself swings by ~1e-2 eV/atom). A
# force/energy mismatch or a discontinuity at the cutoff would show up far above this.
TOLERANCE_EV_PER_ATOM = 1e-5


def test_nve_200_steps_conserves_energy():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True) * (2, 1, 1)
    thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(0))
    atoms.calc = UncertaintyCalculator(tiny_model(), uncertainty="energy")
    dyn = VelocityVerlet(atoms, 0.5 * units.fs)
    etot = []
    dyn.attach(lambda: etot.append(atoms.get_total_energy()), interval=1)
    dyn.run(200)
    etot = np.asarray(etot) / len(atoms)
    assert len(etot) == 201
    assert np.abs(etot - etot[0]).max() < TOLERANCE_EV_PER_ATOM
    assert atoms.get_temperature() > 10  # the atoms moved
    assert atoms.calc.n_model_calls == 201  # get_total_energy reuses the forces call


@pytest.mark.slow
def test_nve_20000_steps_drift(capsys):
    """Long NVE (20,000 steps of 1 fs, 8 Cu atoms at 300 K): no drift and no blow-up. The drift
    (slope of a linear fit of E_tot per atom against time) is printed for the record."""
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True) * (2, 1, 1)
    thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(1))
    atoms.calc = UncertaintyCalculator(tiny_model(), uncertainty="energy")
    dyn = VelocityVerlet(atoms, 1.0 * units.fs)
    etot = []
    dyn.attach(lambda: etot.append(atoms.get_total_energy() / len(atoms)), interval=10)
    dyn.run(20_000)
    etot = np.asarray(etot)
    t_ps = np.arange(len(etot)) * 10 * 1e-3
    slope = np.polyfit(t_ps, etot, 1)[0]  # eV/atom/ps
    with capsys.disabled():
        print(
            f"\nNVE 20,000 x 1 fs: drift {slope:.2e} eV/atom/ps, max |dE| {np.abs(etot - etot[0]).max():.2e} eV/atom"
        )
    assert np.all(np.isfinite(etot)) and len(etot) == 2001
    assert abs(slope) < 1e-5 and np.abs(etot - etot[0]).max() < 1e-4


def _full_posterior_model() -> BayesianPotential:
    model = tiny_model()
    d = model.posterior_width
    model.set_full_posterior(0.5 * torch.eye(d), torch.tensor([1.0, 1.0, 0.01, 0.01]))
    return model


def test_monitored_md_runs_one_forward_a_step_and_sigma_only_on_monitored_steps(tmp_path, cu):
    """MD asks for forces every step and the monitor for sigma every ``interval`` steps: the
    backbone runs once a step, the force-uncertainty backward passes only on monitored steps."""
    import mlip_unc.models.full_posterior as fp
    from mlip_unc.active.monitor import run_md
    from mlip_unc.config import MDSettings

    calc = UncertaintyCalculator(_full_posterior_model(), uncertainty="auto")
    forwards, sigma_passes = [], []
    calc.model.backbone.register_forward_hook(
        lambda _m, _i, z: forwards.append(1) if z.shape[0] == len(cu) else None
    )
    original = fp.full_derivatives

    def counted(*args, **kwargs):
        sigma_passes.append(1)
        return original(*args, **kwargs)

    fp.full_derivatives = counted
    try:
        settings = MDSettings(temperature=300, steps=20, timestep=1.0, interval=5)
        result = run_md(cu, calc, settings, tmp_path / "md", plot=False)
    finally:
        fp.full_derivatives = original
    monitored = len(result.log["step"])
    assert monitored == 5  # steps 0, 5, 10, 15, 20
    assert len(forwards) == calc.n_model_calls == 21  # the start and one per step
    assert len(sigma_passes) == calc.n_uncertainty_calls == monitored
    assert np.all(np.isfinite(result.log["max_force_std"]))


@pytest.mark.parametrize("mode", ["lowrank", "exact", "sketch", "sampled", "auto"])
def test_on_demand_sigma_equals_the_one_call_mode(cu, mode):
    """Forces first, then sigma (on demand, one forward pass) gives what asking for sigma
    first gives; ``auto`` on demand is ``lowrank``."""
    model = _full_posterior_model()
    lazy = UncertaintyCalculator(model, uncertainty=mode)
    eager = UncertaintyCalculator(
        model, uncertainty="lowrank" if mode == "auto" else mode, on_demand=False
    )
    for calc in (lazy, eager):
        atoms = cu.copy()
        atoms.calc = calc
        atoms.get_forces()
        calc.get_property("max_force_std", atoms)
        calc.get_property("stress_std", atoms)
        assert calc.n_model_calls == 1
    for key in ("forces", "stress", "energy", "forces_var", "max_force_std", "stress_var"):
        np.testing.assert_allclose(lazy.results[key], eager.results[key], rtol=1e-10, atol=1e-12)
    assert lazy.n_uncertainty_calls == 1 and eager.n_uncertainty_calls == 0


@pytest.mark.parametrize("n", [3, 9, pytest.param(22, marks=pytest.mark.slow)])
def test_on_demand_sigma_at_size_is_lowrank(n):
    """``auto`` asked on demand equals ``lowrank`` asked at once at 27, 729 and 10,648 atoms
    (past 256 / r atoms ``auto`` asked at once would sketch)."""
    atoms = bulk("Cu", "sc", a=2.6) * (n, n, n)
    atoms.rattle(0.05, seed=3)
    model = _full_posterior_model()
    lazy = UncertaintyCalculator(model, uncertainty="auto")
    eager = UncertaintyCalculator(model, uncertainty="lowrank", on_demand=False)
    for calc in (lazy, eager):
        calc.get_forces(atoms)
        calc.get_property("max_force_std", atoms)
    np.testing.assert_allclose(
        lazy.results["forces_var"], eager.results["forces_var"], rtol=1e-9, atol=1e-14
    )
    assert lazy.results["max_force_std"] == pytest.approx(eager.results["max_force_std"], rel=1e-9)
