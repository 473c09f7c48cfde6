"""Density proxies and structural calibration (docs/method.md section 7)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mlip_unc.uncertainty import density as den


def test_latent_knn_distance_zero_on_training_point_and_grows() -> None:
    g = torch.Generator().manual_seed(0)
    z_train = torch.randn(50, 4, generator=g)
    query = torch.cat([z_train[7:8], z_train[7:8] + 10.0])
    d = den.latent_knn_distance(query, z_train, k=1)
    assert d.shape == (2,) and isinstance(d, np.ndarray)
    assert d[0] == pytest.approx(0.0, abs=1e-5)
    assert d[1] > 5.0
    d10 = den.latent_knn_distance(query, z_train, k=10)
    assert d10[1] > d10[0] > 0.0


def test_latent_knn_chunking_and_standardisation() -> None:
    rng = np.random.default_rng(1)
    z_train, z_query = rng.normal(size=(40, 3)), rng.normal(size=(9, 3))
    full = den.latent_knn_distance(z_query, z_train, k=5)
    chunked = den.latent_knn_distance(z_query, z_train, k=5, chunk_size=2)
    np.testing.assert_allclose(chunked, full)
    scale = np.array([1.0, 100.0, 0.01])  # per-coordinate units do not matter after standardising
    np.testing.assert_allclose(
        den.latent_knn_distance(z_query * scale, z_train * scale, k=5), full, rtol=1e-10
    )
    with pytest.raises(ValueError):
        den.latent_knn_distance(z_query, z_train, k=41)


def test_atom_latent_knn_distance_per_element() -> None:
    rng = np.random.default_rng(2)
    z_train = np.r_[
        rng.normal(size=(30, 3)), rng.normal(size=(4, 3)) + 50.0
    ]  # element 0, then element 1
    t_train = np.r_[np.zeros(30, int), np.ones(4, int)]
    z_query, t_query = (
        np.r_[z_train[3:4], z_train[31:32], rng.normal(size=(2, 3))],
        np.array([0, 1, 1, 2]),
    )
    d = den.atom_latent_knn_distance(
        z_query, t_query, z_train, t_train, k=10
    )  # k capped at 4 for element 1
    ref0 = den.latent_knn_distance(z_query[:1], z_train[:30], k=10)
    ref1 = den.latent_knn_distance(
        z_query[1:3], z_train[30:], k=4
    )  # element 1 standardised on its own atoms
    np.testing.assert_allclose(d[:3], np.r_[ref0, ref1])
    assert d[3] == math.inf  # element 2 never seen in training
    with pytest.raises(ValueError, match="one type per latent"):
        den.atom_latent_knn_distance(z_query, t_query[:3], z_train, t_train)


def test_tanimoto_max_similarity() -> None:
    train = ["CCO", "c1ccccc1", "CC(=O)O"]
    sim = den.tanimoto_max_similarity(["OCC", "CCCCCCCCCC", "not a smiles"], train)
    assert sim[0] == pytest.approx(1.0)  # same molecule as CCO
    assert 0.0 <= sim[1] < 1.0
    assert math.isnan(sim[2])
    with pytest.raises(ValueError):
        den.tanimoto_max_similarity(["CCO"], ["C1CC"])


def test_structure_descriptor_molecule_and_periodic() -> None:
    from ase import Atoms

    dimer = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 1.5]])
    desc = den.structure_descriptor([dimer, torch.as_tensor(dimer)], n_bins=6, r_max=6.0)
    assert desc.shape == (2, 6)
    np.testing.assert_allclose(desc[0], [0, 1, 0, 0, 0, 0])  # one neighbour per atom at 1.5
    np.testing.assert_allclose(desc[1], desc[0])
    cubic = Atoms("Ar", positions=[[0, 0, 0]], cell=np.eye(3) * 3.0, pbc=True)
    d_cubic = den.structure_descriptor([cubic], n_bins=7, r_max=3.5)
    assert d_cubic[0, 6] == pytest.approx(6.0)  # 6 neighbours at 3.0 A in [3.0, 3.5)
    assert d_cubic[0, :6].sum() == 0.0
    knn = den.descriptor_knn_distance(desc[:1], desc, k=1)
    assert knn[0] == pytest.approx(0.0)


def test_structure_descriptor_smeared_and_empty() -> None:
    from ase import Atoms

    dimer = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 1.5]])
    smeared = den.structure_descriptor(
        [dimer, Atoms(), dimer[:1]], n_bins=5, r_max=4.0, smearing=0.5
    )
    centres = np.linspace(0.0, 4.0, 5)
    np.testing.assert_allclose(
        smeared[0], np.exp(-0.5 * ((1.5 - centres) / 0.5) ** 2)
    )  # 2 pairs / 2 atoms
    np.testing.assert_allclose(smeared[1:], 0.0)  # empty structure, single atom
    periodic = Atoms("Ar", positions=[[0, 0, 0]], cell=np.eye(3) * 3.0, pbc=True)
    np.testing.assert_allclose(
        den.structure_descriptor([periodic], n_bins=5, r_max=4.0, smearing=0.5)[0],
        6.0 * np.exp(-0.5 * ((3.0 - centres) / 0.5) ** 2),
    )
    with pytest.raises(ValueError, match="smearing"):
        den.structure_descriptor([dimer], smearing=0.0)


def test_structural_calibration() -> None:
    proxy = np.array([0.1, 0.5, 0.3, 2.0, np.nan])
    assert den.structural_calibration(proxy * 3 + 1, proxy) == pytest.approx(1.0)
    assert den.structural_calibration(-proxy, proxy) == pytest.approx(-1.0)


def test_prepared_references_match_the_one_shot_functions() -> None:
    gen = torch.Generator().manual_seed(0)
    z_train, z = torch.randn(60, 5, generator=gen), torch.randn(9, 5, generator=gen)
    t_train, t = (
        np.repeat([0, 1, 2], 20),
        np.array([0, 1, 2, 0, 1, 2, 0, 1, 3]),
    )  # type 3 never seen
    ref = den.AtomLatentReference(z_train, t_train, k=4)
    got = ref.distances(z, t)
    want = den.atom_latent_knn_distance(z, t, z_train, t_train, k=4)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.isinf(got[-1])
    np.testing.assert_allclose(
        ref.distances(z[:3], t[:3]), got[:3], rtol=1e-12
    )  # the reference is reused unchanged
    np.testing.assert_allclose(
        den.LatentReference(z_train, k=3).distances(z), den.latent_knn_distance(z, z_train, k=3)
    )
