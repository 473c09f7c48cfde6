"""Configuration of molecular property models (``mlip-unc property train``).

Three sections, ``data``, ``model`` and ``train``, and ``data_root``. Method-dependent
defaults (``null`` fields) are resolved at validation, so a saved config holds the values that
were really used::

    data: {csv: mols.csv, smiles_column: smiles, target_columns: [logp], split: scaffold}
    model: {method: agl, hidden: 128, latent_dim: 32}
    train: {epochs: 150, lr: 1.0e-3, regularizer: agl_mean, reg_lambda: 1.0}

Relative paths are taken relative to the working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from mlip_unc.config.enums import (
    Calibration,
    DType,
    Estimator,
    Intervention,
    Likelihood,
    LRSchedule,
    Method,
    Norm,
    Pooling,
    RegularizerKind,
    SplitKind,
    StopMetric,
)
from mlip_unc.config.loader import (
    ConfigError,
    Section,
    apply_overrides,
    default_data_root,
    load_raw,
    validate,
)
from mlip_unc.config.training import TrainCoreConfig

__all__ = [
    "DATASET_NAMES",
    "PropertyDataConfig",
    "PropertyModelConfig",
    "PropertyTrainConfig",
    "PropertyConfig",
    "load_property_config",
]

#: The known molecular datasets of ``data.dataset`` (``mlip_unc.data.molecules`` reads them).
DATASET_NAMES: tuple[str, ...] = ("esol", "freesolv", "lipo", "bace", "qm7", "cep")
_NEEDS_POSTERIOR = (RegularizerKind.AGL_RAYLEIGH, RegularizerKind.AGL_MEAN, RegularizerKind.ANTI)
_BAYES_LAST_LAYER = (Method.BGNN, Method.AGL)


class PropertyDataConfig(Section):
    """The molecules and their split: a CSV file of the user's or a known dataset.

    Every field is optional so that a saved config, or one whose graphs are passed to
    ``train_property_model`` directly, validates; ``mlip-unc property train`` needs
    ``csv`` or ``dataset``.

    Attributes:
        csv: CSV file with a header row, a SMILES column and the target columns.
        dataset: a known set instead (esol, freesolv, lipo, bace, qm7, cep), read from
            ``data_root``.
        smiles_column: the column of ``csv`` that holds the SMILES.
        target_columns: the columns of ``csv`` that hold the targets (one model output each).
        split: 80/10/10 split of the rows (:class:`SplitKind`), seeded by ``train.seed``.
        split_file: JSON ``{"train", "val", "test"}`` of 0-based data rows; replaces ``split``.
        train_fraction: train on this nested subset of the training rows (a fraction in (0, 1];
            for one seed a smaller fraction is a subset of a larger one).
    """

    csv: str | None = None
    dataset: str | None = None
    smiles_column: str = "smiles"
    target_columns: tuple[str, ...] = ()
    split: SplitKind = SplitKind.RANDOM
    split_file: str | None = None
    train_fraction: float = Field(1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _check(self) -> PropertyDataConfig:
        if self.csv is not None and self.dataset is not None:
            raise ValueError("data.dataset: give data.csv or data.dataset, not both")
        return self


class PropertyModelConfig(Section):
    """GIN backbone and uncertainty head. ``null`` fields get method-dependent defaults.

    Attributes:
        method: the uncertainty method (:class:`Method`).
        hidden, layers: GIN width and number of GINE layers; latent_dim: d, the head's input.
        pooling, norm: graph pooling and per-layer normalisation.
        dropout: backbone dropout; default 0.1 for mcdropout, else 0.
        likelihood: default heteroscedastic for bgnn, mve and ensemble, else homoscedastic
            (bgnn: chosen from benchmarks/results/molecular.md, section "Default likelihood":
            heteroscedastic noise ranks errors and calibrates better; the homoscedastic sigma
            hardly varies between molecules).
        prior_std: sigma_p of the Gaussian weight prior; init_std: initial posterior std.
        estimator: training-time sampling of the Bayesian layers.
        noise_init_std: initial aleatoric std, in units of the standardised target.
        fullbnn_hidden: hidden widths of the full-BNN head; ensemble_size: members M.
        mc_samples: Monte Carlo draws at prediction (full-BNN weights, MC-dropout masks).
    """

    method: Method = Method.BGNN
    hidden: int = Field(128, gt=0)
    layers: int = Field(4, gt=0)
    latent_dim: int = Field(32, gt=0)
    pooling: Pooling = Pooling.MEAN
    norm: Norm = Norm.BATCH
    dropout: float = Field(0.0, ge=0, lt=1)
    likelihood: Likelihood = Likelihood.HOMOSCEDASTIC
    prior_std: float = Field(1.0, gt=0)
    init_std: float = Field(0.1, gt=0)
    estimator: Estimator = Estimator.LOCAL
    noise_init_std: float = Field(0.5, gt=0)
    fullbnn_hidden: tuple[int, ...] = (32,)
    ensemble_size: int = Field(5, gt=0)
    mc_samples: int = Field(50, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _method_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return _fill(dict(data), _derived_model(data.get("method", Method.BGNN)))

    @model_validator(mode="after")
    def _check(self) -> PropertyModelConfig:
        if self.method is Method.MCDROPOUT and self.dropout == 0.0:
            raise ValueError("model.dropout: mcdropout needs dropout > 0")
        return self


def _fill(data: dict[str, Any], derived: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the ``derived`` defaults where a field is absent or null."""
    for name, value in derived.items():
        if data.get(name) is None:
            data[name] = value
    return data


