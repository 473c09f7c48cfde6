import json

import numpy as np
import pytest
from ase.build import bulk

from mlip_unc.active.data import oracle_md
from mlip_unc.active.evaluation import evaluate_structures
from mlip_unc.active.loop import no_labels_reason, run_active_learning
from mlip_unc.active.oracles import make_oracle
from mlip_unc.active.report import oracle_calls_in_all
from mlip_unc.active.training import refit_energy_offsets, train_model
from mlip_unc.calculator import ThresholdError, UncertaintyCalculator
from mlip_unc.config import ActiveLearningConfig, ConfigError, GenerateSettings, validate

CU = {"bulk": "Cu", "crystalstructure": "fcc", "a": 3.61, "cubic": True}


def test_config_validation_names_the_key():
    with pytest.raises(ConfigError, match=r"^md\.temp: unknown key"):
        validate(ActiveLearningConfig, {"structures": CU, "bootstrap": {}, "md": {"temp": 3}})
    with pytest.raises(ConfigError, match="nothing to start from"):
        validate(ActiveLearningConfig, {"structures": CU})
    with pytest.raises(ConfigError, match=r"^md\.ensemble"):
        validate(
            ActiveLearningConfig, {"structures": CU, "bootstrap": {}, "md": {"ensemble": "npt"}}
        )


def test_bad_thresholds_fail_before_any_work(tmp_path):
    out = tmp_path / "al"
    for thresholds in ({"max_force": 2.0}, {"max_force_std": -1.0}):
        config = validate(
            ActiveLearningConfig,
            {"out": str(out), "structures": CU, "bootstrap": {}, "thresholds": thresholds},
        )
        with pytest.raises(ThresholdError, match="^thresholds: "):
            run_active_learning(config)
    assert not out.exists()


def test_train_model_stores_levels_and_refit_offsets(tmp_path, tiny_training):
    emt = make_oracle("emt")
    frames = oracle_md(
        bulk("Cu", cubic=True, a=3.61), emt, GenerateSettings(frames=6, interval=3, equilibration=0)
    )
    path = train_model(frames[:4], frames[4:], tiny_training, tmp_path / "run", refit_offsets=True)
    calc = UncertaintyCalculator(path)
    assert set(calc.uncertainty_levels) >= {"max_force_std", "energy_std_per_atom"}
    assert calc.uncertainty_levels["n_structures"] == 2  # the trainer's, on the validation frames
    assert "energy_offset_refit" in calc.metadata
    errors = [calc.get_property("energy", a) - a.get_potential_energy() for a in frames[:4]]
    assert abs(np.mean(errors)) < 1e-6  # offsets fit the training energies on average
    assert refit_energy_offsets(path, frames[:4])[29] == pytest.approx(0.0, abs=1e-6)
    metrics = evaluate_structures(calc, frames[4:])
    assert metrics["n"] == 2 and metrics["force_rmse"] > 0 and metrics["mean_max_force_std"] > 0


def test_train_model_without_validation_levels_on_training_frames(tmp_path, tiny_training):
    emt = make_oracle("emt")
    frames = oracle_md(
        bulk("Cu", cubic=True, a=3.61), emt, GenerateSettings(frames=4, interval=3, equilibration=0)
    )
    tiny_training["data"]["valid_fraction"] = (
        0.0  # the trainer has no validation set: stores no levels
    )
    path = train_model(frames, [], tiny_training, tmp_path / "run")
    levels = UncertaintyCalculator(path).uncertainty_levels
    assert (
        levels["n_structures"] == 4
        and levels["max_force_std"] > 0
        and levels["energy_std_per_atom"] > 0
    )


def _one_round(tmp_path, training, **extra) -> ActiveLearningConfig:
    """One EMT round on Cu that labels 3 frames and retrains (``extra``: more settings)."""
    return validate(
        ActiveLearningConfig,
        {
            "out": str(tmp_path / "al"),
            "oracle": "emt",
            "structures": CU,
            "rounds": 1,
            "bootstrap": {"frames": 6, "valid_frames": 2, "interval": 3, "equilibration": 0},
            "training": training,
            "retrain_epochs": 1,
            "md": {"temperature": 1500, "steps": 6, "interval": 2, "timestep": 2.0},
            "thresholds": {
                "max_force_std": 1e-9
            },  # flag everything: the round must label and retrain
            "selection": {"top_k": 3},
            **extra,
        },
    )


