"""MACE (mace-torch) as a backbone of the Bayesian head: trained here, or a user's trained model.

Both run mace-torch's own blocks (species embedding, radial and spherical-harmonic edge
features, interaction and product blocks; Batatia et al. 2022) on this project's batches:

- :class:`MACEBackbone` (``backbone: mace``): a new MACE, trained by this project's trainer and
  losses. Its readouts are dropped; the ``0e`` scalars of every layer's node features,
  concatenated (``channels * num_layers`` wide), go through this project's readout
  (:meth:`PerAtomBackbone._build_readout`) to the ``latent_dim`` latents of the Bayesian head,
  or (``readout="mace"``) through mace-torch's readout structure up to its final linear maps.
- :class:`MACEModelFeatures` (``backbone: mace_model``): a MACE model trained with mace-torch,
  frozen (``mlip-unc attach``). Its latents are the model's last-layer features, the inputs of
  the final linear map of each readout: the ``0e`` scalars of a layer with a linear readout and
  the hidden activations of the non-linear readout of the last layer, so the model's energy is
  linear in them. :meth:`MACEModelFeatures.latents_and_energies` adds the model's own per-atom
  energies (the ``base energy`` of :mod:`mlip_unc.models.backbones`): under a zero-mean head
  the potential predicts what the MACE model predicts (to rounding, see
  :mod:`mlip_unc.posthoc.attach`).

Edges: this project's ``edge_index`` is ``[sender j, receiver i]`` with
``edge_vec = pos[j] - pos[i] + shift @ cell`` (:mod:`mlip_unc.geometry`), pointing from the
receiver to the sender; MACE's edge vector points from the sender to the receiver, so MACE is
given ``-batch_edge_vectors(batch)`` on the same ``edge_index``: the same messages, and the
gradients reach positions and cell (forces, stress).

mace-torch is optional: it is imported when a MACE backbone is built (the ``mace`` extra; a
missing install raises :class:`~mlip_unc.nn.extras.MissingDependencyError` with the pip command
for this installation). e3nn compiles the blocks' modules with TorchScript as they are built,
and torch warns about their annotations once per module: :func:`quiet_scripting` drops those
warnings, which say nothing about the model. The constructor arguments of both classes are plain data, so checkpoints
rebuild them without pickled code (:mod:`mlip_unc.nn.mace_config` converts a model's config).
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from mlip_unc import keys
from mlip_unc.geometry import batch_edge_vectors
from mlip_unc.nn.extras import MissingDependencyError, pip_install_hint
from mlip_unc.nn.radial import PerAtomBackbone

if TYPE_CHECKING:
    from torch_geometric.data.data import BaseData

__all__ = [
    "MACEBackbone",
    "MACEModelFeatures",
    "import_mace",
    "mace_inputs",
    "mace_layer_features",
    "quiet_scripting",
]

#: torch's warning on every e3nn module that TorchScript compiles while a MACE is built
_SCRIPTING_WARNING = r"The TorchScript type system doesn't support instance-level annotations"


def import_mace(name: str = "mace.modules") -> Any:
    """Import a mace-torch module, or raise :class:`MissingDependencyError` saying how to
    install it (the command right for this installation)."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise MissingDependencyError(
            f"the MACE backbones need mace-torch ({name} could not be imported: {err}); "
            f"install it with: {pip_install_hint('mace')}"
        ) from err


@contextlib.contextmanager
def quiet_scripting() -> Iterator[None]:
    """Build mace-torch modules without torch's TorchScript annotation warnings (one per e3nn
    module compiled; other warnings pass)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SCRIPTING_WARNING, category=UserWarning)
        yield


def scalar_slices(irreps: Any) -> list[tuple[int, int]]:
    """``(start, stop)`` of every ``0e`` block of an ``e3nn.o3.Irreps``."""
    return [
        (sl.start, sl.stop)
        for (_, ir), sl in zip(irreps, irreps.slices(), strict=False)
        if ir.l == 0 and ir.p == 1
    ]


def mace_inputs(batch: BaseData, num_elements: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What MACE's blocks read, from a batch of this project.

    Returns:
        ``node_attrs (n_atoms, num_elements)`` one-hot species (in the positions' dtype),
        ``vectors (n_edges, 3)`` sender -> receiver (MACE's convention, ``-edge_vec``),
        ``lengths (n_edges, 1)`` and ``edge_index (2, n_edges)``.
    """
    pos = batch[keys.POSITIONS]
    node_attrs = nn.functional.one_hot(batch[keys.ATOM_TYPE], num_elements).to(pos.dtype)
    vectors = -batch_edge_vectors(batch)  # (n_edges, 3)
    lengths = torch.linalg.norm(vectors, dim=-1, keepdim=True)  # (n_edges, 1), as MACE computes it
    return node_attrs, vectors, lengths, batch[keys.EDGE_INDEX]


