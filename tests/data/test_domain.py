"""The domain guard: training distances, the three rules, coincident atoms, plain-data round trip."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule
from ase.calculators.emt import EMT

from mlip_unc.data import StructureDataset
from mlip_unc.data.domain import CoincidentAtomsError, DomainCheck, DomainGuard, check_coincident

R_MAX = 5.0


def _labelled(atoms: Atoms) -> Atoms:
    atoms.calc = EMT()
    atoms.get_potential_energy()
    return atoms


def cells() -> list[Atoms]:
    """A few rattled EMT Cu and Al cells (the training set)."""
    out = []
    for seed in range(3):
        cu = bulk("Cu", "fcc", a=3.6, cubic=True)
        cu.rattle(0.04, seed=seed)
        al = bulk("Al", "fcc", a=4.05, cubic=True)
        al.rattle(0.04, seed=seed + 100)
        out += [_labelled(cu), _labelled(al)]
    return out


@pytest.fixture
def guard() -> DomainGuard:
    return DomainGuard.fit(cells(), R_MAX)


def test_fit_records_pairs_and_nearest_neighbours(guard):
    assert set(guard.min_distance) == {(13, 13), (29, 29)} and guard.elements == [13, 29]
    # rattled: the shortest pair below the ideal nn distance (Cu 2.546, Al 2.864 A), the largest
    # nearest-neighbour distance near it (each atom's nearest of 12 neighbours)
    assert 2.3 < guard.min_distance[(29, 29)] < guard.max_nn_distance[29] < 2.6
    assert 2.6 < guard.min_distance[(13, 13)] < guard.max_nn_distance[13] < 2.95
    assert not guard.check(bulk("Cu", "fcc", a=3.6, cubic=True)).out_of_domain  # the ideal lattice
    from_graphs = DomainGuard.fit(
        StructureDataset.from_atoms(cells(), R_MAX)
    )  # r_max from the dataset
    assert from_graphs == guard
    assert DomainGuard.fit(list(StructureDataset.from_atoms(cells(), R_MAX)), R_MAX) == guard


def test_training_structures_are_in_domain(guard):
    for atoms in cells():
        check = guard.check(atoms)
        assert isinstance(check, DomainCheck) and not check.out_of_domain and check.reason == ""
        assert check.min_ratio >= 1.0 - 1e-12 and check.max_nn_ratio <= 1.0 + 1e-12


def test_a_close_pair_is_flagged(guard):
    atoms = cells()[0]
    atoms.positions[3] = atoms.positions[1] + [0.0, 0.1, 0.0]
    check = guard.check(atoms)
    assert check.out_of_domain and check.rules == ("short_pair",)
    assert "Cu-Cu atoms 1 and 3 at 0.100 A" in check.reason and check.min_ratio < 0.1


def test_a_stretched_cell_is_flagged(guard):
    atoms = cells()[0]
    atoms.set_cell(atoms.cell * 1.25, scale_atoms=True)
    check = guard.check(atoms)
    assert check.out_of_domain and check.rules == ("stretched",) and check.max_nn_ratio > 1.1
    assert "stretched: Cu atom" in check.reason and "4 such atom(s)" in check.reason


def test_margins_are_0_9_and_1_1():
    dimers = [Atoms("Cu2", positions=[[0, 0, 0], [0, 0, d]]) for d in (2.2, 2.4)]
    guard = DomainGuard.fit(dimers, R_MAX)
    assert guard.min_distance[(29, 29)] == pytest.approx(2.2) and guard.max_nn_distance[
        29
    ] == pytest.approx(2.4)

    def ood(d: float) -> bool:
        return guard.check(Atoms("Cu2", positions=[[0, 0, 0], [0, 0, d]])).out_of_domain

    assert not ood(0.95 * 2.2) and ood(0.85 * 2.2)  # 0.9 x the shortest training distance
    assert not ood(1.05 * 2.4) and ood(1.15 * 2.4)  # 1.1 x the largest nearest-neighbour one
    loose = DomainGuard.fit(dimers, R_MAX, pair_factor=0.5, nn_factor=1.5)
    assert not loose.check(Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 1.5]])).out_of_domain


def test_a_dissociated_fragment_is_flagged():
    waters = []
    for seed in range(4):
        water = molecule("H2O")
        water.rattle(0.02, seed=seed)
        waters.append(water)
    guard = DomainGuard.fit([*waters, Atoms("H"), Atoms("O")], 4.0)  # isolated atoms: no nn bound
    assert guard.max_nn_distance[1] < 1.1 and not guard.check(waters[0]).out_of_domain
    apart = waters[0].copy()
    apart.positions[1] += 2.0 * (apart.positions[1] - apart.positions[0])  # H at ~3 A from O
    check = guard.check(apart)
    assert check.out_of_domain and "stretched: H atom 1 nearest neighbour" in check.reason
    gone = waters[0].copy()
    gone.positions[2] += [20.0, 0.0, 0.0]
    check = guard.check(gone)
    assert check.out_of_domain and check.max_nn_ratio == np.inf
    assert "H atom 2 has no neighbour within 4 A" in check.reason


def test_unseen_pairs_and_elements():
    guard = DomainGuard.fit(cells(), R_MAX)
    alloy = cells()[0]
    alloy.numbers[0] = 13
    check = guard.check(alloy)
    assert (
        check.out_of_domain and check.rules == ("unseen_pair",) and check.unseen_pairs == ("Al-Cu",)
    )
    relaxed = DomainGuard.fit(cells(), R_MAX, flag_unseen_pairs=False)
    check = relaxed.check(alloy)
    assert not check.out_of_domain and check.unseen_pairs == ("Al-Cu",)
    gold = cells()[0]
    gold.numbers[:] = 79
    check = guard.check(gold)
    assert check.out_of_domain and "unseen_element: Au not in training" in check.reason


def test_coincident_atoms_raise_naming_the_pair(guard):
    atoms = cells()[0]
    atoms.numbers[2] = 13
    atoms.positions[2] = atoms.positions[0] + [0.005, 0.0, 0.0]
    with pytest.raises(
        CoincidentAtomsError, match=r"atoms 0 \(Cu\) and 2 \(Al\) are 0\.0050 A apart"
    ) as err:
        guard.check(atoms)
    assert isinstance(err.value, ValueError)
    with pytest.raises(ValueError, match=r"atoms 0 \(Cu\) and 2 \(Al\)"):
        check_coincident(atoms)
    with pytest.raises(ValueError, match="coincident"):
        DomainGuard.fit([atoms], R_MAX)
    check_coincident(cells()[0])  # no error


def test_round_trip_through_plain_data(guard):
    data = guard.to_dict()
    assert DomainGuard.from_dict(json.loads(json.dumps(data))) == guard
    buffer = io.BytesIO()
    torch.save({"metadata": {"domain": data}}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["metadata"]["domain"]
    again = DomainGuard.from_dict(loaded)
    assert again == guard and again.check(cells()[0]) == guard.check(cells()[0])
    with pytest.raises(ValueError, match="version"):
        DomainGuard.from_dict({**data, "version": 99})


def test_fit_errors():
    with pytest.raises(ValueError, match="r_max"):
        DomainGuard.fit(cells())
    with pytest.raises(ValueError, match="no structures"):
        DomainGuard.fit([], R_MAX)
    with pytest.raises(ValueError, match="exceeds"):
        DomainGuard.fit(StructureDataset.from_atoms(cells(), 3.0), R_MAX)


def test_a_pair_just_under_the_limit_is_not_printed_at_it(guard):
    """The distance is rounded down: 0.0099996 A reads 0.0099, never '0.0100 A apart (< 0.01 A)'
    (a case the calculator fuzz test found)."""
    atoms = cells()[0]
    atoms.positions[2] = atoms.positions[0] + [0.0099996, 0.0, 0.0]
    with pytest.raises(CoincidentAtomsError, match=r"are 0\.0099 A apart \(< 0\.01 A\)"):
        guard.check(atoms)
