"""On-the-fly active learning: seed set, fixed validation, geometry stop, triggers, budget end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ase.build import bulk, molecule
from ase.calculators.emt import EMT

from mlip_unc.active.guard import GeometryGuard
from mlip_unc.active.onthefly import choose_labels, run_on_the_fly
from mlip_unc.active.seed import isolated_atoms, seed_frames
from mlip_unc.active.triggers import Trigger, temperature_line
from mlip_unc.config import (
    ActiveLearningConfig,
    GuardSettings,
    OnTheFlySettings,
    SeedSettings,
)
from mlip_unc.config.loader import load_raw, validate
from mlip_unc.data.readers import read_structures


def test_seed_frames_are_spaced_shared_over_temperatures_and_validation_is_separate():
    start = bulk("Cu", "fcc", a=3.61, cubic=True)
    settings = SeedSettings(
        temperatures=[300, 900],
        frames=5,
        valid_frames=3,
        spacing_fs=100,
        timestep=5.0,
        equilibration_fs=50,
    )
    train, valid = seed_frames(start, EMT(), settings)
    assert len(train) == 5 and len(valid) == 3
    assert [a.info["seed_temperature"] for a in train] == [300, 300, 300, 900, 900]
    assert [a.info["seed_temperature"] for a in valid] == [300, 300, 900]
    for a in train + valid:  # labelled by the oracle itself
        ref = a.copy()
        ref.calc = EMT()
        np.testing.assert_allclose(a.get_forces(), ref.get_forces(), atol=1e-10)
    # consecutive frames 100 fs apart, not copies: they differ by thermal motion
    assert np.abs(train[0].positions - train[1].positions).max() > 0.01
    # validation comes from its own trajectory
    assert not any(np.allclose(v.positions, t.positions) for v in valid for t in train)


def test_validation_frames_span_their_own_temperatures_and_training_frames_stay():
    start = bulk("Cu", "fcc", a=3.61, cubic=True)
    base = dict(temperatures=[300, 900], frames=4, spacing_fs=100, timestep=5.0)
    settings = SeedSettings(**base, valid_frames=4, valid_temperatures=[300, 600, 900, 1200])
    train, valid = seed_frames(start, EMT(), settings)
    assert [a.info["seed_temperature"] for a in valid] == [300, 600, 900, 1200]
    same_train, old_valid = seed_frames(start, EMT(), SeedSettings(**base, valid_frames=2))
    for a, b in zip(train, same_train, strict=True):  # the training trajectories are unchanged
        np.testing.assert_array_equal(a.positions, b.positions)
    np.testing.assert_array_equal(valid[0].positions, old_valid[0].positions)  # 300 K: seed + 1


def test_per_temperature_level_reads_a_line_through_the_validation_scores():
    assert temperature_line([300, 300, 600, 1200], [1.0, 1.2, 1.4, 2.3]) == pytest.approx(
        tuple(np.polyfit([300, 300, 600, 1200], [1.0, 1.2, 1.4, 2.3], 1)[::-1])
    )
    with pytest.raises(ValueError, match="two temperatures"):
        temperature_line([300, 300], [1.0, 2.0])
    settings = OnTheFlySettings(trigger="max_force", threshold=2.0, level="per_temperature")
    trigger = Trigger(settings, np.random.default_rng(0))
    calc = EMT()
    valid = []
    for k, (t, amp) in enumerate([(300, 0.02), (300, 0.03), (900, 0.08), (900, 0.09)]):
        v = bulk("Cu", cubic=True)
        v.rattle(amp, seed=k)
        v.info["seed_temperature"] = t
        valid.append(v)
    trigger.level_for(calc, valid)
    scores = [np.linalg.norm(calc.get_forces(v), axis=1).max() for v in valid]
    intercept, slope = np.polyfit([300, 300, 900, 900], scores, 1)[::-1]
    assert trigger.level == pytest.approx(np.mean(scores))
    assert trigger.level_at(900) == pytest.approx(intercept + slope * 900)
    assert trigger.level_at(900) > trigger.level_at(300)
    assert trigger.level_at(None) == trigger.level  # no temperature: the mean
    assert trigger.level_at(-1e6) == pytest.approx(0.1 * trigger.level)  # floored
    # a frame between the two thresholds fires at 300 K and not at 900 K
    frame = bulk("Cu", cubic=True)
    frame.rattle(0.1, seed=5)
    score = np.linalg.norm(calc.get_forces(frame), axis=1).max()
    assert 2 * trigger.level_at(300) < score < 2 * trigger.level_at(900)
    assert trigger.fires(calc, frame, 300.0) == (True, pytest.approx(score))
    assert trigger.fires(calc, frame, 900.0)[0] is False


def test_per_temperature_level_needs_validation_at_two_temperatures():
    raw = load_raw("configs/al_xtb_3bpa.yaml")
    raw["seed_set"] = {**raw["seed_set"], "temperatures": [300], "valid_temperatures": None}
    raw["on_the_fly"] = {**raw["on_the_fly"], "level": "per_temperature"}
    with pytest.raises(ValueError, match="two temperatures"):
        validate(ActiveLearningConfig, raw)


def test_seed_spacing_below_100_fs_is_refused():
    with pytest.raises(ValueError, match="spacing_fs"):
        SeedSettings(spacing_fs=50)


def test_isolated_atoms_of_the_emt_oracle():
    (cu,) = isolated_atoms("emt", ["Cu"])
    assert len(cu) == 1 and cu.symbols[0] == "Cu"
    ref = cu.copy()
    ref.cell, ref.pbc = np.eye(3) * 20, True
    ref.calc = EMT()
    assert cu.get_potential_energy() == pytest.approx(ref.get_potential_energy())


def test_guard_stops_a_stretched_bond_and_two_close_atoms_not_a_thermal_frame():
    water = molecule("H2O")
    guard = GeometryGuard.from_structure(water, GuardSettings())
    assert len(guard.pairs) == 2  # the two O-H bonds
    thermal = water.copy()
    thermal.positions += np.random.default_rng(0).normal(0, 0.03, (3, 3))
    assert guard.check(thermal) is None
    stretched = water.copy()
    stretched.positions[1] = stretched.positions[0] + 1.6 * (
        stretched.positions[1] - stretched.positions[0]
    )
    assert "bond 0-1 at 1.60x" in guard.check(stretched)
    crushed = water.copy()
    crushed.positions[2] = crushed.positions[1] + [0.3, 0, 0]
    assert guard.check(crushed) is not None


def test_guard_of_a_crystal_checks_distances_only():
    si = bulk("Si", "diamond", a=5.43, cubic=True)
    guard = GeometryGuard.from_structure(si, GuardSettings())
    assert len(guard.pairs) == 0  # bonds may rearrange in a hot crystal
    close = si.copy()
    close.positions[1] = close.positions[0] + [0.5, 0, 0]
    assert "0.50 A apart" in guard.check(close)


def test_guard_of_a_molecule_in_a_large_empty_cell_uses_no_cell_list(monkeypatch):
    """The 3BPA files hold the molecule in a 50 A non-periodic cell: ASE's cell list would bin
    it at 0.7 A (about 0.5 s a check); the guard searches the positions instead."""
    from mlip_unc.active import guard as guard_module

    water = molecule("H2O")
    water.cell = [50.0, 50.0, 50.0]
    guard = GeometryGuard.from_structure(water, GuardSettings())

    def no_cell_list(*args, **kwargs):
        raise AssertionError("cell-list search on a non-periodic structure")

    monkeypatch.setattr(guard_module, "neighbor_list", no_cell_list)
    crushed = water.copy()
    crushed.positions[2] = crushed.positions[1] + [0.3, 0.4, 0]
    assert guard.check(crushed) == "atoms 1 and 2 0.50 A apart (< 0.7 A)"
    assert guard.check(water) is None


def test_periodic_and_relative_triggers():
    rng = np.random.default_rng(0)
    periodic = Trigger(OnTheFlySettings(trigger="periodic", every=3), rng)
    atoms = bulk("Cu")
    assert [periodic.fires(None, atoms)[0] for _ in range(7)] == [
        False,
        False,
        True,
        False,
        False,
        True,
        False,
    ]
    atoms.calc = EMT()
    rel = Trigger(OnTheFlySettings(trigger="max_force", threshold=2.0), rng)
    valid = []
    for s in range(3):
        v = bulk("Cu", cubic=True)
        v.rattle(0.05, seed=s)
        valid.append(v)
    calc = EMT()
    level = rel.level_for(calc, valid)
    forces = [np.linalg.norm(calc.get_forces(v), axis=1).max() for v in valid]
    assert level == pytest.approx(np.mean(forces))
    hot = bulk("Cu", cubic=True)
    hot.rattle(0.3, seed=9)
    fired, score = rel.fires(calc, hot)
    assert fired == (score > 2 * level) and fired


def test_choose_labels_keeps_the_first_flagged_frame():
    frames = []
    for s in range(6):
        a = bulk("Cu", cubic=True)
        a.rattle(0.02 * (s + 1), seed=s)
        frames.append(a)
    chosen = choose_labels(frames, 3)
    assert len(chosen) == 3 and chosen[0] is frames[0]


def _config(tmp_path, training, **otf):
    return ActiveLearningConfig.model_validate(
        {
            "out": str(tmp_path / "run"),
            "oracle": "emt",
            "structures": {"bulk": "Cu", "crystalstructure": "fcc", "a": 3.61, "cubic": True},
            "mode": "on_the_fly",
            "seed_set": {
                "temperatures": [300, 600],
                "frames": 4,
                "valid_frames": 3,
                "timestep": 5.0,
                "equilibration_fs": 50,
            },
            "isolated_atoms": "oracle",
            "training": training,
            "retrain_epochs": 1,
            "temperatures": [300, 900],
            "md": {"timestep": 2.0, "interval": 5, "friction": 0.02},
            "on_the_fly": {
                "segment_fs": 40,
                "hold_ps": 0.04,
                "final_ps": 0.08,
                "labels_per_update": 2,
                "window": 2,
                **otf,
            },
        }
    )


def test_budget_end_fixed_validation_and_no_broken_frame_labelled(tmp_path, tiny_training):
    config = _config(tmp_path, tiny_training, trigger="periodic", every=2, max_calls=11)
    result = run_on_the_fly(config)
    assert result.ended == "budget" and result.calls == 11
    assert [r["calls"] for r in result.rows][0] == 7  # seed 4 + validation 3
    out = tmp_path / "run"
    valid0 = read_structures(out / "data" / "valid.xyz")
    guard = GeometryGuard.from_structure(bulk("Cu", "fcc", a=3.61, cubic=True), config.guard)
    for row in result.rows[1:]:
        folder = (out / row["model"]).parent if not row["model"].startswith("/") else None
        folder = folder or __import__("pathlib").Path(row["model"]).parent
        valid = read_structures(folder / "valid.xyz")
        assert [v.positions.tolist() for v in valid] == [v.positions.tolist() for v in valid0]
        for frame in read_structures(folder / "train.xyz")[4:]:
            assert guard.check(frame) is None
    lines = (out / "updates.jsonl").read_text().splitlines()
    assert len(lines) == len(result.rows)
    assert json.loads(lines[-1])["calls"] == 11
    iso = read_structures(out / "data" / "isolated_atoms.xyz", require_forces=False)
    assert len(iso) == 1 and len(iso[0]) == 1
    assert (out / "report.md").is_file() and (out / "updates.png").is_file()


def test_a_model_that_never_flags_climbs_the_ladder_and_completes(tmp_path, tiny_training):
    config = _config(tmp_path, tiny_training, trigger="uncertainty", threshold=1e9)
    result = run_on_the_fly(config)
    assert result.ended == "completed" and result.calls == 7
    assert len(result.rows) == 1
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["md"]["t_index"] == 1  # reached the top of the ladder
    assert state["md"]["md_fs"] >= 1000 * (0.04 + 0.08)


def test_resume_continues_without_new_oracle_calls_for_done_work(tmp_path, tiny_training):
    config = _config(tmp_path, tiny_training, trigger="periodic", every=2, max_calls=9)
    first = run_on_the_fly(config)
    again = run_on_the_fly(config, resume=True)
    assert again.calls == first.calls and len(again.rows) == len(first.rows)
    with pytest.raises(FileExistsError):
        run_on_the_fly(config)


def test_an_oracle_that_cannot_label_the_elements_fails_before_any_work(tmp_path, tiny_training):
    from mlip_unc.active.oracles import OracleError

    config = _config(tmp_path, tiny_training).updated(
        structures={"bulk": "Si", "crystalstructure": "diamond", "a": 5.43, "cubic": True}
    )
    with pytest.raises(OracleError, match="Si"):
        run_on_the_fly(config)
    assert not (tmp_path / "run").exists()


def test_a_geometry_stop_restarts_md_and_labels_only_physical_frames(tmp_path, tiny_training):
    """A guard that thermal Cu breaks within femtoseconds (no two atoms closer than 2.45 A,
    nearest neighbours at 2.55 A): every segment stops, nothing is flagged, so each stop labels
    the segment's last good frame (a rescue) and MD starts the segment again."""
    config = _config(tmp_path, tiny_training, trigger="uncertainty", threshold=1e9, max_calls=9)
    config = config.updated(guard={"min_distance": 2.45})
    result = run_on_the_fly(config)
    assert result.ended == "budget" and result.calls == 9
    updates = result.rows[1:-1]  # the last row: the final refit
    assert result.rows[-1]["refit"] and result.rows[-1]["calls"] == 9
    assert len(updates) == 2 and all(r["rescue"] and r["n_flagged"] == 0 for r in updates)
    assert updates[-1]["geometry_stops"] >= 2
    guard = GeometryGuard.from_structure(bulk("Cu", "fcc", a=3.61, cubic=True), config.guard)
    labels = read_structures(tmp_path / "run" / "update_2" / "train.xyz")[4:]
    assert len(labels) == 2 and all(guard.check(a) is None for a in labels)


