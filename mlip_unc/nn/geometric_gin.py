"""GeometricGIN: an invariant GIN/GINE backbone on interatomic distances.

The graph-isomorphism update of Xu et al. with GINE edge features (Hu et al.), made smooth for
potentials: edge features are a radial basis times a cutoff envelope, and every message is
scaled by the envelope, so a neighbour entering or leaving the cutoff sphere changes the
latents continuously with a continuous derivative. Only distances enter, so the latents are
invariant to rotations, translations and (per atom) permutations.

Layer ``l`` (residual)::

    m_ij   = f_cut(r_ij) * silu(h_j + W_e e(r_ij))               e = basis(r) * f_cut(r)
    h_i   <- h_i + MLP((1 + eps_l) h_i + sum_j m_ij / avg_num_neighbors)

With ``angular_l_max = L > 0`` each layer also sees the angular shape of its neighbourhood
(three-body information, which distances summed over neighbours cannot carry), as the
invariant power spectrum of a learned neighbour density (:mod:`mlip_unc.nn.power_spectrum`)::

    A_i,c,lm = sum_j f_cut(r_ij) R_c(r_ij) (W_a h_j)_c Y_lm(r_ij / |r_ij|) / avg_num_neighbors
    B_i,c,l  = sum_m A_i,c,lm^2                    (invariant, smooth; c < angular_channels)
    h_i   <- h_i + MLP((1 + eps_l) h_i + sum_j m_ij / avg_num_neighbors + W_b B_i)

and the per-atom latent is ``z_i = W_out h_i`` (``latent_dim`` wide, separate from the
backbone width). With ``concat_layers`` the readout sees ``[h_i^(1), ..., h_i^(L)]`` (every
layer's features, as MACE's per-layer readouts); with ``readout_hidden`` a per-atom SiLU MLP
sits before ``W_out``. Both give latents whose position Jacobian spans more directions
(method.md 3b). This is the backbone contract of :mod:`mlip_unc.models.potential`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from mlip_unc import keys
from mlip_unc.geometry import batch_edge_vectors
from mlip_unc.nn.power_spectrum import edge_spherical_harmonics, power_spectrum
from mlip_unc.nn.radial import PerAtomBackbone, RadialEmbedding

if TYPE_CHECKING:
    from torch_geometric.data.data import BaseData

__all__ = ["GeometricGIN", "GeometricGINLayer"]


def _mlp(width: int, n_layers: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k in range(n_layers):
        layers.append(nn.Linear(width, width))
        if k < n_layers - 1:
            layers.append(nn.SiLU())
    return nn.Sequential(*layers)


class GeometricGINLayer(nn.Module):
    """One smooth GINE update with a residual connection.

    Args:
        hidden: node feature width.
        num_basis: width of the radial edge features.
        mlp_layers: depth of the update MLP.
        avg_num_neighbors: divides the summed messages (keeps activations O(1)).
        train_eps: learn the GIN ``eps`` (starts at 0).
        angular_l_max: largest ``l`` of the neighbour-density power spectrum; 0: none
            (distances only, the layer of old checkpoints).
        angular_channels: radial/feature channels of that density.

    Shapes:
        - **h:** ``(n_atoms, hidden)``
        - **edge_index:** ``(2, n_edges)`` ``[sender j, receiver i]``
        - **edge_attr:** ``(n_edges, num_basis)``; **edge_weight:** ``(n_edges,)`` envelope
        - **edge_sh:** ``(n_edges, (angular_l_max + 1)^2)`` real spherical harmonics of the
          edge directions (component normalisation), needed when ``angular_l_max > 0``
        - **output:** ``(n_atoms, hidden)``
    """

    def __init__(
        self,
        hidden: int,
        num_basis: int,
        *,
        mlp_layers: int = 2,
        avg_num_neighbors: float = 1.0,
        train_eps: bool = True,
        angular_l_max: int = 0,
        angular_channels: int = 16,
    ) -> None:
        super().__init__()
        if angular_l_max < 0:
            raise ValueError(f"angular_l_max must be >= 0, got {angular_l_max}")
        self.angular_l_max = int(angular_l_max)
        self.edge_linear = nn.Linear(num_basis, hidden)
        if self.angular_l_max > 0:
            self.density_radial = nn.Linear(num_basis, angular_channels)
            self.density_node = nn.Linear(hidden, angular_channels, bias=False)
            self.density_out = nn.Linear(angular_channels * (self.angular_l_max + 1), hidden)
        self.mlp = _mlp(hidden, mlp_layers)
        self.act = nn.SiLU()
        self.avg_num_neighbors = float(avg_num_neighbors)
        if train_eps:
            self.eps = nn.Parameter(torch.zeros(()))
        else:
            self.register_buffer("eps", torch.zeros(()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.edge_linear.reset_parameters()
        if self.angular_l_max > 0:
            for linear in (self.density_radial, self.density_node, self.density_out):
                linear.reset_parameters()
        for module in self.mlp:
            if isinstance(module, nn.Linear):
                module.reset_parameters()
        with torch.no_grad():
            self.eps.zero_()

    def forward(
        self,
        h: Tensor,
        edge_index: Tensor,
        *,
        edge_attr: Tensor,
        edge_weight: Tensor,
        edge_sh: Tensor | None = None,
    ) -> Tensor:
        sender, receiver = edge_index[0], edge_index[1]
        messages = self.act(h[sender] + self.edge_linear(edge_attr))  # (n_edges, hidden)
        messages = messages * edge_weight.unsqueeze(-1)
        agg = torch.zeros_like(h).index_add_(0, receiver, messages) / self.avg_num_neighbors
        if self.angular_l_max > 0:
            if edge_sh is None:
                raise ValueError(
                    "angular_l_max > 0 needs edge_sh, the spherical harmonics of the edges"
                )
            agg = agg + self.density_out(
                self._power_spectrum(h, sender, receiver, edge_attr, edge_weight, edge_sh)
            )
        return h + self.mlp((1.0 + self.eps) * h + agg)

    def _power_spectrum(
        self,
        h: Tensor,
        sender: Tensor,
        receiver: Tensor,
        edge_attr: Tensor,
        edge_weight: Tensor,
        edge_sh: Tensor,
    ) -> Tensor:
        """B_i,c,l (:func:`mlip_unc.nn.power_spectrum.power_spectrum`), ``(n_atoms, channels * (l_max + 1))``."""
        w = (
            self.density_radial(edge_attr)
            * self.density_node(h[sender])
            * edge_weight.unsqueeze(-1)
        )  # (n_edges, c)
        return power_spectrum(w, receiver, edge_sh, h.shape[0], self.avg_num_neighbors)


class GeometricGIN(PerAtomBackbone):
    """Species embedding -> ``num_layers`` smooth GINE layers -> readout to ``latent_dim``.

    Args:
        num_types: number of species (length of the model's type map); input ``atom_type``.
        r_max: cutoff radius (must not exceed the graphs' neighbour-list radius).
        hidden: backbone width.
        latent_dim: width ``d`` of the per-atom latent fed to the Bayesian head.
        num_layers: message-passing layers.
        num_basis: radial basis functions.
        mlp_layers: depth of each update MLP.
        avg_num_neighbors: message normalisation (set it to the training set's mean degree).
        basis: ``"bessel"`` or ``"gaussian"``; cutoff: ``"polynomial"`` or ``"cosine"``.
        cutoff_p: degree of the polynomial envelope.
        train_eps: learn the GIN ``eps``.
        concat_layers: the readout input is every layer's features concatenated
            (``hidden * num_layers`` wide) instead of the last layer's (``hidden``).
        readout_hidden: widths of a per-atom SiLU MLP before the final linear map to
            ``latent_dim``; ``()`` is the linear readout.
        angular_l_max: with ``L > 0``, every layer adds the invariant power spectrum of a
            learned neighbour density up to ``l = L`` (three-body, angular information);
            0 (default): distances only.
        angular_channels: channels of that density.
        check_latent_span: raise ValueError when ``latent_dim`` exceeds the width the final
            linear map reads (it could not be spanned); off only for old checkpoints.

    Shapes:
        - **input:** a PyG graph/batch with ``pos``, ``atom_type``, ``edge_index`` and, if
          periodic, ``cell``, ``cell_shift``, ``batch`` (see :mod:`mlip_unc.keys`)
        - **output:** ``z (n_atoms, latent_dim)``, invariant
    """

    backbone_name = "gin"

    def __init__(
        self,
        num_types: int,
        *,
        r_max: float = 5.0,
        hidden: int = 32,
        latent_dim: int = 16,
        num_layers: int = 3,
        num_basis: int = 8,
        mlp_layers: int = 2,
        avg_num_neighbors: float = 1.0,
        basis: str = "bessel",
        cutoff: str = "polynomial",
        cutoff_p: int = 6,
        train_eps: bool = True,
        concat_layers: bool = False,
        readout_hidden: Sequence[int] = (),
        angular_l_max: int = 0,
        angular_channels: int = 16,
        check_latent_span: bool = True,
    ) -> None:
        super().__init__()
        self._config = {
            "num_types": int(num_types),
            "r_max": float(r_max),
            "hidden": int(hidden),
            "latent_dim": int(latent_dim),
            "num_layers": int(num_layers),
            "num_basis": int(num_basis),
            "mlp_layers": int(mlp_layers),
            "avg_num_neighbors": float(avg_num_neighbors),
            "basis": str(basis),
            "cutoff": str(cutoff),
            "cutoff_p": int(cutoff_p),
            "train_eps": bool(train_eps),
            "concat_layers": bool(concat_layers),
            "readout_hidden": [int(w) for w in readout_hidden],
            "angular_l_max": int(angular_l_max),
            "angular_channels": int(angular_channels),
            "check_latent_span": bool(check_latent_span),
        }
        self.concat_layers = bool(concat_layers)
        self.latent_dim = int(latent_dim)
        self.r_max = float(r_max)
        self.angular_l_max = int(angular_l_max)
        self.embedding = nn.Embedding(num_types, hidden)
        self.radial = RadialEmbedding(
            r_max, num_basis, basis=basis, cutoff=cutoff, cutoff_p=cutoff_p
        )
        self.layers = nn.ModuleList(
            GeometricGINLayer(
                hidden,
                num_basis,
                mlp_layers=mlp_layers,
                avg_num_neighbors=avg_num_neighbors,
                train_eps=train_eps,
                angular_l_max=angular_l_max,
                angular_channels=angular_channels,
            )
            for _ in range(num_layers)
        )
        in_width = hidden * num_layers if concat_layers else hidden
        self.readout = self._build_readout(
            in_width,
            latent_dim,
            readout_hidden,
            check_latent_span=check_latent_span,
            width_name=f"hidden = {hidden}"
            + (f" x num_layers = {num_layers}" if concat_layers else ""),
        )
        self.reset_parameters()

    def forward(self, batch: BaseData) -> Tensor:
        edge_index = batch[keys.EDGE_INDEX]
        vectors = batch_edge_vectors(batch)  # (n_edges, 3)
        r = torch.linalg.vector_norm(vectors, dim=-1)  # (n_edges,)
        edge_attr, envelope = self.radial(r)
        edge_sh = (
            edge_spherical_harmonics(vectors, self.angular_l_max)
            if self.angular_l_max > 0
            else None
        )
        h = self.embedding(batch[keys.ATOM_TYPE])  # (n_atoms, hidden)
        per_layer: list[Tensor] = []
        for layer in self.layers:
            h = layer(h, edge_index, edge_attr=edge_attr, edge_weight=envelope, edge_sh=edge_sh)
            per_layer.append(h)
        x = torch.cat(per_layer, dim=-1) if self.concat_layers else h  # (n_atoms, in_width)
        return self.readout(x)  # (n_atoms, latent_dim)
