"""Fitting the full posterior: the calibration fit, the precision, the end-to-end fit."""

from __future__ import annotations

import math

import ase.io
import pytest
import torch
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator

from mlip_unc import keys
from mlip_unc.config import potential_config_from_dict
from mlip_unc.models.full_posterior import latent_jacobian
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.posthoc.posterior import _pass, fit_full_posterior, gaussian_scale_fit
from mlip_unc.train.potential import train_potential
from mlip_unc.train.potential_data import prepare_data


def test_gaussian_scale_fit_recovers_known_scales():
    g = torch.Generator().manual_seed(0)
    var = torch.rand(20_000, generator=g, dtype=torch.float64) * 3 + 0.01
    weight = torch.randint(1, 5, (20_000,), generator=g).double()
    err = torch.randn(20_000, generator=g, dtype=torch.float64) * (0.7 * var + 0.2 * weight).sqrt()
    alpha2, noise2, nll = gaussian_scale_fit(err, var, weight)
    assert alpha2 == pytest.approx(0.7, rel=0.06) and noise2 == pytest.approx(0.2, rel=0.1)
    worse = 0.5 * (math.log(2 * math.pi) + torch.log(var) + err**2 / var).mean()
    assert nll < float(worse)


def _labelled(atoms):
    atoms.calc = EMT()
    e, f = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, energy=e, forces=f)
    return atoms


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("llpr")
    frames = []
    for k in range(24):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        if k % 3 == 0:
            atoms[1].symbol = "Al"
        atoms.rattle(0.12, seed=k)
        frames.append(_labelled(atoms))
    ase.io.write(root / "train.xyz", frames)
    config = potential_config_from_dict(
        {
            "out": str(root / "run"),
            "dtype": "float64",
            "data": {"train": str(root / "train.xyz"), "valid_fraction": 0.25, "r_max": 4.0},
            "model": {
                "backbone": "gin",
                "backbone_kwargs": {"hidden": 12, "num_layers": 2},
                "latent_dim": 8,
            },
            "train": {"epochs": 6, "batch_size": 4, "lr": 0.01, "progress": False},
        }
    )
    result = train_potential(config)
    return config, result


def test_training_attaches_a_calibrated_full_posterior(trained):
    config, result = trained
    payload = torch.load(result.model_path, weights_only=True)
    summary = payload["metadata"]["posterior"]
    assert summary["alpha2_forces"] > 0 and summary["lambda"] > 0
    assert 0 < summary["fit_seconds"] < 60  # recorded, for the fit-time table of docs/guides
    assert (
        "domain" in payload["metadata"]
        and payload["metadata"]["uncertainty_levels"]["max_force_std"] > 0
    )
    model = BayesianPotential.from_checkpoint(result.model_path)
    assert model.has_full_posterior
    # calibrated on validation: the total force variance matches the squared errors on average
    data = prepare_data(config)
    errors, variances = [], []
    for graph in data.valid.graphs:
        out = model(graph, uncertainty="exact")
        errors.append((out[keys.FORCES] - graph[keys.FORCES]).detach().reshape(-1))
        variances.append(
            (out[keys.FORCES_VAR] + model.noise_variances(graph)[keys.FORCES]).detach().reshape(-1)
        )
    ratio = float(torch.cat(errors).square().mean() / torch.cat(variances).mean())
    assert 0.5 < ratio < 2.0


def test_covariance_is_the_inverse_regularised_precision(trained):
    config, result = trained
    data = prepare_data(config)
    model = BayesianPotential.from_checkpoint(result.model_path)
    summary = fit_full_posterior(model, data.train, data.valid)
    sig_e2, sig_f2 = float(model.energy_noise.detach()) ** 2, float(model.force_noise.detach()) ** 2
    precision = torch.zeros(model.latent_dim, model.latent_dim, dtype=torch.float64)
    for graph in data.train.graphs:  # one structure at a time, written out directly
        state, _, jac = latent_jacobian(model, graph)
        phi = state.phi.detach()[0]
        precision += torch.outer(phi, phi) / (graph.num_nodes * sig_e2)
        rows = jac.reshape(model.latent_dim, -1)
        precision += rows @ rows.T / sig_f2
    precision += summary["lambda"] * torch.eye(model.latent_dim, dtype=torch.float64)
    sigma = model.full_posterior().covariance
    torch.testing.assert_close(
        sigma @ precision, torch.eye(model.latent_dim, dtype=torch.float64), rtol=0, atol=1e-6
    )
    # rows are sorted by decreasing posterior variance
    norms = model.posterior_factor.square().sum(1)
    assert (norms[:-1] >= norms[1:] - 1e-12).all()


