"""Neighbour list against ASE, edge direction, and differentiable edge vectors (mlip_unc.geometry)."""

from __future__ import annotations

import ase
import ase.build
import numpy as np
import pytest
import torch
from ase.neighborlist import neighbor_list as ase_neighbor_list
from torch_geometric.data import Batch, Data

import mlip_unc.data
from mlip_unc.data import DataError, neighbour_list
from mlip_unc.geometry import batch_edge_vectors, edge_lengths, edge_vectors


def _triclinic() -> ase.Atoms:
    cell = np.array([[2.1, 0.0, 0.0], [0.7, 2.3, 0.0], [0.4, -0.5, 2.6]])
    frac = np.array([[0.0, 0.0, 0.0], [0.3, 0.6, 0.2], [0.7, 0.2, 0.9]])
    return ase.Atoms("H2O", scaled_positions=frac, cell=cell, pbc=True)


def _molecule() -> ase.Atoms:
    return ase.Atoms("H2", positions=[[0.0, 0.0, 0.0], [0.0, 0.3, 0.74]], pbc=False)


def _copper() -> ase.Atoms:
    return ase.build.bulk("Cu", "fcc", a=3.6, cubic=True) * (3, 3, 3)


def _slab() -> ase.Atoms:
    slab = ase.build.fcc111("Al", size=(2, 2, 3), vacuum=5.0)
    slab.rattle(0.05, seed=1)
    return slab  # pbc = (T, T, F)


def _unwrapped() -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True) * (2, 2, 2)
    atoms.positions += np.random.default_rng(0).uniform(-20.0, 20.0, size=(len(atoms), 3))
    return atoms  # positions far outside the cell


def _wire() -> ase.Atoms:
    positions = np.random.default_rng(1).uniform(0.0, 3.0, size=(3, 3))
    return ase.Atoms(
        "H3",
        positions=positions,
        cell=[[2.5, 0, 0], [0, 0, 0], [0, 0, 0]],
        pbc=[True, False, False],
    )


CASES = {
    "triclinic_r_max_larger_than_cell": (_triclinic, 5.0),
    "molecule": (_molecule, 3.0),
    "cu_fcc_108": (_copper, 4.0),
    "slab_mixed_pbc": (_slab, 4.5),
    "unwrapped_positions": (_unwrapped, 4.0),
    "wire_zero_vectors": (_wire, 6.0),
}


def _our_pairs(atoms: ase.Atoms, r_max: float) -> dict[tuple, float]:
    edge_index, shift = neighbour_list(atoms.positions, atoms.cell.array, atoms.pbc, r_max)
    j, i = edge_index
    vec = atoms.positions[j] - atoms.positions[i] + shift @ atoms.cell.array
    return {
        (a, b, *s): d
        for a, b, s, d in zip(i, j, shift.tolist(), np.linalg.norm(vec, axis=1), strict=False)
    }


def _ase_pairs(atoms: ase.Atoms, r_max: float) -> dict[tuple, float]:
    i, j, d, shift = ase_neighbor_list("ijdS", atoms, r_max)
    return {(a, b, *s): x for a, b, s, x in zip(i, j, shift.tolist(), d, strict=False)}


@pytest.mark.parametrize("name", list(CASES))
def test_pairs_and_distances_equal_ase(name: str) -> None:
    build, r_max = CASES[name]
    atoms = build()
    ours, ref = _our_pairs(atoms, r_max), _ase_pairs(atoms, r_max)
    assert len(ref) > 0
    assert set(ours) == set(ref)
    np.testing.assert_allclose([ours[k] for k in ref], list(ref.values()), atol=1e-6)


def test_small_cell_sees_own_images_but_not_itself() -> None:
    atoms = _triclinic()
    edge_index, shift = neighbour_list(atoms.positions, atoms.cell.array, atoms.pbc, 5.0)
    own = edge_index[0] == edge_index[1]
    assert own.any()  # images of the same atom
    assert np.all(np.any(shift[own] != 0, axis=1))  # never with a zero shift
    assert edge_index.dtype == np.int64 and shift.shape == (edge_index.shape[1], 3)


def test_edge_vectors_match_ase_direction() -> None:
    atoms = _triclinic()
    edge_index, shift = neighbour_list(atoms.positions, atoms.cell.array, atoms.pbc, 5.0)
    vec = edge_vectors(
        torch.tensor(atoms.positions),
        torch.tensor(edge_index),
        torch.tensor(shift),
        torch.tensor(atoms.cell.array),
    ).numpy()
    i, j, big_d, big_s = ase_neighbor_list("ijDS", atoms, 5.0)
    ref = {(a, b, *s): v for a, b, s, v in zip(i, j, big_s.tolist(), big_d, strict=False)}
    for (j_, i_), s, v in zip(edge_index.T, shift.tolist(), vec, strict=False):
        np.testing.assert_allclose(v, ref[(i_, j_, *s)], atol=1e-10)


