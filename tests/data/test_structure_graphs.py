"""Structures -> graphs: type map, labels and their conventions, file reading, bad input."""

from __future__ import annotations

import warnings
from pathlib import Path

import ase
import ase.build
import ase.io
import numpy as np
import pytest
import torch
from ase.calculators.singlepoint import SinglePointCalculator
from ase.units import GPa
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.data import (
    DataError,
    StructureDataset,
    TypeMap,
    atoms_to_graph,
    fit_reference_energies,
    frame_stress,
    read_structures,
)
from mlip_unc.data.references import is_isolated_atom

TYPE_MAP = TypeMap.from_list([1, 6, 8])


# ---------------------------------------------------------------- type map
def test_type_map_sorted_and_round_trip(molecules) -> None:
    type_map = TypeMap.from_atoms_list(molecules)
    assert type_map.to_list() == [1, 6, 8] and type_map.symbols == ["H", "C", "O"]
    assert TypeMap.from_list(type_map.to_list()) == type_map
    assert type_map.index(6) == 1
    np.testing.assert_array_equal(type_map.indices(np.array([8, 1, 6])), [2, 0, 1])


def test_type_map_unknown_element_names_symbol_and_frame() -> None:
    with pytest.raises(ValueError, match=r"Cl \(Z=17\) in 'x.xyz', frame 4"):
        TYPE_MAP.index(17, context="'x.xyz', frame 4")


# ---------------------------------------------------------------- graph fields
def test_molecule_graph_fields(molecules) -> None:
    atoms = molecules[0]
    graph = atoms_to_graph(atoms, 3.0, TYPE_MAP, frame_index=7)
    n = len(atoms)
    assert graph[keys.POSITIONS].shape == (n, 3) and graph[keys.POSITIONS].dtype == torch.float64
    assert graph[keys.ATOM_TYPE].tolist() == [1, 0, 0, 0, 0]
    assert graph[keys.CELL].shape == (1, 3, 3) and torch.all(graph[keys.CELL] == 0)
    assert graph[keys.PBC].shape == (1, 3) and not graph[keys.PBC].any()
    assert graph[keys.CELL_SHIFT].dtype == torch.float64
    assert graph[keys.CELL_SHIFT].shape == (graph[keys.EDGE_INDEX].shape[1], 3)
    assert graph[keys.FRAME_INDEX].tolist() == [7] and graph[keys.NUM_ATOMS].tolist() == [n]
    assert graph[keys.ENERGY].shape == (1,)
    assert graph[keys.ENERGY].item() == pytest.approx(atoms.get_potential_energy())
    np.testing.assert_allclose(graph[keys.FORCES].numpy(), atoms.get_forces())
    assert graph[keys.HAS_ENERGY].item() and graph[keys.HAS_FORCES].item()
    assert not graph[keys.HAS_STRESS].item() and torch.all(graph[keys.STRESS] == 0)


def test_graph_does_not_alias_atoms(molecules) -> None:
    atoms = molecules[0]
    graph = atoms_to_graph(atoms, 3.0, TYPE_MAP)
    before = graph[keys.POSITIONS].clone()
    atoms.positions += 1.0
    atoms.numbers[0] = 8
    assert torch.equal(graph[keys.POSITIONS], before) and graph[keys.ATOMIC_NUMBERS][0] == 6


def test_periodic_graph_float32_and_stress_from_calculator() -> None:
    atoms = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True)
    voigt = np.array([0.1, 0.2, 0.3, 0.04, 0.05, 0.06])
    atoms.calc = SinglePointCalculator(atoms, energy=-1.0, stress=voigt)
    graph = atoms_to_graph(atoms, 3.0, TypeMap.from_list([29]), dtype=torch.float32)
    assert graph[keys.POSITIONS].dtype == torch.float32
    assert graph[keys.CELL_SHIFT].dtype == torch.float32
    assert graph[keys.PBC].all() and graph[keys.HAS_STRESS].item()
    assert not graph[keys.HAS_FORCES].item() and torch.all(graph[keys.FORCES] == 0)
    expected = np.array([[0.1, 0.06, 0.05], [0.06, 0.2, 0.04], [0.05, 0.04, 0.3]])
    np.testing.assert_allclose(graph[keys.STRESS][0].numpy(), expected, rtol=1e-6)


