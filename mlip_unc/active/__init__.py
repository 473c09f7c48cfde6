"""Active learning with uncertainty: monitor MD, select structures, label with an oracle, retrain.

- :mod:`~mlip_unc.active.monitor`: :class:`UncertaintyMonitor` (an ASE dynamics observer),
  :func:`run_md`;
- :mod:`~mlip_unc.active.selection`: ranking, farthest-point diversity, structure descriptors;
- :mod:`~mlip_unc.active.oracles`: reference calculators (EMT, PySCF, xTB, any factory);
- :mod:`~mlip_unc.active.loop`: the MD -> flag -> label -> retrain loop;
- :mod:`~mlip_unc.active.demo` and :mod:`~mlip_unc.active.report`: ``mlip-unc demo`` and reports.
"""

from mlip_unc.active.loop import ActiveLearningConfig, load_al_config, run_active_learning
from mlip_unc.active.monitor import MDSettings, UncertaintyLimitReached, UncertaintyMonitor, run_md
from mlip_unc.active.oracles import PySCFCalculator, label_structures, make_oracle
from mlip_unc.active.selection import farthest_point_sampling, score_structures, select

__all__ = [
    "ActiveLearningConfig",
    "MDSettings",
    "PySCFCalculator",
    "UncertaintyLimitReached",
    "UncertaintyMonitor",
    "farthest_point_sampling",
    "label_structures",
    "load_al_config",
    "make_oracle",
    "run_active_learning",
    "run_md",
    "score_structures",
    "select",
]
