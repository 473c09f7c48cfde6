"""What an active-learning run starts from: the seed set, the fixed validation set and the
per-element reference energies, all from the oracle.

- :func:`seed_frames`: decorrelated frames of oracle MD: one trajectory per temperature for the
  training frames and an independent one per temperature for the validation frames, kept frames
  ``spacing_fs`` apart (at least 100 fs, so that they are not copies of one another). The
  validation frames are labelled once and nothing joins them later: the uncertainty levels and
  the relative thresholds measured on them mean the same in every round.
- :func:`isolated_atoms`: each element's single atom labelled by the oracle, in its lowest spin
  state where the oracle has spin (GFN2-xTB: every multiplicity of the right parity up to 5,
  spin-polarised). These fix the energy offsets of the training (``reference_energies``), so
  they do not move when the training set changes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from ase.data import atomic_numbers, chemical_symbols

from mlip_unc.active.data import oracle_md
from mlip_unc.config import GenerateSettings, SeedSettings

__all__ = ["seed_frames", "isolated_atoms", "XTB_MULTIPLICITIES"]

log = logging.getLogger(__name__)

#: multiplicities tried for a free atom with the xtb oracle (the parity of its electron count)
XTB_MULTIPLICITIES = {0: (1, 3, 5), 1: (2, 4)}


def _shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal integers, the larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


def seed_frames(
    start: Atoms, oracle: Any, settings: SeedSettings
) -> tuple[list[Atoms], list[Atoms]]:
    """(train, valid) labelled frames of oracle MD from ``start``.

    Temperature ``k`` of ``settings.temperatures`` gets its share of ``settings.frames`` from a
    trajectory seeded ``seed + 2k``; temperature ``k`` of ``settings.valid_temperatures`` (default:
    the same list) its share of ``settings.valid_frames`` from one seeded ``seed + 2k + 1``;
    every trajectory is equilibrated ``equilibration_fs`` first. Frames carry
    ``info["seed_temperature"]`` (K).
    """
    interval = max(1, math.ceil(settings.spacing_fs / settings.timestep))
    equilibration = math.ceil(settings.equilibration_fs / settings.timestep)
    train: list[Atoms] = []
    valid: list[Atoms] = []
    parts = (
        (train, settings.temperatures, settings.frames, 0, "training"),
        (
            valid,
            settings.valid_temperatures or settings.temperatures,
            settings.valid_frames,
            1,
            "validation",
        ),
    )
    for part, temperatures, total, offset, name in parts:
        for k, (temperature, n) in enumerate(
            zip(temperatures, _shares(total, len(temperatures)), strict=True)
        ):
            if n == 0:
                continue
            gen = GenerateSettings(
                temperature=temperature,
                interval=interval,
                timestep=settings.timestep,
                equilibration=equilibration,
            )
            frames = oracle_md(start, oracle, gen, n_frames=n, seed=settings.seed + 2 * k + offset)
            for frame in frames:
                frame.info["seed_temperature"] = float(temperature)
            part.extend(frames)
            log.info("seed set: %d %s frames at %g K", n, name, temperature)
    return train, valid


def _is_xtb(oracle_spec: Any) -> bool:
    name = oracle_spec.get("name") if isinstance(oracle_spec, dict) else oracle_spec
    return isinstance(name, str) and name.lower() == "xtb"


def isolated_atoms(oracle_spec: Any, elements: Sequence[int | str]) -> list[Atoms]:
    """One labelled single-atom frame per element (``energy`` in ``info``/calc, ``forces`` 0).

    ``oracle_spec``: what :func:`~mlip_unc.active.oracles.make_oracle` takes. With the xtb oracle
    every multiplicity of the element's parity (:data:`XTB_MULTIPLICITIES`) is computed with
    spin polarisation and the lowest energy kept (its multiplicity in
    ``info["multiplicity"]``). Other oracles label the atom as they are; a periodic oracle (a
    crystal's SNAP) sees it alone in a 20 A box.
    """
    from mlip_unc.active.oracles import make_oracle

    frames: list[Atoms] = []
    for element in elements:
        z = atomic_numbers[element] if isinstance(element, str) else int(element)
        atoms = Atoms(chemical_symbols[z], positions=[[0.0, 0.0, 0.0]])
        best: tuple[float, int | None] | None = None
        if _is_xtb(oracle_spec):
            kwargs = dict(oracle_spec) if isinstance(oracle_spec, dict) else {}
            kwargs.pop("name", None)
            for mult in XTB_MULTIPLICITIES[z % 2]:
                calc = make_oracle(
                    {"name": "xtb", **kwargs, "multiplicity": mult, "spin_polarization": 1.0}
                )
                try:
                    energy = float(calc.get_potential_energy(atoms.copy()))
                except Exception as err:  # an impossible spin state for this atom
                    log.debug("%s multiplicity %d: %s", chemical_symbols[z], mult, err)
                    continue
                if best is None or energy < best[0]:
                    best = (energy, mult)
        else:
            oracle = make_oracle(oracle_spec)
            boxed = atoms.copy()
            boxed.cell = np.eye(3) * 20.0
            boxed.center()
            boxed.pbc = True
            best = (float(oracle.get_potential_energy(boxed)), None)
        if best is None:
            raise RuntimeError(f"the oracle failed on every spin state of a free {element} atom")
        atoms.calc = SinglePointCalculator(atoms, energy=best[0], forces=np.zeros((1, 3)))
        if best[1] is not None:
            atoms.info["multiplicity"] = best[1]
        frames.append(atoms)
        log.info("isolated %s: %.6f eV", chemical_symbols[z], best[0])
    return frames
