"""One forward state of a potential: reading the batch, differentiable inputs, forces and stress.

As defined in docs/method.md section 3 of this project: forces ``F = -dE/dr`` and, for
periodic graphs with a non-zero volume, stress ``sigma = (1/V) dE/d(strain)`` (ASE sign; 0
otherwise). The strain ``eps (n_graphs, 3, 3)`` enters symmetrised, acting on positions and
cell alike::

    r -> r (1 + sym(eps)),   cell -> cell (1 + sym(eps)),   sym(eps) = (eps + eps^T) / 2

evaluated at ``eps = 0``. A :class:`PotentialState` holds what one forward pass of
:class:`~mlip_unc.models.potential.BayesianPotential` shares between the energy, its
derivatives and their variances (:mod:`mlip_unc.models.potential_uncertainty`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mlip_unc import keys

if TYPE_CHECKING:
    from torch_geometric.data.data import BaseData

__all__ = [
    "PotentialState",
    "graph_index",
    "num_graphs",
    "atom_types",
    "differentiable_inputs",
    "inverse_volume",
    "forces_and_stress",
]


@dataclass
class PotentialState:
    """One forward pass: differentiable inputs, latents and their per-graph sums."""

    batch: BaseData
    """The input graph or batch (read for ``pbc``)."""
    graph: Tensor
    """``(n_atoms,)`` graph index of each atom."""
    n_graphs: int
    inputs: list[Tensor]
    """What derivatives are taken with respect to: ``[pos (n_atoms, 3)]``, then
    ``strain (n_graphs, 3, 3)`` when stress is asked; empty when neither is."""
    strain: Tensor | None
    """``(n_graphs, 3, 3)`` zero strain (requires grad), or None without stress."""
    cell: Tensor
    """``(n_graphs, 3, 3)`` unstrained cells (zeros for molecules)."""
    atom_type: Tensor
    """``(n_atoms,)`` indices into the model's type map."""
    z: Tensor
    """``(n_atoms, d)`` per-atom latents (isolated-atom reference subtracted)."""
    phi: Tensor
    """``(n_graphs, d)`` per-graph latent sums ``Phi``."""


def graph_index(batch: BaseData) -> Tensor:
    """``(n_atoms,)`` graph of each atom: ``batch.batch``, or zeros for a single graph."""
    graph = getattr(batch, keys.BATCH, None)
    if graph is None:
        pos = batch[keys.POSITIONS]
        graph = torch.zeros(pos.shape[0], dtype=torch.long, device=pos.device)
    return graph


def num_graphs(batch: BaseData, graph: Tensor) -> int:
    """Number of graphs of ``batch`` (``num_graphs``, else the cells, else ``graph``)."""
    n = getattr(batch, "num_graphs", None)
    if isinstance(n, int):
        return n
    cell = getattr(batch, keys.CELL, None)
    if cell is not None:
        return cell.reshape(-1, 3, 3).shape[0]
    return int(graph.max().item()) + 1 if graph.numel() else 1


def atom_types(batch: BaseData, z_to_index: Tensor, type_map: list[int]) -> Tensor:
    """``(n_atoms,)`` type indices: ``batch.atom_type``, or ``atomic_numbers`` mapped by ``z_to_index``.

    Args:
        batch: graph(s) with ``atomic_numbers`` (preferred) or ``atom_type``.
        z_to_index: ``(max_z + 1,)`` type index of each atomic number, -1 for absent elements.
        type_map: atomic numbers of the types (for the error messages).

    Raises:
        ValueError: an element that is not in the type map.
    """
    numbers = getattr(batch, keys.ATOMIC_NUMBERS, None)
    if numbers is None:
        return batch[keys.ATOM_TYPE]
    numbers = numbers.reshape(-1)
    if numbers.numel() and int(numbers.max()) >= z_to_index.shape[0]:
        raise ValueError(f"element {int(numbers.max())} is not in the type map {type_map}")
    types = z_to_index[numbers]
    if (types < 0).any():
        missing = sorted(set(numbers[types < 0].tolist()))
        raise ValueError(f"elements {missing} are not in the type map {type_map}")
    return types


def differentiable_inputs(
    pos: Tensor, cell: Tensor, graph: Tensor, n_graphs: int, *, forces: bool, stress: bool
) -> tuple[Tensor, Tensor, list[Tensor], Tensor | None]:
    """Positions and strain as leaves of the graph, and the strained geometry.

    Args:
        pos: ``(n_atoms, 3)`` positions (made a leaf requiring grad when derivatives are asked,
            unless it already requires grad).
        cell: ``(n_graphs, 3, 3)`` cells.
        graph: ``(n_atoms,)`` graph index of each atom.
        n_graphs: number of graphs.
        forces, stress: which derivatives will be taken.

    Returns:
        ``(pos (n_atoms, 3), cell (n_graphs, 3, 3), inputs, strain)``: the (strained) geometry
        to run the backbone on, the list of differentiable inputs ``[pos, (strain)]`` and the
        strain ``(n_graphs, 3, 3)`` or None.
    """
    inputs: list[Tensor] = []
    if forces or stress:
        if not pos.requires_grad:
            pos = pos.detach().requires_grad_(True)
        inputs.append(pos)
    if not stress:
        return pos, cell, inputs, None
    strain = pos.new_zeros(n_graphs, 3, 3, requires_grad=True)
    inputs.append(strain)
    sym = 0.5 * (strain + strain.transpose(-1, -2))  # (n_graphs, 3, 3)
    pos = pos + torch.einsum("ni,nij->nj", pos, sym[graph])
    return pos, cell + torch.bmm(cell, sym), inputs, strain


def inverse_volume(state: PotentialState) -> Tensor:
    """``(n_graphs,)`` ``1/V`` for periodic graphs with a non-zero volume, 0 otherwise."""
    cell = state.cell
    volume = torch.linalg.det(cell).abs()  # (n_graphs,)
    pbc = getattr(state.batch, keys.PBC, None)
    periodic = volume > 0
    if pbc is not None:
        periodic = periodic & pbc.reshape(-1, 3).any(-1)
    return torch.where(periodic, 1.0 / torch.where(periodic, volume, torch.ones_like(volume)), 0.0)


def forces_and_stress(state: PotentialState, grads: list[Tensor]) -> dict[str, Tensor]:
    """FORCES ``(n_atoms, 3)`` (and STRESS ``(n_graphs, 3, 3)``) from ``dE/d[pos, (strain)]``."""
    out: dict[str, Tensor] = {keys.FORCES: -grads[0]}
    if state.strain is not None:
        out[keys.STRESS] = grads[1] * inverse_volume(state)[:, None, None]
    return out