def test_one_round_with_the_emt_oracle(tmp_path, tiny_training, caplog, capsys):
    config = _one_round(
        tmp_path,
        tiny_training,
        test={"temperature": 1000, "frames": 2, "interval": 3, "equilibration": 0},
    )
    with caplog.at_level("INFO", logger="mlip_unc.active.loop"):
        rows = run_active_learning(config, progress=True)
    assert [r["round"] for r in rows] == [0, 1]
    lines = [r.getMessage() for r in caplog.records if r.name == "mlip_unc.active.loop"]
    round_lines = [m for m in lines if m.startswith("round 0:")]  # one line per round
    assert len(round_lines) == 1 and "3 of 4 MD frames flagged, 3 labelled" in round_lines[0]
    assert "retrained on 8 + 3 structures" in round_lines[0]
    assert sum(m.startswith("final model (after 1 rounds):") for m in lines) == 1
    bars = capsys.readouterr().err  # tqdm bars on stderr: rounds, MD steps, oracle calls
    assert "active learning" in bars and "round 0, structure 0" in bars and "oracle" in bars
    # step 0 is the ideal lattice, where the forces and their std vanish by symmetry
    assert rows[0]["n_md_frames"] == 4 and rows[0]["n_flagged"] == 3 and rows[0]["n_labelled"] == 3
    assert rows[1]["n_train"] + rows[1]["n_valid"] == 6 + 2 + 3
    assert rows[1]["test_force_rmse"] > 0
    out = tmp_path / "al"
    assert (out / "report.md").is_file() and (out / "rounds.png").stat().st_size > 0
    assert (out / "round_0" / "md_0" / "md.png").is_file() and (
        out / "round_0" / "labelled.xyz"
    ).is_file()
    calc = UncertaintyCalculator(rows[1]["model"])
    # the retrained model's own levels, on the enlarged validation set (2 bootstrap + 1 labelled)
    assert calc.uncertainty_levels["n_structures"] == rows[1]["n_valid"] == 3
    assert calc.metadata["training_config"]["train"]["init_from"] == rows[0]["model"]
    history = json.loads((out / "round_0" / "retrained" / "history.json").read_text())
    assert history["config"]["train"]["init_from"] == rows[0]["model"]
    assert (
        calc.model.backbone.config()
        == UncertaintyCalculator(rows[0]["model"]).model.backbone.config()
    )


def test_a_round_whose_chosen_frames_are_all_dropped_says_so_and_stops(
    tmp_path, tiny_training, caplog
):
    """max_label_force below every EMT force: the 3 chosen frames are dropped, and the log
    names that cause, not the thresholds."""
    config = _one_round(tmp_path, tiny_training)
    config = config.updated(selection=config.selection.updated(max_label_force=1e-6))
    with caplog.at_level("INFO", logger="mlip_unc.active.loop"):
        rows = run_active_learning(config)
    assert rows[0]["n_labelled"] == 0 and rows[0]["n_dropped"] == 3 and len(rows) == 1
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("round 0:"))
    assert "all 3 chosen frames dropped (the oracle failed on them, or their reference" in line
    assert line.endswith("selection.max_label_force): stopping")
    assert no_labels_reason({"n_dropped": 0}) == "nothing to label (no frame over the thresholds)"
    # the dropped labels count among the run's labels, though no model was trained on them
    spent = rows[0]["oracle_calls"]  # the bootstrap's 6 + 2
    assert oracle_calls_in_all(rows) == {"labels": spent + 3, "dropped": 3, "audit": 0}
    report = (tmp_path / "al" / "report.md").read_text()
    assert f"training data in all: {spent + 3}, the starting training and validation" in report
    assert "(3 dropped: the oracle failed" in report
    assert "| n_dropped | oracle_calls |" in report
    assert any(f"training data in all: {spent + 3}" in r.getMessage() for r in caplog.records)


class _Killed(Exception):
    """Stands for kill -9 in the middle of an oracle call."""


def _al_config(out, tiny_training, oracle):
    return validate(
        ActiveLearningConfig,
        {
            "out": str(out),
            "oracle": oracle,
            "structures": CU,
            "rounds": 2,
            "bootstrap": {"frames": 6, "valid_frames": 2, "interval": 3, "equilibration": 0},
            "training": tiny_training,
            "retrain_epochs": 1,
            "md": {"temperature": 1500, "steps": 6, "interval": 2, "timestep": 2.0},
            "thresholds": {"max_force_std": 1e-9},
            "selection": {"top_k": 2},
        },
    )


