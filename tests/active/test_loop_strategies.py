"""The loop's strategies on EMT copper with tiny models: committees (``train_members``,
``committee_model``), visited candidates, the random and max_force baselines, extra test sets,
the flag audit, the oracle-call and CPU bookkeeping, ``on_round`` and resume."""

from __future__ import annotations

import json

import ase.io
import numpy as np
import pytest
from ase.build import bulk

from mlip_unc.active import loop
from mlip_unc.active.candidates import max_force
from mlip_unc.active.data import oracle_md, write_frames
from mlip_unc.active.loop import run_active_learning
from mlip_unc.active.oracles import make_oracle
from mlip_unc.active.selection import select
from mlip_unc.active.training import committee_model, train_members
from mlip_unc.calculator import UncertaintyCalculator
from mlip_unc.config import ActiveLearningConfig, ConfigError, GenerateSettings, validate
from mlip_unc.models.checkpoint import load_checkpoint

CU = {"bulk": "Cu", "crystalstructure": "fcc", "a": 3.61, "cubic": True}
CPU_KEYS = ("cpu_md_s", "cpu_score_s", "cpu_retrain_s")


def _frames(n: int, seed: int = 0, temperature: float = 300.0):
    settings = GenerateSettings(
        frames=n, interval=3, equilibration=0, temperature=temperature, seed=seed
    )
    return oracle_md(bulk("Cu", cubic=True, a=3.61), make_oracle("emt"), settings)


def _seed(path) -> int:
    return load_checkpoint(path, kind="potential")["metadata"]["training_config"]["seed"]


def test_train_members_folders_seeds_init_and_the_committee(tmp_path, tiny_training):
    frames = _frames(6)
    train, valid = frames[:4], frames[4:]
    (one,) = train_members(train, valid, tiny_training, tmp_path / "single", seed=5)
    assert one == tmp_path / "single" / "model.pt" and one.is_file()
    assert _seed(one) == 5

    paths = train_members(train, valid, tiny_training, tmp_path / "pair", members=2, seed=3)
    assert paths == [tmp_path / "pair" / f"member_{m}" / "model.pt" for m in range(2)]
    assert [_seed(p) for p in paths] == [3, 1003]
    assert all((p.parent / "train.xyz").is_file() for p in paths)  # each member's own data files

    tuned = train_members(
        train, valid, tiny_training, tmp_path / "tuned", members=2, init_from=paths, epochs=1
    )
    for m, path in enumerate(tuned):
        config = load_checkpoint(path, kind="potential")["metadata"]["training_config"]
        assert config["train"]["init_from"] == str(paths[m])

    committee = committee_model(paths, frames)
    assert len(committee.members) == 2
    levels = committee.metadata["uncertainty_levels"]
    assert levels["n_structures"] == 6 and levels["max_force_std"] > 0
    # the levels are the committee's own force std across members, not a member's posterior
    member_levels = UncertaintyCalculator(paths[0]).uncertainty_levels
    assert levels["max_force_std"] != pytest.approx(member_levels["max_force_std"])
    calc = UncertaintyCalculator(committee, thresholds={"max_force_std": 2.0, "relative": True})
    assert calc.thresholds.max_force_std == pytest.approx(2.0 * levels["max_force_std"])


