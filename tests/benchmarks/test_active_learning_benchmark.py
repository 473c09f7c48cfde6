"""The active-learning benchmark (``benchmarks.active_learning``): each strategy's overrides of
the shipped config, the JSONL records, the stability trajectories, and the page's numbers and
verdicts from hand-made records (fast: no xTB, no data sets)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.calculators.calculator import Calculator, all_changes
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from ase.io import write

from benchmarks.active_learning import benchmark, report
from benchmarks.common.records import append_jsonl, read_jsonl
from mlip_unc.config import load_active_config

# --- strategies and overrides ----------------------------------------------------------------------


def test_strategy_overrides():
    assert benchmark.strategy_overrides("ours") == []
    assert benchmark.strategy_overrides("random") == [
        "selection.metric=random",
        "selection.diverse=false",
    ]
    assert benchmark.strategy_overrides("force_magnitude") == ["selection.metric=max_force"]
    assert benchmark.strategy_overrides("committee5") == ["committee=5"]
    assert benchmark.strategy_overrides("ours_biased", 0.0123456789) == [
        "md.bias=udd",
        "md.bias_strength=0.9",
        "md.bias_width=0.0123457",
    ]
    assert benchmark.strategy_overrides("ours_top") == ["selection.pool_factor=1"]
    assert benchmark.strategy_overrides("true_error") == ["selection.pool_factor=1"]
    assert benchmark.strategy_overrides("ours_early") == [
        "selection.pool_factor=1",
        "md.max_flags=10",
    ]
    with pytest.raises(ValueError, match="ours_biased needs the bias width"):
        benchmark.strategy_overrides("ours_biased")
    with pytest.raises(ValueError, match=r"unknown strategy 'ensemble': use one of random, "):
        benchmark.strategy_overrides("ensemble")


def test_run_overrides_share_the_initial_model_except_for_the_committee(tmp_path):
    model = tmp_path / "initial" / "model.pt"
    settings = {"overrides": ["rounds=2", "audit=2"]}
    items = benchmark.run_overrides("ours", 3, tmp_path, model, settings)
    assert items[:4] == ["rounds=2", "audit=2", "seed=3", f"out={tmp_path / 'ours'}"]
    assert f"train_data={tmp_path / 'seed_train.xyz'}" in items
    assert f"valid_data={tmp_path / 'seed_valid.xyz'}" in items
    for name in benchmark.REFERENCE_SETS:
        assert f"test_sets.{name}={tmp_path / f'test_{name}.xyz'}" in items
    assert items[-1] == f"model={model}"
    committee = benchmark.run_overrides("committee5", 3, tmp_path, model, settings)
    assert not any(item.startswith("model=") for item in committee)
    assert not any(
        i.startswith("model=") for i in benchmark.run_overrides("ours", 0, tmp_path, None, settings)
    )


@pytest.mark.parametrize("strategy", benchmark.STRATEGIES + benchmark.VARIANTS)
def test_every_strategy_makes_a_valid_config_from_the_shipped_one(tmp_path, strategy):
    """The shipped config with the quick size, the run's and the strategy's overrides validates
    (no oracle is made, no file is read)."""
    model = tmp_path / "initial" / "model.pt"
    items = benchmark.run_overrides(strategy, 1, tmp_path, model, benchmark.QUICK)
    items += benchmark.strategy_overrides(strategy, 0.05)
    config = load_active_config(benchmark.CONFIG, items)
    assert (config.seed, config.out, config.rounds, config.audit) == (
        1,
        str(tmp_path / strategy),
        2,
        2,
    )
    assert config.train_data == str(tmp_path / "seed_train.xyz")
    assert set(config.test_sets) == set(benchmark.REFERENCE_SETS)
    assert config.test_sets["md_600K"] == str(tmp_path / "test_md_600K.xyz")
    assert config.selection.candidates == "visited"  # every strategy labels top_k per round
    assert config.selection.top_k == 2 and config.training["model"]["latent_dim"] == 4
    shared = str(model)  # every single-model strategy starts from the shared initial model
    expected = {
        "random": ("random", False, 1, shared, "none"),
        "force_magnitude": ("max_force", True, 1, shared, "none"),
        "ours": ("max_force_std", True, 1, shared, "none"),
        "ours_biased": ("max_force_std", True, 1, shared, "udd"),
        "committee5": ("max_force_std", True, 5, None, "none"),
        "ours_top": ("max_force_std", True, 1, shared, "none"),
        "true_error": ("max_force_std", True, 1, shared, "none"),  # its score replaces the metric
        "ours_early": ("max_force_std", True, 1, shared, "none"),
    }[strategy]
    got = (
        config.selection.metric,
        config.selection.diverse,
        config.committee,
        config.model,
        config.md.bias,
    )
    assert config.selection.pool_factor == (1 if strategy in benchmark.VARIANTS else 4)
    assert config.md.max_flags == (10 if strategy == "ours_early" else None)
    assert got == expected
    if strategy == "ours_biased":
        assert (config.md.bias_strength, config.md.bias_width) == (0.9, 0.05)
    # the round temperatures of the shipped config: 300 K rising to 1200 K, the last one held
    assert [config.md_settings(r).temperature for r in (0, 5, 9)] == [300, 1200, 1200]


# --- records -----------------------------------------------------------------------------------------


def _row(round_index: int, **extra) -> dict:
    return {
        "round": round_index,
        "model": "/runs/x/model.pt",
        "n_train": 16,
        "oracle_calls": 20,
        "md_300K_force_mae": 0.0123456789,
        "md_300K_energy_mae_per_atom": 0.001,
        "md_300K_mean_energy_std_per_atom": 0.002,
        "level_energy_std_per_atom": 0.000123456789,
        "audit_tp": 1,
        "audit_max_force_error": [0.123456789, 1.0],
        "audit_max_force_std": [0.5, 0.987654321],
        "some_list": [1, 2, 3],
        "flag": True,
        "cpu_initial_train_s": 99.0,
        **extra,
    }


def test_record_of_a_round():
    out = benchmark.record("ours", 2, _row(0), initial_cpu=12.5)
    assert out["strategy"] == "ours" and out["seed"] == 2 and out["round"] == 0
    assert "model" not in out and "some_list" not in out
    assert "md_300K_energy_mae_per_atom" not in out
    assert "md_300K_mean_energy_std_per_atom" not in out
    assert out["md_300K_force_mae"] == 0.0123457  # 6 significant digits
    assert out["level_energy_std_per_atom"] == 0.000123457
    assert out["audit_max_force_error"] == [0.12346, 1.0]
    assert out["audit_max_force_std"] == [0.5, 0.98765]
    assert out["flag"] is True and out["audit_tp"] == 1 and out["n_train"] == 16
    assert out["cpu_initial_train_s"] == 12.5  # the shared initial model's CPU
    json.dumps(out)  # a JSON record
    # the committee trains its own initial models: the loop's number stays
    assert benchmark.record("committee5", 2, _row(0), 12.5)["cpu_initial_train_s"] == 99.0
    later = benchmark.record("ours", 2, _row(1, cpu_initial_train_s=None), 12.5)
    assert later["cpu_initial_train_s"] is None
    plain = _row(1)
    del plain["cpu_initial_train_s"], plain["audit_max_force_error"], plain["audit_max_force_std"]
    later = benchmark.record("random", 0, plain, 12.5)
    assert "cpu_initial_train_s" not in later and "audit_max_force_std" not in later


def test_final_model_is_the_last_committed_model(tmp_path):
    assert benchmark.final_model("ours", tmp_path) is None
    (tmp_path / "ours").mkdir()
    rounds = [{"model": "/a/model.pt"}, {"model": "/b/model.pt"}, {"model": None}]
    state = {"config": {"rounds": 6}, "rounds": rounds}
    (tmp_path / "ours" / "state.json").write_text(json.dumps(state))
    assert benchmark.final_model("ours", tmp_path) == Path("/b/model.pt")  # stopped early
    state = {"config": {"rounds": 3}, "rounds": rounds[:2]}
    (tmp_path / "ours" / "state.json").write_text(json.dumps(state))
    assert benchmark.final_model("ours", tmp_path) is None  # round 3 of 3 still running
    state["config"]["rounds"] = 2
    (tmp_path / "ours" / "state.json").write_text(json.dumps(state))
    assert benchmark.final_model("ours", tmp_path) == Path("/b/model.pt")
    (tmp_path / "ours" / "state.json").write_text(json.dumps({"config": {}, "rounds": []}))
    assert benchmark.final_model("ours", tmp_path) is None


# --- stability ---------------------------------------------------------------------------------------


def _cluster() -> Atoms:
    """A Cu4 tetrahedron, bonds 2.55 A (the 6 pairs are bonds by the natural cutoffs)."""
    d = 2.55
    positions = [
        [0, 0, 0],
        [d, 0, 0],
        [d / 2, d * math.sqrt(3) / 2, 0],
        [d / 2, d * math.sqrt(3) / 6, d * math.sqrt(2 / 3)],
    ]
    atoms = Atoms("Cu4", positions=positions)
    atoms.center(vacuum=5.0)
    return atoms


class _Exploding(Calculator):
    """Strong radial forces away from the centre: the cluster flies apart."""

    implemented_properties = ["energy", "forces"]

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        r = self.atoms.positions - self.atoms.positions.mean(0)
        self.results = {"energy": 0.0, "forces": 200.0 * r / np.linalg.norm(r, axis=1)[:, None]}


class _Refusing(Calculator):
    implemented_properties = ["energy", "forces"]

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        raise FloatingPointError("NaN in the forces")


def _patch_calculator(monkeypatch, make):
    import mlip_unc.calculator

    made = []

    def factory(model, **kwargs):
        made.append((model, kwargs))
        return make()

    monkeypatch.setattr(mlip_unc.calculator, "UncertaintyCalculator", factory)
    return made


SETTINGS = {"stability": {"temperatures": (600.0,), "runs": 2, "steps": 40, "timestep": 0.5}}


def test_stability_of_a_bonded_cluster_survives(monkeypatch):
    made = _patch_calculator(monkeypatch, EMT)
    row = benchmark.stability(Path("m.pt"), 600.0, 1, SETTINGS, _cluster())
    assert made == [(Path("m.pt"), {"uncertainty": "none"})]
    assert row["length_ps"] == pytest.approx(0.02) and row["survived_ps"] == row["length_ps"]
    assert (row["failed"], row["reason"], row["temperature"], row["run"]) == (False, "", 600.0, 1)
    assert row["cpu_s"] >= 0


def test_stability_detects_a_broken_molecule_and_a_refused_frame(monkeypatch):
    _patch_calculator(monkeypatch, _Exploding)
    row = benchmark.stability(Path("m.pt"), 600.0, 0, SETTINGS, _cluster())
    assert row["failed"] is True and row["reason"].startswith("bond ratio")
    assert 0 < row["survived_ps"] < row["length_ps"]
    steps = row["survived_ps"] * 1000 / 0.5
    assert steps == pytest.approx(round(steps)) and round(steps) % 10 == 0  # checked every 10 steps

    _patch_calculator(monkeypatch, _Refusing)
    row = benchmark.stability(Path("m.pt"), 1200.0, 0, SETTINGS, _cluster())
    assert (row["failed"], row["reason"]) == (True, "FloatingPointError")
    assert row["survived_ps"] == pytest.approx(10 * 0.5 / 1000)


def test_stability_with_a_tiny_model_is_seeded(tmp_path):
    """A real (untrained, tiny) potential: a consistent record, the same twice for the same run."""
    import torch

    from mlip_unc.models.potential import BayesianPotential, build_backbone

    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=1, r_max=4.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(backbone, [29], 4.0, torch.tensor([-0.01]), init_std=0.3).double()
    path = tmp_path / "tiny.pt"
    model.save(path)
    settings = {"stability": {"steps": 20, "timestep": 0.5}}
    first = benchmark.stability(path, 300.0, 0, settings, _cluster())
    second = benchmark.stability(path, 300.0, 0, settings, _cluster())
    assert first["length_ps"] == pytest.approx(0.01)
    assert first["failed"] == (first["survived_ps"] < first["length_ps"])
    assert first["failed"] == bool(first["reason"])
    drop_cpu = lambda r: {k: v for k, v in r.items() if k != "cpu_s"}  # noqa: E731
    assert drop_cpu(first) == drop_cpu(second)


def test_run_stability_records_only_the_missing_trajectories(tmp_path, monkeypatch):
    made = _patch_calculator(monkeypatch, EMT)
    folder, out = tmp_path / "seed_0", tmp_path / "results"
    (folder / "ours").mkdir(parents=True)
    out.mkdir()
    start = _cluster()
    start.calc = SinglePointCalculator(start, energy=-1.0, forces=np.zeros((4, 3)))
    write(folder / "seed_train.xyz", [start], format="extxyz")
    path = out / benchmark.STABILITY_RECORDS
    # nothing to run without a finished model
    benchmark.run_stability("ours", 0, folder, SETTINGS, out, "full")
    assert not path.exists()
    (folder / "ours" / "state.json").write_text(
        json.dumps({"config": {"rounds": 1}, "rounds": [{"model": "/m/r0.pt"}]})
    )
    done = {"temperature": 600.0, "run": 0, "strategy": "ours", "seed": 0, "tag": "full"}
    append_jsonl(path, done)
    append_jsonl(path, {**done, "run": 1, "tag": "quick"})  # another tag: not this run's
    benchmark.run_stability("ours", 0, folder, SETTINGS, out, "full")
    rows = read_jsonl(path)
    assert len(rows) == 3 and [m for m, _ in made] == [Path("/m/r0.pt")]
    new = rows[-1]
    assert (new["temperature"], new["run"], new["strategy"], new["seed"], new["tag"]) == (
        600.0,
        1,
        "ours",
        0,
        "full",
    )
    assert new["failed"] is False
    benchmark.run_stability("ours", 0, folder, SETTINGS, out, "full")  # all done: nothing new
    assert len(read_jsonl(path)) == 3


# --- report: the page's numbers ---------------------------------------------------------------------


def _sets(err_meV: float) -> dict:
    """Per-set force MAEs (eV/A) whose mean is ``err_meV`` meV/A, spread over the four sets."""
    out = {}
    for name, f in zip(report.SETS, (0.75, 1.25, 0.875, 1.125), strict=True):
        out[f"{name}_force_mae"] = f * err_meV / 1000
        out[f"{name}_force_rmse"] = 1.5 * f * err_meV / 1000
        out[f"{name}_energy_mae"] = 0.002
    return out


def _run(strategy, seed, calls, errors, *, initial, md, score, retrain, audit=None, tag="full"):
    """The records of a finished run: one per round, the last one the final model's."""
    rows = []
    for k, (c, e) in enumerate(zip(calls, errors, strict=True)):
        row = {"strategy": strategy, "seed": seed, "round": k, "oracle_calls": c, "tag": tag}
        row.update(_sets(e), cpu_eval_s=1000.0)  # evaluation CPU is not model CPU
        if k == 0:
            row["cpu_initial_train_s"] = initial
        if k < len(calls) - 1:
            row.update(cpu_md_s=md, cpu_score_s=score, cpu_retrain_s=retrain)
            row.update(audit or {})
        rows.append(row)
    return rows


