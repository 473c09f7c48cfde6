"""The backbone contract of :class:`~mlip_unc.models.potential.BayesianPotential` and its registry.

**Backbone contract.** Any ``nn.Module`` with

- an int attribute ``latent_dim`` (= d),
- ``forward(batch) -> z (n_atoms, latent_dim)``: invariant per-atom latents, computed from
  ``batch.pos``, ``batch.cell``, ``batch.cell_shift``, ``batch.edge_index``, ``batch.batch`` and
  ``batch.atom_type`` with :func:`mlip_unc.geometry.batch_edge_vectors` (never from
  precomputed edge vectors), so that the potential can differentiate with respect to positions
  and strain;
- optionally ``r_max`` (checked against the potential's), ``reset_parameters()``, and, for
  checkpoints, ``backbone_name`` (a key of :data:`BACKBONES`) and ``config() -> dict`` of
  constructor kwargs.

This is how a frozen external backbone (e.g. a MACE model's per-atom features) can sit under
the Bayesian head.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn
from torch_geometric.data import Data

from mlip_unc.nn.equivariant import EquivariantBackbone
from mlip_unc.nn.geometric_gin import GeometricGIN

__all__ = ["Backbone", "BACKBONES", "build_backbone", "isolated_atoms_batch"]


@runtime_checkable
class Backbone(Protocol):
    """Per-atom invariant latents from a graph batch (see the module docstring)."""

    latent_dim: int

    def __call__(self, batch: Any) -> Tensor:  # (n_atoms, latent_dim)
        ...


BACKBONES: dict[str, type[nn.Module]] = {"gin": GeometricGIN, "equivariant": EquivariantBackbone}
"""Backbones that checkpoints can rebuild from plain data, by ``backbone_name``."""


def build_backbone(name: str, **kwargs: Any) -> nn.Module:
    """Build a registered backbone from plain data: ``"gin"`` or ``"equivariant"``."""
    try:
        cls = BACKBONES[name]
    except KeyError:
        raise ValueError(f"unknown backbone {name!r}; known: {sorted(BACKBONES)}") from None
    return cls(**kwargs)


def isolated_atoms_batch(type_map: list[int], *, dtype: torch.dtype, device: torch.device | str) -> Data:
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