def test_periodic_labels_keep_time_on_the_ladder_and_complete(tmp_path, tiny_training):
    """periodic judges nothing: its labels do not hold MD back at a rung (hold_ps of MD there,
    labels or not, then the next; final_ps at the top ends the run)."""
    config = _config(tmp_path, tiny_training, trigger="periodic", every=3, max_calls=60)
    result = run_on_the_fly(config)
    assert result.ended == "completed" and 7 < result.calls < 60
    assert len(result.rows) > 2  # labelled on the way
    # the kept trajectory: the ladder's MD time (hold_ps, then final_ps at the top), no more
    kept = [r["kept_frames"] for r in result.rows]
    assert kept == sorted(kept) and kept[-1] * 5 * 2.0 >= 1000 * (0.04 + 0.08)
    assert kept[-1] <= result.rows[-1]["monitored"]
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["md"]["t_index"] == 1
    assert {r["temperature"] for r in result.rows[1:]} == {300.0, 900.0}


def test_time_ladder_climbs_and_ends_on_md_time_whatever_the_trigger_says(tmp_path, tiny_training):
    """ladder: time with a trigger that fires on every frame (threshold ~0): the same MD
    schedule as a run that never flags, labels all along."""
    config = _config(
        tmp_path, tiny_training, trigger="uncertainty", threshold=1e-9, ladder="time", max_calls=80
    )
    result = run_on_the_fly(config)
    assert result.ended == "completed" and result.calls < 80 and len(result.rows) > 2
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["md"]["t_index"] == 1