AUDIT = {"audit_tp": 3, "audit_fp": 1, "audit_fn": 2, "audit_tn": 4}


def _records(ours_seed1=(80.0, 20.0, 10.0)) -> list[dict]:
    records = []
    for seed in (0, 1):
        records += _run("random", seed, [20, 30, 40], [100.0, 60.0, 40.0], initial=2.0, md=1.0,
                        score=0.5, retrain=1.5)  # fmt: skip
        ours = (80.0, 20.0, 10.0) if seed == 0 else ours_seed1
        records += _run("ours", seed, [10, 25, 40], list(ours), initial=2.0, md=1.0, score=0.5,
                        retrain=1.5, audit=AUDIT)  # fmt: skip
        records += _run("committee5", seed, [20, 30, 40], [60.0, 20.0, 10.0], initial=20.0,
                        md=5.0, score=1.0, retrain=14.0)  # fmt: skip
    # an unfinished run (its last row still retrains): not on the page
    records += _run("force_magnitude", 0, [20, 30], [90.0, 50.0], initial=2.0, md=1.0, score=0.5,
                    retrain=1.5)[:1]  # fmt: skip
    # a stale record of a round recorded again later: the later one counts
    stale = {**records[1], **_sets(500.0)}
    return [stale, *records]


def _stab() -> list[dict]:
    rows = []
    for strategy, survived in (("ours", (2.0, 2.0)), ("committee5", (1.0, 2.0))):
        for run, s in enumerate(survived):
            rows.append({"strategy": strategy, "seed": 0, "temperature": 1200.0, "run": run,
                         "length_ps": 2.0, "survived_ps": s, "failed": s < 2.0})  # fmt: skip
        rows.append({"strategy": strategy, "seed": 0, "temperature": 600.0, "run": 0,
                     "length_ps": 2.0, "survived_ps": 2.0, "failed": False})  # fmt: skip
    return rows


