"""The oracle reference sets of the active-learning benchmark: torsion definitions and a run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ase import Atoms
from ase.io import read

from benchmarks.active_learning import reference_sets as rs


def three_bpa() -> Atoms:
    """3BPA (3-(benzyloxy)pyridin-2-amine) embedded by RDKit, hydrogens included."""
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles("Nc1ncccc1OCc1ccccc1"))
    assert AllChem.EmbedMolecule(mol, randomSeed=7) == 0
    AllChem.MMFFOptimizeMolecule(mol)
    numbers = [a.GetAtomicNum() for a in mol.GetAtoms()]
    return Atoms(numbers, positions=mol.GetConformer().GetPositions())


def test_ring_atoms_of_a_chain_and_a_ring():
    assert rs.ring_atoms(4, [(0, 1), (1, 2), (2, 3)]) == set()
    assert rs.ring_atoms(5, [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4)]) == {0, 1, 2}


def test_central_torsions_follow_the_ether_bridge():
    atoms = three_bpa()
    torsions = rs.central_torsions(atoms)
    symbols = atoms.get_chemical_symbols()
    assert len(torsions) == 3
    ring_c, o, ch2, ring_c2 = torsions[1]
    assert [symbols[k] for k in torsions[1]] == ["C", "O", "C", "C"]
    assert torsions[0][1:] == (ring_c, o, ch2) and torsions[2][:3] == (o, ch2, ring_c2)
    assert (
        sum(
            symbols[n] == "H"
            for n in range(len(atoms))
            if (min(ch2, n), max(ch2, n)) in rs.bonds(atoms)
        )
        == 2
    )
    # turning about O-CH2 moves the benzyl group: CH2, six ring C, seven H
    side = rs.moving_side(atoms, torsions[1])
    assert sorted(symbols[k] for k in side) == ["C"] * 7 + ["H"] * 7


def test_setting_a_torsion_moves_only_its_side():
    atoms = three_bpa()
    torsion = rs.central_torsions(atoms)[1]
    side = rs.moving_side(atoms, torsion)
    moved = atoms.copy()
    moved.set_dihedral(*torsion, 100.0, indices=side)
    assert moved.get_dihedral(*torsion) == pytest.approx(100.0, abs=1e-6)
    fixed = [k for k in range(len(atoms)) if k not in side]
    assert np.allclose(moved.positions[fixed], atoms.positions[fixed])
    with pytest.raises(ValueError, match="in a ring"):
        ring = sorted(rs.ring_atoms(len(atoms), rs.bonds(atoms)))
        j, k = next((a, b) for a, b in rs.bonds(atoms) if a in ring and b in ring)
        rs.moving_side(atoms, (0, j, k, 0))


@pytest.mark.slow
def test_quick_sets_with_the_xtb_oracle(tmp_path, monkeypatch):
    """Two tiny sets from the real oracle; a second run finds them up to date."""
    pytest.importorskip("tblite")
    monkeypatch.setattr(rs, "start_geometry", lambda root: three_bpa())
    record = tmp_path / "record.json"
    args = [
        "--quick",
        "--out",
        str(tmp_path),
        "--sets",
        "md_300K,torsion_scan",
        "--record",
        str(record),
    ]
    rs.main(args)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert json.loads(record.read_text()) == manifest
    assert manifest["sets"]["md_300K"]["frames"] == 4
    assert manifest["sets"]["torsion_scan"]["frames"] == 3 * len(rs.SCAN_ANGLES)
    scan = read(tmp_path / "torsion_scan.xyz", ":")
    for frame in scan:
        angle = frame.get_dihedral(*frame.info["torsion_atoms"])
        assert abs((angle - frame.info["angle_deg"] + 180) % 360 - 180) < 0.5
        assert np.isfinite(frame.get_forces()).all()
    rs.main([*args, "--verify"])
    before = (tmp_path / "md_300K.xyz").stat().st_mtime_ns
    rs.main(args)
    assert (tmp_path / "md_300K.xyz").stat().st_mtime_ns == before
