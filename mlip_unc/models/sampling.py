"""The training forward pass of a :class:`~mlip_unc.models.potential.BayesianPotential`:
one reparameterised weight draw per graph (Bayes-by-Backprop, docs/method.md section 3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mlip_unc import keys
from mlip_unc.models.derivatives import forces_and_stress
from mlip_unc.models.potential_uncertainty import UncertaintyMode, energy_uncertainty

if TYPE_CHECKING:
    from torch_geometric.data.data import BaseData

    from mlip_unc.models.potential import BayesianPotential

__all__ = ["sample_forward"]


def sample_forward(
    model: BayesianPotential,
    batch: BaseData,
    *,
    generator: torch.Generator | None = None,
    compute_forces: bool = True,
    compute_stress: bool = False,
    uncertainty: UncertaintyMode | str = UncertaintyMode.NONE,
) -> dict[str, Tensor]:
    """Training forward: one reparameterised weight draw per graph.

    ``w_g = mu + s * eps_g`` for each graph g (independent across the graphs of the batch;
    one shared draw per graph keeps energy and forces consistent), ``E_g = w_g^T Phi_g +
    offsets``, forces/stress by one backward pass with ``create_graph=True``, so the loss
    trains mu, rho (through the forces too) and the backbone. ``uncertainty`` may be
    "none" or "energy" (differentiable closed-form energy variances, e.g. for alignment
    regularisers).
    """
    mode = UncertaintyMode(uncertainty)
    if mode not in (UncertaintyMode.NONE, UncertaintyMode.ENERGY):
        raise ValueError(
            f"sample_forward supports uncertainty 'none' or 'energy', not {mode.value!r}"
        )
    with torch.enable_grad():
        state = model._state(batch, forces=compute_forces, stress=compute_stress)
        mu, s2 = model.posterior()
        eps = torch.randn(
            (state.n_graphs, model.latent_dim),
            generator=generator,
            dtype=mu.dtype,
            device=mu.device,
        )
        weights = mu + model.head.weight_std[0] * eps  # (n_graphs, d), reparameterised
        out = model._energies(state, weights=weights[state.graph])
        if mode is UncertaintyMode.ENERGY:
            out.update(energy_uncertainty(state, s2, model.energy_noise.square()))
        if compute_forces or compute_stress:
            grads = torch.autograd.grad(
                out[keys.ENERGY].sum(),
                state.inputs,
                create_graph=True,
                allow_unused=True,
                materialize_grads=True,
            )
            out.update(forces_and_stress(state, list(grads)))
    return out
