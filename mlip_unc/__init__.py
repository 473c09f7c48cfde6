"""mlip-unc: Bayesian output layers with closed-form uncertainty for GNN property models and
interatomic potentials.

The names in ``__all__`` are the main entry points; each is imported from its module on first
use, so ``import mlip_unc`` stays light (no torch until a name is touched).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"  # the one place the version is kept: pyproject.toml reads it from here

# public name -> module that defines it (the API reference documents it there)
_EXPORTS: dict[str, str] = {
    # use a trained potential
    "UncertaintyCalculator": "mlip_unc.calculator",
    "Thresholds": "mlip_unc.calculator",
    "BayesianPotential": "mlip_unc.models.potential",
    "Committee": "mlip_unc.models.committee",
    "load_potential": "mlip_unc.models.loading",
    "load_checkpoint": "mlip_unc.models.checkpoint",
    "save_checkpoint": "mlip_unc.models.checkpoint",
    # configs
    "PotentialConfig": "mlip_unc.config.potential",
    "load_potential_config": "mlip_unc.config.potential",
    "PropertyConfig": "mlip_unc.config.property",
    "load_property_config": "mlip_unc.config.property",
    "ActiveLearningConfig": "mlip_unc.config.active",
    "load_active_config": "mlip_unc.config.active",
    # data, training, evaluation, post-hoc fits
    "read_structures": "mlip_unc.data.readers",
    "train_potential": "mlip_unc.train.potential",
    "evaluate_potential": "mlip_unc.evaluation.evaluate",
    "attach_uncertainty": "mlip_unc.posthoc.attach",
    "train_property_model": "mlip_unc.train.property",
    "PropertyPredictor": "mlip_unc.models.factory",
    # molecular dynamics and active learning
    "UncertaintyMonitor": "mlip_unc.active.monitor",
    "run_md": "mlip_unc.active.monitor",
    "make_oracle": "mlip_unc.active.oracles",
    "run_active_learning": "mlip_unc.active.loop",
}

__all__ = [
    "UncertaintyCalculator",
    "Thresholds",
    "BayesianPotential",
    "Committee",
    "load_potential",
    "load_checkpoint",
    "save_checkpoint",
    "PotentialConfig",
    "load_potential_config",
    "PropertyConfig",
    "load_property_config",
    "ActiveLearningConfig",
    "load_active_config",
    "read_structures",
    "train_potential",
    "evaluate_potential",
    "attach_uncertainty",
    "train_property_model",
    "PropertyPredictor",
    "UncertaintyMonitor",
    "run_md",
    "make_oracle",
    "run_active_learning",
]

if TYPE_CHECKING:  # static analysers and IDEs see the real objects
    from mlip_unc.active.loop import run_active_learning
    from mlip_unc.active.monitor import UncertaintyMonitor, run_md
    from mlip_unc.active.oracles import make_oracle
    from mlip_unc.calculator import Thresholds, UncertaintyCalculator
    from mlip_unc.config.active import ActiveLearningConfig, load_active_config
    from mlip_unc.config.potential import PotentialConfig, load_potential_config
    from mlip_unc.config.property import PropertyConfig, load_property_config
    from mlip_unc.data.readers import read_structures
    from mlip_unc.evaluation.evaluate import evaluate_potential
    from mlip_unc.models.checkpoint import load_checkpoint, save_checkpoint
    from mlip_unc.models.committee import Committee
    from mlip_unc.models.factory import PropertyPredictor
    from mlip_unc.models.loading import load_potential
    from mlip_unc.models.potential import BayesianPotential
    from mlip_unc.posthoc.attach import attach_uncertainty
    from mlip_unc.train.potential import train_potential
    from mlip_unc.train.property import train_property_model


def __getattr__(name: str) -> object:
    """Lazy attributes: ``mlip_unc.UncertaintyCalculator`` imports torch only when used."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mlip_unc' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
