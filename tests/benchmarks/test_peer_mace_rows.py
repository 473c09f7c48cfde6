"""benchmarks/peers/mace_rows.py: the committee's combination of members, the deadline, the
acceptance lines and the page section, on fake records (no data, no mace-torch training)."""

import argparse
import datetime
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmarks import force_uncertainty as fu
from benchmarks.common import force_frames as ff
from benchmarks.common.format import numbers
from benchmarks.peers import mace_rows as mr
from benchmarks.peers.metatrain import BEGIN as PEER_BEGIN
from benchmarks.peers.metatrain import END as PEER_END
from mlip_unc.evaluation.predictions import Predictions

UTC = datetime.UTC


def fake_predictions(forces: np.ndarray, energy: np.ndarray) -> Predictions:
    """Two frames of two atoms each with zero labels."""
    n = np.array([2, 2])
    return Predictions(
        frame_index=np.arange(2),
        num_atoms=n,
        has_energy=np.ones(2, bool),
        has_forces=np.ones(2, bool),
        energy_true=np.zeros(2),
        energy_pred=energy,
        energy_noise_var=np.zeros(2),
        atom_frame=np.repeat(np.arange(2), n),
        forces_true=np.zeros((4, 3)),
        forces_pred=forces,
        forces_noise_var=np.zeros((4, 3)),
        periodic=np.zeros(2, bool),
    )


def test_committee_is_mean_and_population_variance():
    a = fake_predictions(np.zeros((4, 3)), np.array([0.0, 1.0]))
    b = fake_predictions(np.full((4, 3), 2.0), np.array([2.0, 1.0]))
    c = mr.committee_predictions([a, b])
    assert np.allclose(c.forces_pred, 1.0) and np.allclose(c.forces_epistemic_var, 1.0)
    assert np.allclose(c.energy_pred, [1.0, 1.0]) and np.allclose(
        c.energy_epistemic_var, [1.0, 0.0]
    )
    values = ff.prediction_values(c, "committee5")
    assert np.allclose(values["score"], np.sqrt(3.0))  # sqrt(sum_c Var F_ac)
    assert values["std_over_rmse"] == pytest.approx(1.0)  # std 1, error 1 per component


def test_predictions_round_trip(tmp_path):
    pred = fake_predictions(np.arange(12.0).reshape(4, 3), np.array([0.5, 1.5]))
    back = mr.load_predictions(mr.save_predictions(pred, tmp_path / "p.npz"))
    assert np.array_equal(back.forces_pred, pred.forces_pred) and back.forces_epistemic_var is None


def test_deadline_is_the_next_such_time():
    now = datetime.datetime(2026, 12, 6, 7, 0, tzinfo=UTC)
    assert mr.deadline("07:55", now) == now.replace(minute=55)
    assert mr.deadline("06:00", now).day == 7
    assert mr.deadline(None, now) is None


def test_check_time_refuses_a_step_past_the_deadline():
    soon = datetime.datetime.now(UTC) + datetime.timedelta(minutes=5)
    args = argparse.Namespace(deadline=soon, stop_by="x", budget_minutes=8.0)
    with pytest.raises(mr.OutOfTime):
        mr.check_time(args, "train", "train:3bpa")  # 8 + 2 min
    mr.check_time(argparse.Namespace(deadline=None), "fit", "fit")  # no deadline: no check


def test_acceptance_against_the_committee():
    committee = {
        "spearman_frame_in_domain": 0.6,
        "auroc_ood": 0.8,
        "partial_spearman_given_force": None,
    }
    row = {
        "spearman_frame_in_domain": 0.5,
        "auroc_ood": 0.9,
        "std_over_rmse": 2.5,
        "cost_ratio": 1.5,
    }
    out = mr.acceptance(row, committee)
    assert out["spearman_frame_in_domain"]["miss"] == pytest.approx(0.05)
    assert out["auroc_ood"]["miss"] == 0.0
    assert out["partial_spearman_given_force"]["miss"] is None  # no reference: not measured
    assert out["std_over_rmse"]["miss"] == pytest.approx(0.5)
    assert out["cost_ratio"]["miss"] == 0.0


def frame_record(rng: np.random.Generator, n: int, noise: float) -> dict:
    error = rng.random(n)
    return {
        "score": (error + noise * rng.random(n)).tolist(),
        "error": error.tolist(),
        "force": rng.random(n).tolist(),
        "std_over_rmse": 1.0,
        "force_mae_meV_A": 10.0,
    }


