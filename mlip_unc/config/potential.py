"""Configuration of interatomic-potential training (``mlip-unc train --config X.yaml``).

Example (see ``configs/``)::

    seed: 0
    dtype: float64
    out: runs/ethanol_gin
    data:
      train: ${data_root}/structures/ethanol/train.xyz
      valid_fraction: 0.05
      isolated_atoms: ${data_root}/structures/ethanol/isolated_atoms.xyz
      r_max: 5.0
    model: {backbone: gin, backbone_kwargs: {hidden: 64}, latent_dim: 32}
    train: {epochs: 100, max_minutes: 30, batch_size: 8, lr: 0.005}

Relative paths are taken relative to the working directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, cast

from pydantic import Field, SerializeAsAny, ValidationInfo, field_validator, model_validator

from mlip_unc.config.backbones import (
    RESERVED_BACKBONE_KEYS,
    BackboneName,
    BackboneOptions,
    EquivariantOptions,
    GINOptions,
    MACEOptions,
)
from mlip_unc.config.enums import (
    Backbone,
    DType,
    EnergyCount,
    HeadKind,
    PosteriorBasis,
    PosteriorKind,
    ReferenceEnergies,
    RegularizerKind,
)
from mlip_unc.config.loader import (
    NestedConfigError,
    Section,
    apply_overrides,
    load_raw,
    validate,
    validate_nested,
)
from mlip_unc.config.training import TrainCoreConfig
from mlip_unc.registry import BACKBONE_REGISTRY

__all__ = [
    "DataConfig",
    "PotentialModelConfig",
    "LossConfig",
    "RegularizerConfig",
    "PotentialTrainConfig",
    "PotentialConfig",
    "load_potential_config",
    "potential_config_from_dict",
]


class DataConfig(Section):
    """Training data (extended XYZ, JSON lists in mlearn's layout, or any format
    ``read_structures`` reads).

    Attributes:
        train: training file.
        valid: validation file; when null, ``valid_fraction`` of ``train`` is held out.
        valid_fraction: held-out fraction of ``train`` when ``valid`` is null (0 = none).
        test: optional file evaluated with the best model at the end.
        isolated_atoms: file of one-atom frames giving E0(Z).
        index: ASE-style frame selection applied to every file (``":"``, ``"0:500"``).
        max_train: use at most this many training frames (after the split; null = all).
        energy_key, forces_key: label names; stress_key: null = no stress term. For mlearn's
            JSON (``.json``: ``outputs.virial_stress`` in kbar, VASP order and sign) use
            ``stress``: the reader converts it to eV/A^3 with ASE's sign.
        r_max: cutoff radius, Angstrom.
        accept_predicted_labels: take labels that a model predicted (the energy, forces and
            stress of ``md.traj``) in ``train``, ``valid`` and ``test`` as references; false
            (default) refuses them, naming the file and frame.
    """

    train: str
    valid: str | None = None
    valid_fraction: float = Field(0.05, ge=0, lt=1)
    test: str | None = None
    isolated_atoms: str | None = None
    index: str = ":"
    max_train: int | None = Field(None, gt=0)
    energy_key: str = "energy"
    forces_key: str = "forces"
    stress_key: str | None = None
    r_max: float = Field(5.0, gt=0)
    accept_predicted_labels: bool = False


BackboneOptionsOf = (
    GINOptions | EquivariantOptions | MACEOptions | SerializeAsAny[BackboneOptions]
)  # the last: a registered backbone's options (mlip_unc.registry), dumped with its fields


def _no_options() -> BackboneOptionsOf:
    """The default of ``model.backbone_kwargs``: no option set. A plain mapping on purpose:
    the field's validator turns it into the defaults of the chosen backbone."""
    return cast(BackboneOptionsOf, {})