def test_final_refit_trains_from_scratch_on_every_label_without_an_oracle_call(
    tmp_path, tiny_training
):
    """The run ends with a model trained anew (no warm start) on the last update's training
    set; it is the result's model, costs no call, and a resumed run does not train it again."""
    config = _config(tmp_path, tiny_training, trigger="periodic", every=2, max_calls=11)
    result = run_on_the_fly(config)
    out = tmp_path / "run"
    refit, last = result.rows[-1], result.rows[-2]
    assert refit["refit"] and refit["calls"] == last["calls"] == 11
    assert result.model == out / "refit" / "model.pt" and result.model.is_file()
    assert load_raw(out / "refit" / "config.yaml")["train"]["init_from"] is None
    assert load_raw(Path(last["model"]).parent / "config.yaml")["train"][
        "init_from"
    ]  # the updates before it were fine-tuned
    trained = read_structures(Path(last["model"]).parent / "train.xyz")
    assert len(read_structures(out / "refit" / "train.xyz")) == len(trained)
    assert "| refit |" in (out / "report.md").read_text()
    again = run_on_the_fly(config, resume=True)
    assert len(again.rows) == len(result.rows) and again.model == result.model

    plain = config.updated(
        out=str(tmp_path / "plain"),
        on_the_fly={**config.on_the_fly.model_dump(), "final_refit": False},
    )
    assert not any(r.get("refit") for r in run_on_the_fly(plain).rows)