def mace_layer_features(
    mace: Any, node_attrs: Tensor, vectors: Tensor, lengths: Tensor, edge_index: Tensor
) -> list[Tensor]:
    """Node features after each interaction + product block of a mace-torch ``MACE``
    (the loop of ``MACE.forward``): ``[(n_atoms, irreps_l.dim)]``, one per layer."""
    node_feats = mace.node_embedding(node_attrs)
    edge_attrs = mace.spherical_harmonics(vectors)
    edge_feats, cutoff = mace.radial_embedding(lengths, node_attrs, edge_index, mace.atomic_numbers)
    features = []
    for i, (interaction, product) in enumerate(zip(mace.interactions, mace.products, strict=False)):
        node_feats, sc = interaction(
            node_attrs=node_attrs,
            node_feats=node_feats,
            edge_attrs=edge_attrs,
            edge_feats=edge_feats,
            edge_index=edge_index,
            cutoff=cutoff,
            first_layer=(i == 0),
        )
        node_feats = product(node_feats=node_feats, sc=sc, node_attrs=node_attrs)
        features.append(node_feats)
    return features


def _hidden_irreps(channels: int, max_L: int) -> str:
    return "+".join(f"{channels}x{l}{'e' if l % 2 == 0 else 'o'}" for l in range(max_L + 1))