class PotentialModelConfig(Section):
    """Backbone and Bayesian energy head.

    Attributes:
        backbone: ``gin``, ``equivariant``, ``mace`` or the name of another registered
            backbone (:mod:`mlip_unc.registry`).
        backbone_kwargs: the options of that backbone (:class:`GINOptions`,
            :class:`EquivariantOptions`, :class:`MACEOptions` or a registered backbone's
            model, chosen by ``backbone``).
        latent_dim: d, the width of the per-atom latents.
        prior_std: sigma_p of the Gaussian weight prior; init_std: initial posterior std.
        head: ``bayesian`` or ``map``.
        reference_energies: source of the per-element offsets.
        refit_offsets: after training, shift the offsets by the least-squares fit of the
            training energy residuals on element counts (forces unchanged; the direction the
            force loss leaves free, :mod:`mlip_unc.train.offsets`).
        standardise: shift/scale the head by the mean/std of the per-atom energy residuals
            (E - sum E0) / n of the training set.
        learn_noise: train the energy and force noise stds with the NLL (default); false keeps
            them at their initial values (the per-atom energy residual std and the force RMS with
            ``standardise``), so the loss is a fixed-weight squared error, as mace-torch's.
        posterior: the head's posterior used for uncertainties after training (``full``: the
            last-layer prediction-rigidity covariance, fitted and calibrated at the end of
            training; ``diagonal``: the variational one).
        posterior_rank: directions of the ``lowrank`` uncertainty mode.
        posterior_basis: weight space of the full posterior: ``shared`` (the head's ``d``
            weights) or ``per_element`` (``n_types * d``; the fit and the ``exact`` mode cost
            ``n_types`` times more backward passes, ``lowrank`` the same ``rank + 1``).
        posterior_max_frames: fit the full posterior on at most this many training structures
            (a random subset, config seed; null = all). Exact, each batch costs
            ``min(D, 3 n_atoms)`` Jacobian products (``D`` the basis width), which made a MACE
            backbone's fit take tens of minutes on CPU before ``posterior_probes``.
        posterior_probes: sketch the training structures' force precision with this many
            random sign probes per batch (forward-mode products, unbiased;
            ``mlip_unc.posthoc.posterior``) instead of ``min(d, 3 n_atoms)`` exact Jacobian
            products; null = exact. The validation structures, which calibrate, stay exact.
        posterior_valid_frames: choose lambda and the force scales of the full posterior on at
            most this many validation structures (a random subset, config seed; null = all).
            Each costs ``min(D, 3 n_atoms)`` exact Jacobian products, the larger part of a MACE
            backbone's fit. The energy scales and the uncertainty levels still use every
            validation structure (a forward pass each).
    """

    backbone: Backbone | str = Backbone.GIN
    backbone_kwargs: BackboneOptionsOf = Field(
        default_factory=_no_options,
        description="Options of the chosen backbone (GINOptions, EquivariantOptions, "
        "MACEOptions or a registered backbone's, by model.backbone).",
    )
    latent_dim: int = Field(32, gt=0)
    prior_std: float = Field(1.0, gt=0)
    init_std: float = Field(0.1, gt=0)
    head: HeadKind = HeadKind.BAYESIAN
    reference_energies: ReferenceEnergies = ReferenceEnergies.AUTO
    refit_offsets: bool = True
    standardise: bool = True
    learn_noise: bool = True
    posterior: PosteriorKind = PosteriorKind.FULL
    posterior_rank: int = Field(4, gt=0)
    posterior_basis: PosteriorBasis = PosteriorBasis.SHARED
    posterior_max_frames: int | None = Field(None, gt=0)
    posterior_probes: int | None = Field(None, gt=0)
    posterior_valid_frames: int | None = Field(None, gt=0)

    @property
    def backbone_name(self) -> str:
        """``backbone`` as a plain string (the registry's and the checkpoints' name)."""
        return str(getattr(self.backbone, "value", self.backbone))

    @field_validator("backbone", mode="after")
    @classmethod
    def _registered_backbone(cls, value: Backbone | str) -> Backbone | str:
        """A built-in as its :class:`Backbone` member, another registered backbone's name as a
        :class:`BackboneName`; an unknown name or one no config trains is an error."""
        name = str(getattr(value, "value", value))
        entry = BACKBONE_REGISTRY.get(name)  # ValueError: unknown backbone, the known ones
        if entry.options is None:
            trainable = [n for n in BACKBONE_REGISTRY.names() if BACKBONE_REGISTRY[n].options]
            raise ValueError(
                f"backbone {name!r} is not trained from a config ({entry.description}); "
                f"choose one of {', '.join(trainable)}"
            )
        if name in Backbone._value2member_map_:
            return Backbone(name)
        return BackboneName(name)

    @field_validator("backbone_kwargs", mode="before")
    @classmethod
    def _options_of_the_backbone(cls, value: Any, info: ValidationInfo) -> BackboneOptionsOf:
        backbone = info.data.get("backbone")
        if backbone is None:  # model.backbone itself is invalid (reported first)
            return value
        if isinstance(value, dict):
            for key, instead in RESERVED_BACKBONE_KEYS.items():
                if key in value:
                    raise NestedConfigError(f".{key}: set by {instead}, remove it here")
        options = BACKBONE_REGISTRY.get(str(getattr(backbone, "value", backbone))).options
        assert options is not None  # checked by _registered_backbone
        return cast(BackboneOptionsOf, validate_nested(options, value))