def test_assemble_and_section_from_steps(tmp_path):
    rng = np.random.default_rng(0)
    settings = {
        "command": "python -m benchmarks.peers.mace_rows",
        "started": "2026-12-06 06:00",
        "quick": False,
        "seed": 0,
        "budget_minutes": 8.0,
        "overrides": [],
        "threads": 1,
        "members": 5,
    }
    steps = ff.Steps(tmp_path / "steps.jsonl", settings)
    steps.add(
        "train:3bpa:mace_torch:0",
        {"model": "m0", "train_minutes": 8.0, "epochs": 3, "best_epoch": 3, "dtype": "float32"},
    )
    steps.add(
        "attach:3bpa",
        {
            "command": "mlip-unc attach",
            "seconds": 1.0,
            "attach": {"n_train": 360, "n_fit": 200, "n_valid": 40},
        },
    )
    steps.add(
        f"modes:3bpa:{mr.ATTACH}",
        {"offered": ["energy", "lowrank"], "skipped": {}, "default": "lowrank"},
    )
    for mode in ("lowrank", "energy"):
        steps.add(
            f"eval:3bpa:{mr.ATTACH}:{mode}", {p: frame_record(rng, 30, 0.5) for p in ("in", "ood")}
        )
    steps.add(
        f"cost:3bpa:{mr.ATTACH}",
        {"ms": {"plain": 2.0, "lowrank": 3.0, "energy": 2.1, mr.FORWARD: 1.5}, "vectors": 5},
    )
    dist = {b: {p: rng.random(30).tolist() for p in ("in", "ood")} for b in ff.DISTANCES}
    # the latent distance ranks the frames perfectly, so it is listed above the default
    dist["latent_distance"]["in"] = list(steps.get(f"eval:3bpa:{mr.ATTACH}:lowrank")["in"]["error"])
    steps.add(f"distance:3bpa:{mr.ATTACH}", dist)
    steps.add(
        f"eval:3bpa:{mr.COMMITTEE}",
        {**{p: frame_record(rng, 30, 0.1) for p in ("in", "ood")}, "members": [0, 1, 2]},
    )
    steps.add(
        f"cost:3bpa:{mr.COMMITTEE}", {"ms": {"plain": 2.0, "committee": 8.0}, "members": [0, 1, 2]}
    )
    args = argparse.Namespace(datasets=["3bpa", "ethanol"], seed=0, notes=[])
    results = mr.assemble(steps, args, "partial")
    entry = results["3bpa"]
    assert "ethanol" not in results  # nothing evaluated there
    assert entry["defaults"] == {mr.ATTACH: f"{mr.ATTACH}:lowrank"}
    assert entry["rows"][f"{mr.ATTACH}:lowrank"]["cost_ratio"] == pytest.approx(1.5)
    assert entry["rows"][mr.COMMITTEE]["cost_ratio"] == pytest.approx(4.0)
    assert set(entry["rows"][mr.COMMITTEE]) == set(ff.ROW_KEYS)
    assert entry["acceptance"][mr.ATTACH]["cost_ratio"]["miss"] == 0.0
    lines = mr.section(json.loads(json.dumps(results)))
    table = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in lines if line[:3] == "| m"}
    assert table[f"{mr.ATTACH}:lowrank (default)"][6] == "1.50"  # cost_ratio, the default marked
    assert table[f"{mr.COMMITTEE} (3 members)"][6] == "4.00"
    committee = next(line for line in lines if line.startswith("Committee:"))
    assert numbers(committee)[:5] == [0, 1, 2, 3, 5]  # seeds 0-2: 3 of 5 members
    accept = next(line for line in lines if line.startswith(f"- {mr.ATTACH}:lowrank: spearman"))
    parts = dict(
        part.split(" ", 1) for part in accept[len(f"- {mr.ATTACH}:lowrank: ") :].split("; ")
    )
    assert numbers(parts["cost_ratio"]) == [1.5, 2.0] and parts["cost_ratio"].endswith(": met.")
    # the floor: f = 1.5 ms, b = 2.0 - 1.5 ms, 5 vectors -> (1.5 + 5 * 0.5) / 2.0
    assert entry[mr.ATTACH]["cost_floor"] == pytest.approx(2.0)
    floor = next(line for line in lines if line.startswith(f"{mr.ATTACH}:") and "floor" in line)
    assert numbers(floor)[:4] == [2.0, 5, 1.5, 0.5]  # floor, K, f ms, b ms
    # the |F_pred| baseline: the default's own frames scored by their max |F_pred|
    base, rec = (
        entry["rows"][f"{mr.ATTACH}:force_magnitude"],
        steps.get(f"eval:3bpa:{mr.ATTACH}:lowrank"),
    )
    assert base["cost_ratio"] == 1.0 and base["std_over_rmse"] is None
    assert base["spearman_frame_in_domain"] == pytest.approx(
        stats.spearmanr(rec["in"]["force"], rec["in"]["error"])[0]
    )
    # the distance baselines: their own scores against the default's errors, not timed
    dist = steps.get(f"distance:3bpa:{mr.ATTACH}")
    for b in ff.DISTANCES:
        r = entry["rows"][f"{mr.ATTACH}:{b}"]
        assert r["cost_ratio"] is None and r["std_over_rmse"] is None
        assert r["spearman_frame_in_domain"] == pytest.approx(
            stats.spearmanr(dist[b]["in"], rec["in"]["error"])[0]
        )
        assert f"{mr.ATTACH}:{b}" in table
    better = next(line for line in lines if line.startswith("- ") and "latent_distance" in line)
    assert numbers(better) == [0.89, 1.0]  # the default's Spearman, the one baseline above it
    gap = entry["paired_bootstrap"][mr.ATTACH]["spearman_frame_in_domain"]
    assert gap["gap"] == pytest.approx(
        entry["rows"][f"{mr.ATTACH}:lowrank"]["spearman_frame_in_domain"]
        - entry["rows"][mr.COMMITTEE]["spearman_frame_in_domain"]
    )
    paired = next(line for line in lines if line.startswith(f"- {mr.ATTACH}:lowrank - "))
    assert gap["std"] > 0 and f"{gap['gap']:.3f}" in paired and f"{gap['std']:.3f}" in paired
    assert f"{mr.ATTACH}:force_magnitude" in table
    # an invocation on another data set keeps this one's rows on the page
    other = mr.assemble(steps, argparse.Namespace(datasets=["ethanol"], seed=0, notes=[]), "x")
    assert other["3bpa"]["rows"] == results["3bpa"]["rows"]


