"""benchmarks/peers/metatrain.py: the mtt log parsing, the options it writes, and (slow tier) the
whole peer on a tiny 3BPA split: PET trained by ``mtt train``, metatrain's LLPR, metatomic's
ASE calculator, the suite's scoring, and the resume."""

import json
import math
import os
from pathlib import Path

import pytest

from benchmarks.common.force_frames import ROW_KEYS
from benchmarks.common.format import numbers
from benchmarks.common.records import read_jsonl
from benchmarks.peers import metatrain

REPO = Path(__file__).resolve().parents[2]
LOG = """\
[2026-12-06 00:53:13][INFO] - Base learning rate: 0.0001
[2026-12-06 00:53:13][INFO] - Starting training
[2026-12-06 00:53:15][INFO] - Epoch:    0 | learning rate: 7.500e-05 | training loss: 4.990e+04
[2026-12-06 00:53:17][INFO] - Epoch:    1 | learning rate: 2.500e-05 | training loss: 4.990e+04
/x/omegaconf.py:127: UserWarning: register_new_resolver() is deprecated
[2026-12-06 00:53:21][INFO] - Epoch:    2 | learning rate: 0.000e+00 | training loss: 4.990e+04
[2026-12-06 00:53:21][INFO] - Training finished!
"""


def test_training_seconds_from_the_log():
    seconds, epochs = metatrain.training_seconds(LOG)
    assert (seconds, epochs) == (8.0, 3)


def test_errors_drop_warnings_only():
    text = "a.py:1: UserWarning: x\n\nValueError: batch size (16) too large\n"
    assert metatrain._errors(text) == "ValueError: batch size (16) too large"


def test_options_train_pet_then_wrap_it():
    pet = metatrain.pet_options(seed=3, epochs=7)
    assert pet["architecture"]["name"] == "pet"
    assert pet["architecture"]["model"] == metatrain.PET_MODEL
    assert pet["architecture"]["training"]["num_epochs"] == 7
    assert pet["seed"] == 3 and pet["validation_set"]["systems"]["read_from"] == "valid.xyz"
    llpr = metatrain.llpr_options(seed=3, members=5)
    assert llpr["architecture"]["name"] == "llpr"
    assert llpr["architecture"]["training"]["model_checkpoint"] == "model.ckpt"
    assert llpr["architecture"]["model"]["num_ensemble_members"] == {"energy": 5}
    json.dumps([pet, llpr])  # written as JSON (= YAML)


@pytest.mark.slow
def test_quick_peer_end_to_end(tmp_path):
    data = Path(os.environ.get("MLIP_UNC_DATA") or REPO.parent / "shared" / "data")
    if not (data / "structures" / "3BPA" / "train_300K.xyz").is_file():
        pytest.skip(f"no 3BPA data under {data}")
    results = metatrain.main(["--quick", "--out", str(tmp_path)])
    assert results["meta"]["status"] == "complete"
    (run,) = results["runs"]
    assert run["status"] == "complete", run.get("error")
    assert 0.8 < run["pet_parameters"] / run["our_parameters"] < 1.25  # the same budget
    assert run["frames"] == {"train": 20, "valid": 20, "test": 20, "ood": 20}
    for row in metatrain.ROWS:
        assert set(run["rows"][row]) == set(ROW_KEYS)
        assert -1.0 <= run["rows"][row]["spearman_frame_in_domain"] <= 1.0
        assert 0.0 <= run["rows"][row]["auroc_ood"] <= 1.0
    assert run["rows"]["metatrain_pet_llpr"]["std_over_rmse"] > 0.0  # ensemble forces spread
    assert run["rows"]["metatrain_pet_llpr"]["cost_ratio"] > 1.0  # one backward per member
    assert run["accuracy"]["in"]["force_mae_meV_A"] > 0.0
    (record,) = read_jsonl(tmp_path / "metatrain.jsonl.gz")
    values = record["frames_values"]["metatrain_pet_llpr"]
    assert len(values["in"]["score"]) == len(values["ood"]["score"]) == 20
    assert "metatrain_pet_llpr" in (tmp_path / "metatrain.md").read_text()
    metatrain.main(["--quick", "--out", str(tmp_path)])  # resumed: nothing to do
    assert len(read_jsonl(tmp_path / "metatrain.jsonl.gz")) == 1


