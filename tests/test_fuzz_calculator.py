"""Fuzzing the calculator and the graph builders (hypothesis): random species, cells (skewed,
tiny, mixed pbc), positions (near-coincident atoms, atoms far outside the cell), single atoms,
empty structures. Property: a clear error (``ValueError`` and its subclasses) or finite
results; never NaN, never another exception. The default run tries 60 structures; the slow
tier (``pytest -m slow``) 1,000."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlip_unc.calculator import UncertaintyCalculator
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.potential import BayesianPotential

R_MAX = 3.5


@pytest.fixture(scope="module")
def calc() -> UncertaintyCalculator:
    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=2, r_max=R_MAX, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(
        backbone, [13, 29], R_MAX, torch.tensor([-0.1, -0.2]), init_std=0.2
    ).double()
    return UncertaintyCalculator(model, uncertainty="exact")


@st.composite
def structures(draw) -> Atoms:
    n = draw(st.integers(0, 6))
    numbers = draw(st.lists(st.sampled_from([13, 29]), min_size=n, max_size=n))
    scale = draw(st.sampled_from([0.05, 1.0, 3.0, 50.0]))  # tiny to far outside the cell
    coords = st.floats(-1.0, 1.0, allow_nan=False, allow_infinity=False)
    positions = np.array(
        draw(st.lists(st.tuples(coords, coords, coords), min_size=n, max_size=n)), dtype=float
    )
    positions = positions.reshape(n, 3) * scale
    if n >= 2 and draw(st.booleans()):  # a near-coincident pair
        positions[1] = positions[0] + draw(st.sampled_from([1e-4, 5e-3, 0.02, 0.3]))
    pbc = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    cell = None
    if any(pbc):
        lengths = draw(st.tuples(*[st.sampled_from([0.5, 2.0, 4.0, 9.0])] * 3))
        skew = draw(st.sampled_from([0.0, 0.3, 0.9]))
        cell = np.diag(lengths) + skew * np.triu(np.ones((3, 3)), 1) * min(lengths)
    return Atoms(numbers=numbers, positions=positions, cell=cell, pbc=pbc)


def _check(calc: UncertaintyCalculator, atoms: Atoms) -> None:
    try:
        calc.calculate(atoms, ["energy", "forces", "forces_std", "energy_std"])
    except ValueError:  # DataError, CoincidentAtomsError, NonFiniteResultError...: a clear error
        return
    for key in ("energy", "forces", "forces_std", "energy_std"):
        assert np.all(np.isfinite(calc.results[key])), (key, atoms)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(atoms=structures())
def test_clear_error_or_finite_results(calc, atoms):
    _check(calc, atoms)


@pytest.mark.slow
@settings(
    max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(atoms=structures())
def test_clear_error_or_finite_results_full(calc, atoms):
    _check(calc, atoms)