def test_empty_and_single_atom() -> None:
    edge_index, shift = neighbour_list(np.zeros((1, 3)), np.zeros((3, 3)), [False] * 3, 3.0)
    assert edge_index.shape == (2, 0) and shift.shape == (0, 3)


@pytest.mark.parametrize(
    "positions, cell, pbc, r_max, match",
    [
        (np.zeros((2, 3)), np.zeros((3, 3)), [True] * 3, 3.0, "zero"),
        (np.zeros((2, 3)), [[3, 0, 0], [6, 0, 0], [0, 0, 3]], [True] * 3, 3.0, "zero volume"),
        ([[0, 0, 0], [np.nan, 0, 0]], np.eye(3), [False] * 3, 3.0, "NaN"),
        (np.zeros((2, 3)), np.eye(3), [False] * 3, -1.0, "r_max"),
    ],
)
def test_bad_inputs_raise(positions, cell, pbc, r_max, match) -> None:
    with pytest.raises(DataError, match=match):
        neighbour_list(np.asarray(positions, float), np.asarray(cell, float), pbc, r_max)


def _graph(atoms: ase.Atoms, r_max: float) -> Data:
    edge_index, shift = neighbour_list(atoms.positions, atoms.cell.array, atoms.pbc, r_max)
    return Data(
        pos=torch.tensor(atoms.positions),
        edge_index=torch.tensor(edge_index),
        cell_shift=torch.tensor(shift, dtype=torch.float64),
        cell=torch.tensor(atoms.cell.array).reshape(1, 3, 3),
        num_nodes=len(atoms),
    )


def test_gradients_flow_to_positions_and_cell() -> None:
    atoms = _triclinic()
    graph = _graph(atoms, 5.0)
    pos = graph.pos.clone().requires_grad_(True)
    cell = graph.cell.clone().requires_grad_(True)
    lengths = edge_lengths(pos, graph.edge_index, graph.cell_shift, cell)
    (lengths**2).sum().backward()
    assert pos.grad is not None and cell.grad is not None
    # L = sum_e |v_e|^2 with v_e = r_j - r_i + S_e @ cell: dL/dr_a = 2 sum_e v_e ([a = j] - [a = i])
    # and dL/dcell = 2 S^T V, from the same pairs in NumPy
    j, i = graph.edge_index.numpy()
    shift = graph.cell_shift.numpy()
    v = atoms.positions[j] - atoms.positions[i] + shift @ atoms.cell.array  # (n_edges, 3)
    d_pos = np.zeros_like(atoms.positions)
    np.add.at(d_pos, j, 2 * v)
    np.add.at(d_pos, i, -2 * v)
    assert np.abs(d_pos).max() > 1e-3 and np.abs(shift).max() > 0  # neither side is trivially 0
    np.testing.assert_allclose(pos.grad.numpy(), d_pos, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(cell.grad.numpy()[0], 2 * shift.T @ v, rtol=1e-10, atol=1e-10)


def test_finite_difference_gradients_float64() -> None:
    graph = _graph(_triclinic(), 3.0)

    def f(pos: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
        return edge_lengths(pos, graph.edge_index, graph.cell_shift, cell)

    inputs = (graph.pos.clone().requires_grad_(True), graph.cell.clone().requires_grad_(True))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def test_batched_edge_vectors_equal_single_graphs() -> None:
    graphs = [_graph(_triclinic(), 4.0), _graph(_copper(), 3.0), _graph(_molecule(), 3.0)]
    batch = Batch.from_data_list(graphs)
    vec = edge_vectors(batch.pos, batch.edge_index, batch.cell_shift, batch.cell, batch.batch)
    single = torch.cat([edge_vectors(g.pos, g.edge_index, g.cell_shift, g.cell) for g in graphs])
    torch.testing.assert_close(vec, single)


def test_batch_edge_vectors_periodic_and_without_cell() -> None:
    graphs = [_graph(_triclinic(), 4.0), _graph(_molecule(), 3.0)]
    batch = Batch.from_data_list(graphs)
    ref = edge_vectors(batch.pos, batch.edge_index, batch.cell_shift, batch.cell, batch.batch)
    torch.testing.assert_close(batch_edge_vectors(batch), ref, rtol=0.0, atol=0.0)
    bare = Data(pos=graphs[1].pos, edge_index=graphs[1].edge_index)  # no cell: non-periodic
    plain = bare.pos[bare.edge_index[0]] - bare.pos[bare.edge_index[1]]
    torch.testing.assert_close(batch_edge_vectors(bare), plain, rtol=0.0, atol=0.0)


def test_data_package_reexports_geometry() -> None:
    assert mlip_unc.data.edge_vectors is edge_vectors
    assert mlip_unc.data.edge_lengths is edge_lengths


def test_geometry_imports_only_keys_of_mlip_unc() -> None:
    import ast
    import inspect

    import mlip_unc.geometry

    tree = ast.parse(inspect.getsource(mlip_unc.geometry))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {
        f"{n.module}.{a.name}" if n.module == "mlip_unc" else str(n.module)
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    }
    assert {m for m in names if m.startswith("mlip_unc")} == {"mlip_unc.keys"}