def _config(out, tiny_training, **extra):
    raw = {
        "out": str(out),
        "oracle": "emt",
        "structures": CU,
        "rounds": 2,
        "bootstrap": {"frames": 6, "valid_frames": 2, "interval": 3, "equilibration": 0},
        "training": tiny_training,
        "retrain_epochs": 1,
        "md": {"temperature": 1500, "steps": 6, "interval": 2, "timestep": 2.0},
        "thresholds": {"max_force_std": 1e-9},
        "selection": {"top_k": 2},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return validate(ActiveLearningConfig, raw)


def _positions(frames):
    return sorted(np.round(a.positions, 6).ravel().tolist() for a in frames)


def test_committee_visited_random_audit_test_sets_and_resume(tmp_path, tiny_training, monkeypatch):
    """The benchmark's committee/random set-up in small: 2 members, every logged MD frame a
    candidate, random choice, an extra test set, the audit; the oracle-call count includes the
    frames dropped by max_label_force; a finished run resumed gives the same rows."""
    extra = tmp_path / "hot.xyz"
    write_frames(extra, _frames(2, seed=9, temperature=900))
    # 3 chosen per round, the first one dropped as if by max_label_force
    original = loop.label_selected

    def drop_first(chosen, oracle, selection, **kw):
        labelled, dropped = original(chosen, oracle, selection, **kw)
        return labelled[1:], dropped + 1

    monkeypatch.setattr(loop, "label_selected", drop_first)
    config = _config(
        tmp_path / "al",
        tiny_training,
        committee=2,
        audit=2,
        test_sets={"hot": str(extra)},
        temperatures=[1500, 1000],
        thresholds={"max_force_std": 1e6},  # nothing flagged: visited frames are labelled anyway
        selection={"candidates": "visited", "metric": "random", "diverse": False, "top_k": 3},
    )
    seen: list[dict] = []
    rows = run_active_learning(config, on_round=seen.append)

    assert [r["round"] for r in rows] == [0, 1, 2]
    assert [r["round"] for r in seen] == [0, 1, 2] and seen == rows  # each final row once
    assert all(r["n_models"] == 2 for r in rows)
    assert rows[1]["model"].endswith("round_0/retrained/member_0/model.pt")
    for r in rows[:2]:
        assert (r["n_md_frames"], r["n_flagged"], r["n_labelled"], r["n_dropped"]) == (4, 0, 2, 1)
        assert r["audit_calls"] == 2 and r["audit_threshold"] == 1e6
        assert (r["audit_tp"], r["audit_fp"], r["audit_fn"], r["audit_tn"]) == (0, 0, 0, 2)
        assert len(r["audit_max_force_error"]) == len(r["audit_max_force_std"]) == 2
        assert all(r[k] >= 0 for k in CPU_KEYS)
    assert [r["md_temperature"] for r in rows[:2]] == [1500, 1000]
    assert "audit_calls" not in rows[2] and not any(k in rows[2] for k in CPU_KEYS)
    # labels spent: 6 + 2 initial frames, then 3 per round (2 kept + 1 dropped); audits excluded
    assert [r["oracle_calls"] for r in rows] == [8, 11, 14]
    assert [r["n_train"] + r["n_valid"] for r in rows] == [8, 10, 12]
    assert rows[0]["cpu_initial_train_s"] > 0
    assert "cpu_initial_train_s" not in rows[1] and "cpu_initial_train_s" not in rows[2]
    for r in rows:
        assert r["cpu_eval_s"] > 0
        for name in ("hot", "test"):
            if name == "test":
                assert "test_force_mae" not in r  # no test set configured
                continue
            assert r[f"{name}_force_mae"] > 0 and r[f"{name}_force_rmse"] >= r[f"{name}_force_mae"]
            assert r[f"{name}_energy_mae"] >= 0 and "hot_mean_max_force_std" in r

    out = tmp_path / "al"
    state = json.loads((out / "state.json").read_text())
    assert state["initial_models"] == [
        str(out / "initial" / f"member_{m}" / "model.pt") for m in range(2)
    ]
    # the round's calculator is the committee, its levels measured on the validation frames
    committee = committee_model(
        state["initial_models"], ase.io.read(out / "data" / "valid.xyz", ":")
    )
    level = committee.metadata["uncertainty_levels"]["max_force_std"]
    assert rows[0]["level_max_force_std"] == pytest.approx(level, rel=1e-5)
    member = UncertaintyCalculator(state["initial_models"][0]).uncertainty_levels
    assert rows[0]["level_max_force_std"] != pytest.approx(member["max_force_std"], rel=1e-3)
    # random choice among all logged frames: the seeded draw of (seed, round, 1), top 3
    visited = ase.io.read(out / "round_0" / "md_0" / "md.traj", ":")
    order = select(np.random.default_rng([config.seed, 0, 1]).random(len(visited)), top_k=3)
    labelled = ase.io.read(out / "round_0" / "labelled.xyz", ":")
    assert _positions(labelled) == _positions([visited[k] for k in order[1:]])

    seen_again: list[dict] = []
    resumed = run_active_learning(config, resume=True, on_round=seen_again.append)

    def strip(row):
        return {k: v for k, v in row.items() if k != "cpu_eval_s"}

    assert [strip(r) for r in resumed[:2]] == [strip(r) for r in rows[:2]]  # as committed
    # the final row is evaluated again: the same numbers, up to the committee's levels, which
    # are measured on the validation frames as read back from valid.xyz (rounded positions)
    # instead of the in-memory frames of the first invocation
    assert strip(resumed[2]).keys() == strip(rows[2]).keys()
    for key, value in strip(rows[2]).items():
        assert resumed[2][key] == (
            pytest.approx(value, rel=1e-5) if isinstance(value, float) else value
        ), key
    # committed rows are reported again (a kill between commit and callback loses none)
    assert [r["round"] for r in seen_again] == [0, 1, 2]
    assert seen_again[:2] == rows[:2]


def test_max_force_baseline_labels_the_largest_predicted_forces(tmp_path, tiny_training):
    """metric max_force over the flagged frames (a single model): the frames with the largest
    predicted |F_i| are labelled; the round's temperature comes from ``temperatures``."""
    config = _config(
        tmp_path / "al",
        tiny_training,
        rounds=1,
        temperatures=[700],
        md={"steps": 10},
        selection={"metric": "max_force", "diverse": False},
    )
    rows = run_active_learning(config)
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[0]["n_models"] == 1 and rows[0]["md_temperature"] == 700
    assert rows[0]["n_md_frames"] == 6 and rows[0]["n_flagged"] == 5  # step 0 has no force std
    assert rows[0]["n_labelled"] == 2 and [r["oracle_calls"] for r in rows] == [8, 10]
    assert rows[1]["model"].endswith("round_0/retrained/model.pt")

    out = tmp_path / "al"
    calc = UncertaintyCalculator(rows[0]["model"])
    visited = ase.io.read(out / "round_0" / "md_0" / "md.traj", ":")
    forces = np.array([max_force(calc, a) for a in visited])
    best = np.argsort(-forces)[:2]
    assert 0 not in best  # the ideal lattice's forces vanish: it is never chosen
    labelled = ase.io.read(out / "round_0" / "labelled.xyz", ":")
    assert _positions(labelled) == _positions([visited[k] for k in best])


def test_nothing_left_to_label_stops_and_reports_the_row_once(tmp_path, tiny_training):
    """Every chosen frame dropped by max_label_force: the round's row is final, the loop stops."""
    config = _config(
        tmp_path / "al",
        tiny_training,
        selection={"candidates": "visited", "metric": "random", "max_label_force": 1e-6},
    )
    seen: list[dict] = []
    rows = run_active_learning(config, on_round=seen.append)
    assert len(rows) == 1 and seen == rows
    assert (rows[0]["n_labelled"], rows[0]["n_dropped"], rows[0]["oracle_calls"]) == (0, 2, 8)
    resumed = run_active_learning(config, resume=True, on_round=seen.append)
    assert len(resumed) == 1 and resumed[0]["n_dropped"] == 2 and seen == rows + rows


def test_retraining_takes_its_own_learning_rate(tmp_path, tiny_training):
    """``retrain_lr`` reaches the fine-tuning runs (and only them): a warm start at the first
    training's rate undoes what it learned."""
    from mlip_unc.active.training import _training_config

    train = tmp_path / "train.xyz"
    base = _training_config(train, None, tiny_training, tmp_path, init_from=None, epochs=3, seed=0)
    tuned = _training_config(
        train, None, tiny_training, tmp_path, init_from="m.pt", epochs=3, seed=0, lr=2e-3
    )
    assert base.train.lr == tiny_training["train"].get("lr", base.train.lr) != 2e-3
    assert (tuned.train.lr, tuned.train.init_from, tuned.train.epochs) == (2e-3, "m.pt", 3)
    config = validate(ActiveLearningConfig, {"structures": CU, "bootstrap": {}, "retrain_lr": 1e-3})
    assert config.retrain_lr == 1e-3
    with pytest.raises(ConfigError, match=r"^retrain_lr"):
        validate(ActiveLearningConfig, {"structures": CU, "bootstrap": {}, "retrain_lr": 0})


def test_a_score_hook_ranks_the_candidates_and_pool_factor_one_takes_the_top_k(
    tmp_path, tiny_training
):
    """``score(calc, candidates, round)`` replaces ``selection.metric``; with ``pool_factor: 1``
    the diverse selection labels exactly the ``top_k`` best-scored frames (a 4 x top_k pool
    would hold every one of the 4 candidates, and farthest-point sampling would choose)."""
    calls: list[tuple[int, int]] = []

    def score(calc, frames, r):
        assert isinstance(calc, UncertaintyCalculator)
        calls.append((r, len(frames)))
        return -np.linalg.norm([a.positions - frames[0].positions for a in frames], axis=(1, 2))

    config = _config(
        tmp_path / "al",
        tiny_training,
        rounds=1,
        md={"steps": 8},
        thresholds={"max_force_std": 1e6},
        selection={"candidates": "visited", "diverse": True, "pool_factor": 1, "top_k": 2},
    )
    rows = run_active_learning(config, score=score)
    assert calls == [(0, 5)] and rows[0]["n_labelled"] == 2
    visited = ase.io.read(tmp_path / "al" / "round_0" / "md_0" / "md.traj", ":")
    labelled = ase.io.read(tmp_path / "al" / "round_0" / "labelled.xyz", ":")
    assert _positions(labelled) == _positions(visited[:2])  # the two closest to the first frame
    with pytest.raises(ConfigError, match=r"^selection.pool_factor"):
        validate(
            ActiveLearningConfig,
            {"structures": CU, "bootstrap": {}, "selection": {"pool_factor": 0}},
        )


def test_select_flagged_takes_given_scores_and_checks_their_number():
    from mlip_unc.config import SelectionSettings

    frames = _frames(5)
    rule = SelectionSettings(top_k=2, diverse=True, pool_factor=1)
    chosen = loop.select_flagged(frames, rule, scores=np.array([0.0, 3.0, 1.0, 2.0, -1.0]))
    assert _positions(chosen) == _positions([frames[1], frames[3]])
    # the shipped pool (4 x top_k) holds all five: farthest-point sampling picks another pair
    fps = select(
        np.array([0.0, 3.0, 1.0, 2.0, -1.0]), top_k=2, features=loop.distance_histograms(frames)
    )
    assert sorted(fps.tolist()) != [1, 3]
    wide = SelectionSettings(top_k=2, diverse=True)
    chosen = loop.select_flagged(frames, wide, scores=np.array([0.0, 3.0, 1.0, 2.0, -1.0]))
    assert _positions(chosen) == _positions([frames[k] for k in fps])
    with pytest.raises(ValueError, match="3 scores for 5 candidate frames"):
        loop.select_flagged(frames, rule, scores=np.zeros(3))
