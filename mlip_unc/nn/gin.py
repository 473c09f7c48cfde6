"""A GINE backbone for molecular graphs: categorical atom/bond features -> graph latent z.

Input graphs are those of ``torch_geometric.utils.from_smiles`` (see mlip_unc/keys.py):
``x`` (n_atoms, 9) long and ``edge_attr`` (n_edges, 3) long, each column a categorical index
into ``torch_geometric.utils.smiles.x_map`` / ``e_map``. Each column has its own
``nn.Embedding``; the embeddings are summed (the OGB atom/bond encoder).

Message passing (Hu et al. 2020, "GINE"), per layer l with its own bond embedding e^l::

    h_i <- h_i + Dropout(Act(Norm(MLP((1 + eps) h_i + sum_{j->i} ReLU(h_j + e^l_ji)))))

then pooling over atoms and a small readout ``Linear(h, h) -> Act -> Linear(h, d)`` to the
Bayesian latent width d (kept separate from the backbone width h). z has no final activation.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn
from torch_geometric.nn import GINEConv, global_add_pool, global_max_pool, global_mean_pool
from torch_geometric.nn.norm import BatchNorm, LayerNorm
from torch_geometric.utils.smiles import e_map, x_map

from mlip_unc.config.enums import Norm, Pooling

ATOM_VOCAB: tuple[int, ...] = tuple(len(v) for v in x_map.values())
"""Vocabulary size of each of the 9 atom feature columns of ``from_smiles``."""
BOND_VOCAB: tuple[int, ...] = tuple(len(v) for v in e_map.values())
"""Vocabulary size of each of the 3 bond feature columns of ``from_smiles``."""


_POOL = {Pooling.MEAN: global_mean_pool, Pooling.SUM: global_add_pool, Pooling.MAX: global_max_pool}


class CategoricalEmbedding(nn.Module):
    """Sum of one ``nn.Embedding`` per categorical column.

    Shapes:
        - **input:** ``(n, len(vocab))`` long
        - **output:** ``(n, dim)``
    """

    def __init__(self, vocab: tuple[int, ...], dim: int) -> None:
        super().__init__()
        self.vocab = tuple(vocab)
        self.embeddings = nn.ModuleList(nn.Embedding(size, dim) for size in self.vocab)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for emb in self.embeddings:
            nn.init.xavier_uniform_(cast(nn.Embedding, emb).weight)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != len(self.vocab):
            raise ValueError(
                f"expected (n, {len(self.vocab)}) categorical features, got {tuple(x.shape)}"
            )
        out = self.embeddings[0](x[:, 0])
        for k in range(1, len(self.vocab)):
            out = out + self.embeddings[k](x[:, k])
        return out


def _norm(kind: Norm, width: int) -> nn.Module:
    if kind is Norm.BATCH:
        return BatchNorm(width, allow_single_element=True)
    if kind is Norm.LAYER:
        return LayerNorm(width, mode="graph")
    return nn.Identity()


class MolecularGIN(nn.Module):
    """GINE message passing on molecular graphs, pooled and projected to a latent z.

    Args:
        hidden: backbone width h.
        layers: number of GINE layers.
        latent_dim: width d of z (the input of the Bayesian output layer).
        pooling: ``"mean" | "sum" | "max"``.
        dropout: dropout after each layer and in the readout (also MC dropout's source).
        norm: ``"batch" | "layer" | "none"``.
        atom_vocab, bond_vocab: vocabulary sizes of the categorical columns
            (default: those of ``from_smiles``).

    Shapes:
        - **input:** x ``(n_atoms, 9)`` long, edge_index ``(2, n_edges)``,
          edge_attr ``(n_edges, 3)`` long, batch ``(n_atoms,)``
        - **output:** z ``(n_graphs, latent_dim)``
    """

    def __init__(
        self,
        hidden: int = 128,
        layers: int = 4,
        latent_dim: int = 32,
        *,
        pooling: Pooling | str = Pooling.MEAN,
        dropout: float = 0.0,
        norm: Norm | str = Norm.BATCH,
        atom_vocab: tuple[int, ...] = ATOM_VOCAB,
        bond_vocab: tuple[int, ...] = BOND_VOCAB,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if layers < 1 or hidden < 1 or latent_dim < 1:
            raise ValueError("hidden, layers and latent_dim must be positive")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.hidden, self.num_layers, self.latent_dim = hidden, layers, latent_dim
        self.pooling, self.norm_kind = Pooling(pooling), Norm(norm)
        self.atom_encoder = CategoricalEmbedding(atom_vocab, hidden)
        self.bond_encoders = nn.ModuleList(
            CategoricalEmbedding(bond_vocab, hidden) for _ in range(layers)
        )
        self.convs = nn.ModuleList(
            GINEConv(
                nn.Sequential(
                    nn.Linear(hidden, 2 * hidden), nn.ReLU(), nn.Linear(2 * hidden, hidden)
                ),
                train_eps=True,
            )
            for _ in range(layers)
        )
        self.norms = nn.ModuleList(_norm(self.norm_kind, hidden) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)
        self.readout = nn.Sequential(
            nn.Linear(hidden, hidden), nn.SiLU(), nn.Dropout(dropout), nn.Linear(hidden, latent_dim)
        )
        self.to(device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        self.atom_encoder.reset_parameters()
        for enc, conv, norm in zip(self.bond_encoders, self.convs, self.norms, strict=False):
            cast(CategoricalEmbedding, enc).reset_parameters()
            cast(GINEConv, conv).reset_parameters()
            reset_norm = getattr(norm, "reset_parameters", None)
            if reset_norm is not None:
                reset_norm()
        for layer in self.readout:
            reset_layer = getattr(layer, "reset_parameters", None)
            if reset_layer is not None:
                reset_layer()

    def forward(
        self, x: Tensor, edge_index: Tensor, *, edge_attr: Tensor, batch: Tensor | None = None
    ) -> Tensor:
        if batch is None:
            batch = x.new_zeros(x.shape[0], dtype=torch.long)
        n_graphs = int(batch.max()) + 1 if batch.numel() else 0
        h = self.atom_encoder(x)  # (n_atoms, h)
        for enc, conv, norm in zip(self.bond_encoders, self.convs, self.norms, strict=False):
            e = enc(edge_attr)  # (n_edges, h)
            m = conv(h, edge_index, edge_attr=e)
            m = norm(m, batch) if isinstance(norm, LayerNorm) else norm(m)
            h = h + self.dropout(torch.relu(m))
        pooled = _POOL[self.pooling](h, batch, size=n_graphs)  # (n_graphs, h)
        return self.readout(pooled)  # (n_graphs, d)

    def extra_repr(self) -> str:
        return f"pooling={self.pooling.value}, norm={self.norm_kind.value}"
