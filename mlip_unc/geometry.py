"""Differentiable edge vectors: the one place where ``edge_vec`` is computed (pure torch).

Edge convention (see :mod:`mlip_unc.keys`): ``edge_index[0] = j`` is the sender (neighbour),
``edge_index[1] = i`` the receiver (centre), and::

    edge_vec = pos[j] - pos[i] + cell_shift @ cell[batch[i]]     # (n_edges, 3)

which is ASE's ``neighbor_list("D")`` vector for the pair ``(i, j, S)``. The integer shifts
``S`` come from the neighbour list (:func:`mlip_unc.data.neighbours.neighbour_list`);
recomputing the vectors here from ``pos`` and ``cell`` lets gradients reach both (forces and
stress).

- :func:`edge_vectors`: from tensors.
- :func:`edge_lengths`: their norms.
- :func:`batch_edge_vectors`: from a PyG graph or batch with the fields of :mod:`mlip_unc.keys`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mlip_unc import keys

if TYPE_CHECKING:
    from torch_geometric.data.data import BaseData

__all__ = ["edge_vectors", "edge_lengths", "batch_edge_vectors"]


def edge_vectors(
    pos: torch.Tensor,
    edge_index: torch.Tensor,
    cell_shift: torch.Tensor,
    cell: torch.Tensor,
    batch: torch.Tensor | None = None,
) -> torch.Tensor:
    """Differentiable edge vectors ``pos[j] - pos[i] + cell_shift @ cell[batch[i]]``.

    Gradients flow to ``pos`` and ``cell`` (needed for forces and stress).

    Args:
        pos: (n_atoms, 3) positions.
        edge_index: (2, n_edges) long, ``[sender j, receiver i]``.
        cell_shift: (n_edges, 3) integer image offsets (any numeric dtype).
        cell: (n_graphs, 3, 3) or (3, 3) rows = lattice vectors.
        batch: (n_atoms,) graph index of each atom; ``None`` means a single graph.

    Returns:
        (n_edges, 3) vectors from receiver i to sender j (and its image).
    """
    sender, receiver = edge_index[0], edge_index[1]
    vec = pos[sender] - pos[receiver]  # (n_edges, 3)
    cell = cell.reshape(-1, 3, 3).to(pos.dtype)  # (n_graphs, 3, 3)
    if batch is None:
        edge_graph = torch.zeros_like(receiver)
    else:
        edge_graph = batch[receiver]  # (n_edges,)
    shift = cell_shift.to(pos.dtype)  # (n_edges, 3)
    return vec + torch.einsum("ek,ekl->el", shift, cell[edge_graph])


def edge_lengths(
    pos: torch.Tensor,
    edge_index: torch.Tensor,
    cell_shift: torch.Tensor,
    cell: torch.Tensor,
    batch: torch.Tensor | None = None,
) -> torch.Tensor:
    """Lengths (n_edges,) of :func:`edge_vectors`, differentiable in ``pos`` and ``cell``."""
    return torch.linalg.vector_norm(edge_vectors(pos, edge_index, cell_shift, cell, batch), dim=-1)


def batch_edge_vectors(batch: BaseData) -> torch.Tensor:
    """Edge vectors ``pos[j] - pos[i] + cell_shift @ cell[batch[i]]`` of a PyG graph/batch.

    Recomputed from ``batch.pos`` and ``batch.cell`` so that gradients reach both (forces and
    stress). A graph without ``cell``/``cell_shift`` counts as non-periodic.

    Shapes:
        - **output:** ``(n_edges, 3)``
    """
    pos = batch[keys.POSITIONS]  # (n_atoms, 3)
    edge_index = batch[keys.EDGE_INDEX]  # (2, n_edges)
    graph = getattr(batch, keys.BATCH, None)  # (n_atoms,) or None for a single graph
    cell = getattr(batch, keys.CELL, None)  # (n_graphs, 3, 3) or None
    shift = getattr(batch, keys.CELL_SHIFT, None)  # (n_edges, 3) or None
    if cell is None or shift is None:
        return pos[edge_index[0]] - pos[edge_index[1]]
    return edge_vectors(pos, edge_index, shift, cell, graph)
