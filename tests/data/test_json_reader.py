"""JSON lists in mlearn's layout: structures, labels, the stress convention, bad entries.

The tiny JSON files are generated here from EMT-labelled copper cells, written the way mlearn
stores its data (pymatgen ``Structure.as_dict()``, total energy, forces, ``virial_stress`` in
kbar, VASP order xx yy zz xy yz zx, positive = compressive); reading them back must give
ASE's EMT stress. The real Si file is read by the ``data``-marked tests.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import ase
import ase.build
import ase.io
import numpy as np
import pytest
import torch
from ase.calculators.emt import EMT
from ase.stress import voigt_6_to_full_3x3_stress
from ase.units import GPa
from pymatgen.core import Molecule
from pymatgen.io.ase import AseAtomsAdaptor

from mlip_unc import keys
from mlip_unc.data import DataError, StructureDataset, frame_stress, read_structures
from mlip_unc.data.json_reader import RAW_STRESS_KEY

_VASP_ORDER = ((0, 0), (1, 1), (2, 2), (0, 1), (1, 2), (2, 0))  # xx yy zz xy yz zx


def _emt_cells() -> list[ase.Atoms]:
    """Three Cu cells: stretched, compressed and sheared (non-orthogonal), all rattled."""
    cells = []
    for k, (scale, shear) in enumerate([(1.03, 0.0), (0.97, 0.0), (1.0, 0.04)]):
        atoms = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True)
        deform = scale * np.eye(3)
        deform[0, 1] = deform[1, 2] = shear
        atoms.set_cell(atoms.cell.array @ deform, scale_atoms=True)
        atoms.rattle(0.05, seed=k)
        atoms.calc = EMT()
        cells.append(atoms)
    return cells


def _mlearn_entry(atoms: ase.Atoms, **extra) -> dict:
    """One entry as mlearn stores it: ASE stress (eV/A^3, tensile +) -> VASP kbar, order, sign."""
    stress = voigt_6_to_full_3x3_stress(atoms.get_stress())  # (3, 3) ASE convention
    kbar = -stress / (0.1 * GPa)  # VASP sign: positive = compressive
    return {
        "structure": AseAtomsAdaptor.get_structure(atoms).as_dict(),
        "outputs": {
            "energy": atoms.get_potential_energy(),
            "forces": atoms.get_forces().tolist(),
            "virial_stress": [kbar[a, b] for a, b in _VASP_ORDER],
        },
        "num_atoms": len(atoms),
        "group": "Elastic",
        "description": "EMT test cell",
        **extra,
    }


@pytest.fixture()
def emt_json(tmp_path: Path) -> tuple[Path, list[ase.Atoms]]:
    cells = _emt_cells()
    path = tmp_path / "training.json"
    path.write_text(json.dumps([_mlearn_entry(a) for a in cells]))
    return path, cells


# ---------------------------------------------------------------- ASE's convention itself
def test_ase_stress_is_strain_derivative_over_volume() -> None:
    """sigma_ij = (1/V) dE/d(eps_ij) with EMT (central differences of a symmetric strain), so a
    stretched cell has positive (tensile) stress: the convention everything converts to."""
    atoms = _emt_cells()[0]
    cell, volume, h = atoms.cell.array.copy(), atoms.get_volume(), 1e-5
    stress = voigt_6_to_full_3x3_stress(atoms.get_stress())
    numeric = np.zeros((3, 3))
    for i, j in [(0, 0), (1, 1), (2, 2), (0, 1), (1, 2), (0, 2)]:
        energies = []
        for sign in (1, -1):
            eps = np.eye(3)
            eps[i, j] += sign * h / (1 if i == j else 2)
            eps[j, i] = eps[i, j]
            strained = atoms.copy()
            strained.calc = EMT()
            strained.set_cell(cell @ eps, scale_atoms=True)
            energies.append(strained.get_potential_energy())
        numeric[i, j] = numeric[j, i] = (energies[0] - energies[1]) / (2 * h) / volume
    np.testing.assert_allclose(stress, numeric, atol=1e-7)
    assert stress[0, 0] > 0  # stretched by 3 %: tensile


# ---------------------------------------------------------------- round trip
def test_json_round_trip_equals_emt(emt_json) -> None:
    path, cells = emt_json
    frames = read_structures(path, stress_key="stress", require_stress=True)
    assert len(frames) == len(cells)
    for read, ref in zip(frames, cells, strict=False):
        np.testing.assert_allclose(read.cell.array, ref.cell.array, atol=1e-12)
        np.testing.assert_allclose(read.positions, ref.positions, atol=1e-10)
        assert read.pbc.all() and list(read.numbers) == list(ref.numbers)
        assert read.get_potential_energy() == pytest.approx(ref.get_potential_energy(), abs=1e-12)
        np.testing.assert_allclose(read.get_forces(), ref.get_forces(), atol=1e-12)
        np.testing.assert_allclose(read.get_stress(), ref.get_stress(), atol=1e-12)  # ASE Voigt
        expected = voigt_6_to_full_3x3_stress(ref.get_stress())
        np.testing.assert_allclose(frame_stress(read, "stress"), expected, atol=1e-12)
        # the raw kbar label, read through the same conversion, agrees
        np.testing.assert_allclose(frame_stress(read, RAW_STRESS_KEY), expected, atol=1e-12)
        assert read.info["group"] == "Elastic" and read.info["num_atoms"] == len(ref)
    sheared = voigt_6_to_full_3x3_stress(cells[2].get_stress())
    assert abs(sheared[0, 1]) > 1e-4 and abs(sheared[1, 2]) > 1e-4  # off-diagonals are exercised


def test_dataset_from_json_with_index(emt_json) -> None:
    path, cells = emt_json
    dataset = StructureDataset.from_files(path, 4.0, index="1:3", stress_key="stress")
    assert [g[keys.FRAME_INDEX].item() for g in dataset] == [1, 2]  # list indices
    for graph, ref in zip(dataset, cells[1:], strict=False):
        assert graph[keys.HAS_ENERGY].item() and graph[keys.HAS_FORCES].item()
        assert graph[keys.HAS_STRESS].item() and graph[keys.PBC].all()
        expected = torch.as_tensor(voigt_6_to_full_3x3_stress(ref.get_stress()))
        assert torch.allclose(graph[keys.STRESS][0], expected, atol=1e-12)


def test_molecule_dict_and_missing_outputs(tmp_path: Path) -> None:
    water = Molecule(["O", "H", "H"], [[0, 0, 0], [0, 0.76, 0.59], [0, -0.76, 0.59]])
    path = tmp_path / "mol.json"
    path.write_text(
        json.dumps(
            [
                {"structure": water.as_dict(), "outputs": {"energy": -14.2}},
                {"structure": water.as_dict()},
            ]
        )
    )
    frames = read_structures(path, require_forces=False, require_energy=False)
    assert not frames[0].pbc.any() and frames[0].get_chemical_formula() == "H2O"
    assert frames[0].get_potential_energy() == -14.2 and frames[1].calc is None
    with pytest.raises(DataError, match=r"mol.json', frame 1: no energy under key 'energy'"):
        read_structures(path, require_forces=False)


def test_ase_database_json_is_read_by_ase(tmp_path: Path) -> None:
    cells = _emt_cells()
    for atoms in cells:
        atoms.get_stress()
    path = tmp_path / "db.json"
    ase.io.write(path, cells, format="json")
    frames = read_structures(path, stress_key="stress", require_stress=True)
    assert len(frames) == 3
    np.testing.assert_allclose(frames[2].get_stress(), cells[2].get_stress())


# ---------------------------------------------------------------- bad input
def _broken(field: str) -> dict:
    entry = _mlearn_entry(_emt_cells()[0])
    if field == "no_structure":
        del entry["structure"]
    elif field == "forces_shape":
        entry["outputs"]["forces"] = entry["outputs"]["forces"][:-1]
    elif field == "element":
        entry["structure"]["sites"][2]["species"][0]["element"] = "Qq"
    elif field == "disordered":
        entry["structure"]["sites"][1]["species"] = [
            {"element": "Cu", "occu": 0.5},
            {"element": "Ni", "occu": 0.5},
        ]
    elif field == "num_atoms":
        entry["num_atoms"] = 5
    elif field == "stress_size":
        entry["outputs"]["virial_stress"] = [1.0, 2.0, 3.0, 4.0, 5.0]
    elif field == "energy_text":
        entry["outputs"]["energy"] = "-3.2 eV"
    elif field == "nan_forces":
        entry["outputs"]["forces"][0][1] = float("nan")
    elif field == "lattice":
        entry["structure"]["lattice"]["matrix"] = [[1.0, 0.0], [0.0, 1.0]]
    return entry


@pytest.mark.parametrize(
    "field, match",
    [
        ("no_structure", r"entry 1: no 'structure'; keys: \["),
        ("forces_shape", r"entry 1: outputs 'forces' must have shape \(4, 3\), got \(3, 3\)"),
        ("element", r"entry 1: site 2: unknown element 'Qq'"),
        ("disordered", r"entry 1: site 1 is disordered"),
        ("num_atoms", r"entry 1: 'num_atoms' is 5 but the structure has 4 sites"),
        ("stress_size", r"entry 1: outputs 'virial_stress' must have 6 \(or 9\) components, got 5"),
        ("energy_text", r"entry 1: outputs 'energy' must be one finite number"),
        ("nan_forces", r"entry 1: outputs 'forces' contains NaN or inf"),
        ("lattice", r"entry 1: lattice 'matrix' must have shape \(3, 3\)"),
    ],
)
def test_bad_entries_name_file_and_index(tmp_path: Path, field: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([_mlearn_entry(_emt_cells()[1]), _broken(field)]))
    with pytest.raises(DataError, match=re.escape(str(path)) + r"', " + match):
        read_structures(path)


@pytest.mark.parametrize(
    "text, match",
    [
        ('[{"structure": ', r"not valid JSON: .* at line 1, column"),
        ('{"energy": 1.0}', r"expected a JSON list of \{structure, outputs\} entries"),
        ("[]", r"the JSON list is empty"),
        ("[3]", r"entry 0: expected an object with 'structure' and 'outputs', got int"),
    ],
)
def test_bad_documents(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "doc.json"
    path.write_text(text)
    with pytest.raises(DataError, match=r"doc.json.*" + match):
        read_structures(path)


def test_unknown_element_outside_type_map_names_frame(emt_json) -> None:
    from mlip_unc.data import TypeMap

    path, _ = emt_json
    with pytest.raises(DataError, match=r"Cu \(Z=29\) in '.*training.json', frame 0"):
        StructureDataset.from_files(path, 4.0, TypeMap.from_list([28]))


# ---------------------------------------------------------------- the real mlearn file
def _work_matches_energy(frames: list[ase.Atoms]) -> None:
    """Along each strain series of mlearn's "Elastic" frames, the energy change equals the work
    integral of V sigma : d(strain) (trapezoid rule) with sigma converted from virial_stress:
    a wrong sign, unit or component order would break it (the shear modes test xy/yz/zx)."""
    ground = next(a for a in frames if a.info["description"] == "Ground state crystal")
    cell0 = ground.cell.array
    series: dict[int, list[tuple[float, ase.Atoms]]] = {}
    for atoms in frames:
        found = re.search(r"mode (\d+), strain (\S+)", atoms.info.get("description", ""))
        if atoms.info.get("group") == "Elastic" and found:
            series.setdefault(int(found[1]), []).append((float(found[2]), atoms))
    assert len(series) == 6  # 3 normal + 3 shear modes
    for mode, members in series.items():
        chain = [a for _, a in sorted([*members, (0.0, ground)], key=lambda m: m[0])]
        work, start = 0.0, chain[0].get_potential_energy()
        for prev, cur in itertools.pairwise(chain):
            deform = [
                np.linalg.solve(cell0, a.cell.array).T for a in (prev, cur)
            ]  # cell = cell0 F^T
            d_def, mid = deform[1] - deform[0], 0.5 * (deform[0] + deform[1])
            power = [
                a.get_volume() * np.sum(frame_stress(a, "stress") * (d_def @ np.linalg.inv(mid)))
                for a in (prev, cur)
            ]
            work += 0.5 * (power[0] + power[1])
            change = cur.get_potential_energy() - start  # eV, up to ~17 along the shear modes
            assert work == pytest.approx(change, rel=0.02, abs=0.05), f"mode {mode}"


@pytest.mark.data
def test_mlearn_si_json_reads_like_its_extxyz_conversion(data_root: Path) -> None:
    folder = data_root / "structures/mlearn/Si"
    frames = read_structures(folder / "training.json", stress_key="stress", require_stress=True)
    converted = read_structures(folder / "training.extxyz", stress_key="virial_stress_kbar")
    assert len(frames) == len(converted) == 214
    for atoms, other in zip(frames, converted, strict=False):
        assert set(atoms.numbers) == {14} and atoms.pbc.all()
        np.testing.assert_allclose(atoms.positions, other.positions, atol=1e-6)
        assert atoms.get_potential_energy() == pytest.approx(other.get_potential_energy(), abs=1e-8)
        np.testing.assert_allclose(
            frame_stress(atoms, "stress"), frame_stress(other, "virial_stress_kbar")
        )
    _work_matches_energy(frames)