def test_per_element_fit_is_the_inverse_regularised_precision_of_per_element_features(trained):
    config, result = trained
    data = prepare_data(config)
    model = BayesianPotential.from_checkpoint(result.model_path)
    shared_var = model(data.valid.graphs[0], uncertainty="exact")[keys.FORCES_VAR]
    model.posterior_basis = "per_element"
    summary = fit_full_posterior(model, data.train, data.valid)
    width, d = model.posterior_width, model.latent_dim
    assert width == 2 * d and model.full_posterior().n_blocks == 2
    sig_e2, sig_f2 = float(model.energy_noise.detach()) ** 2, float(model.force_noise.detach()) ** 2
    precision = summary["lambda"] * torch.eye(width, dtype=torch.float64)
    for graph in (
        data.train.graphs
    ):  # Phi_e and its Jacobian from the shared ones of each element's atoms alone
        state, _, jac = latent_jacobian(model, graph)  # shared basis: (d, n_atoms, 3)
        z = state.z.detach()
        phi = torch.cat([z[state.atom_type == e].sum(0) for e in range(2)])  # (2 d,)
        precision += torch.outer(phi, phi) / (graph.num_nodes * sig_e2)
        assert jac.shape[0] == d
        per_el, _, jac_e = latent_jacobian(model, graph, 2)  # (2 d, n_atoms, 3)
        torch.testing.assert_close(per_el.phi.detach()[0], phi)
        torch.testing.assert_close(
            jac_e.reshape(2, d, -1, 3).sum(0), jac
        )  # the blocks sum to the shared Jacobian
        rows = jac_e.reshape(width, -1)
        precision += rows @ rows.T / sig_f2
    sigma = model.full_posterior().covariance
    torch.testing.assert_close(
        sigma @ precision, torch.eye(width, dtype=torch.float64), rtol=0, atol=1e-6
    )
    again = BayesianPotential.from_checkpoint(model.to_checkpoint())
    assert again.posterior_basis == "per_element"
    per_var = again(data.valid.graphs[0], uncertainty="exact")[keys.FORCES_VAR]
    assert per_var.shape == shared_var.shape and not torch.allclose(per_var, shared_var)


def test_config_posterior_basis_reaches_the_checkpoint(trained, tmp_path):
    config, _ = trained
    raw = config.to_dict()
    raw["out"] = str(tmp_path / "run")
    raw["train"]["epochs"] = 1
    raw["model"]["posterior_basis"] = "per_element"
    result = train_potential(potential_config_from_dict(raw))
    model = BayesianPotential.from_checkpoint(result.model_path)
    assert model.posterior_basis == "per_element" and model.full_posterior().n_blocks == 2
    assert tuple(model.posterior_factor.shape) == (2 * model.latent_dim, 2 * model.latent_dim)


def test_random_subset_caps_in_order_and_is_seeded():
    from mlip_unc.posthoc.posterior import random_subset

    items = list(range(50))
    a, b = random_subset(items, 10, seed=3), random_subset(items, 10, seed=3)
    assert a == b and len(a) == 10 and a == sorted(a) and set(a) <= set(items)
    assert random_subset(items, None, 0) == items and random_subset(items, 100, 0) == items


@pytest.mark.parametrize("key", ["posterior_max_frames", "posterior_valid_frames"])
def test_posterior_frame_caps_are_validated(key):
    from mlip_unc.config import ConfigError, potential_config_from_dict

    with pytest.raises(ConfigError, match=f"model.{key}"):
        potential_config_from_dict({"data": {"train": "x.xyz"}, "model": {key: 0}})


