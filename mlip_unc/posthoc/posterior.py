"""Fit the full-covariance last-layer posterior of a trained potential (docs/method.md s.3b).

One pass over the training set accumulates the precision of the energy head's weights from
the energy features and the force Jacobian rows of the latent sums::

    A = sum_frames Phi Phi^T / (n_atoms sigma_e^2) + sum_frames sum_ic J_ic J_ic^T / sigma_f^2

with the model's learned noises; ``Sigma(lambda) = (A + lambda I)^-1``. ``Phi`` and ``J`` are taken
in the model's ``posterior_basis`` (``per_element``: ``n_types * d`` features, as many backward
passes; :mod:`mlip_unc.models.full_posterior`). On the validation set
(the training set when there is none), for each ``lambda`` of a scale-free grid
(``c * mean eig(A)``, ``c = 1e-14 ... 1e4``) the force errors ``e_ic`` at the posterior mean and
the raw variances ``v_ic = J_ic^T Sigma J_ic`` give the two calibration scalars of the forces by
maximum likelihood, ``e ~ N(0, alpha_F^2 v + sigma_f^2)``; the ``lambda`` with the lowest
validation NLL wins, and the energies get their own ``alpha_E^2, sigma_e^2`` the same way
(per-atom noise: ``Var = alpha_E^2 v_E + n_atoms sigma_e^2``). The result is attached to the
model (:meth:`BayesianPotential.set_full_posterior`); the mean predictions do not change.

The force term of ``A`` costs ``min(D, 3 n_max)`` Jacobian products per batch. With ``probes = m``
it is sketched instead: ``m`` forward-mode products along random +-1 directions ``z`` of every
atom component give ``y = J z`` per frame, and ``mean y y^T`` estimates ``J J^T`` without bias
(``E[z z^T] = I``); the quadratic form along any fixed direction ``u`` involves only ``u^T J``,
so the least constrained directions are not swamped by the large ones. The validation pass,
which calibrates every scale, keeps the exact Jacobians, so a noisier ``A`` shows as worse
validation NLL and is scaled, not hidden.

The grid is wide on purpose, so that it does not cut off the NLL's optimum: that optimum lies
near the grid's low end on the shipped native models (docs/what-we-tried.md records the values).

``calibration="rmse"`` (``mlip-unc attach``, docs/guides/attach-calibration.md) keeps that
``lambda`` but sets each epistemic scale by moment matching on the validation set, so that the
mean predicted epistemic variance equals the mean squared error there:
``alpha^2 = mean(e^2) / mean(v)`` for the exact forces, the low-rank forces (``alpha_r^2``) and
the energies, then fits the noises by NLL at those scales. The epistemic std/RMSE is then 1 on
the validation set in every mode (the sampled mode draws with ``alpha_F^2``: unbiased for the
exact one), which the NLL fit does not promise: its scale is ``mean(e^2 / v)``-like and blows
up when ``v`` spans orders of magnitude that the errors do not. Where the features cannot carry
a calibrated posterior (a force Jacobian of effective rank below :data:`MIN_JACOBIAN_RANK`, no
variance, low-rank directions the features never move along) it raises
:class:`PosteriorCalibrationError` naming the measured quantity.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.loader import DataLoader

from mlip_unc import keys
from mlip_unc.models.derivatives import PotentialState, graph_index
from mlip_unc.models.devices import module_device, to_device
from mlip_unc.models.full_posterior import basis_state, latent_jacobian, latent_probes
from mlip_unc.uncertainty.sample_size import too_few

if TYPE_CHECKING:
    from torch_geometric.data.data import BaseData

    from mlip_unc.models.potential import BayesianPotential

__all__ = [
    "MIN_JACOBIAN_RANK",
    "MIN_LOWRANK_SHARE",
    "PosteriorCalibrationError",
    "fit_full_posterior",
    "gaussian_scale_fit",
    "moment_scale",
    "random_subset",
]

log = logging.getLogger(__name__)
_GRID = tuple(10.0**k for k in range(-14, 5))

MIN_JACOBIAN_RANK = 2.0
"""Smallest effective rank (:func:`mlip_unc.uncertainty.diagnostics.jacobian_effective_rank`) of
the features' force Jacobian over the validation components for ``calibration="rmse"``: below
it every force variance is a multiple of one direction's (sigma_F ~ |one force pattern|)."""