def test_error_is_the_mean_force_mae_over_the_sets_in_meV():
    assert report.error(_sets(40.0)) == pytest.approx(40.0)
    assert report.error({"md_300K_force_mae": 0.01, "torsion_scan_force_mae": 0.03}) == (
        pytest.approx(20.0)
    )
    assert math.isnan(report.error({"test_force_mae": 0.01}))


def test_curves_sort_rounds_and_the_last_record_wins():
    records = [
        {"strategy": "ours", "seed": 1, "round": 1, "oracle_calls": 5, "v": "old"},
        {"strategy": "ours", "seed": 1, "round": 0, "oracle_calls": 1},
        {"strategy": "ours", "seed": 1, "round": 1, "oracle_calls": 5, "v": "new"},
        {"strategy": "random", "seed": 0, "round": 0, "oracle_calls": 1},
    ]
    by = report.curves(records)
    assert set(by) == {"ours", "random"} and list(by["ours"]) == [1]
    assert [r["round"] for r in by["ours"][1]] == [0, 1] and by["ours"][1][1]["v"] == "new"


def _curve(calls, errors):
    return [{"oracle_calls": c, **_sets(e)} for c, e in zip(calls, errors, strict=True)]


def test_calls_to_reach_interpolates_the_first_crossing():
    rows = _curve([10, 20, 30], [100.0, 60.0, 20.0])
    calls, ok = report.calls_to_reach(rows, 40.0)
    assert ok and calls == pytest.approx(25.0)
    # the first crossing counts, not a later one
    rows = _curve([10, 20, 30, 40], [100.0, 30.0, 80.0, 5.0])
    calls, ok = report.calls_to_reach(rows, 50.0)
    assert ok and calls == pytest.approx(10 + 10 * 50 / 70)
    # reached at once; an exact hit; never reached: censored at the final calls
    assert report.calls_to_reach(_curve([8, 20], [30.0, 10.0]), 40.0) == (8.0, True)
    calls, ok = report.calls_to_reach(_curve([10, 20], [60.0, 40.0]), 40.0)
    assert ok and calls == pytest.approx(20.0)
    assert report.calls_to_reach(_curve([10, 20, 35], [100.0, 60.0, 41.0]), 40.0) == (35.0, False)


