"""The stability part of the on-the-fly benchmark: trajectories, resume, and the page's cells."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from ase import Atoms

from benchmarks.active_learning import onthefly_report as report
from benchmarks.active_learning import stability
from benchmarks.common.records import append_jsonl, read_jsonl


class CountingGuard:
    """Names a reason at its ``fail_at``-th check (never when ``fail_at`` is 0)."""

    def __init__(self, fail_at: int = 0) -> None:
        self.fail_at, self.checks = fail_at, 0

    def check(self, atoms: Atoms) -> str | None:
        self.checks += 1
        return "bond 0-1 at 1.60x its start length" if self.checks == self.fail_at else None


def _calc(path):
    from mlip_unc.calculator import UncertaintyCalculator

    return UncertaintyCalculator(str(path), uncertainty="none")


def _dimer() -> Atoms:
    return Atoms("Cu3", positions=[[0, 0, 0], [0, 0, 2.5], [0, 2.3, 1.2]])


def test_a_trajectory_that_holds_lasts_its_length(tiny_checkpoint):
    protocol = stability.Stability(temperatures=(600.0,), runs=1, length_ps=0.01, check_every=5)
    guard = CountingGuard()
    row = stability.trajectory(_calc(tiny_checkpoint), _dimer(), guard, 600.0, 0, 1.0, protocol)
    assert not row["failed"] and row["survived_ps"] == 0.01 and row["reason"] == ""
    assert guard.checks == 2  # 10 steps of 1 fs, checked every 5


def test_a_trajectory_stops_at_the_first_unphysical_frame(tiny_checkpoint):
    protocol = stability.Stability(temperatures=(600.0,), runs=1, length_ps=0.1, check_every=5)
    guard = CountingGuard(fail_at=3)
    row = stability.trajectory(_calc(tiny_checkpoint), _dimer(), guard, 600.0, 0, 1.0, protocol)
    assert row["failed"] and guard.checks == 3
    assert np.isclose(row["survived_ps"], 0.015)  # 3 checks x 5 steps x 1 fs
    assert row["reason"].startswith("bond 0-1")


def test_models_are_the_reference_and_each_finished_runs_last_model(tmp_path):
    run = tmp_path / "ours_s0"
    run.mkdir()
    (run / "update_2").mkdir()
    (run / "update_2" / "model.pt").write_bytes(b"x")
    updates = [{"model": str(run / f"update_{k}" / "model.pt")} for k in range(3)]
    (run / "state.json").write_text(json.dumps({"updates": updates}))
    refs = [{"recipe": "shipped", "model": "ref.pt"}, {"recipe": "full_width", "model": "w.pt"}]
    finished = [{"arm": "ours", "seed": 0}, {"arm": "random", "seed": 0}]  # random: no folder
    got = stability.models(tmp_path, finished, refs)
    assert got == [("reference", None, Path("ref.pt")), ("ours", 0, run / "update_2" / "model.pt")]


def test_summary_and_page_cells_count_full_length_runs(tmp_path):
    path = tmp_path / stability.records_name("active_learning_otf.jsonl")
    assert path.name == "active_learning_otf_stability.jsonl"
    for run, survived in enumerate([10.0, 10.0, 10.0, 10.0, 3.5]):
        row = {"arm": "ours", "seed": 0, "temperature": 600.0, "run": run, "length_ps": 10.0}
        append_jsonl(path, {**row, "survived_ps": survived, "failed": survived < 10.0})
    for run, survived in enumerate([0.5, 1.5, 2.5]):
        row = {"arm": "ours", "seed": 0, "temperature": 1200.0, "run": run, "length_ps": 10.0}
        append_jsonl(path, {**row, "survived_ps": survived, "failed": True})
    rows = read_jsonl(path)
    assert stability.summary(rows, "ours", 600.0) == (4, 5, 10.0)
    assert stability.summary(rows, "random", 600.0) == (0, 0, None)
    assert report.stability_cells(rows, "ours") == "4 of 5 | 1.5"
    assert report.stability_cells(rows, "random") == "- | -"


def test_trigger_check_shares_and_page_line(tiny_checkpoint):
    from ase.build import bulk

    from benchmarks.active_learning import trigger_check
    from mlip_unc.calculator import UncertaintyCalculator

    def rattled(amp: float, n: int) -> list[Atoms]:
        out = []
        for k in range(n):
            a = bulk("Cu", cubic=True)
            a.rattle(amp, seed=k)
            out.append(a)
        return out

    valid, hot = rattled(0.02, 3), rattled(0.3, 4)
    row = trigger_check.shares(tiny_checkpoint, valid, {"hot": hot}, threshold=2.0)
    calc = UncertaintyCalculator(str(tiny_checkpoint), uncertainty="lowrank")
    level = trigger_check.max_force_std(calc, valid).mean()
    sigma = trigger_check.max_force_std(calc, hot)
    assert np.isclose(row["level"], level)
    assert row["sets"]["hot"]["share_over"] == np.mean(sigma > 2 * level)
    assert np.isclose(row["sets"]["hot"]["mean_over_level"], sigma.mean() / level)
    line = trigger_check.page_line([{**row, "seed": 0}])
    assert line is not None and line.startswith("Oracle frames over the σ threshold (2x")
    assert trigger_check.page_line([{**row, "seed": 0}], variant="v2") is None
