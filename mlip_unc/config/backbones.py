"""Typed options of each potential backbone: the ``model.backbone_kwargs`` section.

``model.backbone`` picks the model that validates ``model.backbone_kwargs``, so a misspelt or
misplaced option is an error at load time that names the key and suggests the closest one
(``model.backbone_kwargs.hiden: unknown key (did you mean 'hidden'?)``). The fields and
defaults are the backbone constructors' keyword arguments (``mlip_unc.nn``); the ones the
trainer sets itself are not options: ``num_types`` (the type map), ``r_max``
(``data.r_max``), ``latent_dim`` (``model.latent_dim``) and ``avg_num_neighbors`` (the
training data's mean degree).

An options model reads as a mapping of keyword arguments, so ``build_backbone(name,
**options)`` works as it did with the plain dict this section used to be.

The built-in backbones are registered here (:mod:`mlip_unc.registry`), next to their options
and with lazy ``"module:attr"`` targets, so that reading a config imports no torch. Another
backbone registers itself, its options model beside it (``docs/guides/extending.md``).
"""

from __future__ import annotations

from collections.abc import KeysView
from typing import Any, Literal

from pydantic import Field

from mlip_unc.config.enums import Backbone
from mlip_unc.config.loader import Section
from mlip_unc.registry import register_backbone

__all__ = [
    "BACKBONE_OPTIONS",
    "BackboneName",
    "RESERVED_BACKBONE_KEYS",
    "BackboneOptions",
    "EquivariantOptions",
    "GINOptions",
    "MACEOptions",
]

RESERVED_BACKBONE_KEYS: dict[str, str] = {
    "num_types": "the type map of the training data",
    "r_max": "data.r_max",
    "latent_dim": "model.latent_dim",
    "avg_num_neighbors": "the training data (mean number of neighbours)",
}
"""Constructor arguments the trainer sets, and what sets them
(:data:`mlip_unc.registry.TRAINER_KEYS`, which no backbone's options may hold)."""


class BackboneName(str):
    """``model.backbone`` when it names a registered backbone outside the :class:`Backbone`
    enum of the built-ins: a string that reads like an enum member (``.value``)."""

    @property
    def value(self) -> str:
        return str(self)


class BackboneOptions(Section):
    """Base of the per-backbone options: a frozen section that reads as a mapping.

    A backbone's options subclass it, one field per constructor keyword argument but those the
    trainer sets (:data:`RESERVED_BACKBONE_KEYS`), with the constructor's defaults.
    """

    def kwargs(self) -> dict[str, Any]:
        """The options as constructor keyword arguments (lists stay lists)."""
        return self.model_dump()

    def keys(self) -> KeysView[str]:
        return self.kwargs().keys()

    def __getitem__(self, key: str) -> Any:
        return self.kwargs()[key]

    def __contains__(self, key: object) -> bool:
        return key in type(self).model_fields


class GINOptions(BackboneOptions):
    """Options of ``backbone: gin`` (:class:`~mlip_unc.nn.geometric_gin.GeometricGIN`).

    Attributes:
        hidden: node feature width.
        num_layers: message-passing layers.
        num_basis: radial basis functions.
        mlp_layers: depth of each update MLP.
        basis: radial basis, ``bessel`` or ``gaussian``.
        cutoff: cutoff envelope, ``polynomial`` or ``cosine``.
        cutoff_p: degree of the polynomial envelope.
        train_eps: learn the GIN ``eps``.
        concat_layers: read out every layer's features concatenated, not the last layer's.
        readout_hidden: widths of a per-atom SiLU MLP before the linear map to the latents.
        angular_l_max: largest ``l`` of the neighbour-density power spectrum each layer adds
            (bond angles); 0: distances only.
        angular_channels: channels of that neighbour density.
        check_latent_span: refuse a ``latent_dim`` wider than the readout's input (off only
            in models rebuilt from format-1 checkpoints written before the check existed).
    """

    hidden: int = Field(32, gt=0)
    num_layers: int = Field(3, gt=0)
    num_basis: int = Field(8, gt=0)
    mlp_layers: int = Field(2, gt=0)
    basis: Literal["bessel", "gaussian"] = "bessel"
    cutoff: Literal["polynomial", "cosine"] = "polynomial"
    cutoff_p: int = Field(6, gt=0)
    train_eps: bool = True
    concat_layers: bool = False
    readout_hidden: list[int] = Field(default_factory=list)
    angular_l_max: int = Field(0, ge=0)
    angular_channels: int = Field(16, gt=0)
    check_latent_span: bool = True