def test_tuned_trainer_is_written_out_and_named():
    args = metatrain.parse_args(["--trainer", "tuned", "--datasets", "ethanol", "--seeds", "1"])
    assert args.training == metatrain.TUNED and set(metatrain.TUNED) <= set(metatrain.TUNED_REASONS)
    assert args.variant == "best_model_metric=loss,learning_rate=0.01,scale_targets=false"
    pet = metatrain.pet_options(seed=1, epochs=9, training=args.training)
    assert pet["architecture"]["training"] == {"num_epochs": 9, "num_workers": 0, **metatrain.TUNED}
    assert metatrain.parse_args([]).variant == "defaults"  # the documented defaults stay reported
    given = metatrain.parse_args(["--trainer", "tuned", "--learning-rate", "0.01"])
    assert given.training["learning_rate"] == 0.01 and given.training["scale_targets"] is False


def test_compact_rounds_floats_only():
    values = {"in": {"score": [0.123456789, 2.0, float("nan")], "n": 3, "name": "x"}}
    out = metatrain.compact(values)
    assert out["in"]["score"][:2] == [0.1235, 2.0] and math.isnan(out["in"]["score"][2])
    assert out["in"]["n"] == 3 and out["in"]["name"] == "x"


def test_verdict_ahead_level_behind():
    ahead = metatrain.verdict("spearman_frame_in_domain", [0.6, 0.5], [0.1, 0.2])
    assert " ahead of " in ahead  # difference, our mean, the peer's, seeds, the larger std
    assert numbers(ahead) == pytest.approx([0.4, 0.55, 0.15, 2, 2, 0.071])
    level = metatrain.verdict("auroc_ood", [0.80, 0.70], [0.74, 0.78])
    assert "level with" in level  # 0.01 apart, seed std 0.07
    assert "behind" in metatrain.verdict("cost_ratio", [2.0, 2.1], [1.0, 1.1])  # lower is better
    calib = metatrain.verdict("std_over_rmse", [0.9, 1.1], [0.2, 0.3])  # closer to 1 is better
    assert "ahead of" in calib and "|ln(std/RMSE)|" in calib
    one = metatrain.verdict("force_mae_meV_A", [30.0], [300.0])
    assert "ahead of" in one and "no spread" in one
    assert "n/a" in metatrain.verdict("auroc_ood", [None], [0.5])


def test_write_section_replaces_its_block_only(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Page\n\ntable\n")
    metatrain.write_section(page, ["## Peer", "one"])
    metatrain.write_section(page, ["## Peer", "two"])
    text = page.read_text()
    assert text.startswith("# Page\n\ntable\n") and text.count(metatrain.BEGIN) == 1
    assert "two" in text and "one" not in text.split(metatrain.BEGIN)[1]


def test_under_budget_runs_are_run_again():
    assert metatrain.used_budget({"train_minutes": 6.0, "budget_minutes": 8.0})
    assert not metatrain.used_budget({"train_minutes": 3.7, "budget_minutes": 8.0})
    assert metatrain.used_budget({"train_minutes": 0.01, "budget_minutes": 0.1, "max_frames": 20})


def test_page_table_first_and_per_seed_tables_beside_it(tmp_path):
    """The committed results re-rendered: the mean ± std table first, per-seed rows in CSVs."""
    from benchmarks.common.tables import read_csv

    results = json.loads((REPO / "benchmarks/results/peers/metatrain.json").read_text())
    metatrain.write_markdown(results, tmp_path / "metatrain.md")
    lines = (tmp_path / "metatrain.md").read_text().splitlines()
    assert lines[4].startswith("| set | PET trainer | row | seeds |")
    done = [r for r in results["runs"] if r["status"] == "complete"]
    groups = {(r["dataset"], r.get("variant", "defaults")) for r in done}
    assert sum(line.startswith(("| 3bpa |", "| ethanol |")) for line in lines) == 3 * len(groups)
    rows = read_csv(tmp_path / metatrain.ROWS_CSV)
    ours = sum(1 + bool(r["ours"].get("committee5")) for r in done if "ours" in r)
    assert len(rows) == len(metatrain.ROWS) * len(done) + ours
    runs = read_csv(tmp_path / metatrain.RUNS_CSV)
    first = done[0]["accuracy"]["in"]["force_mae_meV_A"]
    assert len(runs) == len(done) and runs[0]["force MAE meV/A"] == f"{first:.1f}"
