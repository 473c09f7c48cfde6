"""benchmarks/speed part ``size``: its systems, timing rules, instruments and a ``--quick`` run.

The quick run is in-process (the test process has torch, e3nn and, in .venv-mace, mace-torch
imported already) on the liquid only (no data files needed): < 20 s on 2 shared cores.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.neighborlist import neighbor_list

from benchmarks.common.format import numbers
from benchmarks.common.tables import read_csv
from benchmarks.speed import instruments, size_part, size_report, sizes, suite
from mlip_unc import UncertaintyCalculator
from mlip_unc.models.full_posterior import default_uncertainty_mode
from mlip_unc.models.potential_uncertainty import UncertaintyMode
from mlip_unc.uncertainty.moments import linear_gradients

AMU_PER_A3_IN_G_CM3 = 1.66054


def test_systems_have_the_stated_atom_counts_and_densities(tmp_path):
    systems = {s.name: s for s in sizes.size_series(tmp_path, quick=False)}  # RDKit 3BPA
    expected = {
        "molecules": [27, 108, 972, 10206],
        "liquid": [12, 108, 1008, 10080],
        "crystal": [8, 100, 1000, 10000],
    }
    for kind, counts in expected.items():
        assert [s.n_atoms for s in systems.values() if s.kind == kind] == counts
    assert not systems["molecules_27"].periodic and systems["molecules_108"].periodic
    water = systems["liquid_1008"].atoms
    density = water.get_masses().sum() / water.get_volume() * AMU_PER_A3_IN_G_CM3
    assert density == pytest.approx(1.0, rel=0.01)
    assert min(neighbor_list("d", water, 1.5)) > 0.8  # no clashes between molecules


def test_plans_skip_slow_or_too_big_rows_and_cap_the_calls():
    settings = size_part.Settings(
        repeats=10, row_budget_s=5.0, max_call_s=60.0, verdict_calls=3, verdict_repeats=40
    )
    plan, pred, Plan = size_part.plan_row, size_part.Prediction, size_part.Plan
    assert plan(None, settings) == Plan(2, 10, None, 1, 10)  # the first size: two warm-ups
    assert plan(pred(0.1, 10.0), settings, 1000.0) == Plan(1, 10, 0.1, 1, 10)
    assert plan(pred(20.0, None), settings) == Plan(0, 1, 20.0, 1, 10)
    # a row the verdict reads: a warm-up and three timed calls however long a call is, and up
    # to verdict_repeats (not repeats) where calls are short
    assert plan(pred(20.0, None), settings, verdict=True) == Plan(1, 3, 20.0, 3, 40)
    assert plan(pred(0.5, None), settings, verdict=True) == Plan(1, 10, 0.5, 3, 40)
    assert plan(pred(0.01, None), settings, verdict=True) == Plan(1, 40, 0.01, 3, 40)
    assert plan(None, settings, verdict=True) == Plan(2, 40, None, 3, 40)
    assert numbers(plan(pred(90.0, None), settings, verdict=True)) == [90, 60]  # s, > max_call_s
    assert size_part.verdict_keys("auto") == {"ours E+F", "ours auto README", "ours auto reverse"}
    assert numbers(plan(pred(90.0, None), settings)) == [90, 60]
    too_big = plan(pred(1.0, 900.0), settings, 1000.0)  # GiB added > 0.8 x GiB available
    assert numbers(too_big) == [0.9, settings.memory_fraction, 1.0]
    assert size_part.calls_for(2.0, settings) == 2 and size_part.calls_for(None, settings) == 10
    assert size_part.calls_for(0.01, settings, 3, 40) == 40
    history = {"ours exact README": (10, 2.0, 50.0)}
    assert size_part.predict(history, "ours exact README", 100) == pred(20.0, 500.0)
    assert size_part.predict(history, "mace E+F", 100) is None


def test_the_floor_is_k_backward_vectors_against_one():
    t = {"graph": 1.0, "forward": 3.0, "backward": 2.0, "backward_5": 6.0}
    assert size_part.floor_ratio(t, 1) == 1.0
    assert size_part.floor_ratio(t, 5) == pytest.approx((4 + 5 * 2) / (4 + 2))
    assert size_part.batched_floor(t, 5) == pytest.approx((4 + 6) / (4 + 2))
    assert size_part.batched_floor(t, 7) is None


def test_backward_vectors_are_counted_batched_or_not():
    x = torch.randn(4, 3, requires_grad=True)
    phi = (x.sin().sum(0, keepdim=True) @ torch.randn(3, 6)).tanh()  # (1, 6)
    weights = torch.randn(3, 6)
    with instruments.counting_vectors() as counter:
        linear_gradients(phi, [x], weights, method="batched", retain_graph=True)
        assert counter.count == 3
        counter.reset()
        linear_gradients(phi, [x], weights, method="loop", retain_graph=True)
        assert counter.count == 3
        counter.reset()
        torch.autograd.grad(phi.sum(), [x])
        assert counter.count == 1
    assert torch.autograd.grad is instruments.torch.autograd.grad  # restored
    assert "counted" not in torch.autograd.grad.__qualname__


def test_the_peak_probe_sees_a_call_of_its_own():
    if not instruments.peak_resettable():
        pytest.skip("no resettable VmHWM here")
    before = instruments.start_peak()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    peak = instruments.read_peak()
    del block
    assert peak - before > 50


def test_each_call_is_a_new_structure_so_no_cache_hides_work():
    cu = sizes.System("crystal", bulk("Cu", "fcc", a=3.61, cubic=True), "test")
    models = size_part.build_models(quick=True, mace=False)
    rows, skipped = size_part.ours_rows(models, cu)
    keys = {r.key for r in rows}
    modes = [m.value for m in UncertaintyMode if m is not UncertaintyMode.NONE]
    for mode in modes:
        assert {f"ours {mode} README", f"ours {mode} reverse"} <= keys or f"ours {mode}" in skipped
    reverse = next(r for r in rows if r.order == "reverse" and r.mode == models.default)
    assert reverse.props[-1] == "forces" and reverse.props[0] in ("max_force_std", "energy_std")
    for _ in range(3):
        reverse.call()
    assert isinstance(reverse.calc, UncertaintyCalculator) and reverse.calc.n_model_calls == 3
    assert models.default == default_uncertainty_mode(models.ours)


class _SlowCalc:
    """A calculator whose every call takes 20 ms: over the row budget of the test below."""

    def __init__(self) -> None:
        self.calls = 0

    def get_property(self, name: str, atoms: object) -> None:
        self.calls += 1
        time.sleep(0.02)


def test_a_verdict_row_is_timed_at_least_its_minimum_whatever_the_budget():
    settings = size_part.Settings(repeats=10, row_budget_s=0.001)  # budget: one call per row
    cu = bulk("Cu", "fcc", a=3.61, cubic=True)
    rows = [
        size_part.Row(key, "ours", "E+F", "", ("forces",), _SlowCalc(), cu.copy()) for key in "ab"
    ]
    plans = {"a": size_part.Plan(1, 10, None, 3), "b": size_part.Plan(1, 10, None)}
    size_part.time_rows(rows, plans, settings)
    assert [len(r.ms) for r in rows] == [3, 1]  # the verdict row three times, the other once
    assert [r.calc.calls for r in rows] == [4, 2]  # each after one warm-up


def test_timed_calls_run_no_memory_probe_unless_the_row_had_no_warm_up(monkeypatch):
    pending: list[bool] = [False]  # a probe ran since the last call
    probed: list[tuple[str, int]] = []  # (row, its call number) of every probed call

    class ProbedCalc(_SlowCalc):
        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

        def get_property(self, name: str, atoms: object) -> None:
            super().get_property(name, atoms)
            if pending[0]:
                probed.append((self.key, self.calls))
                pending[0] = False

    def start_peak() -> float:
        pending[0] = True
        return 0.0

    monkeypatch.setattr(size_part.instruments, "start_peak", start_peak)
    monkeypatch.setattr(size_part.instruments, "read_peak", lambda: 1.0)
    cu = bulk("Cu", "fcc", a=3.61, cubic=True)
    rows = [
        size_part.Row(k, "ours", "E+F", "", ("forces",), ProbedCalc(k), cu.copy()) for k in "ab"
    ]
    plans = {"a": size_part.Plan(2, 4, None), "b": size_part.Plan(0, 4, None)}
    size_part.time_rows(rows, plans, size_part.Settings(repeats=4, row_budget_s=10.0))
    assert [len(r.ms) for r in rows] == [4, 4] and [r.calc.calls for r in rows] == [6, 4]
    assert sorted(probed) == [("a", 1), ("b", 1)]  # a's first warm-up; b's first timed call
    assert [r.added_mib for r in rows] == [[1.0], [1.0]]


def test_short_verdict_rows_are_timed_up_to_verdict_repeats_and_the_others_up_to_repeats():
    settings = size_part.Settings(repeats=2, verdict_repeats=5, row_budget_s=10.0)
    cu = bulk("Cu", "fcc", a=3.61, cubic=True)
    rows = [
        size_part.Row(key, "ours", "E+F", "", ("forces",), _SlowCalc(), cu.copy()) for key in "ab"
    ]
    plans = {"a": size_part.Plan(1, 5, None, 3, 5), "b": size_part.Plan(1, 2, None, 1, 2)}
    size_part.time_rows(rows, plans, settings)
    assert [len(r.ms) for r in rows] == [5, 2]


@pytest.fixture
def torch_threads():
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def test_quick_part_writes_every_row_ratio_floor_memory_and_md(
    tmp_path: Path, torch_threads, monkeypatch
):
    loads = iter([[0.1, 0.2, 0.3]])  # the first reading; the part's own work loads the machine
    monkeypatch.setattr(size_part, "load_avg", lambda: next(loads, [9.0, 9.0, 9.0]))
    argv = [
        "--part",
        "size",
        "--quick",
        "--kinds",
        "liquid",
        "--threads",
        "1",
        "--out",
        str(tmp_path),
    ]
    suite.main(argv)
    entry = json.loads((tmp_path / "speed.json").read_text())["parts"]["size"]
    meta = entry["meta"]
    assert meta["status"] == "complete" and meta["quick"] and meta["threads"] == [1]
    assert meta["load_avg_start"] == [0.1, 0.2, 0.3]  # read before the models were built
    assert meta["load_avg_models_built"] == [9.0, 9.0, 9.0] and len(meta["load_avg_end"]) == 3
    page = (tmp_path / "speed.md").read_text()
    machine = next(line for line in page.splitlines() if line.startswith("- Machine:"))
    assert numbers(machine)[-9:] == [0.1, 0.2, 0.3, 9.0, 9.0, 9.0, *meta["load_avg_end"]]
    assert size_report.QUIET_LOAD > 0.1 and "NOT a quiet machine" not in page
    assert {"python", "torch", "e3nn", "ase"} <= set(meta["versions"])
    assert meta["modes"] == [m.value for m in UncertaintyMode if m is not UncertaintyMode.NONE]
    assert [g["n_atoms"] for g in entry["groups"]] == [6, 12]
    for group in entry["groups"]:
        rows = {r["key"]: r for r in group["rows"]}
        for mode in meta["modes"]:
            for order in size_part.ORDERS:
                assert f"ours {mode} {order}" in rows or f"ours {mode}" in group["skipped"]
        defaults = {r["mode"] for r in group["rows"] if r["default"]}
        assert defaults == {meta["default_mode"]}
        assert rows["ours E+F"]["x_ours_ef"] == pytest.approx(1.0)
        assert rows["ours E+F"]["vectors"] == 1 and rows["ours E+F"]["floor"] == 1.0
        for r in group["rows"]:
            assert r["ms_median"] > 0 and r["calls"] >= 1
            if r["model"] == "ours":
                assert r["floor"] >= 1.0 and r["vectors"] >= 1
        if suite.setup.mace_available():
            assert rows["mace E+F"]["x_mace_ef"] == pytest.approx(1.0)
            assert rows["mace committee5"]["vectors"] == size_part.COMMITTEE
        else:
            assert "not importable" in group["skipped"]["mace E+F"]
        assert {"graph", "forward", "backward"} <= set(group["floor_ms"])
    md = {r["row"] for r in entry["groups"][-1]["md"]}
    assert {"ours E+F", f"ours {meta['default_mode']} (default), σ every step"} <= md
    page = (tmp_path / "speed.md").read_text()
    for section in (
        "## Calculator cost from 10 to 10,000 atoms (part `size`)",
        f"### The default mode (`{meta['default_mode']}`)",
        "### Run (part `size`)",
    ):
        assert section in page, section
    assert meta["command"] in page and "QUICK mode" in page
    # every row, the floor and the MD rows: CSV files beside the page, linked from it
    every = read_csv(tmp_path / size_report.ROWS_CSV)
    assert len(every) == sum(len(g["rows"]) + len(g["skipped"]) for g in entry["groups"])
    assert {r["threads"] for r in every} == {"1"} and {r["atoms"] for r in every} == {"6", "12"}
    assert len(read_csv(tmp_path / size_report.FLOOR_CSV)) == len(entry["groups"])
    assert {r["row"] for r in read_csv(tmp_path / size_report.MD_CSV)} == md
    for name in (size_report.ROWS_CSV, size_report.FLOOR_CSV, size_report.MD_CSV):
        assert f"]({name})" in page
