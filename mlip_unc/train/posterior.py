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

The grid is wide on purpose: the validation NLL picked its lowest values on the native 3BPA and
ethanol models and its highest on the last-layer features of attached MACE models
(docs/what-we-tried.md).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.loader import DataLoader

from mlip_unc import keys
from mlip_unc.models.full_posterior import latent_jacobian
from mlip_unc.train.device import module_device, to_device

__all__ = ["fit_full_posterior", "gaussian_scale_fit", "random_subset"]

log = logging.getLogger(__name__)
_GRID = tuple(10.0**k for k in range(-14, 5))


def random_subset(items: list, limit: int | None, seed: int) -> list:
    """At most ``limit`` of ``items`` (a random subset, in their order); all for ``limit`` None or 0."""
    if not limit or len(items) <= limit:
        return list(items)
    keep = np.random.default_rng(seed).permutation(len(items))[:limit]
    return [items[k] for k in sorted(keep)]


def _batches(dataset: Any, batch_size: int):
    graphs = list(getattr(dataset, "graphs", dataset))
    return DataLoader(graphs, batch_size=batch_size, shuffle=False)


def _pass(model, dataset: Any, batch_size: int, *, keep: bool) -> dict[str, Any]:
    """Precision sums over ``dataset``; with ``keep``, the per-frame features and errors too."""
    d, blocks = model.posterior_width, model.posterior_blocks  # D = blocks * latent_dim
    sig_e2 = float(model.energy_noise.detach()) ** 2
    sig_f2 = float(model.force_noise.detach()) ** 2
    device = module_device(model)
    a_energy = torch.zeros(d, d, dtype=torch.float64, device=device)
    a_forces = torch.zeros(d, d, dtype=torch.float64, device=device)
    rows: dict[str, list[Tensor]] = {"phi": [], "e_err": [], "n_atoms": [], "jac": [], "f_err": []}
    for batch in _batches(dataset, batch_size):
        batch = to_device(batch, device)
        state, out, jac = latent_jacobian(model, batch, blocks)
        jac = jac.double()  # (D, n_atoms, 3)
        phi = state.phi.detach().double()  # (n_graphs, D)
        n_atoms = torch.bincount(state.graph, minlength=state.n_graphs).double()
        has_e = batch[keys.HAS_ENERGY].reshape(-1).bool()
        has_f = batch[keys.HAS_FORCES].reshape(-1).bool()[state.graph]  # (n_atoms,)
        a_energy += (phi[has_e] / (n_atoms[has_e, None] * sig_e2)).T @ phi[has_e]
        jf = jac[:, has_f].reshape(d, -1)  # (D, 3 n_labelled_atoms)
        a_forces += jf @ jf.T / sig_f2
        if keep:
            rows["phi"].append(phi[has_e])
            rows["n_atoms"].append(n_atoms[has_e])
            rows["e_err"].append((out[keys.ENERGY].double() - batch[keys.ENERGY].double())[has_e])
            rows["jac"].append(jf)
            rows["f_err"].append(
                (out[keys.FORCES].double() - batch[keys.FORCES].double())[has_f].reshape(-1)
            )
    result: dict[str, Any] = {"a_energy": a_energy.cpu(), "a_forces": a_forces.cpu()}
    if keep:  # the Jacobians are taken on the model's device; the small solves below run on the CPU
        result.update(
            {k: torch.cat(v, dim=-1 if k == "jac" else 0).cpu() for k, v in rows.items() if v}
        )
    return result


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


def _variances(proj: Tensor, eig: Tensor, lam: float) -> Tensor:
    """``sum_k proj_k^2 / (eig_k + lam)``: ``x^T (A + lam I)^-1 x`` from ``proj = V^T x (d, M)``."""
    return (proj.square() / (eig[:, None] + lam)).sum(0)


def fit_full_posterior(
    model, train: Any, valid: Any | None = None, *, batch_size: int = 8
) -> dict[str, Any]:
    """Fit and attach the full posterior to ``model`` (module docstring); returns a summary
    (lambda, calibration scalars, validation NLL per lambda, effective rank of ``A``)."""
    was_training = model.training
    model.eval()
    has_valid = valid is not None and len(valid) > 0
    fit = _pass(model, train, batch_size, keep=not has_valid)
    val = (
        _pass(model, valid, batch_size, keep=True) if has_valid else fit
    )  # one pass when calibrating in-sample
    a = fit["a_energy"] + fit["a_forces"]
    eig, vec = torch.linalg.eigh(a)  # ascending
    eig = eig.clamp_min(0.0)
    scale = float(eig.mean()) if float(eig.mean()) > 0 else 1.0
    f_proj = vec.T @ val["jac"]  # (d, 3 M)
    e_proj = vec.T @ val["phi"].T  # (d, n_frames)
    scores = []
    for c in _GRID:
        lam = c * scale
        alpha2, noise2, nll = gaussian_scale_fit(val["f_err"], _variances(f_proj, eig, lam))
        scores.append((nll, lam, alpha2, noise2))
    nll_f, lam, alpha2_f, noise2_f = min(scores)
    alpha2_e, noise2_e, nll_e = gaussian_scale_fit(
        val["e_err"], _variances(e_proj, eig, lam), val["n_atoms"]
    )
    rank = min(int(model.posterior_rank), eig.shape[0])  # low rank: the smallest eig of A
    low = _variances(f_proj[:rank], eig[:rank], lam)
    alpha2_r, _, nll_r = gaussian_scale_fit(val["f_err"], low, fixed_noise=noise2_f)
    sigma = 1.0 / (eig + lam)  # posterior variances along vec, descending with ascending eig
    factor = sigma.sqrt()[:, None] * vec.T  # rows sqrt(sigma_k) v_k, largest variance first
    calibration = torch.tensor(
        [alpha2_e, alpha2_f, noise2_e, noise2_f, alpha2_r], dtype=torch.float64
    )
    model.set_full_posterior(factor, calibration)
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
    }
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
