"""benchmarks/force_uncertainty_size.py (the suite's ``--part size``): boxes of independent
molecules, the row columns, the acceptance, a --quick run end to end (EMT Cu, seconds) and the
shape of the suite's page (tables first, peer sections on their own pages)."""

import json
import shutil

import numpy as np
import pytest
from ase import Atoms

from benchmarks import force_uncertainty as fu
from benchmarks import force_uncertainty_size as size
from benchmarks.common import force_frames as ff


def _molecule(k: int) -> Atoms:
    rng = np.random.default_rng(k)
    return Atoms("CH3", positions=rng.normal(scale=0.8, size=(4, 3)))


def test_box_keeps_molecules_apart_and_whole():
    mols = [_molecule(k) for k in range(8)]
    step = size.spacing(mols, r_max=5.0)
    atoms = size.box(mols, step)
    assert len(atoms) == 32 and atoms.pbc.all()
    assert np.allclose(atoms.cell.lengths(), 2 * step)
    d = atoms.get_all_distances(mic=True)  # (32, 32), periodic images included
    mol = np.repeat(np.arange(8), 4)
    other = mol[:, None] != mol[None, :]
    assert d[other].min() >= 5.0 + size.SPACING_MARGIN - 1e-9  # no graph edge between molecules
    for k, m in enumerate(mols):  # each molecule's own geometry kept
        inside = atoms.positions[4 * k : 4 * k + 4]
        assert np.allclose(inside - inside.mean(0), m.positions - m.positions.mean(0))


def test_row_values_known_cases():
    rng = np.random.default_rng(0)
    true = rng.normal(size=(12, 3))
    err = np.repeat(np.arange(1.0, 13.0)[:, None], 3, axis=1) / 10  # |dF| grows with the atom
    var = (err / 2) ** 2  # sigma ranks every atom's error exactly; std/RMSE = 1/2
    molecule = np.repeat(np.arange(4), 3)
    out = size.row_values(true + err, true, var, var + 0.75 * err**2, molecule, 50, 0)
    assert out["spearman_atom"] == pytest.approx(1.0)
    assert out["spearman_molecule"] == pytest.approx(1.0)
    assert out["spearman_atom_std"] == pytest.approx(0.0, abs=1e-12)
    assert out["std_over_rmse"] == pytest.approx(0.5)
    assert out["total_std_over_rmse"] == pytest.approx(1.0)
    assert out["force_mae_meV_A"] == pytest.approx(1e3 * err.mean())
    crystal = size.row_values(true + err, true, var[::-1], var, None, 50, 0)
    assert crystal["spearman_atom"] == pytest.approx(-1.0) and crystal["spearman_molecule"] is None
    with pytest.raises(ValueError):  # molecules of different sizes cannot be resampled whole
        size.bootstrap_std(err[:, 0], err[:, 0], np.array([0] * 5 + [1] * 7), 10, 0)


def test_acceptance_gap_and_range():
    def row(name, rho, ratio):
        return {
            "block": "b",
            "set": "s",
            "atoms_per_box": 9,
            "temperature_K": None,
            "row": name,
            "spearman_atom": rho,
            "std_over_rmse": ratio,
        }

    (a,) = size.acceptance([row("md_default", 0.50, 0.60), row("lowrank", 0.53, 0.60)])
    assert a["spearman_gap"] == pytest.approx(0.03) and not a["spearman_met"]
    assert a["std_missed_by"] == pytest.approx(0.07) and not a["std_met"]
    (b,) = size.acceptance([row("md_default", 0.50, 1.2), row("lowrank", 0.51, 1.2)])
    assert b["spearman_met"] and b["std_met"] and b["std_missed_by"] == 0.0