class LossConfig(Section):
    """Joint Gaussian likelihood weights and the KL scale.

    loss = w_E NLL_E(per atom) + w_F NLL_F + w_S NLL_S + beta KL / N_train (+ regulariser),
    per structure (``mlip_unc.train.losses``).

    Energy/force balance (``energy_count``): ``NLL_E`` is the NLL of the per-atom energy
    (E_pred - E) / n_atoms, whose noise variance is sigma_e^2 / n_atoms (independent per-atom
    noise); ``NLL_F`` sums the NLL over the 3 n_atoms force components. With ``structure`` the
    energy term counts once per structure (the plain likelihood of its energy): a structure's
    squared per-atom residual weighs n_atoms / sigma_e^2, against its 3 n_atoms force terms.
    With ``atom`` it counts once per atom, which multiplies that by n_atoms, so larger cells'
    energies weigh more per atom (n_atoms^2 per structure; MACE's loss weighs every
    structure's ((E_pred - E) / N)^2 alike). ``auto`` (the default) takes ``atom`` for periodic
    training data and for molecules of widely different sizes (largest more than twice the
    smallest), else ``structure`` (one molecule's MD, as ethanol or 3BPA). Why: counted per
    structure, the energies of many-atom cells are outweighed by their force terms, the learned
    energy noise grows and training abandons the energy; counted per atom on a single
    molecule, the energy dominates early and delays force learning.

    Attributes:
        energy_weight, forces_weight, stress_weight: weights of the NLL terms. With
            ``forces_weight: 0`` (and no stage-two force weight) the potential trains on
            energies alone: frames need no forces, and the force uncertainty takes the
            calibration of the energy's (``mlip_unc.posthoc.posterior``).
        energy_count: ``auto``, ``structure`` or ``atom`` (above).
        stress_noise: fixed stress noise std (eV/A^3) of the stress likelihood.
        beta: KL weight (1 = proper ELBO).
        kl_warmup_epochs: linear ramp of beta from 0 (``mlip_unc.train.losses.kl_weight``).
        stage_two_start: fraction of training (``train.schedule_clock``: of the epochs by
            default, as the cosine schedule counts it) from which the stage-two weights apply
            (MACE's ``--swa`` stage: forces first, then a higher energy weight); null: one
            stage. Validation selects the best model of the last stage reached.
        stage_two_energy_weight, stage_two_forces_weight: the weights from then on (null:
            unchanged).
    """

    energy_weight: float = Field(1.0, ge=0)
    energy_count: EnergyCount = EnergyCount.AUTO
    forces_weight: float = Field(1.0, ge=0)
    stress_weight: float = Field(0.0, ge=0)
    stress_noise: float = Field(0.005, gt=0)
    beta: float = Field(1.0, ge=0)
    kl_warmup_epochs: int = Field(0, ge=0)
    stage_two_start: float | None = Field(None, gt=0, lt=1)
    stage_two_energy_weight: float | None = Field(None, ge=0)
    stage_two_forces_weight: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> LossConfig:
        if self.energy_weight + self.forces_weight + self.stress_weight <= 0:
            raise ValueError("loss.energy_weight: energy, forces and stress weights are all zero")
        two = (self.stage_two_energy_weight, self.stage_two_forces_weight)
        if self.stage_two_start is not None and two == (None, None):
            raise ValueError(
                "loss.stage_two_start is set but neither stage_two_energy_weight nor "
                "stage_two_forces_weight: stage two would change nothing"
            )
        if self.stage_two_start is None and two != (None, None):
            raise ValueError(
                "loss.stage_two_energy_weight / stage_two_forces_weight need loss.stage_two_start"
            )
        return self

    def weights(self, progress: float) -> tuple[int, dict[str, float]]:
        """``(stage, {"energy", "forces", "stress": weight})`` at the fraction ``progress`` of training."""
        stage = int(self.stage_two_start is not None and progress >= self.stage_two_start)
        energy, forces = self.energy_weight, self.forces_weight
        if stage:
            energy = (
                energy if self.stage_two_energy_weight is None else self.stage_two_energy_weight
            )
            forces = (
                forces if self.stage_two_forces_weight is None else self.stage_two_forces_weight
            )
        return stage, {"energy": energy, "forces": forces, "stress": self.stress_weight}


