"""EquivariantBackbone: a small E(3)-equivariant message-passing network (NequIP/MACE family).

Per layer (Batzner et al. 2022, NequIP's interaction block, simplified)::

    x        = Linear(h)                                          (equivariant linear)
    w_ij     = f_cut(r_ij) * MLP(basis(r_ij) * f_cut(r_ij))       (tensor-product weights)
    m_ij     = TP_uvu(x_j, Y(r_hat_ij); w_ij)                      (Y = spherical harmonics)
    h_i     <- Gate(Linear(sum_j m_ij / avg_num_neighbors) + SelfLinear(h_i)) (+ h_i)

Features carry irreps ``channels x (l, (-1)^l)`` for ``l = 0..l_max``; the last layer keeps
only scalars (``0e``), and a linear map takes them to the ``latent_dim``-wide invariant
latent. With ``angular_l_max = L > 0`` every block's gate also reads the bond-angle invariants
B_i (the power spectrum up to l = L of a neighbour density weighted by the block's input
scalars, :mod:`mlip_unc.nn.power_spectrum`), which l <= 1 messages summed over neighbours do
not carry (they see the angle at a neighbour, through its l = 1 features, only as cos theta). With ``concat_layers`` the readout reads the ``0e`` channels of every layer's output
(as MACE's per-layer readouts do), with ``readout_hidden`` through a per-atom SiLU MLP. Messages vanish smoothly at ``r_max`` (envelope on both the radial input and the
weights), so energies and forces are continuous across the cutoff.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from e3nn import o3
from e3nn.nn import FullyConnectedNet, Gate
from torch import Tensor, nn
from torch.nn import functional as F

from mlip_unc import keys
from mlip_unc.geometry import batch_edge_vectors
from mlip_unc.nn.power_spectrum import edge_spherical_harmonics, power_spectrum
from mlip_unc.nn.radial import PerAtomBackbone, RadialEmbedding

if TYPE_CHECKING:
    from torch_geometric.data.data import BaseData

__all__ = ["EquivariantBackbone", "EquivariantInteraction"]


def _natural_irreps(channels: int, l_max: int) -> o3.Irreps:
    return o3.Irreps([(channels, (l, (-1) ** l)) for l in range(l_max + 1)])


def _uvu_tensor_product(
    irreps_in: o3.Irreps, irreps_sh: o3.Irreps, allowed: o3.Irreps
) -> tuple[o3.TensorProduct, o3.Irreps]:
    """A weight-per-edge 'uvu' tensor product keeping the outputs whose irrep is in ``allowed``."""
    allowed_irs = {ir for _, ir in allowed}
    irreps_mid: list[tuple[int, o3.Irrep]] = []
    instructions = []
    for i, (mul, ir_in) in enumerate(irreps_in):
        for j, (_, ir_edge) in enumerate(irreps_sh):
            for ir_out in ir_in * ir_edge:
                if ir_out in allowed_irs:
                    instructions.append((i, j, len(irreps_mid), "uvu", True))
                    irreps_mid.append((mul, ir_out))
    mid = o3.Irreps(irreps_mid)
    mid_sorted, perm, _ = mid.sort()
    instructions = [(i, j, perm[k], mode, train) for i, j, k, mode, train in instructions]
    tp = o3.TensorProduct(
        irreps_in,
        irreps_sh,
        mid_sorted,
        instructions,
        shared_weights=False,
        internal_weights=False,
    )
    return tp, mid_sorted


def _scalar_slice(irreps: o3.Irreps) -> tuple[int, int]:
    """``(start, stop)`` of the ``0e`` block of ``irreps`` (one block: ``_natural_irreps``)."""
    blocks = [
        sl for (_, ir), sl in zip(irreps, irreps.slices(), strict=False) if ir == o3.Irrep("0e")
    ]
    if len(blocks) != 1:
        raise ValueError(f"expected exactly one 0e block in {irreps}")
    return blocks[0].start, blocks[0].stop


class EquivariantInteraction(nn.Module):
    """One interaction block: radial-weighted tensor-product messages, gate, residual.

    With ``angular_l_max > 0`` the gate input also gets a linear map of the power spectrum
    of a neighbour density (``angular_channels`` channels, weighted by the input scalars).

    Shapes:
        - **h:** ``(n_atoms, irreps_in.dim)``; **sh:** ``(n_edges, irreps_sh.dim)``
        - **edge_attr:** ``(n_edges, num_basis)``; **edge_weight:** ``(n_edges,)`` envelope
        - **edge_sh_angular:** ``(n_edges, (angular_l_max + 1)^2)`` when ``angular_l_max > 0``
        - **output:** ``(n_atoms, irreps_out.dim)``
    """

    def __init__(
        self,
        irreps_in: o3.Irreps,
        irreps_sh: o3.Irreps,
        irreps_out: o3.Irreps,
        *,
        num_basis: int,
        radial_hidden: int = 16,
        avg_num_neighbors: float = 1.0,
        angular_l_max: int = 0,
        angular_channels: int = 16,
    ) -> None:
        super().__init__()
        self.irreps_in, self.irreps_out = o3.Irreps(irreps_in), o3.Irreps(irreps_out)
        if angular_l_max < 0:
            raise ValueError(f"angular_l_max must be >= 0, got {angular_l_max}")
        self.angular_l_max = int(angular_l_max)
        self.avg_num_neighbors = float(avg_num_neighbors)
        self.linear_up = o3.Linear(self.irreps_in, self.irreps_in)
        self.tp, self.irreps_mid = _uvu_tensor_product(self.irreps_in, irreps_sh, self.irreps_out)
        self.radial_mlp = FullyConnectedNet(
            [num_basis, radial_hidden, self.tp.weight_numel], F.silu
        )
        scalars = o3.Irreps([(mul, ir) for mul, ir in self.irreps_out if ir.l == 0])
        gated = o3.Irreps([(mul, ir) for mul, ir in self.irreps_out if ir.l > 0])
        if gated.num_irreps > 0:
            self.gate: nn.Module = Gate(
                scalars, [F.silu], o3.Irreps(f"{gated.num_irreps}x0e"), [torch.sigmoid], gated
            )
            irreps_gate_in = self.gate.irreps_in
        else:
            self.gate = nn.SiLU()
            irreps_gate_in = self.irreps_out
        self.linear_down = o3.Linear(self.irreps_mid, irreps_gate_in)
        self.self_connection = o3.Linear(self.irreps_in, irreps_gate_in)
        self.residual = self.irreps_in == self.irreps_out
        if self.angular_l_max > 0:
            self._in_scalars = _scalar_slice(self.irreps_in)
            n_in = self._in_scalars[1] - self._in_scalars[0]
            self.density_radial = nn.Linear(num_basis, angular_channels)
            self.density_node = nn.Linear(n_in, angular_channels, bias=False)
            self.density_out = o3.Linear(
                o3.Irreps(f"{angular_channels * (self.angular_l_max + 1)}x0e"), irreps_gate_in
            )

    def reset_parameters(self) -> None:
        angular = (self.density_out,) if self.angular_l_max > 0 else ()
        for module in (self.linear_up, self.linear_down, self.self_connection, *angular):
            with torch.no_grad():
                module.weight.normal_()  # e3nn's own initialisation (path-normalised)
        if self.angular_l_max > 0:
            self.density_radial.reset_parameters()
            self.density_node.reset_parameters()
        for layer in self.radial_mlp:
            with torch.no_grad():
                layer.weight.normal_()

    def forward(
        self,
        h: Tensor,
        edge_index: Tensor,
        *,
        sh: Tensor,
        edge_attr: Tensor,
        edge_weight: Tensor,
        edge_sh_angular: Tensor | None = None,
    ) -> Tensor:
        sender, receiver = edge_index[0], edge_index[1]
        x = self.linear_up(h)
        weights = self.radial_mlp(edge_attr) * edge_weight.unsqueeze(-1)  # (n_edges, weight_numel)
        messages = self.tp(x[sender], sh, weights)  # (n_edges, irreps_mid.dim)
        agg = messages.new_zeros(h.shape[0], messages.shape[-1]).index_add_(0, receiver, messages)
        gate_in = self.linear_down(agg / self.avg_num_neighbors) + self.self_connection(h)
        if self.angular_l_max > 0:
            if edge_sh_angular is None:
                raise ValueError(
                    "angular_l_max > 0 needs edge_sh_angular, the spherical harmonics of the edges"
                )
            start, stop = self._in_scalars
            w = (
                self.density_radial(edge_attr)
                * self.density_node(h[sender, start:stop])
                * edge_weight.unsqueeze(-1)
            )
            b = power_spectrum(w, receiver, edge_sh_angular, h.shape[0], self.avg_num_neighbors)
            gate_in = gate_in + self.density_out(b)
        out = self.gate(gate_in)
        return out + h if self.residual else out


class EquivariantBackbone(PerAtomBackbone):
    """Species embedding -> ``num_layers`` equivariant interactions -> invariant latent.

    Args:
        num_types: number of species (input ``atom_type``).
        r_max: cutoff radius (must not exceed the graphs' neighbour-list radius).
        latent_dim: width ``d`` of the per-atom latent fed to the Bayesian head.
        channels: multiplicity of every irrep in the hidden features.
        l_max: highest rotation order of spherical harmonics and hidden features.
        num_layers: interaction blocks (the last one outputs scalars only).
        num_basis: Bessel functions; radial_hidden: width of the radial MLP.
        avg_num_neighbors: message normalisation (set it to the training set's mean degree).
        cutoff_p: degree of the polynomial envelope.
        concat_layers: the readout input is the ``0e`` channels of every layer's output
            concatenated (``channels * num_layers`` wide) instead of the last layer's.
        readout_hidden: widths of a per-atom SiLU MLP before the final linear map to
            ``latent_dim``; ``()`` is the linear readout.
        angular_l_max: with ``L > 0`` every block's gate also reads the bond-angle power
            spectrum up to ``l = L``; 0 (default): none.
        angular_channels: channels of that neighbour density.
        check_latent_span: raise ValueError when ``latent_dim`` exceeds the width the final
            linear map reads (it could not be spanned); off only for old checkpoints.

    Shapes:
        - **input:** a PyG graph/batch (``pos``, ``atom_type``, ``edge_index``, ``cell``,
          ``cell_shift``, ``batch``; see :mod:`mlip_unc.keys`)
        - **output:** ``z (n_atoms, latent_dim)``, invariant under E(3)
    """

    backbone_name = "equivariant"

    def __init__(
        self,
        num_types: int,
        *,
        r_max: float = 5.0,
        latent_dim: int = 8,
        channels: int = 8,
        l_max: int = 1,
        num_layers: int = 2,
        num_basis: int = 8,
        radial_hidden: int = 16,
        avg_num_neighbors: float = 1.0,
        cutoff_p: int = 6,
        concat_layers: bool = False,
        readout_hidden: Sequence[int] = (),
        angular_l_max: int = 0,
        angular_channels: int = 16,
        check_latent_span: bool = True,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self._config = {
            "num_types": int(num_types),
            "r_max": float(r_max),
            "latent_dim": int(latent_dim),
            "channels": int(channels),
            "l_max": int(l_max),
            "num_layers": int(num_layers),
            "num_basis": int(num_basis),
            "radial_hidden": int(radial_hidden),
            "avg_num_neighbors": float(avg_num_neighbors),
            "cutoff_p": int(cutoff_p),
            "concat_layers": bool(concat_layers),
            "readout_hidden": [int(w) for w in readout_hidden],
            "angular_l_max": int(angular_l_max),
            "angular_channels": int(angular_channels),
            "check_latent_span": bool(check_latent_span),
        }
        self.angular_l_max = int(angular_l_max)
        self.concat_layers = bool(concat_layers)
        self.latent_dim = int(latent_dim)
        self.r_max = float(r_max)
        self.embedding = nn.Embedding(num_types, channels)
        self.radial = RadialEmbedding(
            r_max, num_basis, basis="bessel", cutoff="polynomial", cutoff_p=cutoff_p
        )
        self.irreps_sh = o3.Irreps.spherical_harmonics(l_max)
        self.spherical_harmonics = o3.SphericalHarmonics(
            self.irreps_sh, normalize=True, normalization="component"
        )
        scalars = o3.Irreps(f"{channels}x0e")
        hidden = _natural_irreps(channels, l_max)
        irreps = [scalars] + [hidden] * (num_layers - 1) + [scalars]
        self.layers = nn.ModuleList(
            EquivariantInteraction(
                irreps[k],
                self.irreps_sh,
                irreps[k + 1],
                num_basis=num_basis,
                radial_hidden=radial_hidden,
                avg_num_neighbors=avg_num_neighbors,
                angular_l_max=angular_l_max,
                angular_channels=angular_channels,
            )
            for k in range(num_layers)
        )
        # (0e start, stop) of every layer's output, read by the concatenated readout
        self._scalar_slices = [_scalar_slice(layer.irreps_out) for layer in self.layers]
        in_width = channels * num_layers if concat_layers else channels
        self.readout = self._build_readout(
            in_width,
            latent_dim,
            readout_hidden,
            check_latent_span=check_latent_span,
            width_name=f"channels = {channels}"
            + (f" x num_layers = {num_layers}" if concat_layers else ""),
        )

    def forward(self, batch: BaseData) -> Tensor:
        edge_index = batch[keys.EDGE_INDEX]
        vec = batch_edge_vectors(batch)  # (n_edges, 3)
        r = torch.linalg.vector_norm(vec, dim=-1)  # (n_edges,)
        edge_attr, envelope = self.radial(r)
        sh = self.spherical_harmonics(vec)  # (n_edges, irreps_sh.dim)
        sh_angular = (
            edge_spherical_harmonics(vec, self.angular_l_max) if self.angular_l_max > 0 else None
        )
        h = self.embedding(batch[keys.ATOM_TYPE])  # (n_atoms, channels) scalars
        scalars: list[Tensor] = []
        for layer, (start, stop) in zip(self.layers, self._scalar_slices, strict=False):
            h = layer(
                h,
                edge_index,
                sh=sh,
                edge_attr=edge_attr,
                edge_weight=envelope,
                edge_sh_angular=sh_angular,
            )
            scalars.append(h[:, start:stop])  # (n_atoms, channels) 0e part
        x = torch.cat(scalars, dim=-1) if self.concat_layers else h  # (n_atoms, in_width)
        return self.readout(x)  # (n_atoms, latent_dim)