def test_resume_after_a_kill_gives_the_same_data_and_labels_nothing_twice(
    tmp_path, tiny_training, monkeypatch
):
    """Kill during an oracle call of round 1, then --resume: the final training set equals an
    uninterrupted run's, and no structure goes to the oracle twice."""
    import ase.io

    straight = run_active_learning(_al_config(tmp_path / "a", tiny_training, "emt"))
    calls: list[str] = []
    from mlip_unc.active.state import CachedLabels, structure_hash

    original = CachedLabels.label

    def counting(self, atoms, oracle, compute):
        def spy(a, o):
            calls.append(structure_hash(a))
            if len(calls) == 3:  # the first label of round 1 (round 0 labels 2)
                raise _Killed
            return compute(a, o)

        return original(self, atoms, oracle, spy)

    monkeypatch.setattr(CachedLabels, "label", counting)
    config = _al_config(tmp_path / "b", tiny_training, "emt")
    with pytest.raises(_Killed):
        run_active_learning(config)
    with pytest.raises(FileExistsError, match="--resume"):
        run_active_learning(config)
    # what a kill -9 mid-write leaves: temporary files of atomic writes, removed on --resume
    out = tmp_path / "b"
    stale = [out / ".state.json.abcd_123.tmp", out / "labels" / f".{calls[0]}.json.x1y2z3w4.tmp"]
    for path in stale:
        path.write_bytes(b"")
    resumed = run_active_learning(config, resume=True)
    assert not any(path.exists() for path in stale)
    assert len(calls) == len(set(calls)) + 1  # only the killed call was repeated
    assert [r["n_train"] for r in resumed] == [r["n_train"] for r in straight]
    final = lambda root: ase.io.read(root / "round_1" / "retrained" / "train.xyz", ":")  # noqa: E731
    a, b = final(tmp_path / "a"), final(tmp_path / "b")
    assert len(a) == len(b) and all(
        np.allclose(x.positions, y.positions) for x, y in zip(a, b, strict=False)
    )
    assert all(
        np.isclose(x.get_potential_energy(), y.get_potential_energy())
        for x, y in zip(a, b, strict=False)
    )


def test_a_bootstrap_killed_half_way_is_read_back_not_recomputed(
    tmp_path, tiny_training, monkeypatch
):
    """Kill during the oracle MD that makes the round-0 data, then --resume: the replayed
    trajectory comes from the label cache (no oracle call repeated) and the data are the same."""
    import ase.io
    from ase.calculators.emt import EMT

    from mlip_unc.active import loop

    calls: list[int] = []

    class CountingEMT(EMT):
        def calculate(self, atoms=None, properties=("energy",), system_changes=None):
            calls.append(1)
            if len(calls) == kill_at[0]:
                raise _Killed
            super().calculate(atoms, properties, system_changes or [])

    class _DataDone(Exception):
        """The round-0 data are committed: the test needs nothing after."""

    def stop(*args, **kwargs):
        raise _DataDone

    monkeypatch.setattr(loop, "make_oracle", lambda spec: CountingEMT())
    monkeypatch.setattr(loop, "train_members", stop)
    config = _al_config(tmp_path / "a", tiny_training, "emt")
    kill_at = [0]
    with pytest.raises(_DataDone):
        run_active_learning(config)
    n_straight = len(calls)
    assert n_straight > 12  # 6 + 2 frames, 3 steps apart
    calls.clear()
    kill_at[0] = 9  # inside the bootstrap MD
    config = config.updated(out=str(tmp_path / "b"))
    with pytest.raises(_Killed):
        run_active_learning(config)
    kill_at[0] = 0
    with pytest.raises(_DataDone):
        run_active_learning(config, resume=True)
    assert len(calls) == n_straight + 1  # only the killed call was made again
    a, b = (ase.io.read(tmp_path / r / "data" / "train.xyz", ":") for r in ("a", "b"))
    assert len(a) == len(b) == 6 and all(
        np.array_equal(x.positions, y.positions) for x, y in zip(a, b, strict=False)
    )
    assert all(np.array_equal(x.get_forces(), y.get_forces()) for x, y in zip(a, b, strict=False))


def test_retraining_from_scratch_uses_the_training_recipe(tmp_path, tiny_training):
    """``retrain_from_scratch``: each round's model is trained anew (no ``init_from``) with the
    training config's epochs and rate, not the retraining ones."""
    tiny_training["train"].update(epochs=2, lr=3e-3)
    config = _one_round(tmp_path, tiny_training, retrain_lr=1e-4, retrain_from_scratch=True)
    rows = run_active_learning(config)
    train_cfg = UncertaintyCalculator(rows[1]["model"]).metadata["training_config"]["train"]
    assert train_cfg.get("init_from") is None
    assert (train_cfg["epochs"], train_cfg["lr"]) == (2, 3e-3)
