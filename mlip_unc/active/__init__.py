"""Active learning with uncertainty: monitor MD, select structures, label with an oracle, retrain.

- :mod:`~mlip_unc.active.monitor`: :class:`UncertaintyMonitor` (an ASE dynamics observer),
  :func:`run_md`;
- :mod:`~mlip_unc.active.selection`: ranking, farthest-point diversity, structure descriptors;
- :mod:`~mlip_unc.active.oracles`: reference calculators (EMT, PySCF, xTB, any factory);
- :mod:`~mlip_unc.active.data`: starting structures, oracle MD, initial data, splits;
- :mod:`~mlip_unc.active.training`: training on labelled frames, uncertainty levels, offsets;
- :mod:`~mlip_unc.active.evaluation`: held-out errors and uncertainties of a calculator;
- :mod:`~mlip_unc.active.loop`: the MD -> flag -> label -> retrain loop;
- :mod:`~mlip_unc.active.demo` and :mod:`~mlip_unc.active.report`: ``mlip-unc demo`` and reports.

The configs (:class:`ActiveLearningConfig`, :class:`MDSettings`, ...) live in
:mod:`mlip_unc.config`; they are re-exported here.
"""

from mlip_unc.active.loop import run_active_learning
from mlip_unc.active.monitor import UncertaintyLimitReached, UncertaintyMonitor, run_md
from mlip_unc.active.oracles import PySCFCalculator, label_structures, make_oracle
from mlip_unc.active.selection import farthest_point_sampling, score_structures, select
from mlip_unc.config import (
    ActiveLearningConfig,
    GenerateSettings,
    MDSettings,
    SelectionSettings,
    load_active_config,
)

__all__ = [
    "ActiveLearningConfig",
    "GenerateSettings",
    "MDSettings",
    "PySCFCalculator",
    "SelectionSettings",
    "UncertaintyLimitReached",
    "UncertaintyMonitor",
    "farthest_point_sampling",
    "label_structures",
    "load_active_config",
    "make_oracle",
    "run_active_learning",
    "run_md",
    "score_structures",
    "select",
]
