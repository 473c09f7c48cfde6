"""Which labels a model predicted: the results in ``md.traj`` are predictions, not references.

``mlip-unc md`` (:func:`mlip_unc.active.monitor.run_md`) stores each logged frame in ``md.traj``
with the model's energy, forces and stress as the frame's calculator results (``ase gui`` shows
them) and the predicted energy in ``info[PREDICTED_ENERGY]`` (:func:`predicted_frame`); ``info``
survives the ``.traj`` and the extxyz round trips. A frame's calculator results count as
predictions (:func:`is_predicted`) when

* the mark is there and the results' energy equals it (a frame recomputed by a reference
  method keeps the mark but not the energy, and its labels are accepted), or
* a ``.traj`` file names one of this package's calculators as their source (it stores the
  calculator's name): trajectories written from Python and ``md.traj`` of earlier versions.

The label readers (:func:`mlip_unc.data.readers.read_validated_frames`, hence ``train``,
``eval`` and ``convert``) refuse such labels (:func:`refuse_predicted`) unless told that the
model is the reference (``accept_predicted``); ``flag --out`` writes them under the prediction
names of :data:`PREDICTION_NAMES` (:func:`without_predicted_labels`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import ase
import numpy as np
from ase.calculators.singlepoint import SinglePointCalculator, all_properties

from mlip_unc.data.errors import DataError
from mlip_unc.keys import PREDICTED_ENERGY

__all__ = [
    "MODEL_CALCULATORS",
    "PREDICTION_NAMES",
    "is_predicted",
    "predicted_frame",
    "predicted_labels",
    "refuse_predicted",
    "without_predicted_labels",
]

MODEL_CALCULATORS = frozenset({"uncertaintycalculator", "biasedcalculator"})
"""ASE names (``calc.name``) of this package's calculators, as a ``.traj`` file stores them."""

PREDICTION_NAMES = {"energy": "mlip_energy", "forces": "mlip_forces", "stress": "mlip_stress"}
"""Where predictions go when written beside structures (the names of ``flagged.xyz``):
``mlip_energy`` (eV) and ``mlip_stress`` (6, Voigt, eV/A^3) in ``info``, ``mlip_forces``
(n_atoms, 3; eV/A) in ``arrays``."""


def predicted_frame(atoms: ase.Atoms) -> ase.Atoms:
    """A copy of ``atoms`` to store in a trajectory: the current results of its calculator
    (energy, forces, stress, ...) in a ``SinglePointCalculator`` of the same name, and the
    predicted energy in ``info[PREDICTED_ENERGY]`` (the mark of :func:`is_predicted`)."""
    calc = atoms.calc
    frame = atoms.copy()
    results = {k: v for k, v in calc.results.items() if k in all_properties and v is not None}
    frame.calc = SinglePointCalculator(frame, **results)
    frame.calc.name = calc.name
    if "energy" in results:
        frame.info[PREDICTED_ENERGY] = float(results["energy"])
    return frame


def is_predicted(atoms: ase.Atoms) -> bool:
    """True when the calculator results of ``atoms`` (as read from a file) are a model's
    predictions: see the module docstring."""
    calc = atoms.calc
    results = getattr(calc, "results", None) or {}
    if not results:
        return False
    if isinstance(calc, SinglePointCalculator) and calc.name in MODEL_CALCULATORS:
        return True
    mark = atoms.info.get(PREDICTED_ENERGY)
    if mark is None:
        return False
    energy = results.get("energy")
    try:
        return energy is None or math.isclose(
            float(energy), float(mark), rel_tol=1e-9, abs_tol=1e-9
        )
    except (TypeError, ValueError):  # a mark that is not a number: still a mark
        return True


def predicted_labels(atoms: ase.Atoms, label_keys: Mapping[str, str | None]) -> list[str]:
    """The label kinds of ``label_keys`` (kind -> key; ``None``: the kind's standard name) that
    ``atoms`` holds as a model's predictions (found in its calculator results)."""
    if not is_predicted(atoms):
        return []
    results = atoms.calc.results
    return [kind for kind, key in label_keys.items() if (key or kind) in results]


def refuse_predicted(atoms: ase.Atoms, label_keys: Mapping[str, str | None], loc: str) -> None:
    """Raise ``DataError`` (naming ``loc``, the file and frame) when ``atoms`` holds predicted
    labels (:func:`predicted_labels`)."""
    kinds = predicted_labels(atoms, label_keys)
    if kinds:
        raise DataError(
            f"{loc}: its {', '.join(kinds)} are a model's predictions (as md writes them to "
            "md.traj), not reference labels; label the frame with your reference method, or, "
            "if that model is your reference, pass --accept-predicted-labels (train: "
            "data.accept_predicted_labels=true)"
        )


def without_predicted_labels(atoms: ase.Atoms) -> ase.Atoms:
    """``atoms`` itself, or, for a frame whose results are predictions (:func:`is_predicted`),
    a copy without calculator and mark that keeps them under :data:`PREDICTION_NAMES`: nothing
    in it reads as a label."""
    if not is_predicted(atoms):
        return atoms
    results = atoms.calc.results
    frame = atoms.copy()  # no calculator
    frame.info.pop(PREDICTED_ENERGY, None)
    if "energy" in results:
        frame.info[PREDICTION_NAMES["energy"]] = float(results["energy"])
    if "stress" in results:
        frame.info[PREDICTION_NAMES["stress"]] = np.asarray(results["stress"], dtype=float)
    if "forces" in results:
        frame.arrays[PREDICTION_NAMES["forces"]] = results["forces"].astype(float)
    return frame
