"""Typed configuration of interatomic-potential training; YAML enters the package only here.

A config is a tree of frozen dataclasses, validated once by :func:`load_config` /
:func:`config_from_dict`; every error names the offending key (``train.batch_size: ...``).
Options are ``str`` Enums with a docstring per member. Example (see ``configs/``)::

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

String values may refer to other values with ``${dotted.key}``; ``${data_root}`` is the
top-level ``data_root`` or, when that is null, the environment variable ``MLIP_UNC_DATA`` or
``../shared/data``. Relative paths are taken relative to the working directory.
Overrides (``--set train.epochs=3`` on the command line) are applied to the raw mapping
before validation; a bare key (``epochs=3``) is accepted when exactly one section has it.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from mlip_unc.train.regularizers import RegularizerKind

__all__ = [
    "ConfigError",
    "Backbone",
    "HeadKind",
    "Dtype",
    "ReferenceEnergies",
    "LRSchedule",
    "RegularizerKind",
    "DataConfig",
    "ModelConfig",
    "LossConfig",
    "RegularizerConfig",
    "TrainConfig",
    "PotentialConfig",
    "load_config",
    "load_raw",
    "config_from_dict",
    "config_to_dict",
    "apply_overrides",
    "default_data_root",
]

DATA_ROOT_ENV = "MLIP_UNC_DATA"


class ConfigError(ValueError):
    """An invalid configuration; the message starts with the dotted key at fault."""


# ================================================================ options
class Backbone(str, Enum):
    """Feature extractor producing the per-atom latents z_a."""

    GIN = "gin"
    """Geometric GIN (invariant; distances only), ``mlip_unc.nn.geometric_gin``."""
    EQUIVARIANT = "equivariant"
    """E(3)-equivariant e3nn network with invariant output latents, ``mlip_unc.nn.equivariant``."""


class HeadKind(str, Enum):
    """How the energy head is trained."""

    BAYESIAN = "bayesian"
    """Mean-field Gaussian head, Bayes-by-Backprop: one weight draw per batch, + beta KL / N."""
    MAP = "map"
    """Posterior mean only (no sampling, no KL): a deterministic model, e.g. a committee member."""


class Dtype(str, Enum):
    """Floating-point precision of model and data."""

    FLOAT32 = "float32"
    """Single precision (faster)."""
    FLOAT64 = "float64"
    """Double precision (exact force/energy consistency; the default)."""


class ReferenceEnergies(str, Enum):
    """Where the per-element energy offsets E0(Z) come from."""

    AUTO = "auto"
    """Isolated-atom frames where available (``data.isolated_atoms`` or one-atom training
    frames), least squares on the training energies for the remaining elements."""
    ISOLATED = "isolated"
    """Isolated-atom frames only; an element without one is an error."""
    LEAST_SQUARES = "least_squares"
    """Least squares of training energies on element counts (isolated frames ignored)."""
    ZERO = "zero"
    """No offsets."""


class LRSchedule(str, Enum):
    """Learning-rate schedule."""

    CONSTANT = "constant"
    """Keep ``train.lr``."""
    PLATEAU = "plateau"
    """Multiply by ``train.lr_factor`` after ``train.lr_patience`` epochs without a better
    validation loss."""
    COSINE = "cosine"
    """Cosine decay from ``train.lr`` to ``train.min_lr``, set every step from the progress
    = the larger of epoch / ``train.epochs`` and elapsed / ``train.max_minutes``, so a run
    limited by its wall-time budget also ends at ``min_lr``."""


# ================================================================ sections
def _positive(name: str, value: float | int | None, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise ConfigError(f"{name}: must be positive, got {value!r}")


def _non_negative(name: str, value: float | int) -> None:
    if value < 0:
        raise ConfigError(f"{name}: must be >= 0, got {value!r}")


@dataclass(frozen=True)
class DataConfig:
    """Training data (extended XYZ or any format ``read_structures`` reads).

    Attributes:
        train: training file.
        valid: validation file; when null, ``valid_fraction`` of ``train`` is held out.
        valid_fraction: held-out fraction of ``train`` when ``valid`` is null (0 = none).
        test: optional file evaluated with the best model at the end.
        isolated_atoms: file of one-atom frames giving E0(Z).
        index: ASE-style frame selection applied to every file (``":"``, ``"0:500"``).
        max_train: use at most this many training frames (after the split; null = all).
        energy_key, forces_key: label names; stress_key: null = no stress term.
        r_max: cutoff radius, Angstrom.
    """

    train: str
    valid: str | None = None
    valid_fraction: float = 0.05
    test: str | None = None
    isolated_atoms: str | None = None
    index: str = ":"
    max_train: int | None = None
    energy_key: str = "energy"
    forces_key: str = "forces"
    stress_key: str | None = None
    r_max: float = 5.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ConfigError(f"data.valid_fraction: must be in [0, 1), got {self.valid_fraction}")
        _positive("data.max_train", self.max_train, allow_none=True)
        _positive("data.r_max", self.r_max)


@dataclass(frozen=True)
class ModelConfig:
    """Backbone and Bayesian energy head.

    Attributes:
        backbone: ``gin`` or ``equivariant``.
        backbone_kwargs: passed to ``build_backbone`` (widths, layers, ...).
        latent_dim: d, the width of the per-atom latents.
        prior_std: sigma_p of the Gaussian weight prior.
        init_std: initial posterior std of every head weight.
        head: ``bayesian`` or ``map``.
        reference_energies: source of the per-element offsets.
        standardise: shift/scale the head by the mean/std of the per-atom energy residuals
            (E - sum E0) / n of the training set.
    """

    backbone: Backbone = Backbone.GIN
    backbone_kwargs: dict[str, Any] = field(default_factory=dict)
    latent_dim: int = 32
    prior_std: float = 1.0
    init_std: float = 0.1
    head: HeadKind = HeadKind.BAYESIAN
    reference_energies: ReferenceEnergies = ReferenceEnergies.AUTO
    standardise: bool = True

    def __post_init__(self) -> None:
        _positive("model.latent_dim", self.latent_dim)
        _positive("model.prior_std", self.prior_std)
        _positive("model.init_std", self.init_std)


@dataclass(frozen=True)
class LossConfig:
    """Joint Gaussian likelihood weights and the KL scale.

    loss = w_E NLL_E(per atom) + w_F NLL_F + w_S NLL_S + beta KL / N_train (+ regulariser).

    Attributes:
        energy_weight, forces_weight, stress_weight: weights of the NLL terms.
        stress_noise: fixed stress noise std (eV/A^3) of the stress likelihood.
        beta: KL weight (1 = proper ELBO).
        kl_warmup_epochs: linear ramp of beta from 0 over this many epochs (0 = none).
    """

    energy_weight: float = 1.0
    forces_weight: float = 1.0
    stress_weight: float = 0.0
    stress_noise: float = 0.005
    beta: float = 1.0
    kl_warmup_epochs: int = 0

    def __post_init__(self) -> None:
        for name in ("energy_weight", "forces_weight", "stress_weight", "beta", "kl_warmup_epochs"):
            _non_negative(f"loss.{name}", getattr(self, name))
        _positive("loss.stress_noise", self.stress_noise)
        if self.energy_weight + self.forces_weight + self.stress_weight <= 0:
            raise ConfigError("loss.energy_weight: energy, forces and stress weights are all zero")


@dataclass(frozen=True)
class RegularizerConfig:
    """AGL or an intervention on the per-atom latents z_a, with schedule lambda(epoch).

    ``kind`` is one of :class:`mlip_unc.train.regularizers.RegularizerKind` (``none``,
    ``agl_rayleigh``, ``agl_mean``, ``isotropy``, ``anti``, ``decorrelation``).

    lambda = 0 for ``warmup_epochs``, then a linear ramp to ``lambda_max`` over ``ramp_epochs``.
    """

    kind: RegularizerKind = RegularizerKind.NONE
    lambda_max: float = 0.0
    warmup_epochs: int = 0
    ramp_epochs: int = 0

    def __post_init__(self) -> None:
        for name in ("lambda_max", "warmup_epochs", "ramp_epochs"):
            _non_negative(f"regularizer.{name}", getattr(self, name))


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, stopping and checkpoints.

    Attributes:
        epochs: maximum number of epochs.
        max_minutes: wall-time budget in minutes (null = none); checked after every batch.
        batch_size, valid_batch_size: structures per batch.
        lr, weight_decay: Adam(W) settings; lr_schedule, lr_factor, lr_patience, min_lr.
        grad_clip: max gradient norm (null = none).
        ema_decay: exponential moving average of the weights (null = off), used for
            validation and the saved model.
        patience: early stopping after this many epochs without a better validation loss.
        ensemble: M > 1 trains M members (seeds seed..seed+M-1) under ``out/member_k``.
        resume: continue from ``out/last.pt`` when it exists (if the data changed, the
            best-on-validation tracking restarts).
        init_from: fine-tune: start from the weights, architecture and offsets of this
            ``model.pt`` (fresh optimiser and schedule); the ``model`` section is then unused.
        progress: tqdm bars (null = only when stderr is a terminal).
    """

    epochs: int = 100
    max_minutes: float | None = None
    batch_size: int = 8
    valid_batch_size: int = 32
    lr: float = 5e-3
    weight_decay: float = 0.0
    lr_schedule: LRSchedule = LRSchedule.PLATEAU
    lr_factor: float = 0.5
    lr_patience: int = 5
    min_lr: float = 1e-5
    grad_clip: float | None = 10.0
    ema_decay: float | None = None
    patience: int | None = None
    ensemble: int = 1
    resume: bool = False
    init_from: str | None = None
    progress: bool | None = None

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "valid_batch_size", "lr", "ensemble"):
            _positive(f"train.{name}", getattr(self, name))
        for name in ("max_minutes", "grad_clip", "patience"):
            _positive(f"train.{name}", getattr(self, name), allow_none=True)
        for name in ("weight_decay", "min_lr", "lr_patience"):
            _non_negative(f"train.{name}", getattr(self, name))
        if not 0.0 < self.lr_factor < 1.0:
            raise ConfigError(f"train.lr_factor: must be in (0, 1), got {self.lr_factor}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ConfigError(f"train.ema_decay: must be in (0, 1) or null, got {self.ema_decay}")


@dataclass(frozen=True)
class PotentialConfig:
    """The whole training configuration.

    Attributes:
        data, model, loss, regularizer, train: the sections.
        seed: random seed (weights, split, batches, posterior draws).
        dtype: ``float32`` or ``float64``.
        out: output folder (model.pt, last.pt, history.json, config.yaml).
        data_root: value of ``${data_root}``; null = ``$MLIP_UNC_DATA`` or ``../shared/data``.
    """

    data: DataConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    regularizer: RegularizerConfig = field(default_factory=RegularizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = 0
    dtype: Dtype = Dtype.FLOAT64
    out: str = "runs/potential"
    data_root: str | None = None

    def __post_init__(self) -> None:
        if self.loss.stress_weight > 0 and self.data.stress_key is None:
            raise ConfigError("loss.stress_weight: > 0 needs data.stress_key")


# ================================================================ parsing
_SECTIONS = ("data", "model", "loss", "regularizer", "train")
_NONE_TYPE = type(None)


def _type_name(hint: Any) -> str:
    if isinstance(hint, type) and issubclass(hint, Enum):
        return " | ".join(repr(m.value) for m in hint)
    return getattr(hint, "__name__", str(hint))


def _convert(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against the type ``hint``; return it converted (Enums, tuples)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None:
            if _NONE_TYPE in args:
                return None
            raise ConfigError(f"{key}: must not be null")
        inner = [a for a in args if a is not _NONE_TYPE]
        errors = []
        for candidate in inner:
            try:
                return _convert(value, candidate, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: invalid value {value!r}")
    if value is None:
        raise ConfigError(f"{key}: must not be null (expected {_type_name(hint)})")
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key)
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            raise ConfigError(f"{key}: {value!r} is not one of {_type_name(hint)}") from None
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    raise TypeError(f"unsupported config type {hint!r} for {key}")  # a bug, not user error


def _build(cls: type, raw: Any, prefix: str) -> Any:
    """Instantiate dataclass ``cls`` from mapping ``raw``; unknown/missing keys are errors."""
    label = prefix or "config"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{label}: expected a mapping, got {raw!r}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for name in raw:
        if name not in names:
            close = difflib.get_close_matches(str(name), names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f"; known keys: {names}"
            raise ConfigError(f"{_join(prefix, name)}: unknown key{hint}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        if f.name in raw:
            kwargs[f.name] = _convert(raw[f.name], hints[f.name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key}: required key is missing")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{label}: {err}") from None


def _join(prefix: str, name: object) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


# ================================================================ interpolation
_REF = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def default_data_root() -> str:
    """``$MLIP_UNC_DATA`` when set, else ``../shared/data`` (relative to the working dir)."""
    return os.environ.get(DATA_ROOT_ENV) or str(Path("..") / "shared" / "data")


def _lookup(raw: Mapping, dotted: str) -> Any:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _interpolate(raw: dict) -> dict:
    """Replace ``${dotted.key}`` in string values (up to 10 levels of nesting)."""
    root = dict(raw)
    if root.get("data_root") is None:
        root["data_root"] = default_data_root()

    def resolve(value: Any, key: str, depth: int = 0) -> Any:
        if isinstance(value, Mapping):
            return {k: resolve(v, _join(key, k), depth) for k, v in value.items()}
        if not isinstance(value, str) or "${" not in value:
            return value
        if depth > 10:
            raise ConfigError(f"{key}: circular ${{...}} reference")

        def sub(match: re.Match) -> str:
            try:
                target = _lookup(root, match.group(1))
            except KeyError:
                raise ConfigError(f"{key}: unknown reference ${{{match.group(1)}}}") from None
            return str(resolve(target, match.group(1), depth + 1))

        return _REF.sub(sub, value)

    return resolve(root, "")


# ================================================================ public entry points
def _set_dotted(raw: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def _qualify(key: str) -> str:
    """``epochs`` -> ``train.epochs`` when exactly one section has that field."""
    if "." in key or key in {f.name for f in dataclasses.fields(PotentialConfig)}:
        return key
    hints = get_type_hints(PotentialConfig)
    owners = [s for s in _SECTIONS if key in {f.name for f in dataclasses.fields(hints[s])}]
    if len(owners) == 1:
        return f"{owners[0]}.{key}"
    if len(owners) > 1:
        raise ConfigError(f"{key}: ambiguous override, write one of {[f'{o}.{key}' for o in owners]}")
    raise ConfigError(f"{key}: unknown key")


def apply_overrides(raw: Mapping, overrides: Sequence[str]) -> dict:
    """Return a copy of ``raw`` with ``key=value`` overrides (values parsed as YAML).

    Raises:
        ConfigError: an override without ``=``, or a bare key that no/several sections have.
    """
    out = _deep_copy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{item}: an override must look like key=value")
        key, text = item.split("=", 1)
        key = _qualify(key.strip())
        _set_dotted(out, key, yaml.safe_load(text) if text.strip() else None)
    return out


def _deep_copy(raw: Mapping) -> dict:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in raw.items()}


def config_from_dict(raw: Mapping) -> PotentialConfig:
    """Validate a raw mapping (e.g. parsed YAML) into a :class:`PotentialConfig`."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config: expected a mapping at the top level, got {type(raw).__name__}")
    return _build(PotentialConfig, _interpolate(dict(raw)), "")


def load_raw(path: str | os.PathLike) -> dict:
    """The YAML file as a mapping (no validation)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: '{path}'")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"config file '{path}' is not valid YAML: {err}") from None
    if raw is None:
        raise ConfigError(f"config file '{path}' is empty")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config file '{path}': expected a mapping at the top level")
    return dict(raw)


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> PotentialConfig:
    """Read, override and validate a YAML config."""
    return config_from_dict(apply_overrides(load_raw(path), overrides))


def config_to_dict(config: Any) -> dict:
    """Plain, YAML/JSON/checkpoint-friendly dict (Enums become their values)."""

    def plain(value: Any) -> Any:
        if isinstance(value, Enum):
            return value.value
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        out[f.name] = config_to_dict(value) if dataclasses.is_dataclass(value) else plain(value)
    return out
