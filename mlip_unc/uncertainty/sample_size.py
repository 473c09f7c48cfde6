"""How many structures (or molecules) a calibration needs before it is trusted.

Every quantity fitted on the validation split to rescale or read an uncertainty (the property
recalibrator, the full posterior's scales, the uncertainty levels behind relative thresholds)
is checked against :data:`MIN_CALIBRATION_SIZE`. Below it the fit logs a warning and stores
the warning beside its result in the checkpoint; where an uncalibrated value exists it is used
instead (a property model's raw std), and a relative threshold on such a level warns when it is
applied (:class:`CalibrationWarning`).
"""

from __future__ import annotations

import logging

__all__ = ["MIN_CALIBRATION_SIZE", "CalibrationWarning", "too_few"]

log = logging.getLogger(__name__)

MIN_CALIBRATION_SIZE = 10
"""Fewest validation structures (molecules) a calibration, recalibration or uncertainty level
is fitted on.

Why 10: a std factor ``c`` fitted as ``c^2 = mean(z^2)`` on ``n`` residuals that are already
calibrated scatters as ``sqrt(chi^2_n / n)``; its central 95 % range is [0.16, 1.92] for
``n = 2``, [0.27, 1.77] for ``n = 3`` and [0.57, 1.43] for ``n = 10``. Below 10 the fit can
shrink a correct std by a factor of 3 or more by chance, which is the size of the
miscalibration it is meant to correct; from 10 on, 95 % of the fits stay within
[0.57, 1.43]. A level
(a mean over structures of a std) has the same problem in another form: with 2 structures one
outlier sets it, and a relative threshold over it may flag nothing (an example:
docs/guides/uncertainty-outputs.md); with 10, one structure moves it by a tenth of
its own value. Ten is also what the shipped examples' validation splits hold (10 % of 100
molecules, 20-25 % of 40-50 structures), so they run without the warning."""


class CalibrationWarning(UserWarning):
    """An uncertainty is read against a calibration fitted on too few structures."""


def too_few(n: int, what: str, consequence: str, *, unit: str = "structures") -> str | None:
    """``None`` when ``n`` reaches :data:`MIN_CALIBRATION_SIZE`; else the warning (logged
    here, to be stored with the fit): ``what`` was fitted on ``n`` ``unit``, ``consequence``
    follows."""
    if n >= MIN_CALIBRATION_SIZE:
        return None
    message = f"{what} fitted on {n} {unit} (fewer than {MIN_CALIBRATION_SIZE}): {consequence}"
    log.warning("%s", message)
    return message
