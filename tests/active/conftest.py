"""Shared fixtures of the active-learning tests: a fake uncertainty-aware calculator."""

from __future__ import annotations

import numpy as np
import pytest
from ase.calculators.calculator import Calculator, all_changes
from ase.calculators.emt import EMT


class FakeUncertaintyCalculator(Calculator):
    """EMT energies/forces plus a made-up 'uncertainty' = displacement from the start."""

    implemented_properties = [
        "energy",
        "free_energy",
        "forces",
        "energy_std",
        "energy_epistemic_var",
        "energies_std",
        "forces_std",
        "max_force_std",
        "alignment",
        "flag",
    ]

    def __init__(self, reference: np.ndarray, threshold: float = 0.05, **kwargs):
        super().__init__(**kwargs)
        self.reference = np.asarray(reference, dtype=float)
        self.threshold = threshold
        self.n_calls = 0
        self._emt = EMT()

    def calculate(self, atoms=None, properties=None, system_changes=all_changes):
        properties = self.implemented_properties if properties is None else properties
        Calculator.calculate(self, atoms, properties, system_changes)
        self.n_calls += 1
        a = self.atoms.copy()
        a.calc = self._emt
        disp = np.linalg.norm(self.atoms.positions - self.reference, axis=1)  # (n,)
        std = 0.01 + disp
        self.results.update(
            energy=a.get_potential_energy(),
            free_energy=a.get_potential_energy(),
            forces=a.get_forces(),
            energy_std=float(std.sum()),
            energy_epistemic_var=float(std.sum() ** 2),
            energies_std=std,
            forces_std=np.repeat(std[:, None], 3, axis=1) / np.sqrt(3),
            max_force_std=float(std.max()),
            alignment=0.5,
            flag=bool(std.max() > self.threshold),
        )


@pytest.fixture
def fake_calc_factory():
    return FakeUncertaintyCalculator


TINY_TRAINING = {
    "dtype": "float64",
    "data": {"r_max": 4.0},
    "model": {
        "backbone": "gin",
        "backbone_kwargs": {"hidden": 8, "num_layers": 1, "num_basis": 4},
        "latent_dim": 4,
        "standardise": False,
    },
    "loss": {"energy_weight": 1e-3},
    "train": {"epochs": 1, "batch_size": 4, "progress": False},
}


@pytest.fixture
def tiny_training():
    import copy

    return copy.deepcopy(TINY_TRAINING)
