"""Typed, validated configuration of property-model training (frozen dataclasses, str Enums).

YAML and JSON enter the package only here (:func:`load_config`, :meth:`PropertyConfig.to_dict`).
A config is validated once, at construction; method-dependent defaults (``None`` fields) are
resolved there too, so a saved config holds the values that were really used.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from mlip_unc.nn.bayesian import Estimator
from mlip_unc.nn.gin import Norm, Pooling
from mlip_unc.nn.likelihood import Likelihood

__all__ = [
    "Method",
    "Scheduler",
    "StopMetric",
    "DType",
    "Intervention",
    "AGLForm",
    "REGULARIZERS",
    "ModelConfig",
    "TrainConfig",
    "PropertyConfig",
    "load_config",
]


class Method(str, Enum):
    """Uncertainty method of the property model (all share the GIN backbone and the trainer)."""

    BGNN = "bgnn"
    """GIN + mean-field Bayesian last layer, closed-form predictive (docs/method.md section 2)."""
    AGL = "agl"
    """BGNN trained with the alignment-guided learning term (docs/method.md section 6)."""
    FULLBNN = "fullbnn"
    """GIN + a head whose every dense layer is Bayesian; Monte Carlo predictive."""
    MCDROPOUT = "mcdropout"
    """Deterministic head, dropout kept on at prediction; Monte Carlo over dropout masks."""
    ENSEMBLE = "ensemble"
    """Deep ensemble of M independently initialised deterministic models (mixture moments)."""
    MVE = "mve"
    """Mean-variance estimation: deterministic mean and heteroscedastic noise, no epistemic part."""
    LAPLACE = "laplace"
    """MAP training, then the closed-form Gaussian last-layer Laplace posterior."""


class Scheduler(str, Enum):
    """Learning-rate schedule."""

    PLATEAU = "plateau"
    """ReduceLROnPlateau on the early-stopping metric (factor 0.5)."""
    COSINE = "cosine"
    """Cosine annealing over all epochs."""
    NONE = "none"
    """Constant learning rate."""


class StopMetric(str, Enum):
    """Validation metric for early stopping, best-model selection and the plateau schedule."""

    NLL = "nll"
    """Gaussian negative log-likelihood of the validation targets."""
    RMSE = "rmse"
    """Root-mean-square error of the predictive mean."""


class DType(str, Enum):
    """Floating-point precision of the model."""

    FLOAT32 = "float32"
    """Single precision."""
    FLOAT64 = "float64"
    """Double precision."""

    @property
    def torch(self) -> torch.dtype:
        return torch.float32 if self is DType.FLOAT32 else torch.float64


class Intervention(str, Enum):
    """LPA-breaking interventions (docs/method.md section 5)."""

    ISOTROPY = "isotropy"
    """Penalise the spread of per-coordinate second moments of z (regulariser ``isotropy``)."""
    ANTI = "anti"
    """Anti-alignment term (regulariser ``anti``)."""
    ROTATION = "rotation"
    """Feed Q z with a fixed random orthogonal Q to the head."""


class AGLForm(str, Enum):
    """Form of the AGL term (docs/method.md section 6)."""

    MEAN = "mean"
    """mean_batch(1 - A(z)); the default (largest effect in the method.md scratch table)."""
    RAYLEIGH = "rayleigh"
    """mean_batch(z^T S z / z^T z)."""


REGULARIZERS: tuple[str, ...] = ("none", "agl_rayleigh", "agl_mean", "isotropy", "anti", "decorrelation")
"""Kinds accepted by ``mlip_unc.train.regularizers.regularizer_term``."""
_NEEDS_POSTERIOR = ("agl_rayleigh", "agl_mean", "anti")
_BAYES_LAST_LAYER = ("bgnn", "agl")


def _enum(cls: type[Enum], value: Any) -> Any:
    return None if value is None else cls(value.value if isinstance(value, Enum) else value)


@dataclass(frozen=True)
class ModelConfig:
    """Backbone and head. ``None`` fields get method-dependent defaults (see each)."""

    method: Method = Method.BGNN
    hidden: int = 128
    """GIN width h."""
    layers: int = 4
    """Number of GINE layers."""
    latent_dim: int = 32
    """Latent width d (input of the output layer)."""
    pooling: Pooling = Pooling.MEAN
    norm: Norm = Norm.BATCH
    dropout: float | None = None
    """Backbone dropout; default 0.1 for mcdropout, else 0.0."""
    likelihood: Likelihood | None = None
    """Default heteroscedastic for mve and ensemble, else homoscedastic."""
    prior_std: float = 1.0
    """sigma_p of the Gaussian weight prior (Bayesian heads)."""
    init_std: float = 0.1
    """Initial posterior std of the Bayesian weights."""
    estimator: Estimator = Estimator.LOCAL
    """Training-time sampling of the Bayesian layers."""
    noise_init_std: float = 0.5
    """Initial aleatoric std, in units of the standardised target."""
    fullbnn_hidden: tuple[int, ...] = (32,)
    """Hidden widths of the full-BNN head."""
    ensemble_size: int = 5
    """M, members of a deep ensemble."""
    mc_samples: int = 50
    """Monte Carlo draws at prediction (full-BNN weights, MC-dropout masks)."""

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("method", Method(_enum(Method, self.method)))
        set_("pooling", _enum(Pooling, self.pooling))
        set_("norm", _enum(Norm, self.norm))
        set_("estimator", _enum(Estimator, self.estimator))
        set_("fullbnn_hidden", tuple(int(h) for h in self.fullbnn_hidden))
        if self.dropout is None:
            set_("dropout", 0.1 if self.method is Method.MCDROPOUT else 0.0)
        if self.likelihood is None:
            hetero = self.method in (Method.MVE, Method.ENSEMBLE)
            set_("likelihood", Likelihood.HETEROSCEDASTIC if hetero else Likelihood.HOMOSCEDASTIC)
        set_("likelihood", _enum(Likelihood, self.likelihood))
        for name in ("hidden", "layers", "latent_dim", "ensemble_size", "mc_samples"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.method is Method.MCDROPOUT and self.dropout == 0.0:
            raise ValueError("mcdropout needs model.dropout > 0")
        for name in ("prior_std", "init_std", "noise_init_std"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, the ELBO weights, early stopping, the latent regulariser hook."""

    epochs: int = 150
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    """Adam weight decay on the deterministic parameters only (never on the posterior)."""
    grad_clip: float | None = 10.0
    """Max gradient norm (None: no clipping)."""
    beta: float = 1.0
    """KL weight: loss = mean NLL + beta * KL / N_train."""
    kl_anneal_epochs: int = 0
    """Linear warm-up of the KL weight from beta/k to beta over k epochs (0: none)."""
    scheduler: Scheduler = Scheduler.PLATEAU
    patience: int = 40
    """Early-stopping patience in epochs (0: never stop early; the best epoch is still kept)."""
    stop_metric: StopMetric = StopMetric.NLL
    seed: int = 0
    dtype: DType = DType.FLOAT32
    calibration: str = "none"
    """Post-hoc std recalibration fitted on validation: none | zscaling | isotonic."""
    regularizer: str = "none"
    """Latent regulariser kind (see REGULARIZERS); ``agl`` defaults to ``agl_mean``."""
    reg_lambda: float = 1.0
    """lambda_max of the regulariser schedule."""
    reg_warmup: int | None = None
    """Epochs with lambda = 0 (default: a fifth of ``epochs``)."""
    reg_ramp: int | None = None
    """Epochs of the linear ramp to lambda_max (default: a fifth of ``epochs``)."""
    intervention: Intervention | None = None
    """isotropy | anti (a regulariser term) | rotation (Q z into the head)."""
    eval_every: int = 1
    """Validate every k epochs (early stopping counts validations x k)."""
    progress: bool = True
    """tqdm bar (shown only on a terminal)."""

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("scheduler", _enum(Scheduler, self.scheduler))
        set_("stop_metric", _enum(StopMetric, self.stop_metric))
        set_("dtype", _enum(DType, self.dtype))
        set_("intervention", _enum(Intervention, self.intervention))
        cal = self.calibration.value if isinstance(self.calibration, Enum) else str(self.calibration)
        set_("calibration", cal)
        if self.reg_warmup is None:
            set_("reg_warmup", self.epochs // 5)
        if self.reg_ramp is None:
            set_("reg_ramp", self.epochs // 5)
        for name in ("epochs", "batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("kl_anneal_epochs", "patience", "reg_warmup", "reg_ramp"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0 or self.beta < 0 or self.weight_decay < 0 or self.reg_lambda < 0:
            raise ValueError("train.lr must be positive; beta, weight_decay, reg_lambda non-negative")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError("train.grad_clip must be positive or None")
        if self.calibration not in ("none", "zscaling", "isotonic"):
            raise ValueError(f"train.calibration must be none|zscaling|isotonic, got {self.calibration!r}")
        if self.regularizer not in REGULARIZERS:
            raise ValueError(f"train.regularizer must be one of {REGULARIZERS}, got {self.regularizer!r}")
        iv = self.intervention
        if iv in (Intervention.ISOTROPY, Intervention.ANTI) and self.regularizer not in ("none", iv.value):
            raise ValueError(
                f"intervention {iv.value!r} is the regulariser {iv.value!r}; "
                f"it cannot be combined with regularizer {self.regularizer!r}"
            )

    @property
    def regularizer_kind(self) -> str:
        """The loss term actually applied (an isotropy/anti intervention is that regulariser)."""
        iv = self.intervention
        if iv in (Intervention.ISOTROPY, Intervention.ANTI):
            return iv.value
        return self.regularizer


@dataclass(frozen=True)
class PropertyConfig:
    """Everything needed to rebuild and retrain a property model."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        method, train = self.model.method, self.train
        if method is Method.AGL and not train.regularizer.startswith("agl_"):
            if train.regularizer != "none":
                raise ValueError(f"method agl needs an agl_* regulariser, got {train.regularizer!r}")
            object.__setattr__(self, "train", replace(train, regularizer="agl_mean"))
        kind = self.train.regularizer_kind
        if kind in _NEEDS_POSTERIOR and method.value not in _BAYES_LAST_LAYER:
            raise ValueError(f"regulariser {kind!r} needs a Bayesian last layer (bgnn/agl), not {method.value}")
        if (kind != "none" or self.train.intervention is not None) and method is Method.ENSEMBLE:
            raise ValueError("latent regularisers and interventions are not supported for ensembles")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain dict of str/int/float/bool/list/None (safe for JSON and weights-only checkpoints)."""

        def plain(v: Any) -> Any:
            if isinstance(v, Enum):
                return v.value
            if isinstance(v, (tuple, list)):
                return [plain(x) for x in v]
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            return v

        return plain(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PropertyConfig:
        unknown = set(data) - {"model", "train"}
        if unknown:
            raise ValueError(f"unknown config section(s) {sorted(unknown)}; expected 'model' and 'train'")
        return cls(model=_build(ModelConfig, data.get("model", {})), train=_build(TrainConfig, data.get("train", {})))

    def with_overrides(self, **overrides: Any) -> PropertyConfig:
        """A new config with ``model.*`` / ``train.*`` fields replaced; ``None`` values are ignored.

        Keys are plain field names (each name belongs to one section). Derived defaults
        (dropout, likelihood, reg_warmup/ramp) are recomputed unless given.
        """
        model_names = {f.name for f in fields(ModelConfig)}
        train_names = {f.name for f in fields(TrainConfig)}
        raw = {"model": dict(_raw_fields(self.model)), "train": dict(_raw_fields(self.train))}
        for key, value in overrides.items():
            if value is None:
                continue
            if key in model_names:
                raw["model"][key] = value
            elif key in train_names:
                raw["train"][key] = value
            else:
                raise ValueError(f"unknown config field {key!r}")
        return PropertyConfig(model=ModelConfig(**raw["model"]), train=TrainConfig(**raw["train"]))


_DERIVED_MODEL = {"dropout": None, "likelihood": None}
_DERIVED_TRAIN = {"reg_warmup": None, "reg_ramp": None}


def _raw_fields(cfg: Any) -> dict[str, Any]:
    """Field values with derived defaults reset to None when they equal what would be derived."""
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    derived = type(cfg)(**{**values, **(_DERIVED_MODEL if isinstance(cfg, ModelConfig) else _DERIVED_TRAIN)})
    for name in _DERIVED_MODEL if isinstance(cfg, ModelConfig) else _DERIVED_TRAIN:
        if values[name] == getattr(derived, name):
            values[name] = None
    return values


def _build(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}")
    return cls(**data)


def load_config(path: str | Path) -> PropertyConfig:
    """A :class:`PropertyConfig` from a YAML (``.yaml``/``.yml``) or JSON file."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config is a mapping with 'model' and 'train' sections")
    return PropertyConfig.from_dict(data)
