"""The on-the-fly active-learning benchmark: arms, rates, milestones, the usable rule, the page."""

from __future__ import annotations

import pytest

from benchmarks.active_learning import onthefly as otf
from benchmarks.active_learning import onthefly_report as report
from mlip_unc.config import load_active_config


def _errors(force: float, energy: float = 10.0) -> dict:
    return {
        s: {"force_mae": force, "energy_mae": energy, "p95_max_force_error": 3 * force}
        for s in otf.SETS
    }


def test_every_arm_is_a_valid_override_of_the_shipped_config():
    for arm in otf.ARMS:
        config = load_active_config(otf.CONFIG, otf.arm_overrides(arm, 12))
        assert config.mode == "on_the_fly"
    assert load_active_config(otf.CONFIG, otf.arm_overrides("periodic", 12)).on_the_fly.every == 12
    random = load_active_config(otf.CONFIG, otf.arm_overrides("random", 8)).on_the_fly
    assert random.trigger == "random" and random.probability == pytest.approx(1 / 8)
    assert load_active_config(otf.CONFIG, otf.arm_overrides("committee5", 1)).committee == 5


def test_periodic_rate_is_the_median_monitored_frames_per_label_of_ours():
    records = [
        {"arm": "ours", "monitored": 400, "calls": 76, "seed_calls": 36},  # 10 per label
        {"arm": "ours", "monitored": 600, "calls": 56, "seed_calls": 36},  # 30
        {"arm": "ours", "monitored": 800, "calls": 76, "seed_calls": 36},  # 20
        {"arm": "random", "monitored": 5, "calls": 40, "seed_calls": 36},
    ]
    assert otf.periodic_rate(records) == 20
    assert otf.periodic_rate([]) == 20
    kept = [{**r, "kept_frames": r["monitored"] // 2} for r in records]  # half were windows
    assert otf.periodic_rate(kept) == 10


def test_periodic_and_random_label_one_frame_per_flag_without_a_window():
    for arm in ("periodic", "random"):
        otf_settings = load_active_config(otf.CONFIG, otf.arm_overrides(arm, 9)).on_the_fly
        assert otf_settings.window == 0 and otf_settings.labels_per_update == 1
    assert load_active_config(otf.CONFIG, otf.arm_overrides("ours", 9)).on_the_fly.window == 10


def test_milestone_models_are_those_a_run_had_at_each_call_count():
    rows = [
        {"calls": 36, "model": "m0"},
        {"calls": 48, "model": "m1"},
        {"calls": 52, "model": "m2"},
        {"calls": 80, "model": "m3"},
    ]
    assert otf.milestone_models(rows) == {50: "m1", 75: "m2", 80: "m3"}


def test_usable_needs_every_set_within_its_limit():
    reference = _errors(100.0, 10.0)
    assert otf.usable(_errors(125.0, 20.0), reference)
    assert not otf.usable(_errors(126.0, 20.0), reference)  # 300/600 K limit 1.25x
    assert not otf.usable(_errors(100.0, 21.0), reference)  # energy limit 2x
    hot = _errors(100.0)
    hot["md_1200K"]["force_mae"] = 150.0
    assert otf.usable(hot, reference)
    hot["md_1200K"]["force_mae"] = 151.0
    assert not otf.usable(hot, reference)


def test_page_is_table_first_short_and_counts_runs(tmp_path):
    from benchmarks.common.records import append_jsonl

    references = [
        {"frames": 300, "errors": _errors(100.0), "cpu_model_s": 600.0, "cpu_oracle_s": 60.0},
        {
            "recipe": "full_width",
            "frames": 300,
            "errors": _errors(80.0),
            "cpu_model_s": 1800.0,
            "cpu_oracle_s": 60.0,
        },
    ]
    curve = [{"calls": 36, "md_ps": 0, "temperature": 300, "valid_force_mae": 0.2}]
    records = [
        {
            "arm": "ours",
            "seed": s,
            "calls": 60 + s,
            "ended": "completed",
            "errors": {"50": _errors(200.0), str(60 + s): _errors(110.0)},
            "cpu_model_s": 120.0,
            "cpu_oracle_s": 6.0,
            "curve": curve,
            "labelled": 20,
            "broken_labelled": 0,
        }
        for s in range(2)
    ]
    variant = {
        **records[0],
        "variant": "v2",
        "command": "python -m benchmarks.active_learning --variant v2 --set a.b=1 --set c=2",
    }
    for r in [*records, variant]:
        append_jsonl(tmp_path / otf.RUNS, r)
    for r in references:
        append_jsonl(tmp_path / otf.REFERENCE, r)
    page = report.write_page(tmp_path, "python -m benchmarks.active_learning")
    lines = page.read_text().splitlines()
    assert len(lines) <= 150
    assert any(line.startswith("| arm |") for line in lines[:15])
    ours = next(line for line in lines if line.startswith("| ours |"))
    cells = [c.strip() for c in ours.strip("|").split("|")]
    assert cells[1] == "2 of 5" and cells[2] == "60, 61" and cells[4] == "60, 61"
    assert cells[5] == "110"  # median force MAE at 300 K, meV/A
    assert "(partial)" in lines[0]
    v2 = next(line for line in lines if line.startswith("| ours (v2) |"))
    assert [c.strip() for c in v2.strip("|").split("|")][1:3] == ["1 of 5", "60"]
    assert "Variant `v2`: the shipped config with `a.b=1 c=2`." in lines
    assert any("Broken frames labelled: 0 of the 40 labels" in line for line in lines)
    assert any("at most 1.25x its force MAE" in line and "1.3x: met" in line for line in lines)
    assert any(line.startswith("| full-width recipe (300") for line in lines)
    assert "## 64-atom Si with the mlearn SNAP potential" in lines  # its section, not run yet
    assert (tmp_path / report.FIGURE).stat().st_size > 0
    assert report.calls_to_usable(records[0], references[0]["errors"]) == 60
    assert "- `true_error` usable in fewer calls than `periodic`: not measured (no run)." in lines


def test_true_error_line_gives_the_control_against_periodic_and_its_ratios():
    reference = _errors(100.0, 10.0)
    control = {
        "arm": "true_error",
        "seed": 0,
        "calls": 150,
        "errors": {"150": _errors(110.0, 25.0)},
    }
    periodic = {"arm": "periodic", "seed": 0, "calls": 120, "errors": {"120": _errors(120.0, 15.0)}}
    lines = report.targets(
        {
            "ours": [{**control, "arm": "ours"}],
            "periodic": [periodic],
            "random": [],
            "committee5": [],
            "true_error": [control],
        },
        reference,
    )
    line = next(x for x in lines if x.startswith("- `true_error`"))
    assert ": 150 against 120 (median calls" in line  # never usable: censored at the budget
    assert "forces 1.10/1.10/1.10/1.10x, energies 2.50/2.50/2.50/2.50x" in line


def test_every_arm_is_a_valid_override_of_the_si_config():
    si = otf.SYSTEMS["si"]
    for arm in otf.ARMS:
        config = load_active_config(si.config, otf.arm_overrides(arm, 10))
        assert config.mode == "on_the_fly" and config.isolated_atoms == "oracle"
    assert set(si.force_limits) == set(si.sets) and si.runs != otf.RUNS


def test_refit_line_sets_the_fine_tuned_final_model_beside_the_refit():
    record = {
        "arm": "ours",
        "errors": {"50": _errors(200.0, 300.0), "120": _errors(110.0, 40.0)},
        "errors_before_refit": _errors(115.0, 170.0),
    }
    line = report.refit_line(
        [record, {**record, "arm": "random", "errors_before_refit": None}], otf.SETS
    )
    assert line == (
        "The final refit (worst set, fine-tuned final model → refit): `ours` energy 170 → 40 "
        "meV, forces 115 → 110 meV/Å."
    )
    assert report.refit_line([], otf.SETS) is None


def test_seed_model_is_the_first_row_of_the_run_given_or_trained(tmp_path):
    import json

    assert otf._seed_model(tmp_path) is None  # no run yet
    given = tmp_path / "given.pt"
    given.write_bytes(b"x")
    (tmp_path / "state.json").write_text(json.dumps({"updates": [{"model": str(given)}]}))
    assert otf._seed_model(tmp_path) == given
    given.unlink()
    assert otf._seed_model(tmp_path) is None  # a first row whose model is gone


def test_milestone_sets_are_the_training_files_a_run_had_before_each_milestone():
    from pathlib import Path

    from benchmarks.active_learning.refits import milestone_sets

    rows = [
        {"calls": 36, "model": "u0/model.pt"},
        {"calls": 48, "model": "u1/model.pt"},
        {"calls": 77, "model": "u2/model.pt"},
        {"calls": 90, "model": "u3/model.pt"},
        {"calls": 90, "model": "refit/model.pt", "refit": True},
    ]
    got = milestone_sets(rows, (40, 50, 75, 100))
    # 40: no label yet; 100: beyond the run (its own refit is the final model)
    assert got == {50: (48, Path("u1/train.xyz")), 75: (48, Path("u1/train.xyz"))}


def test_refits_replace_the_fine_tuned_milestones_and_keep_the_final_model():
    run = {"arm": "ours", "seed": 0, "errors": {"50": _errors(200.0), "90": _errors(100.0)}}
    refits = [
        {"arm": "ours", "seed": 0, "milestone": 50, "errors": _errors(120.0)},
        {"arm": "ours", "seed": 1, "milestone": 50, "errors": _errors(999.0)},
    ]
    (merged,) = report.with_refits([run], refits)
    assert merged["errors"]["50"]["md_300K"]["force_mae"] == 120.0
    assert merged["errors"]["90"]["md_300K"]["force_mae"] == 100.0
    assert merged["refit_milestones"] == 1
    assert report.with_refits([run], [])[0]["errors"] == run["errors"]


def test_equal_calls_lines_compare_the_arms_refit_at_each_milestone():
    refits = [
        {"arm": "ours", "seed": 0, "milestone": 100, "errors": _errors(60.0, 30.0)},
        {"arm": "ours", "seed": 1, "milestone": 100, "errors": _errors(80.0, 50.0)},
        {"arm": "random", "seed": 0, "milestone": 100, "errors": _errors(90.0, 20.0)},
        {"arm": "random", "seed": 0, "milestone": 50, "errors": _errors(120.0, 20.0)},
    ]
    fifty, _, hundred, _ = report.equal_calls_lines(refits, otf.SETS)
    assert fifty.startswith("Refit from scratch on the labels of the first 50 calls")
    assert "1 refits): `random` 120 / 120 / 120 / 120 (energy 20)." in fifty
    assert "3 refits): `ours` 70 / 70 / 70 / 70 (energy 40); `random` 90" in hundred


def test_plain_training_rows_say_whether_n_random_pool_frames_are_usable(tmp_path):
    from benchmarks.common.records import append_jsonl

    reference = {"frames": 300, "errors": _errors(100.0), "cpu_model_s": 600.0}
    subsets = [
        {"recipe": "shipped_subset", "frames": n, "errors": _errors(f), "cpu_model_s": 300.0}
        for n, f in ((50, 140.0), (100, 120.0))
    ]
    for r in [reference, *subsets]:
        append_jsonl(tmp_path / otf.REFERENCE, r)
    lines = report.write_page(tmp_path, "").read_text().splitlines()
    rows = {
        n: [
            c.strip() for c in next(x for x in lines if f"({n} random pool frames)" in x).split("|")
        ]
        for n in (50, 100)
    }
    assert rows[50][5] == "no (errors)" and rows[100][5] == "yes (errors)"  # 1.25x limit
    assert rows[100][6] == "120"  # its 300 K force MAE


def test_reference_subset_is_a_seeded_draw_from_the_pool(tmp_path, monkeypatch):
    import numpy as np
    from ase.build import molecule
    from ase.calculators.singlepoint import SinglePointCalculator

    import benchmarks.active_learning.onthefly as mod
    from mlip_unc.active.data import write_frames

    pool = [molecule("H2O") for _ in range(10)]
    for i, a in enumerate(pool):
        a.info["index"] = i
        a.calc = SinglePointCalculator(a, energy=-float(i), forces=np.zeros((3, 3)))
    data = tmp_path / "reference" / "data"
    write_frames(data / "train.xyz", pool)
    write_frames(data / "valid.xyz", pool[:2])
    seen = {}

    def fake_train(train, valid, training, folder, seed=0):
        seen["frames"], seen["folder"] = [a.info["index"] for a in train], folder
        return folder / "model.pt"

    monkeypatch.setattr("mlip_unc.active.training.train_model", fake_train)
    monkeypatch.setattr(mod, "score", lambda model, sets: {})
    record = mod.reference_model(tmp_path, {}, 300, subset=4)
    assert record["recipe"] == "shipped_subset" and record["frames"] == 4
    assert seen["folder"].name == "model_shipped_4" and len(set(seen["frames"])) == 4
    assert seen["frames"] == sorted(seen["frames"])
    again = mod.reference_model(tmp_path, {}, 300, subset=4)
    assert again["frames"] == 4 and seen["frames"] == sorted(seen["frames"])
    with pytest.raises(SystemExit, match="11 > the pool's 10"):
        mod.reference_model(tmp_path, {}, 300, subset=11)