def test_model_cpu_counts_training_md_and_scoring_up_to_the_final_model():
    rows = _run("ours", 0, [10, 25, 40], [80.0, 20.0, 10.0], initial=2.0, md=1.0, score=0.5,
                retrain=1.5)  # fmt: skip
    rows[-1].update(cpu_md_s=100.0)  # after the final model: not counted
    assert report.model_cpu(rows) == pytest.approx(2.0 + 2 * 3.0)
    rows[0]["cpu_initial_train_s"] = None
    assert report.model_cpu(rows) == pytest.approx(6.0)


def test_summarise_and_verdicts_when_ours_halves_random():
    summary = report.summarise(_records(), _stab())
    st = summary["strategies"]
    assert summary["target_meV_A"] == pytest.approx(40.0)
    assert list(st) == ["random", "ours", "committee5"]  # unfinished force_magnitude left out
    ours, rnd, com = st["ours"], st["random"], st["committee5"]
    assert ours["seeds"] == [0, 1]
    assert ours["calls_to_target"]["0"]["calls"] == pytest.approx(20.0)
    assert ours["calls_to_target_mean"] == pytest.approx(20.0) and ours["all_reached"]
    assert rnd["calls_to_target_mean"] == pytest.approx(40.0) and rnd["all_reached"]
    assert com["calls_to_target_mean"] == pytest.approx(25.0)
    assert ours["final_error"]["mean"] == pytest.approx(10.0)
    assert ours["final_calls"] == {"mean": 40.0, "std": 0.0, "n": 2}
    assert ours["final_sets"]["md_600K"]["force_mae"]["mean"] == pytest.approx(12.5)
    assert ours["final_sets"]["md_600K"]["force_rmse"]["mean"] == pytest.approx(18.75)
    assert ours["final_sets"]["torsion_scan"]["energy_mae"]["mean"] == pytest.approx(2.0)
    assert ours["model_cpu_s"]["mean"] == pytest.approx(8.0)
    assert com["model_cpu_s"]["mean"] == pytest.approx(60.0)
    flags = ours["flags"]
    assert (flags["audit_tp"], flags["audit_fp"], flags["audit_fn"], flags["audit_tn"]) == (
        12,
        4,
        8,
        16,
    )
    assert flags["precision"] == pytest.approx(0.75) and flags["recall"] == pytest.approx(0.6)
    assert rnd["flags"]["precision"] is None and rnd["flags"]["recall"] is None
    assert [p["calls"] for p in ours["curve"]] == [10.0, 25.0, 40.0]
    assert [p["error"] for p in ours["curve"]] == pytest.approx([80.0, 20.0, 10.0])
    # the stale round-1 record of random seed 0 (500 meV/A) was replaced
    assert rnd["curve"][1]["error_max"] == pytest.approx(60.0)
    assert ours["stability"]["1200"] == {
        "runs": 2,
        "failed": 0,
        "mean_survived_ps": 2.0,
        "length_ps": 2.0,
    }
    assert com["stability"]["1200"]["failed"] == 1
    assert com["stability"]["1200"]["mean_survived_ps"] == pytest.approx(1.5)
    assert summary["verdicts"] == [
        "ours reaches random's final error with 0.50x random's oracle calls (target <= 0.6x): met.",
        "ours needs 0.80x the committee's oracle calls to that error (target <= 1.1x): met.",
        "ours spends 0.13x the committee's model CPU time (target <= 0.4x): met.",
        "At 1200 K the final ours model survives 2.00 ps on average (0/2 runs failed) against "
        "the committee-trained model's 1.50 ps (1/2): met.",
    ]


