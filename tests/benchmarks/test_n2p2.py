"""benchmarks/common/n2p2.py: symmetry functions against a hand computation, the file reader, the
order matching, finite-difference forces and stress, and invariances."""

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk

from benchmarks.common import n2p2

RC = 9.0  # Bohr
FUNCTIONS = [
    "2 Si 0.01 0.0 {rc}",
    "2 Si 0.05 3.0 {rc}",
    "3 Si Si 0.01 -1 1.0 {rc}",
    "3 Si Si 0.02 1 4.0 {rc}",
]


def _write_model(folder: Path, scaling: np.ndarray, seed: int = 0, hidden: int = 5) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        "number_of_elements 1",
        "elements Si",
        "atom_energy Si -0.2",
        "cutoff_type 1",
        "scale_symmetry_functions",
        "scale_min_short 0.0",
        "scale_max_short 1.0",
        "global_hidden_layers_short 1",
        f"global_nodes_short {hidden}",
        "global_activation_short t l",
        "# a comment line",
        *(f"symfunction_short Si {f.format(rc=RC)}" for f in FUNCTIONS),
    ]
    (folder / "input.nn").write_text("\n".join(lines) + "\n")
    (folder / "scaling.data").write_text(
        "".join(f"1 {k + 1} {lo:.16e} {hi:.16e} 0.0 1.0\n" for k, (lo, hi) in enumerate(scaling))
    )
    rng = np.random.default_rng(seed)
    out, index = [], 0
    for layer, (n_in, n_out) in enumerate([(len(FUNCTIONS), hidden), (hidden, 1)]):
        for i, o in itertools.product(range(n_in), range(n_out)):
            index += 1
            out.append(f"{rng.normal():.16e} a {index} {layer} {i + 1} {layer + 1} {o + 1}")
        for o in range(n_out):
            index += 1
            out.append(f"{rng.normal():.16e} b {index} {layer + 1} {o + 1}")
    (folder / "weights.001.data").write_text("\n".join(out) + "\n")


def _cell() -> Atoms:
    atoms = bulk("Si", "diamond", a=5.43) * (2, 1, 1)
    atoms.rattle(0.1, seed=1)
    return atoms


def _hand(atoms: Atoms, bohr: float) -> np.ndarray:
    """The four functions of FUNCTIONS for a non-periodic cluster, by explicit loops."""
    pos = atoms.positions / bohr

    def fc(r):
        return 0.5 * (math.cos(math.pi * r / RC) + 1) if r < RC else 0.0

    out = np.zeros((len(atoms), 4))
    for i in range(len(atoms)):
        others = [j for j in range(len(atoms)) if j != i]
        for j in others:
            r = np.linalg.norm(pos[j] - pos[i])
            out[i, 0] += math.exp(-0.01 * r**2) * fc(r)
            out[i, 1] += math.exp(-0.05 * (r - 3.0) ** 2) * fc(r)
        for j, k in itertools.combinations(others, 2):
            a, b = pos[j] - pos[i], pos[k] - pos[i]
            rij, rik, rjk = np.linalg.norm(a), np.linalg.norm(b), np.linalg.norm(b - a)
            cos = a @ b / (rij * rik)
            cut = fc(rij) * fc(rik) * fc(rjk)
            for col, (eta, lam, zeta) in ((2, (0.01, -1, 1.0)), (3, (0.02, 1, 4.0))):
                out[i, col] += (
                    2 ** (1 - zeta)
                    * (1 + lam * cos) ** zeta
                    * math.exp(-eta * (rij**2 + rik**2 + rjk**2))
                    * cut
                )
    return out


def test_symmetry_functions_match_hand_computation(tmp_path):
    _write_model(tmp_path / "m", np.tile([0.0, 1.0], (4, 1)))
    model = n2p2.read_model(tmp_path / "m")
    cluster = Atoms("Si4", positions=[[0, 0, 0], [2.3, 0.1, 0], [0.2, 2.2, 0.4], [1.1, 1.0, 3.9]])
    got = n2p2.symmetry_functions(model, cluster, n2p2.BOHR).numpy()
    np.testing.assert_allclose(got, _hand(cluster, n2p2.BOHR), rtol=1e-12, atol=1e-14)
    assert (got > 1e-5).all()  # every function sees neighbours: the comparison is not vacuous


