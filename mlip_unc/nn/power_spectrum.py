"""Bond-angle invariants: the power spectrum of a learned neighbour density.

A sum over neighbours of distance features (a GIN message) or of one neighbour's direction
at a time (an l <= 1 equivariant message) does not see the angle between two bonds of the
same atom. The power spectrum of a neighbour density does (SOAP; ACE's two-body products)::

    A_i,c,lm = sum_j w_ij,c Y_lm(r_ij / |r_ij|) / avg_num_neighbors
    B_i,c,l  = sum_m A_i,c,lm^2
             = sum_jk w_ij,c w_ik,c P_l(cos theta_jik) (2l + 1) / avg_num_neighbors^2

with learned per-edge weights ``w_ij,c`` (in this project: a linear map of the radial
features, times one of the neighbour's scalar features, times the cutoff envelope), Y the
real spherical harmonics (component normalisation) and P_l the Legendre polynomials. B is
invariant under rotations, translations and permutations of the neighbours, smooth in the
positions, and vanishes smoothly as a neighbour leaves the cutoff sphere when w does.
"""

from __future__ import annotations

import torch
from e3nn import o3
from torch import Tensor

__all__ = ["edge_spherical_harmonics", "power_spectrum"]


def edge_spherical_harmonics(vectors: Tensor, l_max: int) -> Tensor:
    """``(n_edges, (l_max + 1)^2)`` real spherical harmonics of the edge directions, l = 0..l_max
    (component normalisation); a zero-length edge (coincident atoms) gives no NaN here."""
    unit = vectors / torch.linalg.vector_norm(vectors, dim=-1, keepdim=True).clamp_min(1e-9)
    return o3.spherical_harmonics(
        list(range(l_max + 1)), unit, normalize=False, normalization="component"
    )


def power_spectrum(
    weights: Tensor, receiver: Tensor, edge_sh: Tensor, n_atoms: int, avg_num_neighbors: float
) -> Tensor:
    """B_i,c,l from per-edge weights.

    Shapes:
        - **weights:** ``(n_edges, c)``; **receiver:** ``(n_edges,)`` centre atom i of each edge
        - **edge_sh:** ``(n_edges, (l_max + 1)^2)``, from :func:`edge_spherical_harmonics`
        - **output:** ``(n_atoms, c * (l_max + 1))``, channel-major
    """
    l_max = int(round(edge_sh.shape[-1] ** 0.5)) - 1
    a = weights.unsqueeze(-1) * edge_sh.unsqueeze(1)  # (n_edges, c, (l_max + 1)^2)
    density = (
        weights.new_zeros(n_atoms, *a.shape[1:]).index_add_(0, receiver, a) / avg_num_neighbors
    )
    blocks = [density[:, :, l * l : (l + 1) ** 2].pow(2).sum(-1) for l in range(l_max + 1)]
    return torch.stack(blocks, dim=-1).flatten(1)  # (n_atoms, c * (l_max + 1))
