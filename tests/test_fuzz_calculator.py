"""Fuzzing the calculator and the graph builders (hypothesis): random species, cells (skewed,
tiny, mixed pbc), positions (near-coincident atoms, atoms far outside the cell), single atoms,
empty structures. Property: each structure gets exactly what the calculator documents:

- an empty structure: ``DataError`` "empty structure (0 atoms)";
- two atoms (or an atom and a periodic image) closer than 0.01 A, as an independent neighbour
  search (``ase.neighborlist``) finds them: ``CoincidentAtomsError`` naming such a pair, its
  elements and its distance;
- anything else: finite results of the documented shapes (energy and its std scalars, forces and
  their stds ``(n_atoms, 3)``), never an exception.

Any other exception, or a right exception for the wrong structure, fails. The default run tries
60 structures; the slow tier (``pytest -m slow``) 1,000."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.neighborlist import neighbor_list
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlip_unc.calculator import UncertaintyCalculator
from mlip_unc.data.domain import CoincidentAtomsError
from mlip_unc.data.errors import DataError
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


COINCIDENT = 0.01  # Angstrom: the calculator's documented limit
_PAIR = re.compile(
    r"atoms (\d+) \((\w+)\) and (\d+) \((\w+)\) are (\d+\.\d+) A apart \(< 0\.01 A\)"
)


def _coincident_pairs(atoms: Atoms) -> set[tuple[int, int]]:
    """Pairs closer than 0.01 A, periodic images included (ASE's own neighbour search)."""
    if len(atoms) < 2 and not any(atoms.pbc):
        return set()
    i, j = neighbor_list("ij", atoms, COINCIDENT, self_interaction=False)
    return {(min(a, b), max(a, b)) for a, b in zip(i.tolist(), j.tolist(), strict=True)}


def _check(calc: UncertaintyCalculator, atoms: Atoms) -> None:
    n = len(atoms)
    close = _coincident_pairs(atoms) if n else set()
    try:
        calc.calculate(atoms, ["energy", "forces", "forces_std", "energy_std"])
    except CoincidentAtomsError as err:
        match = _PAIR.search(str(err))
        assert match, f"the message names no pair: {err}"
        a, sym_a, b, sym_b, distance = match.groups()
        a, b = int(a), int(b)
        assert (atoms[a].symbol, atoms[b].symbol) == (sym_a, sym_b), (str(err), atoms)
        assert float(distance) < COINCIDENT and (min(a, b), max(a, b)) in close, (str(err), close)
        return
    except DataError as err:
        assert n == 0 and "empty structure (0 atoms)" in str(err), (str(err), atoms)
        return
    assert n > 0, "an empty structure must be refused"
    assert not close, f"coincident atoms {sorted(close)} were not refused"
    expected = {"energy": (), "energy_std": (), "forces": (n, 3), "forces_std": (n, 3)}
    for key, shape in expected.items():
        value = np.asarray(calc.results[key])
        assert value.shape == shape, (key, value.shape, shape)
        assert np.all(np.isfinite(value)), (key, atoms)
    assert np.all(calc.results["forces_std"] >= 0) and calc.results["energy_std"] >= 0


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


class _BrokenCalculator:
    """Stands in for a calculator with one bug: an undocumented error or a wrong shape."""

    def __init__(self, bug: str) -> None:
        self.bug, self.results = bug, {}

    def calculate(self, atoms: Atoms, properties: list[str]) -> None:
        n = len(atoms)
        if self.bug == "value_error":
            raise ValueError("operands could not be broadcast together with shapes (3,) (4,)")
        self.results = {"energy": 0.0, "energy_std": 0.1, "forces": np.zeros((n, 3))}
        self.results["forces_std"] = np.ones(n if self.bug == "shape" else (n, 3))


def test_the_check_fails_on_a_shape_bug_and_on_an_undocumented_error():
    """The property above is not vacuous: the bugs the old check let through now fail it."""
    atoms = Atoms("Cu2", positions=[[0, 0, 0], [2.5, 0, 0]])
    _check(_BrokenCalculator("none"), atoms)  # the stand-in without a bug passes
    with pytest.raises(ValueError, match="broadcast"):
        _check(_BrokenCalculator("value_error"), atoms)
    with pytest.raises(AssertionError, match="forces_std"):
        _check(_BrokenCalculator("shape"), atoms)
