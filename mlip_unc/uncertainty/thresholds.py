"""When a structure counts as uncertain: :class:`Thresholds` on the epistemic force and energy
uncertainties, absolute or relative to the validation-set levels a training stores in its
checkpoint (``payload["metadata"][LEVELS_KEY]``). The calculator's ``uncertainty_flag``,
``mlip-unc md``/``flag`` and the active-learning monitor all compare through this class."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlip_unc import keys
from mlip_unc.uncertainty.sample_size import MIN_CALIBRATION_SIZE, CalibrationWarning

__all__ = ["LEVELS_KEY", "ThresholdError", "Thresholds"]

LEVELS_KEY = "uncertainty_levels"  # payload["metadata"][LEVELS_KEY] = {"max_force_std": ..., ...}


class ThresholdError(ValueError):
    """Thresholds that cannot be applied (e.g. relative without calibrated levels)."""


@dataclass(frozen=True)
class Thresholds:
    """When a structure counts as uncertain ("flagged"): any configured threshold exceeded.

    Quantities compared:

    - ``max_force_std``: the calculator's ``max_force_std``, the largest per-atom EPISTEMIC
      force std norm ``max_i sqrt(sum_c forces_epistemic_var[i, c])`` in eV/Angstrom;
    - ``energy_std_per_atom``: ``sqrt(energy_epistemic_var) / n_atoms`` in eV/atom (epistemic,
      since the learned noise is the same everywhere and says nothing about extrapolation).

    With ``relative=False`` the values are absolute (eV/A, eV/atom). With ``relative=True`` they
    are multiples of the calibrated validation-set levels stored by training in the checkpoint
    (``payload["metadata"]["uncertainty_levels"]``, same keys, same definitions): e.g.
    ``Thresholds(max_force_std=3.0, relative=True)`` flags structures whose max force std is
    more than three times the typical validation value; levels measured on fewer than
    :data:`~mlip_unc.uncertainty.sample_size.MIN_CALIBRATION_SIZE` structures give a
    :class:`~mlip_unc.uncertainty.sample_size.CalibrationWarning`. ``None`` disables a criterion.
    """

    max_force_std: float | None = None
    energy_std_per_atom: float | None = None
    relative: bool = False

    def __post_init__(self) -> None:
        for name in keys.UNCERTAINTY_SCORES:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ThresholdError(f"threshold {name} must be a positive number, got {value!r}")

    @property
    def active(self) -> bool:
        return self.max_force_std is not None or self.energy_std_per_atom is not None

    @property
    def needs_forces(self) -> bool:
        return self.max_force_std is not None

    @classmethod
    def coerce(cls, value: Thresholds | Mapping[str, Any] | None) -> Thresholds:
        if value is None:
            return cls()
        if isinstance(value, Thresholds):
            return value
        unknown = set(value) - {*keys.UNCERTAINTY_SCORES, "relative"}
        if unknown:
            raise ThresholdError(
                f"unknown threshold keys {sorted(unknown)}; use max_force_std, energy_std_per_atom, relative"
            )
        return cls(**value)

    def absolute(self, levels: Mapping[str, Any] | None) -> Thresholds:
        """These thresholds in absolute units (multiplied by ``levels`` when relative).

        Levels measured on fewer than :data:`~mlip_unc.uncertainty.sample_size.MIN_CALIBRATION_SIZE`
        structures (their ``n_structures``) give a :class:`CalibrationWarning`: one structure
        sets such a level, so a multiple of it is no reliable limit."""
        if not self.relative:
            return self
        _warn_small_levels(levels)
        out = {}
        for name in keys.UNCERTAINTY_SCORES:
            factor = getattr(self, name)
            if factor is not None and (not levels or levels.get(name) is None):
                raise ThresholdError(
                    f"relative threshold on {name} needs the calibrated validation-set level "
                    f"metadata['{LEVELS_KEY}']['{name}'] in the checkpoint, which it lacks "
                    f"(found: {sorted(levels or {})}); give an absolute threshold instead"
                )
            out[name] = None if factor is None or not levels else factor * float(levels[name])
        return Thresholds(**out, relative=False)

    def exceeded(self, values: Mapping[str, float]) -> bool:
        """True when any configured (absolute) threshold is exceeded by ``values``."""
        if self.relative:
            raise ThresholdError("call absolute(levels) before comparing relative thresholds")
        limits = (
            (keys.CALC_MAX_FORCE_STD, self.max_force_std),
            (keys.CALC_ENERGY_STD_PER_ATOM, self.energy_std_per_atom),
        )
        return any(limit is not None and float(values[name]) > limit for name, limit in limits)


def _warn_small_levels(levels: Mapping[str, Any] | None) -> None:
    """A :class:`CalibrationWarning` when ``levels`` were measured on too few structures."""
    n = (levels or {}).get("n_structures")
    if n is None or int(n) >= MIN_CALIBRATION_SIZE:
        return
    warnings.warn(
        f"relative threshold on validation levels measured on {int(n)} structure(s) "
        f"(< {MIN_CALIBRATION_SIZE}): one structure sets such a level, so a multiple of it is "
        "no reliable flagging limit; give an absolute threshold, or train with at least "
        f"{MIN_CALIBRATION_SIZE} validation structures",
        CalibrationWarning,
        stacklevel=4,
    )
