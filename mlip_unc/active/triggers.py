"""When on-the-fly active learning calls the oracle: the trigger of a monitored MD frame.

A trigger turns a frame into a decision. The score triggers compare a number with
``threshold`` x its level on the fixed validation set, so one threshold means the same thing
for every model and every score. The level is the score's mean over the validation frames
(``level: mean``) or, with validation frames at several temperatures, a straight line through
their scores against temperature read at the temperature MD runs at (``level:
per_temperature``, :func:`temperature_line`): thermal motion alone raises every score with
temperature, and a hot frame should be compared with hot frames. The scores:

- ``uncertainty``: the model's ``max_force_std`` (eV/A; the committee's force spread for a
  committee);
- ``max_force``: the largest predicted ``|F_i|`` (eV/A), a baseline that needs no uncertainty;
- ``true_error``: the largest ``|F_pred,i - F_ref,i|`` against the oracle (eV/A), a control with
  perfect information whose oracle calls are not counted as labels.

The others ignore the frame: ``periodic`` fires on every ``every``-th monitored frame and
``random`` with probability ``probability``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ase import Atoms

from mlip_unc.config import OnTheFlySettings

__all__ = ["Trigger", "score_function", "temperature_line", "validation_level"]

Score = Callable[[Any, Atoms], float]


def _uncertainty(calc: Any, atoms: Atoms) -> float:
    return float(calc.get_property("max_force_std", atoms))


def _max_force(calc: Any, atoms: Atoms) -> float:
    forces = calc.get_property("forces", atoms)  # (n_atoms, 3)
    return float(np.linalg.norm(forces, axis=1).max())


def score_function(trigger: str, reference: Callable[[Atoms], np.ndarray] | None = None) -> Score:
    """The score of a score trigger; ``reference(atoms)`` gives the oracle's forces (n, 3) for
    ``true_error``."""
    if trigger == "uncertainty":
        return _uncertainty
    if trigger == "max_force":
        return _max_force
    if trigger == "true_error":
        if reference is None:
            raise ValueError("the true_error trigger needs the oracle's forces")

        def true_error(calc: Any, atoms: Atoms) -> float:
            pred = calc.get_property("forces", atoms)  # (n_atoms, 3)
            return float(np.linalg.norm(pred - reference(atoms), axis=1).max())

        return true_error
    raise ValueError(f"{trigger} has no score")


def validation_level(score: Score, calc: Any, valid: Sequence[Atoms]) -> float:
    """Mean of ``score`` over the validation frames (computed on copies)."""
    values = [score(calc, a.copy()) for a in valid]
    if not values:
        raise ValueError("a relative trigger needs validation frames")
    return float(np.mean(values))


def temperature_line(temperatures: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope per K) of the least-squares line of ``values`` against
    ``temperatures``; raises unless the frames span two temperatures or more."""
    t = np.asarray(temperatures, dtype=float)  # (n,)
    v = np.asarray(values, dtype=float)  # (n,)
    if len(np.unique(t)) < 2:
        raise ValueError(
            "level: per_temperature needs validation frames at two temperatures or more "
            "(seed_set.valid_temperatures)"
        )
    slope, intercept = np.polyfit(t, v, 1)
    return float(intercept), float(slope)


@dataclass
class Trigger:
    """The decision of one run: call :meth:`level_for` after every model update, then
    :meth:`fires` on each monitored frame.

    Attributes:
        settings: the run's on-the-fly settings.
        rng: draws of ``random``.
        reference: the oracle's forces of a frame (``true_error`` only).
        level: the current model's validation level of the score (None: no score); with
            ``level: per_temperature``, at the temperature of the last :meth:`fires` (or the
            validation mean before any).
        seen: monitored frames so far (``periodic`` counts them).
        line: (intercept, slope per K) of ``per_temperature`` (None otherwise).
    """

    settings: OnTheFlySettings
    rng: np.random.Generator
    reference: Callable[[Atoms], np.ndarray] | None = None
    level: float | None = None
    seen: int = 0
    line: tuple[float, float] | None = None
    score: Score | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.settings.trigger not in ("periodic", "random"):
            self.score = score_function(self.settings.trigger, self.reference)

    def level_for(self, calc: Any, valid: Sequence[Atoms]) -> float | None:
        """Measure the level of the score for the model behind ``calc`` on ``valid`` (frames
        carry their MD temperature in ``info["seed_temperature"]``)."""
        if self.score is None:
            return self.level
        values = [self.score(calc, a.copy()) for a in valid]
        if not values:
            raise ValueError("a relative trigger needs validation frames")
        self.level = float(np.mean(values))
        if self.settings.level == "per_temperature":
            temps = [float(a.info["seed_temperature"]) for a in valid]
            self.line = temperature_line(temps, values)
        return self.level

    def level_at(self, temperature: float | None) -> float | None:
        """The level at ``temperature`` (K): the line's value, never below a tenth of the
        validation mean (a line fitted on a few frames can reach zero when extrapolated);
        the mean without a line or a temperature."""
        if self.line is None or temperature is None or self.level is None:
            return self.level
        intercept, slope = self.line
        return max(intercept + slope * temperature, 0.1 * self.level)

    @property
    def threshold(self) -> float | None:
        """The absolute threshold of the score (None without a score)."""
        return None if self.level is None else self.settings.threshold * self.level

    def threshold_at(self, temperature: float | None) -> float | None:
        """The absolute threshold of the score at ``temperature`` (None without a score)."""
        level = self.level_at(temperature)
        return None if level is None else self.settings.threshold * level

    def fires(
        self, calc: Any, atoms: Atoms, temperature: float | None = None
    ) -> tuple[bool, float]:
        """(label this frame, taken from MD at ``temperature`` K?, its score: NaN for
        ``periodic`` and ``random``)."""
        self.seen += 1
        s = self.settings
        if s.trigger == "periodic":
            return self.seen % s.every == 0, float("nan")
        if s.trigger == "random":
            return bool(self.rng.random() < s.probability), float("nan")
        threshold = self.threshold_at(temperature)
        assert self.score is not None and threshold is not None, "level_for first"
        value = self.score(calc, atoms)
        return value > threshold, value