def test_batch_of_graphs_has_contract_shapes(molecules) -> None:
    batch = Batch.from_data_list([atoms_to_graph(a, 3.0, TYPE_MAP) for a in molecules[:3]])
    assert batch[keys.CELL].shape == (3, 3, 3) and batch[keys.PBC].shape == (3, 3)
    assert batch[keys.ENERGY].shape == (3,) and batch[keys.NUM_ATOMS].shape == (3,)
    assert batch[keys.STRESS].shape == (3, 3, 3) and batch[keys.HAS_ENERGY].shape == (3,)


# ---------------------------------------------------------------- stress conventions
def _with_info(**info) -> ase.Atoms:
    atoms = ase.Atoms("H", positions=[[0, 0, 0]], cell=np.diag([2.0, 3.0, 4.0]), pbc=True)
    atoms.info.update(info)
    return atoms


def test_virial_to_stress() -> None:
    virial = np.array([[1.0, 0.2, 0.3], [0.2, 2.0, 0.4], [0.3, 0.4, 3.0]])
    atoms = _with_info(virial=virial, REF_virial=virial.reshape(-1))
    np.testing.assert_allclose(frame_stress(atoms, "virial"), -virial / 24.0)
    np.testing.assert_allclose(frame_stress(atoms, "REF_virial"), -virial / 24.0)


def test_voigt_and_full_stress_agree() -> None:
    atoms = _with_info(s6=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], s9=[1, 6, 5, 6, 2, 4, 5, 4, 3])
    np.testing.assert_allclose(frame_stress(atoms, "s6"), frame_stress(atoms, "s9"))