def test_verdicts_missed_and_censored():
    # ours seed 1 never reaches 40 meV/A: censored at its final 40 calls
    summary = report.summarise(_records(ours_seed1=(100.0, 90.0, 50.0)), [])
    ours = summary["strategies"]["ours"]
    assert ours["calls_to_target"]["1"] == {"calls": 40.0, "reached": False}
    assert not ours["all_reached"] and ours["calls_to_target_mean"] == pytest.approx(30.0)
    first, second, third = summary["verdicts"]  # no stability records: no fourth line
    assert first == (
        "ours reaches random's final error with 0.75x random's oracle calls (target <= 0.6x): "
        "missed (censored: not every ours seed reached the target)."
    )
    assert second == (
        "ours needs 1.20x the committee's oracle calls to that error (target <= 1.1x): "
        "missed (censored: not every ours seed reached the target)."
    )
    assert third.endswith(": met.")
    # reached by every seed but not fast enough: missed, not censored
    slow = report.summarise(_records(ours_seed1=(80.0, 60.0, 10.0)), [])
    assert slow["verdicts"][0].endswith("missed.") and "censored" not in slow["verdicts"][0]
    # without a finished committee there are no verdicts
    records = [r for r in _records() if r["strategy"] != "committee5"]
    assert report.summarise(records, [])["verdicts"] == [
        "Targets not evaluated: ours, random and committee5 are not all finished."
    ]


def test_write_report_from_jsonl_files(tmp_path):
    for r in _records():
        append_jsonl(tmp_path / "active_learning.jsonl.gz", r)
    # another tag's records are not this page's
    quick = _run("ours_biased", 0, [2, 4], [500.0, 400.0], initial=1.0, md=1.0, score=1.0,
                 retrain=1.0, tag="quick")  # fmt: skip
    for r in quick:
        append_jsonl(tmp_path / "active_learning.jsonl.gz", r)
    for r in _stab():
        append_jsonl(tmp_path / "active_learning_stability.jsonl", {**r, "tag": "full"})
    runs = tmp_path / "active_learning_runs.jsonl"
    append_jsonl(runs, {"command": "python -m benchmarks.active_learning --quick", "tag": "quick"})
    command = "python -m benchmarks.active_learning --seeds 0,1"
    append_jsonl(
        runs,
        {
            "command": command,
            "tag": "full",
            "started": "2026-12-05 10:00",
            "machine": "Linux x86_64, 2 CPUs",
            "load_avg": [1.5, 1.0, 0.5],
            "versions": {"torch": "2.x"},
        },
    )
    page = report.write_report(tmp_path, "full")
    assert page == tmp_path / "active_learning.md"
    text = page.read_text()
    summary = json.loads((tmp_path / "active_learning.json").read_text())
    assert (tmp_path / "active_learning.png").stat().st_size > 0
    assert summary["commands"] == [command]
    assert set(summary["strategies"]) == {"random", "ours", "committee5"}
    assert summary["target_meV_A"] == pytest.approx(40.0)
    assert "target = random's final error, 40.0 meV/Å." in text
    assert (
        "| ours | 2 | 10.0 ± 0.0 | 40 ± 0 | 20, 20 | 8 ± 0 | 0.75 (12/16) | 0.60 (12/20) |" in text
    )
    assert "| random | 2 | 40.0 ± 0.0 | 40 ± 0 | 40, 40 | 8 ± 0 | n/a (0/0) | n/a (0/0) |" in text
    assert "| ours_biased |" not in text and "| force_magnitude |" not in text  # no rows
    assert "Status: partial (3 seeds wanted; finished: random 0, 1; force_magnitude none;" in text
    assert f"- {summary['verdicts'][0]}" in text and summary["verdicts"][0].endswith("met.")
    assert "| ours | 80.0 @ 10 | 20.0 @ 25 | 10.0 @ 40 |" in text
    assert "| committee5 | 1200 | 2 | 1 | 1.500 of 2 |" in text
    assert f"- Command: `{command}`" in text and "- Date: 2026-12-05 10:00" in text
    assert "- Machine: Linux x86_64, 2 CPUs" in text

    # a tag without records: an empty page, still written
    empty = report.write_report(tmp_path, "none").read_text()
    assert "Targets not evaluated" in empty
    assert np.isnan(json.loads((tmp_path / "active_learning.json").read_text())["target_meV_A"])