def test_reader_and_order_matching(tmp_path):
    _write_model(tmp_path / "probe", np.tile([0.0, 1.0], (4, 1)))
    frames = [_cell(), bulk("Si", "diamond", a=5.6)]
    probe = n2p2.read_model(tmp_path / "probe")
    g = torch.cat([n2p2.symmetry_functions(probe, a, n2p2.BOHR) for a in frames]).numpy()
    ranges = np.stack([g.min(0), g.max(0)], axis=1)
    perm = np.array([2, 0, 3, 1])  # scaling row k describes function perm[k]
    _write_model(tmp_path / "m", ranges[perm])
    model = n2p2.read_model(tmp_path / "m")
    assert (
        model.atom_energy == -0.2
        and model.activations == ["t", "l"]
        and model.weights[0][0].shape == (5, 4)
    )
    assert n2p2.match_order(model, frames, n2p2.BOHR) < 1e-12
    np.testing.assert_array_equal(model.order, perm)
    # errors name the file and the line
    bad = tmp_path / "bad"
    _write_model(bad, ranges)
    (bad / "input.nn").write_text(
        (bad / "input.nn").read_text().replace("3 Si Si 0.01 -1", "9 Si Si 0.01 -1")
    )
    with pytest.raises(ValueError, match=r"input.nn:\d+: symmetry function type 9"):
        n2p2.read_model(bad)
    with pytest.raises(ValueError, match="order unknown"):
        n2p2.energy(n2p2.read_model(tmp_path / "m"), frames[0], n2p2.BOHR, n2p2.HARTREE)


@pytest.fixture()
def calc(tmp_path):
    frames = [_cell()]
    _write_model(tmp_path / "probe", np.tile([0.0, 1.0], (4, 1)))
    g = torch.cat(
        [n2p2.symmetry_functions(n2p2.read_model(tmp_path / "probe"), a, n2p2.BOHR) for a in frames]
    ).numpy()
    _write_model(tmp_path / "m", np.stack([g.min(0) * 0.9, g.max(0) * 1.1], axis=1))
    model = n2p2.read_model(tmp_path / "m")
    n2p2.match_order(model, frames, n2p2.BOHR)
    return n2p2.N2p2Calculator(model)


def test_forces_and_stress_finite_differences(calc):
    atoms = _cell()
    atoms.calc = calc
    forces, stress = atoms.get_forces(), atoms.get_stress(voigt=False)
    assert np.abs(forces).max() > 1e-2  # not a vacuous comparison
    h = 1e-5
    for a, d in [(0, 0), (1, 2), (3, 1)]:
        plus, minus = atoms.copy(), atoms.copy()
        plus.positions[a, d] += h
        minus.positions[a, d] -= h
        plus.calc = minus.calc = calc
        fd = -(plus.get_potential_energy() - minus.get_potential_energy()) / (2 * h)
        assert forces[a, d] == pytest.approx(fd, rel=1e-6, abs=1e-8)
    for a, b in [(0, 0), (0, 1), (2, 2)]:
        eps = np.zeros((3, 3))
        eps[a, b] = eps[b, a] = h
        energies = []
        for sign in (1, -1):
            strained = atoms.copy()
            strained.set_cell(atoms.cell @ (np.eye(3) + sign * eps), scale_atoms=True)
            strained.calc = calc
            energies.append(strained.get_potential_energy())
        fd = (energies[0] - energies[1]) / (2 * h * (1 if a == b else 2)) / atoms.get_volume()
        assert stress[a, b] == pytest.approx(fd, rel=1e-5, abs=1e-9)


def test_energy_invariances(calc):
    atoms = _cell()
    atoms.calc = calc
    e0, f0 = atoms.get_potential_energy(), atoms.get_forces()
    moved = atoms.copy()
    moved.translate([0.3, -1.2, 0.7])
    perm = np.random.default_rng(0).permutation(len(atoms))
    shuffled = atoms[perm]
    rotated = atoms.copy()
    rotated.rotate(37, "x", rotate_cell=True)
    rotated.rotate(-71, "z", rotate_cell=True)
    for other in (moved, shuffled, rotated):
        other.calc = calc
        assert other.get_potential_energy() == pytest.approx(e0, rel=1e-10)
    shuffled.calc = rotated.calc = calc
    np.testing.assert_allclose(shuffled.get_forces(), f0[perm], atol=1e-9)
    np.testing.assert_allclose(
        np.linalg.norm(rotated.get_forces(), axis=1), np.linalg.norm(f0, axis=1), atol=1e-9
    )