def test_vasp_kbar_order_and_sign() -> None:
    # VASP order xx yy zz xy yz zx, positive = compressive -> ASE stress = -0.1 GPa * value.
    atoms = _with_info(virial_stress_kbar=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    expected = -0.1 * GPa * np.array([[1.0, 4.0, 6.0], [4.0, 2.0, 5.0], [6.0, 5.0, 3.0]])
    np.testing.assert_allclose(frame_stress(atoms, "virial_stress_kbar"), expected)


# ---------------------------------------------------------------- files
def test_custom_keys_round_trip_extxyz(tmp_path: Path, molecules) -> None:
    written = []
    for k, atoms in enumerate(molecules):
        copy = ase.Atoms(atoms.numbers, atoms.positions)
        copy.info["energy_xtb"] = -float(k)
        copy.arrays["forces_xtb"] = np.full((len(atoms), 3), 0.1 * k)
        written.append(copy)
    path = tmp_path / "xtb.xyz"
    ase.io.write(path, written, format="extxyz")
    labels = {"energy_key": "energy_xtb", "forces_key": "forces_xtb"}
    dataset = StructureDataset.from_files(path, 3.0, **labels)
    assert len(dataset) == len(molecules) and dataset.type_map == TYPE_MAP
    for k, graph in enumerate(dataset):
        assert graph[keys.ENERGY].item() == -k and graph[keys.FRAME_INDEX].item() == k
        assert torch.allclose(graph[keys.FORCES], torch.full_like(graph[keys.FORCES], 0.1 * k))
    part = StructureDataset.from_files(path, 3.0, TYPE_MAP, index="2:4", **labels)
    assert [g[keys.FRAME_INDEX].item() for g in part] == [2, 3]


def test_default_keys_from_calculator(tmp_path: Path, molecules) -> None:
    path = tmp_path / "dft.extxyz"
    ase.io.write(path, molecules, format="extxyz")
    atoms_list = read_structures(path)
    assert len(atoms_list) == len(molecules)
    np.testing.assert_allclose(atoms_list[2].get_forces(), molecules[2].get_forces())


def test_cif_and_poscar_via_pymatgen(tmp_path: Path) -> None:
    atoms = ase.build.bulk("Si", "diamond", a=5.43)
    ase.io.write(tmp_path / "si.cif", atoms, format="cif")
    ase.io.write(tmp_path / "POSCAR", atoms, format="vasp")
    for name in ("si.cif", "POSCAR"):
        (read,) = read_structures(tmp_path / name, require_energy=False, require_forces=False)
        assert read.get_chemical_formula() == "Si2" and read.pbc.all()
        assert read.get_volume() == pytest.approx(atoms.get_volume(), rel=1e-6)


XYZ_HEADER = 'Properties=species:S:1:pos:R:3:forces:R:3 energy=-1.0 pbc="F F F"'
GOOD_FRAME = f"2\n{XYZ_HEADER}\nH 0 0 0 0 0 0\nH 0 0 0.74 0 0 0\n"


@pytest.mark.parametrize(
    "bad_frame, kwargs, match",
    [
        (
            f"2\n{XYZ_HEADER}\nH 0 0 0 0 0 0\nCl 0 0 2 0 0 0\n",
            {"type_map": TypeMap.from_list([1])},
            r"Cl \(Z=17\) in '.*bad.xyz', frame 1",
        ),
        (f"0\n{XYZ_HEADER}\n", {}, r"'.*bad.xyz', frame 1: empty structure"),
        (f"2\n{XYZ_HEADER}\nH 0 0 nan 0 0 0\nH 0 0 0.74 0 0 0\n", {}, r"frame 1: NaN or inf"),
        (GOOD_FRAME.replace(" energy=-1.0", ""), {}, r"frame 1: no energy under key 'energy'"),
        (
            GOOD_FRAME,
            {"energy_key": "energy_xtb"},
            r"frame 0: no energy under key 'energy_xtb'.*"
            r"calculator results \['energy', 'forces'\]",
        ),
        (
            GOOD_FRAME.replace(":forces:R:3", "").replace(" 0 0 0\n", "\n"),
            {},
            r"frame 1: no forces under key 'forces'",
        ),
        (
            GOOD_FRAME.replace('pbc="F F F"', 'Lattice="3 0 0 6 0 0 0 0 3" pbc="T T T"'),
            {},
            r"frame 1: periodic cell has zero volume",
        ),
    ],
    ids=["element", "empty", "nan", "no_energy", "custom_key_missing", "no_forces", "zero_volume"],
)
def test_bad_files_raise_naming_the_culprit(tmp_path: Path, bad_frame, kwargs, match) -> None:
    path = tmp_path / "bad.xyz"
    if "energy_xtb" in str(kwargs):
        path.write_text(bad_frame)
    else:
        path.write_text(GOOD_FRAME + bad_frame)
    with pytest.raises(DataError, match=match):
        StructureDataset.from_files(path, 3.0, **kwargs)


def test_missing_file_and_parse_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        read_structures(tmp_path / "absent.xyz")
    (tmp_path / "garbage.xyz").write_text("3\nnot an extxyz header\nH 0 0\n")
    with pytest.raises(DataError, match="garbage.xyz"):
        read_structures(tmp_path / "garbage.xyz")


def test_optional_labels_flagged_absent(tmp_path: Path) -> None:
    path = tmp_path / "nolabels.xyz"
    path.write_text(
        GOOD_FRAME.replace(" energy=-1.0", "").replace(":forces:R:3", "").replace(" 0 0 0\n", "\n")
    )
    dataset = StructureDataset.from_files(path, 3.0, require_energy=False, require_forces=False)
    assert not dataset[0][keys.HAS_ENERGY].item() and not dataset[0][keys.HAS_FORCES].item()


# ---------------------------------------------------------------- reference energies
def test_reference_energies_least_squares(molecules, element_energies) -> None:
    fitted = fit_reference_energies(molecules)
    assert set(fitted) == set(element_energies)
    for z, e in element_energies.items():
        assert fitted[z] == pytest.approx(e, abs=1e-6)


def test_reference_energies_prefer_isolated_atoms(molecules) -> None:
    isolated = {1: -13.0, 8: -2000.0}  # deliberately not the generating E0
    hydrogen = ase.Atoms("H", positions=[[1.0, 2.0, 3.0]])  # single-atom frame
    hydrogen.calc = SinglePointCalculator(hydrogen, energy=isolated[1])
    oxygen = ase.Atoms("O", info={"config_type": "IsolatedAtom", "energy": isolated[8]})
    fitted = fit_reference_energies(molecules + [hydrogen, oxygen])
    assert fitted[1] == isolated[1] and fitted[8] == isolated[8]
    # carbon: least squares, per atom, of what remains after removing the isolated H and O energies
    rows = [a for a in molecules if 6 in a.numbers]
    n = np.array([len(a) for a in rows], dtype=float)
    counts = np.array([[np.sum(a.numbers == 6)] for a in rows], dtype=float)
    rest = np.array(
        [a.get_potential_energy() - sum(isolated[z] for z in a.numbers if z != 6) for a in rows]
    )
    assert fitted[6] == pytest.approx(
        np.linalg.lstsq(counts / n[:, None], rest / n, rcond=None)[0][0]
    )


def test_reference_energy_of_elemental_periodic_set_is_mean_per_atom_energy() -> None:
    """Every frame one element (as mlearn's Si): E0 = the mean per-atom energy, whatever the
    cell sizes, with no rank warning; a one-atom bulk cell is a crystal, not an isolated atom."""
    frames = []
    for k, reps in enumerate([(1, 1, 1), (2, 1, 1), (2, 2, 2), (3, 2, 1)]):
        atoms = ase.build.bulk("Si", "diamond", a=5.43).repeat(reps)
        atoms.calc = SinglePointCalculator(atoms, energy=len(atoms) * (-5.4 + 0.01 * k))
        frames.append(atoms)
    primitive = ase.build.bulk("Cu", "fcc", a=3.6)  # one atom, periodic
    primitive.calc = SinglePointCalculator(primitive, energy=-3.7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted = fit_reference_energies(frames + [primitive])
    expected = np.mean([a.get_potential_energy() / len(a) for a in frames])
    assert fitted[14] == pytest.approx(expected, abs=1e-12) and fitted[29] == pytest.approx(-3.7)
    assert not is_isolated_atom(primitive)
    in_vacuum = ase.Atoms("Cu", cell=np.eye(3) * 20.0, pbc=True)  # periodic box, no near image
    assert is_isolated_atom(in_vacuum) and is_isolated_atom(ase.Atoms("Cu"))


def test_reference_energies_rank_deficient_warns(molecules) -> None:
    same = [molecules[1]] * 3  # one composition (H2O): H and O not identifiable
    with pytest.warns(UserWarning, match="not identifiable"):
        fitted = fit_reference_energies(same)
    assert 2 * fitted[1] + fitted[8] == pytest.approx(molecules[1].get_potential_energy())


# ---------------------------------------------------------------- shared data
@pytest.mark.data
def test_3bpa_train_loads(data_root: Path) -> None:
    path = data_root / "structures/3BPA/train_300K.xyz"
    dataset = StructureDataset.from_files(path, 5.0)
    assert len(dataset) == 500 and dataset.type_map.symbols == ["H", "C", "N", "O"]
    energies = torch.cat([g[keys.ENERGY] for g in dataset])
    assert all(g[keys.HAS_ENERGY].item() and g[keys.HAS_FORCES].item() for g in dataset)
    frames = ase.io.read(path, ":")  # the labels as ASE reads them, frame by frame
    expected = [a.get_potential_energy() for a in frames]
    np.testing.assert_allclose(energies.double().numpy(), expected, rtol=1e-12)
    for graph, atoms in zip(dataset, frames, strict=True):
        np.testing.assert_allclose(graph[keys.FORCES].double().numpy(), atoms.get_forces())


@pytest.mark.data
def test_solvent_xtb_custom_keys_and_isolated_atoms(data_root: Path) -> None:
    path = data_root / "structures/solvent_xtb/solvent_xtb_train_20.xyz"
    atoms_list = read_structures(path, energy_key="energy_xtb", forces_key="forces_xtb")
    fitted = fit_reference_energies(atoms_list, energy_key="energy_xtb")
    isolated = {int(a.numbers[0]): a.info["energy_xtb"] for a in atoms_list if len(a) == 1}
    assert fitted == isolated and len(fitted) == 3


@pytest.mark.data
def test_mlearn_kbar_stress_sign(data_root: Path) -> None:
    path = data_root / "structures/mlearn/Si/training.extxyz"
    atoms_list = read_structures(path, stress_key="virial_stress_kbar", require_stress=True)
    stretched = next(a for a in atoms_list if "mode 0, strain 0.02" in a.info["description"])
    stress = frame_stress(stretched, "virial_stress_kbar")
    assert stress[0, 0] > 0  # stretched along x: tensile, positive in ASE's convention


def test_frame_ids_survive_batching():
    """PyG offsets fields named like "*index*" when batching; ours must not be."""
    from torch_geometric.data import Batch

    atoms = ase.Atoms("H2", positions=[[0, 0, 0], [0, 0, 0.7]])
    graphs = [atoms_to_graph(atoms, 3.0, TYPE_MAP, frame_index=k) for k in (5, 9)]
    assert Batch.from_data_list(graphs)[keys.FRAME_INDEX].tolist() == [5, 9]