def test_the_3bpa_loop_retrained_from_scratch_gets_its_own_section(tmp_path):
    for r in _records():
        append_jsonl(tmp_path / "active_learning.jsonl.gz", r)
    for strategy, errors in (("random", [100.0, 50.0]), ("ours", [100.0, 30.0])):
        for r in _run(strategy, 0, [20, 30], errors, initial=2.0, md=1.0, score=0.5,
                      retrain=9.0, tag=report.SCRATCH_TAG):  # fmt: skip
            append_jsonl(tmp_path / "active_learning.jsonl.gz", r)
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("## The loop retrained from scratch every round (3BPA)") :]
    assert "Target = random's final error in these runs, 50.0 meV/Å." in section
    assert "| ours | 1 | 30.0 ± 0.0 |" in section
    assert "Final error: ours 30.0 ± 0.0 against random's 50.0 ± 0.0 meV/Å" in section
    assert "target = random's final error, 40.0 meV/Å." in text  # the main table's own
    assert "tag `scratch`" not in text
    assert (
        "With the loop retrained from scratch every round (section below), ours ends at 30.0 ± "
        "0.0 meV/Å against random's 50.0 ± 0.0: the warm-started retraining hid part" in text
    )
    assert (
        "The committee was not run in this protocol" in section
        and "committee's model CPU" not in section
    )
    for r in _run("committee5", 0, [20, 30], [100.0, 20.0], initial=20.0, md=5.0, score=1.0,
                  retrain=90.0, tag=report.SCRATCH_TAG):  # fmt: skip
        append_jsonl(tmp_path / "active_learning.jsonl.gz", r)
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("## The loop retrained from scratch every round (3BPA)") :]
    assert "The committee was not run in this protocol" not in section
    assert "- ours needs " in section and "the committee's oracle calls" in section
    assert "(target <= 1.1x): met." in section  # ours reached random's final error
    assert "- ours spends 0.11x the committee's model CPU time (target <= 0.4x): met." in section


def test_wide_pool_runs_get_their_own_folders_overrides_and_section(tmp_path):
    """--wide-pool: MD 5x the config's steps, run folders <strategy>[_scratch]_wide, tags wide
    and scratch_wide, and a section per protocol with the logged frames and the label target."""
    wide = benchmark.wide_pool({"overrides": ["rounds=2"]}, benchmark.THREE_BPA)
    assert wide["overrides"] == ["rounds=2", "md.steps=3000"]  # 5 x the shipped 600
    items = benchmark.run_overrides("ours", 0, tmp_path, tmp_path / "m.pt", wide)
    assert f"out={tmp_path / 'ours_wide'}" in items and "md.steps=3000" in items
    assert load_active_config(benchmark.CONFIG, wide["overrides"]).md.steps == 3000
    scratch = benchmark.wide_pool({"overrides": [benchmark.SCRATCH]}, benchmark.THREE_BPA)
    assert benchmark.run_name("random", scratch) == "random_scratch_wide"
    assert benchmark.parse_args(["--wide-pool"]).wide_pool

    for r in _records():
        append_jsonl(tmp_path / "active_learning.jsonl.gz", r)
    for strategy, errors in (("random", [100.0, 50.0]), ("ours", [100.0, 30.0])):
        for r in _run(strategy, 0, [20, 30], errors, initial=2.0, md=1.0, score=0.5,
                      retrain=9.0, tag="wide"):  # fmt: skip
            append_jsonl(tmp_path / "active_learning.jsonl.gz", {**r, "n_md_frames": 151})
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("## A wider pool, fine-tuned each round (3BPA)") :]
    assert "MD 5x longer at the same logging interval (`--wide-pool`): a round logs 151" in section
    assert "Target = random's final error in these runs, 50.0 meV/Å." in section
    assert "| ours | 1 | 30.0 ± 0.0 |" in section
    # random reaches 50 at 30 calls, ours at 20 + 10 x 50/70 = 27.1: 0.90x
    assert "ours reaches random's final error with 0.90x random's oracle calls" in section
    assert "The committee was not run in this protocol." in section
    assert (
        "- Choosing the labels among 5x more MD frames per round (fine-tuned each round, section "
        "'A wider pool'), ours ends at 30.0 ± 0.0 meV/Å against random's 50.0 ± 0.0, at 0.90x "
        "random's calls to its final error: a wider pool does not bring it within the 0.6x target."
        in text
    )
    assert "tag `wide`" not in text and "retrained from scratch every round (3BPA)" not in text
    wide_json = json.loads((tmp_path / "active_learning.json").read_text())["wide_pool"]
    assert set(wide_json) == {"wide"} and wide_json["wide"]["ours"]["final_error"]["mean"] == 30
    assert "Same seed sets and initial models as above." in section
    # runs on another generation of the reference sets: said, and their rows kept apart
    runs = tmp_path / "active_learning_runs.jsonl"
    append_jsonl(runs, {"command": "c", "tag": "full"})  # an older record: no checksums
    append_jsonl(runs, {"command": "c", "tag": "wide", "references": {"md_300K": "ab"}})
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("## A wider pool, fine-tuned each round (3BPA)") :]
    assert "reference sets generated again for them" in section and "compare its rows" in section
    append_jsonl(runs, {"command": "c", "tag": "scratch_wide", "references": {"md_300K": "ab"}})
    assert report.other_references(read_jsonl(runs), "wide", besides=["scratch_wide"])
    assert not report.other_references(read_jsonl(runs), "wide")  # the same sets as scratch_wide
    append_jsonl(runs, {"command": "c", "tag": "full", "references": {"md_300K": "ab"}})
    assert not report.other_references(read_jsonl(runs), "wide", besides=["scratch_wide"])