MIN_LOWRANK_SHARE = 1e-10
"""Smallest share ``mean(v_lowrank) / mean(v_exact)`` of the raw validation force variance that
the low-rank directions may carry for ``calibration="rmse"``: below it they are directions the
features never move along (float64 rounding of the raw variances is ~1e-16 of them) and the
low-rank mode's scale would be a ratio of rounding errors. Small shares above it are normal: on a
tiny 8-channel MACE model the 4 least constrained directions carried 7.6e-6 of the variance and
still gave std/RMSE in [0.5, 2] on held-out cells (tests/posthoc/test_mace_attach.py)."""


class PosteriorCalibrationError(ValueError):
    """The features cannot support a calibrated posterior (the message names the measurement)."""


def random_subset(items: list, limit: int | None, seed: int) -> list:
    """At most ``limit`` of ``items`` (a random subset, in their order); all for ``limit`` None or 0."""
    if not limit or len(items) <= limit:
        return list(items)
    keep = np.random.default_rng(seed).permutation(len(items))[:limit]
    return [items[k] for k in sorted(keep)]


def _batches(dataset: Any, batch_size: int) -> DataLoader:
    graphs = list(getattr(dataset, "graphs", dataset))
    return DataLoader(graphs, batch_size=batch_size, shuffle=False)


def _labelled_energies(
    state: PotentialState, batch: BaseData, energy: Tensor | None = None
) -> dict[str, Tensor]:
    """One batch's energy rows on its frames with an energy label: ``phi (n, D)`` of ``state``
    (in the posterior's basis), ``n_atoms (n,)`` and, given the predicted ``energy
    (n_graphs,)``, its error ``e_err (n,)``."""
    has_e = batch[keys.HAS_ENERGY].reshape(-1).bool()
    n_atoms = torch.bincount(state.graph, minlength=state.n_graphs).double()
    rows = {"phi": state.phi.detach().double()[has_e], "n_atoms": n_atoms[has_e]}
    if energy is not None:
        rows["e_err"] = (energy.double() - batch[keys.ENERGY].double())[has_e]
    return rows


