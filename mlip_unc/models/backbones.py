"""The backbone contract of :class:`~mlip_unc.models.potential.BayesianPotential` and its registry.

**Backbone contract.** Any ``nn.Module`` with

- an int attribute ``latent_dim`` (= d),
- ``forward(batch) -> z (n_atoms, latent_dim)``: invariant per-atom latents, computed from
  ``batch.pos``, ``batch.cell``, ``batch.cell_shift``, ``batch.edge_index``, ``batch.batch`` and
  ``batch.atom_type`` with :func:`mlip_unc.geometry.batch_edge_vectors` (never from
  precomputed edge vectors), so that the potential can differentiate with respect to positions
  and strain;
- optionally ``r_max`` (checked against the potential's), ``reset_parameters()``, and, for
  checkpoints, ``backbone_name`` (a registered name, :data:`BACKBONES`) and ``config() ->
  dict`` of constructor kwargs as plain data (``build_backbone(backbone_name, **config())``
  rebuilds it);
- optionally ``latents_and_energies(batch) -> (z (n_atoms, latent_dim), e (n_atoms,))``: the
  latents and the backbone's own per-atom energies ("base energies", e.g. a trained MACE
  model's). The potential then computes them in one pass instead of ``forward`` and adds ``e``
  to its per-atom energies: ``E_a = w^T z~_a + b_Z + e_a``. With a zero head mean and zero
  offsets the potential predicts the backbone model's own energies, forces and stress (they flow
  through ``e``; equal to rounding, the totals being summed per atom), and the head's posterior
  (fitted post hoc: ``mlip_unc.posthoc.attach``) gives their uncertainty. The energies travel in
  :class:`BackboneState`. ``forward`` still returns ``z`` alone (the isolated-atom reference
  latents use it).

This is how a frozen external model sits under the Bayesian head: ``mace_model``
(:class:`~mlip_unc.nn.mace_backbone.MACEModelFeatures`, a MACE model trained with mace-torch,
``mlip-unc attach``); ``mace`` (:class:`~mlip_unc.nn.mace_backbone.MACEBackbone`) is a MACE
trained here. Both need mace-torch (``pip install mlip-unc[mace]``), imported when built.

**Registry.** Backbones are found by name in :data:`mlip_unc.registry.BACKBONE_REGISTRY`
(``gin``, ``equivariant``, ``mace``, ``mace_model`` and whatever is registered with
:func:`mlip_unc.registry.register_backbone`); :func:`mlip_unc.testing.check_backbone` checks
the contract above and the physics a potential needs from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn
from torch_geometric.data import Data

from mlip_unc.models.derivatives import PotentialState
from mlip_unc.registry import BACKBONE_REGISTRY

__all__ = [
    "BACKBONES",
    "Backbone",
    "BackboneState",
    "backbone_gradient_method",
    "build_backbone",
    "isolated_atoms_batch",
]


@runtime_checkable
class Backbone(Protocol):
    """Per-atom invariant latents from a graph batch (see the module docstring)."""

    latent_dim: int

    def __call__(self, batch: Any) -> Tensor:  # (n_atoms, latent_dim)
        ...


BACKBONES: Mapping[str, Any] = BACKBONE_REGISTRY.targets()
"""Backbones that checkpoints can rebuild from plain data, by ``backbone_name``: a live
read-only view of :data:`~mlip_unc.registry.BACKBONE_REGISTRY`, name -> class or factory."""


@dataclass
class BackboneState(PotentialState):
    """A potential's forward state with the backbone's own per-atom energies (contract above)."""

    base_energy: Tensor | None = None
    """``(n_atoms,)`` energies from ``latents_and_energies``, or None (most backbones)."""


def build_backbone(name: str, **kwargs: Any) -> nn.Module:
    """Build a registered backbone from plain data (its constructor's keyword arguments).

    A module built without a ``backbone_name`` (a factory's) is given ``name``, so that it
    checkpoints.

    Raises:
        ValueError: ``unknown backbone 'name'``, with the registered names.
    """
    module = BACKBONE_REGISTRY.load(name)(**kwargs)
    if not isinstance(module, nn.Module):
        raise TypeError(f"backbone {name!r} built a {type(module).__name__}, not an nn.Module")
    if getattr(module, "backbone_name", None) is None:
        setattr(module, "backbone_name", name)  # noqa: B010 (nn.Module types its attributes)
    return module


def backbone_gradient_method(name: str) -> str:
    """The potential's ``gradient_method`` a registered backbone asks for (``auto``: most)."""
    return str(BACKBONE_REGISTRY.get(name).extra.get("gradient_method", "auto"))


def isolated_atoms_batch(
    type_map: list[int], *, dtype: torch.dtype, device: torch.device | str
) -> Data:
    """One isolated atom of each species in ``type_map`` (no edges, no cell), as one batch.

    The input of the isolated-atom reference latents ``z_iso (n_types, d)`` of
    :meth:`~mlip_unc.models.potential.BayesianPotential.isolated_latents`: graph ``i`` holds
    the single atom of ``atom_type`` ``i`` at the origin.
    """
    n = len(type_map)
    return Data(
        pos=torch.zeros(n, 3, dtype=dtype, device=device),
        atom_type=torch.arange(n, device=device),
        atomic_numbers=torch.tensor(type_map, device=device),
        edge_index=torch.zeros(2, 0, dtype=torch.long, device=device),
        cell_shift=torch.zeros(0, 3, dtype=dtype, device=device),
        cell=torch.zeros(n, 3, 3, dtype=dtype, device=device),
        pbc=torch.zeros(n, 3, dtype=torch.bool, device=device),
        num_atoms=torch.ones(n, dtype=torch.long, device=device),
        batch=torch.arange(n, device=device),
    )