def test_reference_checksums_read_the_manifest(tmp_path):
    assert benchmark.reference_checksums(tmp_path) == {}
    manifest = {"settings": {}, "sets": {"md_300K": {"sha256": "ab", "frames": 2}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert benchmark.reference_checksums(tmp_path) == {"md_300K": "ab"}


def test_the_selection_variants_get_their_section_with_the_pool_ranking(tmp_path):
    """ours_top and true_error beside ours and random in the loop retrained from scratch: calls
    to random's final error as a ratio, and the true_error runs' pool Spearman per round."""
    for r in _records():
        append_jsonl(tmp_path / "active_learning.jsonl.gz", r)
    runs = (("random", [100.0, 50.0]), ("ours", [100.0, 60.0]), ("ours_top", [100.0, 40.0]),
            ("true_error", [100.0, 25.0]))  # fmt: skip
    for strategy, errors in runs:
        for r in _run(strategy, 0, [20, 30], errors, initial=2.0, md=1.0, score=0.5,
                      retrain=9.0, tag=report.SCRATCH_TAG):  # fmt: skip
            append_jsonl(tmp_path / "active_learning.jsonl.gz", {**r, "n_md_frames": 31})
    pool = {"strategy": "true_error", "tag": report.SCRATCH_TAG, "system": "3bpa", "round": 0,
            "n_frames": 31, "n_labelled": 30, "mean_max_force_error": 9.0,
            "spearman_sigma": 0.7, "spearman_force": 0.6}  # fmt: skip
    for seed, rho in ((0, 0.7), (1, 0.5)):
        append_jsonl(
            tmp_path / "active_learning_pool.jsonl", {**pool, "seed": seed, "spearman_sigma": rho}
        )
    append_jsonl(tmp_path / "active_learning_pool.jsonl", {**pool, "seed": 0, "tag": "full"})
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("### How much the score chooses (3BPA, the loop retrained") :]
    assert "A round logs 31 MD frames and labels 10." in section
    # random reaches its own final error (50) at 30 calls; ours never does (60 at 30 calls)
    assert "| random | 1 | 50.0 ± 0.0 | 30 | 1.00 |" in section
    assert "| ours | 1 | 60.0 ± 0.0 | 30 (not every seed reached it) | 1.00 |" in section
    assert "| ours_top | 1 | 40.0 ± 0.0 | 28 | 0.94 |" in section  # 20 + 10 x (100-50)/(100-40)
    assert "| true_error | 1 | 25.0 ± 0.0 | 27 | 0.89 |" in section
    per_set = section[section.index("Final models per reference set:") :]
    assert "| true_error | 19 ± 0 / 28 ± 0, 2 ± 0 |" in per_set  # md_300K: 0.75 x 25 meV/A
    assert "the loop needs 0.89x random's oracle calls to random's final error: above" in section
    assert "`ours_early`" not in section.split("| strategy |")[1]  # not run: no row, no sentence
    early = _run("ours_early", 0, [20, 30], [100.0, 45.0], initial=2.0, md=1.0, score=0.5,
                 retrain=9.0, tag=report.SCRATCH_TAG)  # fmt: skip
    for r, n in zip(early, (13, None), strict=True):
        append_jsonl(tmp_path / "active_learning.jsonl.gz", {**r, "n_md_frames": n})
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("### How much the score chooses (3BPA, the loop retrained") :]
    assert "| ours_early | 1 | 45.0 ± 0.0 |" in section
    assert "`ours_early`'s MD stopped at its tenth flagged frame in 1 of 1 rounds" in section
    assert (
        "labelling the frames with the largest true force error (true_error, section 'How much "
        "the score chooses') ends at 25.0 ± 0.0 meV/Å against random's 50.0, at 0.89x random's "
        "calls to its final error: the frames where the model is most wrong teach the reference "
        "sets more than a uniform draw, so a better error ranking, which is what sigma_F offers, "
        "cannot reach the 0.6x target" in text
    )
    # two seeds of the scratch tag on round 0 (the full-tag record is another protocol's)
    assert "| 0 | 2 | 60 | 9.00 ± 0.00 | 0.60 ± 0.10 | 0.60 ± 0.00 |" in section
    summary = report.summarise(
        [r for r in read_jsonl(tmp_path / "active_learning.jsonl.gz") if r["tag"] == "full"], []
    )
    assert report.selection_section(summary["strategies"], [], system="x", frames=31) == []
    met = _run("random", 0, [20, 40], [100.0, 50.0], initial=2.0, md=1.0, score=0.5, retrain=9.0)
    met += _run("true_error", 0, [20, 40], [45.0, 25.0], initial=2.0, md=1.0, score=0.5,
                retrain=9.0)  # fmt: skip
    lines = report.selection_section(
        report.summarise(met, [])["strategies"], [], system="x", frames=31
    )
    assert any(
        "needs 0.50x random's oracle calls" in x and "would meet the target" in x for x in lines
    )
    assert "How much the score chooses (3BPA, fine-tuned" not in text
    for r in _run("true_error", 0, [20, 30, 40], [100.0, 70.0, 50.0], initial=2.0, md=1.0,
                  score=0.5, retrain=1.5):  # fmt: skip
        append_jsonl(tmp_path / "active_learning.jsonl.gz", r)
    text = report.write_report(tmp_path, "full").read_text()
    warm = text[text.index("## How much the score chooses (3BPA, fine-tuned each round)") :]
    assert warm.index("| true_error | 1 | 50.0 ± 0.0 |") < warm.index("## The loop retrained")


def test_refit_final_trains_from_scratch_on_the_final_data_once(tmp_path):
    """The final frames of a finished run -> a model from scratch (quick sizes), evaluated on
    every reference set; one record per (strategy, seed, tag), not redone."""
    from mlip_unc.active.data import oracle_md
    from mlip_unc.config import GenerateSettings

    start = _cluster()
    frames = oracle_md(start, EMT(), GenerateSettings(frames=6, interval=2, equilibration=0))
    run = tmp_path / "ours" / "round_0" / "retrained"
    run.mkdir(parents=True)
    write(run / "train.xyz", frames[:4])
    write(run / "valid.xyz", frames[4:])
    state = {"config": {"rounds": 1}, "rounds": [{"model": str(run / "model.pt")}]}
    (tmp_path / "ours" / "state.json").write_text(json.dumps(state))
    for name in benchmark.REFERENCE_SETS:
        write(tmp_path / f"test_{name}.xyz", frames[4:])
    out = tmp_path / "out"
    out.mkdir()
    benchmark.refit_final("ours", 0, tmp_path, benchmark.QUICK, out, "t")
    benchmark.refit_final("ours", 0, tmp_path, benchmark.QUICK, out, "t")
    (row,) = read_jsonl(out / benchmark.REFIT_RECORDS)
    assert (row["strategy"], row["seed"], row["n_train"]) == ("ours", 0, 4)
    assert all(row[f"{n}_force_mae"] > 0 for n in benchmark.REFERENCE_SETS)
    assert (tmp_path / "refit_ours" / "model.pt").is_file() and report.error(row) > 0