class MACEBackbone(PerAtomBackbone):
    """A MACE trained under the Bayesian head: ``0e`` scalars of every layer -> readout.

    Args:
        num_types: number of species (input ``atom_type``).
        r_max: cutoff radius (Angstrom).
        latent_dim: width ``d`` of the per-atom latents.
        channels: MACE's ``num_channels`` (multiplicity of every hidden irrep).
        max_L: highest rotation order of the hidden features (``hidden_irreps``).
        l_max: highest order of the edge spherical harmonics (MACE's ``max_ell``).
        num_layers: interaction blocks (``num_interactions``; the last one keeps scalars only).
        correlation: body order of the product basis (``correlation``).
        num_basis: Bessel functions (``num_bessel``); cutoff_p: polynomial envelope degree.
        radial_mlp: hidden widths of the radial MLP of the interactions.
        avg_num_neighbors: message normalisation (the training set's mean degree).
        interaction, interaction_first: keys of ``mace.modules.interaction_classes``, the
            blocks of the later layers and of the first (``mace_run_train``'s MACE defaults).
        readout_hidden: ``readout="mlp"``: widths of a per-atom SiLU MLP before the linear map
            to ``latent_dim``; ``readout="mace"``: one width, that of the last layer's MLP.
        readout: ``"mlp"``: the ``0e`` scalars of all layers, concatenated, through that MLP
            and a linear map; ``"mace"``: mace-torch's readout structure with the head's linear
            map as the final one: latents = the ``0e`` scalars of every layer but the last,
            then ``SiLU(Linear(last layer's scalars))`` (``readout_hidden[0]`` wide, e3nn's
            normalised ``o3.Linear`` as mace-torch's NonLinearReadoutBlock); ``latent_dim`` must
            equal that width.
        latent_norm: (``readout="mace"``) divide the latents by ``sqrt(latent_dim)``, the
            normalisation e3nn's ``o3.Linear`` applies inside mace-torch's final readout map, so
            the head's weights are of order one and an optimiser step moves the energy as much
            as it moves mace-torch's.
        check_latent_span: ValueError when ``latent_dim`` exceeds the width the final linear
            map reads.

    Shapes:
        - **input:** a PyG graph/batch (``pos``, ``atom_type``, ``edge_index``, ``cell``,
          ``cell_shift``, ``batch``)
        - **output:** ``z (n_atoms, latent_dim)``, invariant under E(3)
    """

    backbone_name = "mace"

    def __init__(
        self,
        num_types: int,
        *,
        r_max: float = 5.0,
        latent_dim: int = 32,
        channels: int = 32,
        max_L: int = 1,  # MACE's name
        l_max: int = 3,
        num_layers: int = 2,
        correlation: int = 3,
        num_basis: int = 8,
        cutoff_p: int = 5,
        radial_mlp: Sequence[int] = (64, 64, 64),
        avg_num_neighbors: float = 1.0,
        interaction: str = "RealAgnosticResidualInteractionBlock",
        interaction_first: str = "RealAgnosticInteractionBlock",
        readout_hidden: Sequence[int] = (),
        readout: str = "mlp",
        latent_norm: bool = False,
        check_latent_span: bool = True,
    ) -> None:
        super().__init__()
        modules = import_mace()
        import numpy as np
        from e3nn import o3

        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        for name in (interaction, interaction_first):
            if name not in modules.interaction_classes:
                raise ValueError(
                    f"unknown MACE interaction {name!r}; known: {sorted(modules.interaction_classes)}"
                )
        self._config = {
            "num_types": int(num_types),
            "r_max": float(r_max),
            "latent_dim": int(latent_dim),
            "channels": int(channels),
            "max_L": int(max_L),
            "l_max": int(l_max),
            "num_layers": int(num_layers),
            "correlation": int(correlation),
            "num_basis": int(num_basis),
            "cutoff_p": int(cutoff_p),
            "radial_mlp": [int(w) for w in radial_mlp],
            "avg_num_neighbors": float(avg_num_neighbors),
            "interaction": str(interaction),
            "interaction_first": str(interaction_first),
            "readout_hidden": [int(w) for w in readout_hidden],
            "readout": str(readout),
            "latent_norm": bool(latent_norm),
            "check_latent_span": bool(check_latent_span),
        }
        self.latent_dim = int(latent_dim)
        self.r_max = float(r_max)
        self.num_types = int(num_types)
        with quiet_scripting():
            self.mace = modules.MACE(
                r_max=float(r_max),
                num_bessel=int(num_basis),
                num_polynomial_cutoff=int(cutoff_p),
                max_ell=int(l_max),
                interaction_cls=modules.interaction_classes[interaction],
                interaction_cls_first=modules.interaction_classes[interaction_first],
                num_interactions=int(num_layers),
                num_elements=int(num_types),
                hidden_irreps=o3.Irreps(_hidden_irreps(int(channels), int(max_L))),
                MLP_irreps=o3.Irreps("16x0e"),
                atomic_energies=np.zeros(int(num_types)),
                avg_num_neighbors=float(avg_num_neighbors),
                atomic_numbers=list(range(1, int(num_types) + 1)),
                correlation=int(correlation),
                gate=torch.nn.functional.silu,
                radial_MLP=[int(w) for w in radial_mlp],
            )
        # atomic_numbers 1..num_types stand for the type indices: only MACE's ZBL repulsion and
        # distance transforms read them, and neither is used here. The readouts are this project's: MACE's are dropped.
        self.mace.readouts = nn.ModuleList()
        self._scalar_slices = [
            scalar_slices(product.linear.irreps_out)[0] for product in self.mace.products
        ]
        widths = [stop - start for start, stop in self._scalar_slices]
        self.readout_kind = str(readout)
        if latent_norm and self.readout_kind != "mace":
            raise ValueError("latent_norm applies to readout='mace' only")
        self.latent_scale = 1.0 / float(np.sqrt(self.latent_dim)) if latent_norm else 1.0
        if self.readout_kind == "mace":
            if len(readout_hidden) != 1 or int(readout_hidden[0]) <= 0:
                raise ValueError(
                    f"readout='mace' takes one MLP width in readout_hidden, got {list(readout_hidden)}"
                )
            mlp = int(readout_hidden[0])
            if self.latent_dim != sum(widths[:-1]) + mlp:
                raise ValueError(
                    f"readout='mace': latent_dim must be {sum(widths[:-1]) + mlp} (channels x "
                    f"(num_layers - 1) + readout_hidden[0]), got {self.latent_dim}"
                )
            self.readout = o3.Linear(o3.Irreps(f"{widths[-1]}x0e"), o3.Irreps(f"{mlp}x0e"))
        elif self.readout_kind == "mlp":
            self.readout = self._build_readout(
                sum(widths),
                self.latent_dim,
                readout_hidden,
                check_latent_span=check_latent_span,
                width_name=f"channels = {channels} x num_layers = {num_layers}",
            )
        else:
            raise ValueError(f"readout must be 'mlp' or 'mace', got {readout!r}")

    def reset_parameters(self) -> None:
        """Fresh weights with MACE's own initialisation (a new instance of the same config)."""
        self.load_state_dict(type(self)(**self.config()).state_dict())  # copied into this dtype

    def forward(self, batch: BaseData) -> Tensor:
        node_attrs, vectors, lengths, edge_index = mace_inputs(batch, self.num_types)
        features = mace_layer_features(self.mace, node_attrs, vectors, lengths, edge_index)
        scalars = [
            h[:, a:b] for h, (a, b) in zip(features, self._scalar_slices, strict=False)
        ]  # (n_atoms, channels) each
        if self.readout_kind == "mace":  # earlier layers' scalars, then SiLU(Linear(last layer's))
            z = torch.cat([*scalars[:-1], nn.functional.silu(self.readout(scalars[-1]))], dim=-1)
            return z * self.latent_scale if self.latent_scale != 1.0 else z  # (n_atoms, latent_dim)
        return self.readout(torch.cat(scalars, dim=-1))  # (n_atoms, latent_dim)


