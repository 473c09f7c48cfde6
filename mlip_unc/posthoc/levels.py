"""The uncertainty levels stored with a potential, fitted post hoc on validation data.

:func:`uncertainty_levels` runs the model over the validation set once (with
:func:`~mlip_unc.evaluation.predictions.predict` and
:func:`~mlip_unc.evaluation.frames.frame_table`) and returns the mean uncertainties that the
calculator's relative thresholds are multiples of. Training (``finalize_checkpoint``),
``mlip-unc attach`` and the active-learning loop store them in a checkpoint's
``metadata["uncertainty_levels"]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlip_unc import keys
from mlip_unc.evaluation.frames import frame_table
from mlip_unc.evaluation.predictions import predict
from mlip_unc.models.committee import Committee
from mlip_unc.models.full_posterior import default_uncertainty_mode
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.uncertainty.sample_size import too_few

__all__ = ["uncertainty_levels"]


def uncertainty_levels(
    model: BayesianPotential | Committee,
    data: Any,
    *,
    batch_size: int = 16,
    uncertainty: str | None = None,
) -> dict:
    """Calibrated levels for relative flagging thresholds, over ``data`` (the validation set).

    The mean over frames of ``max_force_std`` (max over atoms of sqrt(sum_c Var F_ic)) and of
    ``energy_std_per_atom`` (epistemic energy std / n_atoms): the definitions of
    :class:`mlip_unc.calculator.UncertaintyCalculator`, stored in a checkpoint's
    ``metadata["uncertainty_levels"]``, in the calculator's default mode, recorded as ``mode``,
    with ``n_structures``. Fewer structures than
    :data:`~mlip_unc.uncertainty.sample_size.MIN_CALIBRATION_SIZE` log a warning, stored as
    ``warning`` (relative thresholds on such levels warn when they are applied).
    """
    uncertainty = uncertainty or default_uncertainty_mode(model)
    table = frame_table(predict(model, data, uncertainty=uncertainty, batch_size=batch_size))
    n = len(table["num_atoms"])
    levels: dict[str, Any] = {
        "mode": uncertainty,
        keys.CALC_MAX_FORCE_STD: float(np.nanmean(table["forces_max_std"])),
        keys.CALC_ENERGY_STD_PER_ATOM: float(
            np.nanmean(table["energy_epistemic_std"] / table["num_atoms"])
        ),
        "n_structures": n,
    }
    warning = too_few(
        n,
        "uncertainty levels for relative thresholds",
        "one structure sets them, so relative thresholds on them are unreliable",
    )
    if warning is not None:
        levels["warning"] = warning
    return levels