def _derived_model(method: Any) -> dict[str, Any]:
    try:
        m = Method(getattr(method, "value", method))
    except ValueError:
        return {}  # the field validator reports the bad method
    hetero = m in (Method.BGNN, Method.MVE, Method.ENSEMBLE)
    return {
        "dropout": 0.1 if m is Method.MCDROPOUT else 0.0,
        "likelihood": Likelihood.HETEROSCEDASTIC if hetero else Likelihood.HOMOSCEDASTIC,
    }


class PropertyTrainConfig(TrainCoreConfig):
    """The training core's options with property defaults, plus the ELBO and the regulariser.

    Attributes:
        beta: KL weight: loss = mean NLL + beta * KL / N_train.
        kl_anneal_epochs: linear ramp of the KL weight from 0 (``mlip_unc.train.losses.kl_weight``).
        stop_metric: validation metric for early stopping, best model and plateau schedule.
        seed: weights, shuffling and posterior draws; dtype: model precision.
        calibration: post-hoc std recalibration fitted on the validation split and stored in the
            checkpoint; default ``zscaling`` (one std factor, the validation-NLL minimiser, so the
            validation NLL never rises and the ranking of the stds is kept).
        regularizer: latent term (:class:`RegularizerKind`); ``agl`` defaults to ``agl_mean``.
        reg_lambda: its lambda_max; reg_warmup / reg_ramp: epochs of lambda = 0 and of the
            linear ramp (default a fifth of ``epochs`` each).
        intervention: isotropy | anti (a regulariser term) | rotation (Q z into the head).
    """

    epochs: int = Field(150, gt=0)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(1e-3, gt=0)
    lr_schedule: LRSchedule = LRSchedule.PLATEAU
    lr_patience: int = Field(10, ge=0)
    patience: int | None = Field(40, ge=0)
    beta: float = Field(1.0, ge=0)
    kl_anneal_epochs: int = Field(0, ge=0)
    stop_metric: StopMetric = StopMetric.NLL
    seed: int = 0
    dtype: DType = DType.FLOAT32
    calibration: Calibration = Calibration.ZSCALING
    regularizer: RegularizerKind = RegularizerKind.NONE
    reg_lambda: float = Field(1.0, ge=0)
    reg_warmup: int = Field(0, ge=0)
    reg_ramp: int = Field(0, ge=0)
    intervention: Intervention | None = None

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "scheduler" in data:  # the key of mlip-unc <= 0.1.0 checkpoints
            old = data.pop("scheduler")
            data.setdefault(
                "lr_schedule", "constant" if getattr(old, "value", old) == "none" else old
            )
        return _fill(data, _derived_train(data.get("epochs", 150)))

    @model_validator(mode="after")
    def _check(self) -> PropertyTrainConfig:
        iv = self.intervention
        if iv in (Intervention.ISOTROPY, Intervention.ANTI) and self.regularizer not in (
            "none",
            iv.value,
        ):
            raise ValueError(
                f"train.intervention: {iv.value!r} is the regulariser {iv.value!r}; "
                f"it cannot be combined with regularizer {self.regularizer.value!r}"
            )
        return self

    @property
    def regularizer_kind(self) -> RegularizerKind:
        """The loss term actually applied (an isotropy/anti intervention is that regulariser)."""
        if self.intervention in (Intervention.ISOTROPY, Intervention.ANTI):
            return RegularizerKind(self.intervention.value)
        return self.regularizer