class MACEModelFeatures(nn.Module):
    """A frozen mace-torch ``ScaleShiftMACE``: its last-layer features and its own energies.

    Args:
        mace_class: ``"ScaleShiftMACE"``.
        mace_config: its constructor arguments as plain data
            (:func:`mlip_unc.nn.mace_config.plain_mace_config`); the weights come with the
            potential's state dict.

    ``forward(batch) -> z (n_atoms, latent_dim)``; ``latents_and_energies(batch)`` also returns
    the model's per-atom energies ``(n_atoms,)`` (E0 + scale * interaction energy + shift), in
    the order of operations of ``ScaleShiftMACE.forward``. The parameters are frozen.
    """

    backbone_name = "mace_model"
    model: Any  # a mace-torch ScaleShiftMACE (mace-torch has no type hints)

    def __init__(self, mace_class: str, mace_config: dict[str, Any]) -> None:
        super().__init__()
        from mlip_unc.nn.mace_config import build_mace_model

        self._config: dict[str, Any] = {
            "mace_class": str(mace_class),
            "mace_config": dict(mace_config),
        }
        self.model = build_mace_model(mace_class, mace_config)
        self.model.requires_grad_(False)
        self.r_max = float(mace_config["r_max"])
        self.num_elements = len(self.model.atomic_numbers)
        blocks = import_mace("mace.modules.blocks")
        self._readouts: list[tuple[str, tuple[int, int]]] = []  # (kind, 0e slice of its input)
        products, width = list(self.model.products), 0
        for i, readout in enumerate(self.model.readouts):
            layer = len(products) - 1 if len(self.model.readouts) == 1 else i
            scalars = scalar_slices(products[layer].linear.irreps_out)[0]
            if type(readout) is blocks.LinearReadoutBlock:
                self._readouts.append(("linear", scalars))
                width += scalars[1] - scalars[0]
            elif type(readout) is blocks.NonLinearReadoutBlock:
                self._readouts.append(("mlp", scalars))
                width += readout.linear_1.irreps_out.dim
            else:
                raise ValueError(
                    f"MACE readout {type(readout).__name__} is not supported (LinearReadoutBlock "
                    "and NonLinearReadoutBlock are)"
                )
        self.latent_dim = width

    def config(self) -> dict[str, Any]:
        """Constructor kwargs as plain data."""
        return {
            "mace_class": self._config["mace_class"],
            "mace_config": dict(self._config["mace_config"]),
        }

    def forward(self, batch: BaseData) -> Tensor:
        return self.latents_and_energies(batch)[0]

    def latents_and_energies(self, batch: BaseData) -> tuple[Tensor, Tensor]:
        """``(z (n_atoms, latent_dim), energies (n_atoms,))``: last-layer features, own energies."""
        model = self.model
        node_attrs, vectors, lengths, edge_index = mace_inputs(batch, self.num_elements)
        n_atoms = node_attrs.shape[0]
        heads = torch.zeros(n_atoms, dtype=torch.long, device=node_attrs.device)
        arange = torch.arange(n_atoms, device=node_attrs.device)
        node_e0 = model.atomic_energies_fn(node_attrs)[arange, heads]  # (n_atoms,)
        if hasattr(model, "pair_repulsion"):
            pair = model.pair_repulsion_fn(lengths, node_attrs, edge_index, model.atomic_numbers)
        else:
            pair = torch.zeros_like(node_e0)
        features = mace_layer_features(model, node_attrs, vectors, lengths, edge_index)
        latents, node_es = [], [pair]
        for i, (readout, (kind, scalars)) in enumerate(
            zip(model.readouts, self._readouts, strict=False)
        ):
            h = features[-1 if len(model.readouts) == 1 else i]
            if kind == "linear":
                latents.append(h[:, scalars[0] : scalars[1]])
                node_es.append(readout(h, heads)[arange, heads])
            else:  # NonLinearReadoutBlock.forward for one head, keeping its hidden activations
                hidden = readout.non_linearity(readout.linear_1(h))  # (n_atoms, mlp width)
                latents.append(hidden)
                node_es.append(readout.linear_2(hidden)[arange, heads])
        node_inter = model.scale_shift(torch.sum(torch.stack(node_es, dim=0), dim=0), heads)
        return torch.cat(latents, dim=-1), node_e0 + node_inter