class RegularizerConfig(Section):
    """AGL or an intervention on the per-atom latents z_a, with schedule lambda(epoch):
    0 for ``warmup_epochs``, then a linear ramp to ``lambda_max`` over ``ramp_epochs``.

    Attributes:
        kind: the latent term (:class:`RegularizerKind`); ``none`` adds nothing.
        lambda_max: its weight after the ramp.
        warmup_epochs: epochs with lambda = 0.
        ramp_epochs: epochs of the linear ramp from 0 to ``lambda_max``.
    """

    kind: RegularizerKind = RegularizerKind.NONE
    lambda_max: float = Field(0.0, ge=0)
    warmup_epochs: int = Field(0, ge=0)
    ramp_epochs: int = Field(0, ge=0)


class PotentialTrainConfig(TrainCoreConfig):
    """The training core's options with potential defaults, plus committees and restarts.

    Attributes:
        valid_batch_size: structures per validation batch.
        ensemble: M > 1 trains M members (seeds seed..seed+M-1) under ``out/member_k``.
        resume: continue from ``out/last.pt`` when it exists (if the data changed, the
            best-on-validation tracking restarts).
        overwrite: replace a run already in ``out`` (without it, and without ``resume``, a
            folder holding a run is refused).
        init_from: fine-tune: start from the weights, architecture and offsets of this
            ``model.pt`` (fresh optimiser and schedule); the ``model`` section is then unused.
    """

    min_lr: float | None = Field(1e-5, ge=0)
    valid_batch_size: int = Field(32, gt=0)
    ensemble: int = Field(1, gt=0)
    resume: bool = False
    overwrite: bool = False
    init_from: str | None = None


class PotentialConfig(Section):
    """The whole training configuration.

    Attributes:
        data, model, loss, regularizer, train: the sections.
        seed: random seed (weights, split, batches, posterior draws).
        dtype: ``float32`` or ``float64``.
        out: output folder (model.pt, last.pt, history.json, config.yaml).
        data_root: value of ``${data_root}``; null = ``$MLIP_UNC_DATA`` or ``../shared/data``.
    """

    data: DataConfig
    model: PotentialModelConfig = PotentialModelConfig()
    loss: LossConfig = LossConfig()
    regularizer: RegularizerConfig = RegularizerConfig()
    train: PotentialTrainConfig = PotentialTrainConfig()
    seed: int = 0
    dtype: DType = DType.FLOAT64
    out: str = "runs/potential"
    data_root: str | None = None

    @model_validator(mode="after")
    def _check(self) -> PotentialConfig:
        if self.loss.stress_weight > 0 and self.data.stress_key is None:
            raise ValueError("loss.stress_weight: > 0 needs data.stress_key")
        return self


def potential_config_from_dict(raw: Any) -> PotentialConfig:
    """Validate a raw mapping (e.g. parsed YAML) into a :class:`PotentialConfig`."""
    return validate(PotentialConfig, raw)


def load_potential_config(
    path: str | os.PathLike, overrides: Sequence[str] = ()
) -> PotentialConfig:
    """Read, override (``--set``) and validate a YAML config."""
    return validate(PotentialConfig, apply_overrides(load_raw(path), overrides, PotentialConfig))