def test_write_section_keeps_the_page_and_the_peer_section(tmp_path):
    page = tmp_path / "force_uncertainty.md"
    page.write_text(f"# native\n\nrows\n\n{PEER_BEGIN}\npeer\n{PEER_END}\n")
    mr.write_section(page, ["first"])
    text = page.read_text()
    assert text.index("rows") < text.index(mr.BEGIN) < text.index("first") < text.index(PEER_BEGIN)
    mr.write_section(page, ["second"])
    text = page.read_text()
    assert "first" not in text and "second" in text and text.count(mr.BEGIN) == 1
    assert text.endswith(f"{PEER_BEGIN}\npeer\n{PEER_END}\n")


def test_native_page_rewrite_keeps_the_peer_sections(tmp_path):
    """The native page's rewrite moves each peer section to its own page beside it, whole, and
    links it (common.pages.move_peer_sections)."""
    (tmp_path / "force_uncertainty.json").write_text(
        (ff.RESULTS / "force_uncertainty.json").read_text()
    )
    page = tmp_path / "force_uncertainty.md"
    page.write_text(f"# old\n\n{PEER_BEGIN}\npeer\n{PEER_END}\n")
    mr.write_section(page, ["## MACE users' rows", "ours"])
    fu.main(["--report-only", "--out", str(tmp_path)])
    text = page.read_text()
    assert "# old" not in text and text.startswith("# Force uncertainty")
    assert mr.BEGIN not in text and PEER_BEGIN not in text
    assert "[MACE users' rows](force_uncertainty_mace_rows.md)" in text
    mace = (tmp_path / "force_uncertainty_mace_rows.md").read_text()
    assert f"{mr.BEGIN}\n## MACE users' rows\nours\n{mr.END}" in mace
    assert (
        f"{PEER_BEGIN}\npeer\n{PEER_END}"
        in (tmp_path / "force_uncertainty_metatrain.md").read_text()
    )


def test_backward_vectors_follow_the_mode_and_the_size():
    model = argparse.Namespace(posterior_rank=4)
    small, large = argparse.Namespace(num_nodes=27), argparse.Namespace(num_nodes=100)
    assert mr.backward_vectors(model, [small], "auto") == 5  # 27 x 4 <= 256: low-rank
    assert mr.backward_vectors(model, [small, large], "auto") == 2  # sketched above
    assert mr.backward_vectors(model, [large], "lowrank") == 5
    assert mr.floor({"ms": {"plain": 2.0}, "vectors": 5}) is None  # no forward timed


def test_calibration_overlap_recomputes_attach_split(tmp_path):
    from mlip_unc.data import random_split

    (tmp_path / "mace_valid_indices_0.txt").write_text("\n".join(map(str, range(0, 100, 10))))
    meta = {
        "n_train": 90,
        "n_fit": 90,
        "n_valid": 10,
        "valid_fraction": 0.1,
        "seed": 0,
        "valid": None,
    }
    out = mr.calibration_overlap(tmp_path, meta)
    split = random_split(100, (0.9, 0.1, 0.0), seed=0)
    assert out["n_train_file"] == 100 and out["n_mace_valid"] == 10
    assert out["calibration_frames"] == sorted(list(split.val) + list(split.test))
    assert out["calibration_in_mace_valid"] == sum(k % 10 == 0 for k in out["calibration_frames"])
    assert mr.calibration_overlap(tmp_path, {**meta, "valid": "v.xyz"}) == {}  # --valid given