def _derived_train(epochs: Any) -> dict[str, Any]:
    try:
        return {"reg_warmup": int(epochs) // 5, "reg_ramp": int(epochs) // 5}
    except (TypeError, ValueError):
        return {}


_DERIVED = {"model": _derived_model, "train": _derived_train}
_DERIVED_FROM = {"model": "method", "train": "epochs"}


class PropertyConfig(Section):
    """Everything needed to rebuild and retrain a property model.

    Attributes:
        data, model, train: the sections.
        data_root: where ``data.dataset`` is read and the value of ``${data_root}``; null =
            ``$MLIP_UNC_DATA`` or ``../shared/data``.
    """

    data: PropertyDataConfig = PropertyDataConfig()
    model: PropertyModelConfig = PropertyModelConfig()
    train: PropertyTrainConfig = PropertyTrainConfig()
    data_root: str | None = None

    @model_validator(mode="after")
    def _check(self) -> PropertyConfig:
        method, train = self.model.method, self.train
        if method is Method.AGL and not train.regularizer.startswith("agl_"):
            if train.regularizer is not RegularizerKind.NONE:
                raise ValueError(
                    f"train.regularizer: method agl needs an agl_* term, got {train.regularizer.value!r}"
                )
            object.__setattr__(self, "train", train.updated(regularizer=RegularizerKind.AGL_MEAN))
        kind = self.train.regularizer_kind
        if kind in _NEEDS_POSTERIOR and method not in _BAYES_LAST_LAYER:
            raise ValueError(
                f"train.regularizer: {kind.value!r} needs a Bayesian last layer (bgnn/agl), not {method.value}"
            )
        if (
            kind is not RegularizerKind.NONE or self.train.intervention is not None
        ) and method is Method.ENSEMBLE:
            raise ValueError(
                "train.regularizer: latent regularisers and interventions are not supported for ensembles"
            )
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PropertyConfig:
        """Validate a plain dict (a saved config or parsed YAML)."""
        return validate(cls, data)

    def dataset_root(self) -> Path:
        """The folder ``data.dataset`` is read from: ``data_root``, else the data root of
        every command (``$MLIP_UNC_DATA``, else ``../shared/data``)."""
        return Path(self.data_root if self.data_root is not None else default_data_root())

    def raw_dict(self) -> dict[str, Any]:
        """``to_dict`` with derived defaults reset to null where they equal what would be
        derived, so that a changed method or epoch count re-derives them."""
        out = self.to_dict()
        for section, derive in _DERIVED.items():
            values = out[section]
            for name, value in derive(values[_DERIVED_FROM[section]]).items():
                if values[name] == getattr(value, "value", value):
                    values[name] = None
        return out

    def with_overrides(self, **overrides: Any) -> PropertyConfig:
        """A new config with ``data.*`` / ``model.*`` / ``train.*`` fields replaced; ``None``
        values are ignored.

        Keys are plain field names (each name belongs to one section); derived defaults
        (dropout, likelihood, reg_warmup/ramp) are recomputed unless given.
        """
        raw = self.raw_dict()
        for key, value in overrides.items():
            if value is None:
                continue
            section = next((s for s in ("data", "model", "train") if key in raw[s]), None)
            if section is None:
                raise ConfigError(f"{key}: unknown key")
            raw[section][key] = getattr(value, "value", value)
        return validate(PropertyConfig, raw)


def load_property_config(path: str, overrides: list[str] | tuple[str, ...] = ()) -> PropertyConfig:
    """Read a YAML/JSON file, apply ``--set`` overrides, validate."""
    raw = apply_overrides(load_raw(path), overrides, PropertyConfig)
    return validate(PropertyConfig, raw)