class EquivariantOptions(BackboneOptions):
    """Options of ``backbone: equivariant`` (:class:`~mlip_unc.nn.equivariant.EquivariantBackbone`).

    Attributes:
        channels: multiplicity of every irrep in the hidden features.
        l_max: highest rotation order of the spherical harmonics and hidden features.
        num_layers: interaction blocks (the last one outputs scalars only).
        num_basis: Bessel functions of the radial basis.
        radial_hidden: width of the radial MLP.
        cutoff_p: degree of the polynomial envelope.
        concat_layers: read out the scalars of every layer concatenated, not the last layer's.
        readout_hidden: widths of a per-atom SiLU MLP before the linear map to the latents.
        angular_l_max: largest ``l`` of the bond-angle power spectrum every block's gate
            reads; 0: none.
        angular_channels: channels of that neighbour density.
        check_latent_span: refuse a ``latent_dim`` wider than the readout's input (off only
            in models rebuilt from format-1 checkpoints written before the check existed).
    """

    channels: int = Field(8, gt=0)
    l_max: int = Field(1, ge=0)
    num_layers: int = Field(2, gt=0)
    num_basis: int = Field(8, gt=0)
    radial_hidden: int = Field(16, gt=0)
    cutoff_p: int = Field(6, gt=0)
    concat_layers: bool = False
    readout_hidden: list[int] = Field(default_factory=list)
    angular_l_max: int = Field(0, ge=0)
    angular_channels: int = Field(16, gt=0)
    check_latent_span: bool = True


class MACEOptions(BackboneOptions):
    """Options of ``backbone: mace`` (:class:`~mlip_unc.nn.mace_backbone.MACEBackbone`;
    the names in brackets are mace-torch's).

    Attributes:
        channels: multiplicity of every hidden irrep (``num_channels``).
        max_L: highest rotation order of the hidden features (``hidden_irreps``).
        l_max: highest order of the edge spherical harmonics (``max_ell``).
        num_layers: interaction blocks (``num_interactions``).
        correlation: body order of the product basis (``correlation``).
        num_basis: Bessel functions (``num_bessel``).
        cutoff_p: degree of the polynomial envelope.
        radial_mlp: hidden widths of the interactions' radial MLP.
        interaction: block of the later layers (a key of ``mace.modules.interaction_classes``).
        interaction_first: block of the first layer.
        readout_hidden: ``readout: mlp``: widths of the MLP before the linear map;
            ``readout: mace``: one width, that of the last layer's MLP.
        readout: ``mlp`` (every layer's scalars through an MLP) or ``mace`` (mace-torch's
            readout structure, the head's linear map as its final one).
        latent_norm: (``readout: mace``) divide the latents by ``sqrt(latent_dim)`` as e3nn's
            linear map inside mace-torch's readout does.
        check_latent_span: refuse a ``latent_dim`` wider than the readout's input.
    """

    channels: int = Field(32, gt=0)
    max_L: int = Field(1, ge=0)  # mace-torch's name
    l_max: int = Field(3, ge=0)
    num_layers: int = Field(2, gt=0)
    correlation: int = Field(3, gt=0)
    num_basis: int = Field(8, gt=0)
    cutoff_p: int = Field(5, gt=0)
    radial_mlp: list[int] = Field(default_factory=lambda: [64, 64, 64])
    interaction: str = "RealAgnosticResidualInteractionBlock"
    interaction_first: str = "RealAgnosticInteractionBlock"
    readout_hidden: list[int] = Field(default_factory=list)
    readout: Literal["mlp", "mace"] = "mlp"
    latent_norm: bool = False
    check_latent_span: bool = True


BACKBONE_OPTIONS: dict[Backbone, type[BackboneOptions]] = {
    Backbone.GIN: GINOptions,
    Backbone.EQUIVARIANT: EquivariantOptions,
    Backbone.MACE: MACEOptions,
}
"""The options model of each built-in ``model.backbone`` (every registered one:
``mlip_unc.registry.BACKBONE_REGISTRY[name].options``)."""

register_backbone(
    "gin",
    "mlip_unc.nn.geometric_gin:GeometricGIN",
    options=GINOptions,
    description="geometric GIN (invariant; distances, optionally bond angles)",
)
register_backbone(
    "equivariant",
    "mlip_unc.nn.equivariant:EquivariantBackbone",
    options=EquivariantOptions,
    description="E(3)-equivariant e3nn network with invariant output latents",
)
register_backbone(
    "mace",
    "mlip_unc.nn.mace_backbone:MACEBackbone",
    options=MACEOptions,
    # batched backward passes through MACE are slower than the loop (docs/what-we-tried.md)
    gradient_method="loop",
    description="MACE blocks (mace-torch) with this project's readout; pip install mlip-unc[mace]",
)
register_backbone(
    "mace_model",
    "mlip_unc.nn.mace_backbone:MACEModelFeatures",
    options=None,  # built by mlip-unc attach from a trained MACE model, not by a config
    gradient_method="loop",
    description="a MACE model trained with mace-torch, frozen (mlip-unc attach)",
)