def test_distance_baselines_record_once_per_model(tmp_path, monkeypatch):
    steps = ff.Steps(tmp_path / "steps.jsonl", {"command": "x"})
    calls = []
    monkeypatch.setattr(ff, "load_frames", lambda *a: "train")
    monkeypatch.setattr(
        ff,
        "distance_scores",
        lambda model, train, sets: (
            calls.append(train) or {b: {p: np.arange(3.0) for p in sets} for b in ff.DISTANCES}
        ),
    )
    split = {"train": "t.xyz"}
    mr.distance_baselines("3bpa", mr.ATTACH, None, split, {"in": 0, "ood": 0}, steps, fresh=-1)
    mr.distance_baselines("3bpa", mr.ATTACH, None, split, {"in": 0, "ood": 0}, steps, fresh=-1)
    assert calls == ["train"]  # the second call found the step
    rec = steps.get(f"distance:3bpa:{mr.ATTACH}")
    assert rec["descriptor_distance"]["ood"] == [0.0, 1.0, 2.0]
    # a model newer than the step (fresh = a later line) computes them again
    mr.distance_baselines("3bpa", mr.ATTACH, None, split, {"in": 0}, steps, fresh=rec["line"])
    assert len(calls) == 2


def test_fit_backbone_again_after_training_or_a_new_validation_cap(tmp_path, monkeypatch):
    import mlip_unc.train.potential as potential
    import mlip_unc.train.potential_data as potential_data

    steps = ff.Steps(tmp_path / "steps.jsonl", {"command": "x"})
    fits, cap = [], {"frames": None}
    config = argparse.Namespace(
        model=argparse.Namespace(posterior=argparse.Namespace(value="full"))
    )

    def train_config(*a):
        config.model.posterior_valid_frames = cap["frames"]
        return config

    monkeypatch.setattr(mr, "backbone_split", lambda name, args: {})
    monkeypatch.setattr(ff, "train_config", train_config)
    monkeypatch.setattr(potential_data, "prepare_data", lambda c: None)
    monkeypatch.setattr(potential, "finalize_checkpoint", lambda *a: fits.append(a))
    monkeypatch.setattr(mr, "attached_metadata", lambda path: {"posterior": {}})
    args = argparse.Namespace(deadline=None)
    steps.add("train:3bpa:backbone", {})
    mr.fit_backbone("3bpa", tmp_path, args, steps)
    mr.fit_backbone("3bpa", tmp_path, args, steps)
    assert len(fits) == 1  # done once
    cap["frames"] = 16
    mr.fit_backbone("3bpa", tmp_path, args, steps)
    assert len(fits) == 2 and steps.get("fit:3bpa:backbone")["valid_frames"] == 16
    steps.add("train:3bpa:backbone", {})  # a new training
    mr.fit_backbone("3bpa", tmp_path, args, steps)
    assert len(fits) == 3


def test_a_run_in_another_work_folder_keeps_the_other_data_sets_with_their_run(tmp_path):
    def meta(command: str) -> dict:
        return {"command": command, "commands": [command], "budget_minutes": 8.0, "threads": 1}

    row = {"rows": {mr.COMMITTEE: {"auroc_ood": 0.5}}, "defaults": {}}
    path = tmp_path / "force_uncertainty_mace.json"
    path.write_text(json.dumps({"meta": meta("old"), "3bpa": row, "ethanol": row}))
    new = {"meta": meta("new"), "ethanol": {**row, "rows": {mr.COMMITTEE: {"auroc_ood": 0.9}}}}
    merged = mr.carry_over(new, path)
    assert list(merged) == ["meta", "3bpa", "ethanol"]  # the data sets in their usual order
    assert merged["meta"]["command"] == "new"
    assert (
        merged["ethanol"]["rows"][mr.COMMITTEE]["auroc_ood"] == 0.9
        and "run" not in merged["ethanol"]
    )
    assert merged["3bpa"]["run"]["command"] == "old"  # kept, with the run that made it
    path.write_text(json.dumps(merged))  # kept again: still the run that made it
    assert mr.carry_over({"meta": meta("third")}, path)["3bpa"]["run"]["command"] == "old"
    text = "\n".join(mr.section(merged))
    kept, current = text.split("### 3bpa", 1)[1].split("### ethanol")
    assert "Run: `old`" in kept and "`new`" not in kept  # the kept data set, with its own run
    assert current.rstrip().splitlines()[-1].startswith("Run: `new`")
    assert mr.carry_over(new, tmp_path / "none.json") == new


def test_a_relative_work_folder_is_made_absolute():  # mace_run_train runs in its own folder
    args = mr.parse_args(["--work", "runs/x"])
    assert args.work.is_absolute() and args.work == (Path.cwd() / "runs" / "x").resolve()