def test_posterior_valid_frames_caps_the_force_calibration_frames(trained, tmp_path):
    """Training calibrates the forces on the capped validation subset (4-atom cells: 12
    components each); the energy calibration and the uncertainty levels read every frame."""
    config, _ = trained
    raw = config.to_dict()
    raw["out"] = str(tmp_path / "run")
    raw["train"]["epochs"] = 1
    raw["model"]["posterior_valid_frames"] = 2
    result = train_potential(potential_config_from_dict(raw))
    meta = torch.load(result.model_path, weights_only=True)["metadata"]
    n_valid = len(prepare_data(config).valid)
    assert n_valid > 2 and meta["posterior"]["n_valid_components"] == 2 * 4 * 3
    assert meta["posterior"]["n_valid_force_frames"] == 2
    assert meta["posterior"]["n_valid_energies"] == n_valid
    assert meta["uncertainty_levels"]["n_structures"] == n_valid


def test_probed_precision_averages_to_the_exact_one(trained):
    """Monte Carlo: with many sign probes the sketched force precision approaches the exact one,
    also along its least constrained direction; the energy term is exact either way."""
    config, result = trained
    data = prepare_data(config)
    model = BayesianPotential.from_checkpoint(result.model_path)
    exact = _pass(model, data.train, 8, keep=False)
    probed = _pass(model, data.train, 8, keep=False, probes=1500, seed=1)
    torch.testing.assert_close(probed["a_energy"], exact["a_energy"])
    a, b = exact["a_forces"], probed["a_forces"]
    assert float((b - a).norm() / a.norm()) < 0.05
    eig, vec = torch.linalg.eigh(a)
    u = vec[:, 0]  # least constrained
    assert float(u @ b @ u) == pytest.approx(float(eig[0]), rel=0.15)
    few = _pass(model, data.train, 8, keep=False, probes=2, seed=1)["a_forces"]
    assert float((few - a).norm() / a.norm()) > 0.05  # a sketch, not the exact sum


def test_fit_with_probes_is_seeded_and_keeps_the_validation_exact(trained):
    config, result = trained
    data = prepare_data(config)
    fits = []
    for seed in (0, 0, 1):
        model = BayesianPotential.from_checkpoint(result.model_path)
        summary = fit_full_posterior(model, data.train, data.valid, probes=3, seed=seed)
        assert summary["probes"] == 3
        assert summary["n_valid_components"] == 3 * sum(g.num_nodes for g in data.valid.graphs)
        fits.append(model.posterior_factor.detach().clone())
    torch.testing.assert_close(fits[0], fits[1])
    assert not torch.allclose(fits[0], fits[2])
    model = BayesianPotential.from_checkpoint(result.model_path)
    assert fit_full_posterior(model, data.train, None, probes=3)["probes"] is None  # in-sample


def test_probes_fall_back_to_the_exact_fit_without_forward_mode(trained, monkeypatch):
    """A backbone without forward-mode rules: a warning, the exact Jacobians, and the summary
    says no probes were used."""
    import mlip_unc.posthoc.posterior as posterior

    config, result = trained
    data = prepare_data(config)

    def no_forward_mode(*args, **kwargs):
        raise NotImplementedError("no forward-mode rule for this op")

    monkeypatch.setattr(posterior, "latent_probes", no_forward_mode)
    model = BayesianPotential.from_checkpoint(result.model_path)
    with pytest.warns(RuntimeWarning, match="forward-mode"):
        summary = fit_full_posterior(model, data.train, data.valid, probes=3)
    exact = BayesianPotential.from_checkpoint(result.model_path)
    fit_full_posterior(exact, data.train, data.valid)
    assert summary["probes"] is None
    torch.testing.assert_close(model.posterior_factor, exact.posterior_factor)


def test_calibration_rows_of_a_force_subset_keep_every_energy_row(trained):
    """The frames outside the force subset add their energy rows from a forward pass alone:
    the same rows as the full pass, in another order; the force rows are the subset's."""
    from mlip_unc.posthoc.posterior import _calibration_rows

    config, result = trained
    valid = prepare_data(config).valid
    model = BayesianPotential.from_checkpoint(result.model_path)
    full = _calibration_rows(model, valid, 4, None, seed=0)
    part = _calibration_rows(model, valid, 4, 2, seed=0)
    assert full["n_force_frames"] == len(valid) and part["n_force_frames"] == 2
    assert part["f_err"].numel() == 2 * 4 * 3 and part["jac"].shape[1] == 2 * 4 * 3
    for key in ("e_err", "n_atoms"):
        torch.testing.assert_close(part[key].sort().values, full[key].sort().values)
    order_full, order_part = full["e_err"].argsort(), part["e_err"].argsort()
    torch.testing.assert_close(part["phi"][order_part], full["phi"][order_full])
