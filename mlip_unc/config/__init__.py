"""Every configuration of the package: typed (pydantic), validated once, one YAML loader.

``loader`` reads YAML, applies ``--set a.b=c`` overrides and ``${...}`` interpolation and turns
validation errors into :class:`ConfigError` naming the key; ``enums`` holds every option;
``training`` the options of the one training core; ``property``, ``potential`` and ``active``
the configs of the three kinds of run. Nothing here imports torch.
"""

from mlip_unc.config.active import (
    ActiveLearningConfig,
    GenerateSettings,
    MDSettings,
    SelectionSettings,
    load_active_config,
)
from mlip_unc.config.enums import (
    AGLForm,
    Backbone,
    Calibration,
    DType,
    EnergyCount,
    Estimator,
    HeadKind,
    Intervention,
    Likelihood,
    LRSchedule,
    Method,
    Norm,
    Pooling,
    PosteriorBasis,
    PosteriorKind,
    ReferenceEnergies,
    RegularizerKind,
    ScheduleClock,
    StopMetric,
)
from mlip_unc.config.loader import (
    DATA_ROOT_ENV,
    ConfigError,
    Section,
    apply_overrides,
    config_to_dict,
    default_data_root,
    interpolate,
    load_raw,
    validate,
)
from mlip_unc.config.potential import (
    DataConfig,
    LossConfig,
    PotentialConfig,
    PotentialModelConfig,
    PotentialTrainConfig,
    RegularizerConfig,
    load_potential_config,
    potential_config_from_dict,
)
from mlip_unc.config.property import (
    PropertyConfig,
    PropertyModelConfig,
    PropertyTrainConfig,
    load_property_config,
)
from mlip_unc.config.training import TrainCoreConfig

__all__ = [
    "ActiveLearningConfig",
    "GenerateSettings",
    "MDSettings",
    "SelectionSettings",
    "load_active_config",
    "AGLForm",
    "Backbone",
    "Calibration",
    "DType",
    "EnergyCount",
    "Estimator",
    "HeadKind",
    "Intervention",
    "Likelihood",
    "LRSchedule",
    "Method",
    "Norm",
    "Pooling",
    "PosteriorBasis",
    "PosteriorKind",
    "ReferenceEnergies",
    "RegularizerKind",
    "ScheduleClock",
    "StopMetric",
    "DATA_ROOT_ENV",
    "ConfigError",
    "Section",
    "apply_overrides",
    "config_to_dict",
    "default_data_root",
    "interpolate",
    "load_raw",
    "validate",
    "DataConfig",
    "LossConfig",
    "PotentialConfig",
    "PotentialModelConfig",
    "PotentialTrainConfig",
    "RegularizerConfig",
    "load_potential_config",
    "potential_config_from_dict",
    "PropertyConfig",
    "PropertyModelConfig",
    "PropertyTrainConfig",
    "load_property_config",
    "TrainCoreConfig",
]
