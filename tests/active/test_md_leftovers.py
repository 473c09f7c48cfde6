"""``run_md`` refused before its first frame (an element the model never saw) leaves no run
behind: no empty ``md.traj`` that a later command would take for an MD run."""

from __future__ import annotations

import csv

import pytest
from ase.build import bulk
from typer.testing import CliRunner

from mlip_unc.active.monitor import run_md
from mlip_unc.calculator import UncertaintyCalculator
from mlip_unc.cli import app
from mlip_unc.config import MDSettings
from mlip_unc.data.errors import DataError

SETTINGS = MDSettings(ensemble="nve", temperature=300, steps=4, timestep=1.0, interval=2)


def _nickel_cell():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms[0].symbol = "Ni"  # the tiny checkpoint knows Cu only
    return atoms


def test_refused_first_frame_leaves_no_files(tiny_checkpoint, tmp_path):
    calc = UncertaintyCalculator(tiny_checkpoint)
    with pytest.raises(DataError, match="Ni"):
        run_md(_nickel_cell(), calc, SETTINGS, tmp_path / "md", plot=False)
    assert not (tmp_path / "md").exists()  # made by this call, removed with its files

    kept = tmp_path / "kept"  # a folder the caller made stays, with what it held
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(DataError):
        run_md(_nickel_cell(), calc, SETTINGS, kept, plot=False)
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]


def test_an_interrupt_after_logged_frames_keeps_them(tiny_checkpoint, tmp_path, monkeypatch):
    calc = UncertaintyCalculator(tiny_checkpoint)
    calls = {"n": 0}
    calculate = calc.calculate

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 3:  # step 0 logged, then Ctrl-C
            raise KeyboardInterrupt
        return calculate(*args, **kwargs)

    monkeypatch.setattr(calc, "calculate", interrupted)
    start = bulk("Cu", "fcc", a=3.6, cubic=True)
    start.rattle(0.02, seed=0)
    with pytest.raises(KeyboardInterrupt):
        run_md(start, calc, SETTINGS, tmp_path / "md", plot=False)
    rows = list(csv.DictReader((tmp_path / "md" / "md.csv").open()))
    assert len(rows) >= 1 and (tmp_path / "md" / "md.traj").stat().st_size > 0


def test_cli_md_with_an_unseen_element_names_it_and_leaves_no_folder(tiny_checkpoint, tmp_path):
    _nickel_cell().write(tmp_path / "ni.xyz")
    out = tmp_path / "run"
    args = ["-q", "md", "-m", str(tiny_checkpoint), "-s", str(tmp_path / "ni.xyz")]
    result = CliRunner().invoke(app, [*args, "--steps", "4", "--out", str(out)])
    assert result.exit_code == 1 and "error: element Ni" in result.output, result.output
    assert not out.exists()
    again = CliRunner().invoke(app, [*args, "--steps", "4", "--out", str(out)])
    assert "already holds" not in again.output  # the same refusal, not a leftover run