def _pass(
    model: BayesianPotential,
    dataset: Any,
    batch_size: int,
    *,
    keep: bool,
    probes: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Precision sums over ``dataset``; with ``keep``, the per-frame features and errors too.

    ``probes`` (without ``keep``): the force term from that many random sign probes per batch
    (:func:`latent_probes`, unbiased) instead of the exact Jacobians; where the backbone has no
    forward-mode rule it warns and takes the exact Jacobians."""
    d, blocks = model.posterior_width, model.posterior_blocks  # D = blocks * latent_dim
    sig_e2 = float(model.energy_noise.detach()) ** 2
    sig_f2 = float(model.force_noise.detach()) ** 2
    device = module_device(model)
    generator = torch.Generator().manual_seed(seed)
    a_energy = torch.zeros(d, d, dtype=torch.float64, device=device)
    a_forces = torch.zeros(d, d, dtype=torch.float64, device=device)
    rows: dict[str, list[Tensor]] = {"phi": [], "e_err": [], "n_atoms": [], "jac": [], "f_err": []}
    for batch in _batches(dataset, batch_size):
        batch = to_device(batch, device)
        y: Tensor | None = None
        if probes and not keep:
            try:
                mask = batch[keys.HAS_FORCES].reshape(-1).bool()[graph_index(batch)]
                state, y = latent_probes(
                    model, batch, blocks, probes, mask=mask, generator=generator
                )
            except (RuntimeError, NotImplementedError) as err:
                warnings.warn(
                    f"posterior probes need forward-mode AD, which failed ({type(err).__name__}: "
                    f"{str(err).splitlines()[0]}); taking the exact Jacobians",
                    RuntimeWarning,
                    stacklevel=2,
                )
                probes = None
        if y is not None and probes:
            yf = y.double().reshape(-1, d)  # (probes * n_graphs, D)
            a_forces += yf.T @ yf / (probes * sig_f2)
        else:
            state, out, jac = latent_jacobian(model, batch, blocks)  # out: the whole prediction
            has_f = batch[keys.HAS_FORCES].reshape(-1).bool()[state.graph]  # (n_atoms,)
            jf = jac.double()[:, has_f].reshape(d, -1)  # (D, 3 n_labelled_atoms)
            a_forces += jf @ jf.T / sig_f2
        energy = _labelled_energies(state, batch, out[keys.ENERGY] if keep else None)
        phi = energy["phi"]  # (n_labelled, D)
        a_energy += (phi / (energy["n_atoms"][:, None] * sig_e2)).T @ phi
        if keep:
            for key, value in energy.items():
                rows[key].append(value)
            rows["jac"].append(jf)
            rows["f_err"].append(
                (out[keys.FORCES].double() - batch[keys.FORCES].double())[has_f].reshape(-1)
            )
    result: dict[str, Any] = {
        "a_energy": a_energy.cpu(),
        "a_forces": a_forces.cpu(),
        "probes": probes if probes and not keep else None,  # None after a fall-back to exact
    }
    if keep:  # the Jacobians are taken on the model's device; the small solves below run on the CPU
        result.update(
            {k: torch.cat(v, dim=-1 if k == "jac" else 0).cpu() for k, v in rows.items() if v}
        )
    return result


def _energy_rows(model: BayesianPotential, dataset: Any, batch_size: int) -> dict[str, Tensor]:
    """The energy calibration's rows of ``dataset`` without Jacobians (one forward pass per
    batch): ``phi (n_frames, D)``, ``e_err (n_frames,)`` at the posterior mean, ``n_atoms``."""
    device = module_device(model)
    mu, _ = model.posterior()
    rows: dict[str, list[Tensor]] = {"phi": [], "e_err": [], "n_atoms": []}
    for batch in _batches(dataset, batch_size):
        batch = to_device(batch, device)
        with torch.no_grad():
            state = model._state(batch, forces=False, stress=False)
            energy = model._energies(state, weights=mu.detach())[keys.ENERGY]
            based = basis_state(state, model.posterior_blocks)
        for key, value in _labelled_energies(based, batch, energy).items():
            rows[key].append(value)
    return {k: torch.cat(v).cpu() for k, v in rows.items()}


def _calibration_rows(
    model: BayesianPotential, valid: Any, batch_size: int, force_frames: int | None, seed: int
) -> dict[str, Any]:
    """The validation pass (``_pass(keep=True)``) on at most ``force_frames`` of ``valid`` (a
    random subset, ``seed``), whose exact Jacobians calibrate lambda and the force scales; the
    energy rows of the other frames join without Jacobians."""
    graphs = list(getattr(valid, "graphs", valid))
    chosen = random_subset(list(range(len(graphs))), force_frames, seed)
    val = _pass(model, [graphs[k] for k in chosen], batch_size, keep=True)
    val["n_force_frames"] = len(chosen)
    rest = sorted(set(range(len(graphs))) - set(chosen))
    if rest:
        more = _energy_rows(model, [graphs[k] for k in rest], batch_size)
        for key, extra in more.items():
            val[key] = torch.cat([val[key], extra]) if key in val else extra
    return val


def gaussian_scale_fit(
    err: Tensor, var: Tensor, weight: Tensor | None = None, *, fixed_noise: float | None = None
) -> tuple[float, float, float]:
    """Maximum likelihood ``(alpha^2, sigma^2, nll)`` of ``err ~ N(0, alpha^2 var + weight sigma^2)``.

    ``weight`` (default 1) multiplies the noise per entry (e.g. ``n_atoms`` for a per-atom energy
    noise); ``fixed_noise`` fixes ``sigma^2`` and fits ``alpha^2`` only; ``nll`` is the mean
    negative log-likelihood at the optimum. Both scales stay >= 0.
    """
    err, var = err.double(), var.double().clamp_min(1e-30)
    weight = torch.ones_like(err) if weight is None else weight.double()
    e2 = err.square()
    init = torch.tensor(
        [math.log(float(e2.mean() / var.mean()) + 1e-30), math.log(float(e2.mean()) * 0.1 + 1e-30)],
        dtype=torch.float64,
    )
    params = init.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([params], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def nll() -> Tensor:
        noise = (
            params[1].exp()
            if fixed_noise is None
            else torch.tensor(fixed_noise, dtype=torch.float64)
        )
        total = params[0].exp() * var + noise * weight
        return 0.5 * (math.log(2 * math.pi) + total.log() + e2 / total).mean()

    def closure() -> Tensor:
        opt.zero_grad()
        value = nll()
        value.backward()
        return value

    opt.step(closure)
    with torch.no_grad():
        noise = float(params[1].exp()) if fixed_noise is None else float(fixed_noise)
        return float(params[0].exp()), noise, float(nll())


def moment_scale(err: Tensor, var: Tensor, what: str) -> float:
    """``alpha^2 = mean(err^2) / mean(var)``: the scale at which the mean predicted variance
    equals the mean squared error (std/RMSE = 1 on these entries); PosteriorCalibrationError
    when ``var`` carries no variance or the scale is not a finite positive number."""
    err, var = err.double(), var.double()
    if err.numel() == 0:
        raise PosteriorCalibrationError(
            f"no {what} labels on the validation structures to calibrate on"
        )
    mean_var, mse = float(var.mean()), float(err.square().mean())
    alpha2 = mse / mean_var if mean_var > 0 and math.isfinite(mean_var) else math.nan
    if not (math.isfinite(alpha2) and alpha2 > 0):
        raise PosteriorCalibrationError(
            f"the {what} variance cannot be calibrated: mean raw variance {mean_var:.3g} against "
            f"a mean squared error of {mse:.3g} on the validation structures (the last-layer "
            "features do not vary there); use a model whose features depend on the structure, "
            "or other validation structures"
        )
    return alpha2


def _noise_at_scale(err: Tensor, epistemic: Tensor, weight: Tensor | None = None) -> float:
    """NLL-optimal noise ``sigma^2`` of ``err ~ N(0, epistemic + weight sigma^2)`` with the
    epistemic variance fixed (:func:`gaussian_scale_fit` with the roles of the terms swapped)."""
    weight = torch.ones_like(err, dtype=torch.float64) if weight is None else weight.double()
    noise2, _, _ = gaussian_scale_fit(err, weight, epistemic.double(), fixed_noise=1.0)
    return noise2


def _rmse_calibration(
    val: dict[str, Any],
    f_proj: Tensor,
    e_proj: Tensor,
    eig: Tensor,
    lam: float,
    rank: int,
) -> tuple[list[float], dict[str, float]]:
    """``[alpha_E^2, alpha_F^2, sigma_e^2, sigma_f^2, alpha_r^2]`` by moment matching on the
    validation set (module docstring), and the measurements behind it; raises
    PosteriorCalibrationError where the features cannot support a calibrated posterior."""
    from mlip_unc.uncertainty.diagnostics import jacobian_effective_rank

    if val["f_err"].numel() == 0:
        raise PosteriorCalibrationError(
            "no force labels on the validation structures: the force uncertainty cannot be calibrated"
        )
    jac_rank = jacobian_effective_rank(val["jac"])
    if jac_rank < MIN_JACOBIAN_RANK:
        raise PosteriorCalibrationError(
            f"the last-layer features' force Jacobian has effective rank {jac_rank:.2f} on the "
            f"validation structures (< {MIN_JACOBIAN_RANK:g}): every force uncertainty would be a "
            "multiple of one force pattern, which no posterior on these features can calibrate; "
            "use a model with more channels or interactions, or more varied validation structures"
        )
    v_f = _variances(f_proj, eig, lam)
    alpha2_f = moment_scale(val["f_err"], v_f, "force")
    v_low = _variances(f_proj[:rank], eig[:rank], lam)
    share = float(v_low.mean() / v_f.mean())
    if not share >= MIN_LOWRANK_SHARE:
        raise PosteriorCalibrationError(
            f"the {rank} least constrained posterior directions carry {share:.2e} of the force "
            f"variance on the validation structures (< {MIN_LOWRANK_SHARE:g}): the features never "
            "move along them, so the lowrank mode cannot be calibrated; raise --posterior-rank"
        )
    alpha2_r = moment_scale(val["f_err"], v_low, "low-rank force")
    v_e = _variances(e_proj, eig, lam)
    alpha2_e = moment_scale(val["e_err"], v_e, "energy") if val["e_err"].numel() else alpha2_f
    noise2_f = _noise_at_scale(val["f_err"], alpha2_f * v_f)
    noise2_e = (
        _noise_at_scale(val["e_err"], alpha2_e * v_e, val["n_atoms"])
        if val["e_err"].numel()
        else 0.0
    )
    return [alpha2_e, alpha2_f, noise2_e, noise2_f, alpha2_r], {
        "valid_jacobian_effective_rank": jac_rank,
        "lowrank_variance_share": share,
    }


def _mean_nll(err: Tensor, total: Tensor) -> float:
    """Mean Gaussian negative log-likelihood of ``err`` under variances ``total``."""
    if err.numel() == 0:
        return math.nan
    total = total.double().clamp_min(1e-300)
    return float(0.5 * (math.log(2 * math.pi) + total.log() + err.double().square() / total).mean())


def _variances(proj: Tensor, eig: Tensor, lam: float) -> Tensor:
    """``sum_k proj_k^2 / (eig_k + lam)``: ``x^T (A + lam I)^-1 x`` from ``proj = V^T x (d, M)``."""
    return (proj.square() / (eig[:, None] + lam)).sum(0)


def fit_full_posterior(
    model: BayesianPotential,
    train: Any,
    valid: Any | None = None,
    *,
    batch_size: int = 8,
    calibration: str = "nll",
    probes: int | None = None,
    seed: int = 0,
    valid_force_frames: int | None = None,
) -> dict[str, Any]:
    """Fit and attach the full posterior to ``model`` (module docstring); returns a summary
    (lambda, calibration scalars, validation NLL per lambda, effective rank of ``A``).

    ``valid_force_frames``: lambda and the force scales from at most that many validation
    frames (a random subset, ``seed``; their exact Jacobians are most of a MACE fit's time);
    the energy scales from every validation frame, which costs a forward pass each.

    ``calibration``: ``"nll"`` (the scales by maximum likelihood; after training) or ``"rmse"``
    (moment matching, ``mlip-unc attach``; may raise :class:`PosteriorCalibrationError`).
    ``probes``: estimate the training frames' force precision from that many random sign probes
    per batch (seeded by ``seed``; module docstring) where validation frames are given; the
    validation pass, which calibrates, stays exact. Without force labels (energy-only data,
    ``loss.forces_weight: 0``) lambda and the scales come from the energies, the force scales
    are the energy's and the force noise is 0 (nothing to calibrate them on). Calibrated on
    fewer structures than :data:`~mlip_unc.uncertainty.sample_size.MIN_CALIBRATION_SIZE`, it
    logs a warning and returns it as ``warning``."""
    if calibration not in ("nll", "rmse"):
        raise ValueError(f"calibration must be 'nll' or 'rmse', got {calibration!r}")
    was_training = model.training
    model.eval()
    has_valid = valid is not None and len(valid) > 0
    fit = (
        _pass(model, train, batch_size, keep=False, probes=probes, seed=seed)
        if has_valid
        else _pass(model, train, batch_size, keep=True)
    )
    val = (
        _calibration_rows(model, valid, batch_size, valid_force_frames, seed) if has_valid else fit
    )  # one pass when calibrating in-sample
    a = fit["a_energy"] + fit["a_forces"]
    eig, vec = torch.linalg.eigh(a)  # ascending
    eig = eig.clamp_min(0.0)
    scale = float(eig.mean()) if float(eig.mean()) > 0 else 1.0
    f_proj = vec.T @ val["jac"]  # (d, 3 M)
    e_proj = vec.T @ val["phi"].T  # (d, n_frames)
    energy_only = val["f_err"].numel() == 0  # no force labels (loss.forces_weight 0)
    scores = []
    for c in _GRID:
        lam = c * scale
        if energy_only:  # lambda from the energies' NLL
            fitted = gaussian_scale_fit(val["e_err"], _variances(e_proj, eig, lam), val["n_atoms"])
        else:
            fitted = gaussian_scale_fit(val["f_err"], _variances(f_proj, eig, lam))
        scores.append((fitted[2], lam, fitted[0], fitted[1]))
    nll_f, lam, alpha2_f, noise2_f = min(scores)
    alpha2_e, noise2_e, nll_e = gaussian_scale_fit(
        val["e_err"], _variances(e_proj, eig, lam), val["n_atoms"]
    )
    rank = min(int(model.posterior_rank), eig.shape[0])  # low rank: the smallest eig of A
    low = _variances(f_proj[:rank], eig[:rank], lam)
    if energy_only:  # the forces' scales are the energy's, their noise unknown (0)
        alpha2_f, noise2_f, nll_f = alpha2_e, 0.0, math.nan
        alpha2_r, nll_r = alpha2_e, math.nan
    else:
        alpha2_r, _, nll_r = gaussian_scale_fit(val["f_err"], low, fixed_noise=noise2_f)
    checks: dict[str, float] = {}
    if calibration == "rmse":
        scales, checks = _rmse_calibration(val, f_proj, e_proj, eig, lam, rank)
        alpha2_e, alpha2_f, noise2_e, noise2_f, alpha2_r = scales
        v_f = _variances(f_proj, eig, lam)  # the NLLs reported are those at these scales
        nll_f = _mean_nll(val["f_err"], alpha2_f * v_f + noise2_f)
        nll_r = _mean_nll(val["f_err"], alpha2_r * low + noise2_f)
        nll_e = _mean_nll(
            val["e_err"], alpha2_e * _variances(e_proj, eig, lam) + noise2_e * val["n_atoms"]
        )
    sigma = 1.0 / (eig + lam)  # posterior variances along vec, descending with ascending eig
    factor = sigma.sqrt()[:, None] * vec.T  # rows sqrt(sigma_k) v_k, largest variance first
    scales_t = torch.tensor([alpha2_e, alpha2_f, noise2_e, noise2_f, alpha2_r], dtype=torch.float64)
    model.set_full_posterior(factor, scales_t)
    model.train(was_training)
    p = eig / eig.sum().clamp_min(1e-300)
    eff_rank = float(torch.exp(-(p[p > 0] * p[p > 0].log()).sum()))
    summary = {
        "lambda": lam,
        "lambda_over_mean_eig": lam / scale,
        "alpha2_energy": alpha2_e,
        "alpha2_forces": alpha2_f,
        "noise_energy_per_atom": math.sqrt(noise2_e),
        "noise_forces": math.sqrt(noise2_f),
        "valid_nll_forces": nll_f,
        "valid_nll_energy": nll_e,
        "alpha2_lowrank": alpha2_r,
        "lowrank_rank": rank,
        "valid_nll_forces_lowrank": nll_r,
        "precision_effective_rank": eff_rank,
        "valid_nll_forces_by_lambda": {f"{s[1] / scale:.0e}": s[0] for s in scores},
        "n_valid_components": int(val["f_err"].numel()),
        "n_valid_force_frames": val.get("n_force_frames"),
        "n_valid_energies": int(val["e_err"].numel()),
        "calibration": calibration,
        "probes": fit["probes"],
        **checks,
    }
    n_calibration = int(val["n_force_frames"]) if has_valid else len(train)
    warning = too_few(
        n_calibration,
        "the full posterior's scales",
        "they may be off by a factor of 3 or more; calibrate on more validation structures",
    )
    if warning is not None:
        summary["warning"] = warning
    log.info(
        "full posterior: lambda %.3g (x mean eig %.0e), alpha_F^2 %.3g, sigma_f %.3g, valid force NLL %.4g, "
        "precision effective rank %.1f",
        lam,
        lam / scale,
        alpha2_f,
        math.sqrt(noise2_f),
        nll_f,
        eff_rank,
    )
    return summary