def test_run_one_refuses_a_run_another_live_process_holds(tmp_path, monkeypatch):
    """Two invocations on one run folder would both write it: the second stops at the lock."""
    import os

    monkeypatch.setattr(benchmark, "initial_model", lambda *a: (tmp_path / "m.pt", 0.0))
    called = []
    monkeypatch.setattr(
        "mlip_unc.active.loop.run_active_learning", lambda *a, **k: called.append(1) or []
    )
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / ".lock").write_text(str(os.getppid()))  # a live process, not this one
    with pytest.raises(SystemExit, match="another active-learning run"):
        benchmark.run_one("ours", 0, tmp_path, benchmark.QUICK, tmp_path, "t")
    (tmp_path / "ours" / ".lock").write_text("999999999")  # a dead one: taken over
    assert benchmark.run_one("ours", 0, tmp_path, benchmark.QUICK, tmp_path, "t") == []
    assert called == [1]


class _Flaky(Calculator):
    """EMT, except on frames whose first atom sits beyond x = 100 (an oracle failure)."""

    implemented_properties = ["energy", "forces"]

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        from ase.calculators.calculator import CalculationFailed

        super().calculate(atoms, properties, system_changes)
        if self.atoms.positions[0, 0] > 100:
            raise CalculationFailed("no SCF")
        emt = EMT()
        self.results = {
            "energy": emt.get_potential_energy(self.atoms),
            "forces": emt.get_forces(self.atoms),
        }


def test_true_error_score_ranks_by_the_largest_force_error_and_records_each_round_once(tmp_path):
    import torch

    from mlip_unc.calculator import UncertaintyCalculator
    from mlip_unc.models.potential import BayesianPotential, build_backbone

    rng = np.random.default_rng(0)
    base = bulk("Cu", cubic=True, a=3.61)
    frames = []
    for k in range(5):
        atoms = base.copy()
        atoms.positions += rng.normal(scale=0.02 * (k + 1), size=atoms.positions.shape)
        frames.append(atoms)
    frames[4].positions[0, 0] += 200.0  # the oracle fails on it
    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=1, r_max=4.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(backbone, [29], 4.0, torch.tensor([-0.01]), init_std=0.3).double()
    calc = UncertaintyCalculator(model, uncertainty="exact")
    tags = {"strategy": "true_error", "seed": 0, "tag": "t", "system": "si"}
    path = tmp_path / "pool.jsonl"
    score = benchmark.TrueErrorScore(_Flaky(), tmp_path / "labels", path, tags)
    got = score(calc, frames, 0)
    assert got[4] == -np.inf
    for k in range(4):
        calc.calculate(frames[k].copy(), ["forces"])
        error = np.linalg.norm(calc.results["forces"] - EMT().get_forces(frames[k]), axis=1).max()
        assert got[k] == pytest.approx(error)
    score(calc, frames, 0)  # a resumed round: no second record
    score(calc, frames, 1)
    rows = read_jsonl(path)
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[0]["n_frames"] == 5 and rows[0]["n_labelled"] == 4
    assert rows[0]["max_max_force_error"] == pytest.approx(max(got[:4]))
    assert -1 <= rows[0]["spearman_sigma"] <= 1 and -1 <= rows[0]["spearman_force"] <= 1
    assert all(rows[0][k] == v for k, v in tags.items())
    # labels over max_label_force would be dropped by the loop: they rank below every kept frame
    largest = [np.abs(EMT().get_forces(frames[k])).max() for k in range(4)]
    limit = float(np.sort(largest)[-2] + 1e-6)  # only the frame with the largest forces is over
    capped = benchmark.TrueErrorScore(_Flaky(), tmp_path / "labels", path, tags, limit)(
        calc, frames, 1
    )
    over = int(np.argmax(largest))
    assert capped[over] == -1.0 and capped[4] == -np.inf
    assert all(capped[k] == pytest.approx(got[k]) for k in range(4) if k != over)


def test_censored_bound_says_when_the_ratio_is_an_upper_bound():
    reach = {"0": {"calls": 80, "reached": False}, "1": {"calls": 37, "reached": True}}
    assert report.censored_bound({"1": reach["1"]}, "random", 60.0, 0.6) == ""
    note = report.censored_bound(reach, "random", 60.0, 0.6)
    assert note == (
        "random: 1 of 2 seeds never reach it and count at their final calls, so the ratio is an "
        "upper bound: missed as measured, met only if random took at least 100 calls on average"
    )
    assert report.censored_bound(reach, "random", 60.0, None).endswith("an upper bound")


def test_dropped_labels_counts_the_spent_calls_that_trained_nothing():
    records = [
        {"strategy": "random", "n_labelled": 7, "n_dropped": 3},
        {"strategy": "random", "n_labelled": 10},
        {"strategy": "ours", "n_labelled": 10, "n_dropped": 0},
        {"strategy": "ours"},  # the final model's row: no labels
    ]
    assert report.dropped_labels(records, ["random", "ours"]) == (
        "Chosen frames whose labels were dropped (the oracle failed, or their reference forces "
        "exceed max_label_force): oracle calls that trained nothing: random 3 of 20, "
        "ours 0 of 10."
    )
    assert report.dropped_labels(records[1:], ["random", "ours"]) == ""
