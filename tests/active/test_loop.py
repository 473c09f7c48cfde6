import json

import numpy as np
import pytest
from ase.build import bulk

from mlip_unc.active.loop import (
    GenerateSettings,
    al_config_from_dict,
    evaluate_structures,
    oracle_md,
    refit_energy_offsets,
    run_active_learning,
    train_model,
)
from mlip_unc.active.oracles import make_oracle
from mlip_unc.calculator import UncertaintyCalculator

CU = {"bulk": "Cu", "crystalstructure": "fcc", "a": 3.61, "cubic": True}


def test_config_validation_names_the_key():
    with pytest.raises(ValueError, match=r"md: unknown keys \['temp'\]"):
        al_config_from_dict({"structures": CU, "bootstrap": {}, "md": {"temp": 3}})
    with pytest.raises(ValueError, match="nothing to start from"):
        al_config_from_dict({"structures": CU})
    with pytest.raises(ValueError, match="ensemble"):
        al_config_from_dict({"structures": CU, "bootstrap": {}, "md": {"ensemble": "npt"}})


def test_train_model_stores_levels_and_refit_offsets(tmp_path, tiny_training):
    emt = make_oracle("emt")
    frames = oracle_md(bulk("Cu", cubic=True, a=3.61), emt, GenerateSettings(frames=6, interval=3, equilibration=0))
    path = train_model(frames[:4], frames[4:], tiny_training, tmp_path / "run", refit_offsets=True)
    calc = UncertaintyCalculator(path)
    assert set(calc.uncertainty_levels) >= {"max_force_std", "energy_std_per_atom"}
    assert "energy_offset_refit" in calc.metadata
    errors = [calc.get_property("energy", a) - a.get_potential_energy() for a in frames[:4]]
    assert abs(np.mean(errors)) < 1e-6  # offsets fit the training energies on average
    assert refit_energy_offsets(path, frames[:4])[29] == pytest.approx(0.0, abs=1e-6)
    metrics = evaluate_structures(calc, frames[4:])
    assert metrics["n"] == 2 and metrics["force_rmse"] > 0 and metrics["mean_max_force_std"] > 0


def test_one_round_with_the_emt_oracle(tmp_path, tiny_training):
    config = al_config_from_dict({
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
    assert "fine_tuned_from" in calc.uncertainty_levels
    history = json.loads((out / "round_0" / "retrained" / "history.json").read_text())
    assert history["config"]["train"]["init_from"] == rows[0]["model"]
    assert calc.model.backbone.config() == UncertaintyCalculator(rows[0]["model"]).model.backbone.config()