def test_quick_run_rows_and_resume(tmp_path):
    argv = ["--quick", "--out", str(tmp_path), "--set", "train.epochs=2"]
    results = fu.main(["--part", "size", *argv, "--cells-cache", str(tmp_path / "cells")])
    rows = results["rows"]
    blocks = {r["block"] for r in rows}
    assert blocks == {
        "cu_clusters:8x2",
        "cu_clusters:27x1",
        "cu_crystal:1x2:300K",
        "cu_crystal:2x2:300K",
    }
    assert len(rows) == 2 * len(size.ROWS) + 2 * len(size.CRYSTAL_ROWS)
    by = {(r["block"], r["row"]): r for r in rows}
    for block in blocks:
        md, low = by[(block, "md_default")], by[(block, "lowrank")]
        assert md["ran"] == ["lowrank (on demand)"] and md["calculator_mode"] == "auto"
        for key in ("spearman_atom", "std_over_rmse", "force_mae_meV_A"):
            assert md[key] == pytest.approx(low[key], rel=1e-6, abs=1e-9)  # the same numbers
    big, small = by[("cu_clusters:27x1", "auto")], by[("cu_clusters:8x2", "auto")]
    assert big["ran"] == ["sketch (one pass)"] and small["ran"] == ["lowrank (one pass)"]
    assert big["spearman_atom"] == pytest.approx(
        by[("cu_clusters:27x1", "sketch")]["spearman_atom"]
    )
    alone = by[
        ("cu_clusters:27x1", "one_at_a_time")
    ]  # independent molecules: the box changes nothing
    assert alone["molecules"] == 27 and alone["atoms"] == big["atoms"] == 108
    assert alone["spearman_atom"] == pytest.approx(
        by[("cu_clusters:27x1", "lowrank")]["spearman_atom"]
    )
    assert all(np.isfinite(r["spearman_atom"]) and r["std_over_rmse"] > 0 for r in rows)
    assert {a["block"] for a in results["acceptance"]} == blocks
    assert set(results["meta"]["cells"]) == {"cu_crystal:1x2:300K", "cu_crystal:2x2:300K"}
    page = (tmp_path / "force_uncertainty.md").read_text().splitlines()
    assert any(line.startswith("| set |") for line in page[:15])
    # resumable: every step is on file, nothing is made again
    steps = (tmp_path / size.JSONL).read_text()
    again = size.main([*argv, "--cells-cache", str(tmp_path / "cells")])
    assert (tmp_path / size.JSONL).read_text() == steps and again["rows"] == rows


def test_suite_page_shape_and_peer_pages(tmp_path):
    """The committed JSON rewritten: tables first, <= 150 lines, every peer section moved to its
    own page (the newer one on the page wins) and linked."""
    shutil.copy(ff.RESULTS / "force_uncertainty.json", tmp_path)
    begin, end = "<!-- peers/demo: begin (test) -->", "<!-- peers/demo: end -->"
    page = tmp_path / "force_uncertainty.md"
    page.write_text(f"# old\n\n{begin}\n## Demo peer\n\n| a |\n|---|\n| 1 |\n{end}\n")
    fu.main(["--report-only", "--out", str(tmp_path)])
    lines = page.read_text().splitlines()
    assert len(lines) <= 150 and any(line.startswith("| set | row |") for line in lines[:15])
    assert begin not in page.read_text() and "[Demo peer](force_uncertainty_demo.md)" in lines[2]
    side = tmp_path / "force_uncertainty_demo.md"
    assert f"{begin}\n## Demo peer\n\n| a |\n|---|\n| 1 |\n{end}" in side.read_text()
    fu.main(["--report-only", "--out", str(tmp_path)])  # again: the peer page stays
    assert "[Demo peer](force_uncertainty_demo.md)" in page.read_text().splitlines()[2]
    page.write_text(page.read_text() + f"\n{begin}\n## Demo peer\n\n| a |\n|---|\n| 2 |\n{end}\n")
    fu.main(["--report-only", "--out", str(tmp_path)])
    assert "| 2 |" in side.read_text() and "| 1 |" not in side.read_text()
    results = json.loads((tmp_path / "force_uncertainty.json").read_text())
    text = page.read_text()
    for name in (n for n in results if n != "meta"):  # every row of the JSON on the page
        for row in (r for r in results[name] if r != "default"):
            assert f"| {name} | {row}" in text
