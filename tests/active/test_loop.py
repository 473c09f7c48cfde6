import json

import numpy as np
import pytest
from ase.build import bulk

from mlip_unc.active.data import oracle_md
from mlip_unc.active.evaluation import evaluate_structures
from mlip_unc.active.loop import run_active_learning
from mlip_unc.active.oracles import make_oracle
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
        validate(ActiveLearningConfig, {"structures": CU, "bootstrap": {}, "md": {"ensemble": "npt"}})


def test_bad_thresholds_fail_before_any_work(tmp_path):
    out = tmp_path / "al"
    for thresholds in ({"max_force": 2.0}, {"max_force_std": -1.0}):
        config = validate(ActiveLearningConfig, {"out": str(out), "structures": CU, "bootstrap": {},
                                                 "thresholds": thresholds})  # fmt: skip
        with pytest.raises(ThresholdError, match="^thresholds: "):
            run_active_learning(config)
    assert not out.exists()


def test_train_model_stores_levels_and_refit_offsets(tmp_path, tiny_training):
    emt = make_oracle("emt")
    frames = oracle_md(bulk("Cu", cubic=True, a=3.61), emt, GenerateSettings(frames=6, interval=3, equilibration=0))
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
    frames = oracle_md(bulk("Cu", cubic=True, a=3.61), emt, GenerateSettings(frames=4, interval=3, equilibration=0))
    tiny_training["data"]["valid_fraction"] = 0.0  # the trainer has no validation set: stores no levels
    path = train_model(frames, [], tiny_training, tmp_path / "run")
    levels = UncertaintyCalculator(path).uncertainty_levels
    assert levels["n_structures"] == 4 and levels["max_force_std"] > 0 and levels["energy_std_per_atom"] > 0


def test_one_round_with_the_emt_oracle(tmp_path, tiny_training):
    config = validate(ActiveLearningConfig, {
        "out": str(tmp_path / "al"), "oracle": "emt", "structures": CU, "rounds": 1,
        "bootstrap": {"frames": 6, "valid_frames": 2, "interval": 3, "equilibration": 0},
        "test": {"temperature": 1000, "frames": 2, "interval": 3, "equilibration": 0},
        "training": tiny_training, "retrain_epochs": 1,
        "md": {"temperature": 1500, "steps": 6, "interval": 2, "timestep": 2.0},
        "thresholds": {"max_force_std": 1e-9},  # flag everything: the round must label and retrain
        "selection": {"top_k": 3},
    })  # fmt: skip
    rows = run_active_learning(config)
    assert [r["round"] for r in rows] == [0, 1]
    # step 0 is the ideal lattice, where the forces and their std vanish by symmetry
    assert rows[0]["n_md_frames"] == 4 and rows[0]["n_flagged"] == 3 and rows[0]["n_labelled"] == 3
    assert rows[1]["n_train"] + rows[1]["n_valid"] == 6 + 2 + 3
    assert rows[1]["test_force_rmse"] > 0
    out = tmp_path / "al"
    assert (out / "report.md").is_file() and (out / "rounds.png").stat().st_size > 0
    assert (out / "round_0" / "md_0" / "md.png").is_file() and (out / "round_0" / "labelled.xyz").is_file()
    calc = UncertaintyCalculator(rows[1]["model"])
    # the retrained model's own levels, on the enlarged validation set (2 bootstrap + 1 labelled)
    assert calc.uncertainty_levels["n_structures"] == rows[1]["n_valid"] == 3
    assert calc.metadata["training_config"]["train"]["init_from"] == rows[0]["model"]
    history = json.loads((out / "round_0" / "retrained" / "history.json").read_text())
    assert history["config"]["train"]["init_from"] == rows[0]["model"]
    assert calc.model.backbone.config() == UncertaintyCalculator(rows[0]["model"]).model.backbone.config()


class _Killed(Exception):
    """Stands for kill -9 in the middle of an oracle call."""


def _al_config(out, tiny_training, oracle):
    return validate(ActiveLearningConfig, {
        "out": str(out), "oracle": oracle, "structures": CU, "rounds": 2,
        "bootstrap": {"frames": 6, "valid_frames": 2, "interval": 3, "equilibration": 0},
        "training": tiny_training, "retrain_epochs": 1,
        "md": {"temperature": 1500, "steps": 6, "interval": 2, "timestep": 2.0},
        "thresholds": {"max_force_std": 1e-9}, "selection": {"top_k": 2},
    })  # fmt: skip


def test_resume_after_a_kill_gives_the_same_data_and_labels_nothing_twice(tmp_path, tiny_training, monkeypatch):
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
    resumed = run_active_learning(config, resume=True)
    assert len(calls) == len(set(calls)) + 1  # only the killed call was repeated
    assert [r["n_train"] for r in resumed] == [r["n_train"] for r in straight]
    final = lambda root: ase.io.read(root / "round_1" / "retrained" / "train.xyz", ":")  # noqa: E731
    a, b = final(tmp_path / "a"), final(tmp_path / "b")
    assert len(a) == len(b) and all(np.allclose(x.positions, y.positions) for x, y in zip(a, b))
    assert all(np.isclose(x.get_potential_energy(), y.get_potential_energy()) for x, y in zip(a, b))
