"""Uncertainties of a Bayesian energy head: closed-form energy variances, exact or sampled
force and stress variances (docs/method.md section 3 of this project).

With ``w ~ N(mu, diag(s2))`` and ``E = w^T Phi + offsets``, ``Phi = sum_a z_a``::

    Var[E]   = Phi^T S Phi  (+ n_atoms sigma_e^2 aleatoric)
    Var[F_i] = sum_k s_k^2 (dPhi_k/dr_i)^2                    (exact: d vector-Jacobian products)
    Var[F_i] ~ unbiased variance of -d(w_k^T Phi)/dr_i        (sampled: one product per draw w_k)

and the same for the stress with the strain derivative of ``Phi``. The formulas themselves live
in :mod:`mlip_unc.uncertainty.moments`; the functions here apply them to one
:class:`~mlip_unc.models.derivatives.PotentialState`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mlip_unc import keys
from mlip_unc.config.enums import UncertaintyMode  # defined with the options; re-exported here
from mlip_unc.models.derivatives import (
    PotentialState,
    forces_and_stress,
    graph_index,
    inverse_volume,
    num_graphs,
)
from mlip_unc.uncertainty import moments

if TYPE_CHECKING:
    from torch_geometric.data.data import BaseData

__all__ = [
    "UncertaintyMode",
    "noise_variances",
    "energy_uncertainty",
    "input_gradients",
    "derivative_variances",
    "exact_derivatives",
    "sampled_derivatives",
]


def noise_variances(
    batch: BaseData, energy_noise_var: Tensor, force_noise_var: Tensor
) -> dict[str, Tensor]:
    """Aleatoric variances of ``batch`` from the per-atom energy and per-component force noises.

    Returns:
        ``{ENERGY: (n_graphs,) n_atoms sigma_e^2, FORCES: (n_atoms, 3) sigma_f^2}``.
    """
    graph = graph_index(batch)
    n_atoms = torch.bincount(graph, minlength=num_graphs(batch, graph))
    forces = force_noise_var.expand(graph.shape[0], 3)
    return {
        keys.ENERGY: moments.energy_aleatoric_variance(n_atoms, energy_noise_var),
        keys.FORCES: forces,
    }


def energy_uncertainty(
    state: PotentialState, s2: Tensor, energy_noise_var: Tensor
) -> dict[str, Tensor]:
    """Closed-form energy variances of one forward pass (no backward pass).

    Args:
        state: the forward state.
        s2: ``(d,)`` posterior variances of the head weights.
        energy_noise_var: ``()`` per-atom aleatoric variance ``sigma_e^2``.

    Returns:
        ENERGY_VAR, ENERGY_EPISTEMIC_VAR, ENERGY_ALEATORIC_VAR, KAPPA ``(n_graphs,)`` and
        LOCAL_ENERGY_VAR ``(n_atoms,)``.
    """
    phi = state.phi
    epistemic = moments.latent_variance(phi, s2)
    n_atoms = torch.bincount(state.graph, minlength=state.n_graphs)
    aleatoric = moments.energy_aleatoric_variance(n_atoms, energy_noise_var)
    return {
        keys.ENERGY_VAR: epistemic + aleatoric,
        keys.ENERGY_EPISTEMIC_VAR: epistemic,
        keys.ENERGY_ALEATORIC_VAR: aleatoric,
        keys.LOCAL_ENERGY_VAR: moments.latent_variance(state.z, s2),
        keys.KAPPA: moments.alignment_kappa(phi, s2),
    }


def input_gradients(
    state: PotentialState, weights: Tensor, method: str, *, base: Tensor | None = None
) -> list[Tensor]:
    """``d(Phi @ w_k).sum() / d inputs`` for each row of ``weights (K, d)``: ``(K, ...)`` per input.

    ``base (n_graphs,)``: a backbone's own per-graph energies, whose derivatives join row 0 (the
    posterior mean) in the same pass: one backward pass fewer than taking them apart."""
    phi = state.phi
    if base is not None:  # Phi gains a column that only row 0 weighs
        phi = torch.cat([phi, base.to(phi.dtype)[:, None]], 1)  # (n_graphs, d + 1)
        column = weights.new_zeros(weights.shape[0], 1)
        column[0] = 1.0
        weights = torch.cat([weights, column], 1)  # (K, d + 1)
    return list(moments.linear_gradients(phi, state.inputs, weights, method=method))


def derivative_variances(
    state: PotentialState, grads: list[Tensor], *, s2: Tensor | None
) -> dict[str, Tensor]:
    """FORCES_VAR ``(n_atoms, 3)`` (and STRESS_VAR ``(n_graphs, 3, 3)``), epistemic.

    Exact with ``s2 (d,)`` given and ``grads`` the latent Jacobians ``(d, ...)``; sampled
    (unbiased sample variance) with ``s2=None`` and ``grads`` the draws' gradients ``(K, ...)``.
    """
    var = (
        (lambda g: moments.gradient_variance(g, s2)) if s2 is not None else moments.sample_variance
    )
    out = {keys.FORCES_VAR: var(grads[0])}
    if state.strain is not None:
        out[keys.STRESS_VAR] = var(grads[1]) * inverse_volume(state).square()[:, None, None]
    return out


def exact_derivatives(
    state: PotentialState, mu: Tensor, s2: Tensor, *, method: str
) -> dict[str, Tensor]:
    """Mean forces (stress) and their exact variances from the d latent Jacobians.

    ``mu, s2 (d,)``: posterior means and variances of the head weights. The mean derivatives
    are ``mu`` contracted with the Jacobians, so they cost nothing extra.
    """
    eye = torch.eye(mu.shape[0], dtype=mu.dtype, device=mu.device)
    grads = input_gradients(state, eye, method)  # (d, ...) per input
    out = forces_and_stress(state, [torch.tensordot(mu, g, dims=1) for g in grads])
    out.update(derivative_variances(state, grads, s2=s2))
    return out


def sampled_derivatives(
    state: PotentialState, mu: Tensor, draws: Tensor, *, method: str, base: Tensor | None = None
) -> dict[str, Tensor]:
    """Mean forces (stress) at ``mu (d,)`` and their variances over weight ``draws (K, d)``;
    ``base (n_graphs,)`` as in :func:`input_gradients`."""
    weights = torch.cat([mu.detach()[None], draws])  # (K+1, d)
    grads = input_gradients(state, weights, method, base=base)
    out = forces_and_stress(state, [g[0] for g in grads])
    out.update(derivative_variances(state, [g[1:] for g in grads], s2=None))
    return out
