"""Candidates, scores and the flag audit of active learning (``mlip_unc.active.candidates``),
the new configuration fields, ``{file, index}`` starting structures and the held-out MAEs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from ase.io import write

from mlip_unc.active.candidates import (
    FLAG_COUNTS,
    audit_flags,
    candidate_scores,
    max_force,
    precision_recall,
    visited_frames,
)
from mlip_unc.active.data import build_structure
from mlip_unc.active.evaluation import evaluate_structures
from mlip_unc.config import ActiveLearningConfig, ConfigError, validate

CU = {"bulk": "Cu", "crystalstructure": "fcc", "a": 3.61, "cubic": True}


def _rattled(n: int, seed: int = 0, stdev: float = 0.05) -> list[Atoms]:
    """``n`` rattled 4-atom Cu cells (distinct positions)."""
    frames = []
    for k in range(n):
        atoms = bulk("Cu", cubic=True, a=3.61)
        atoms.rattle(stdev=stdev, seed=seed + k)
        frames.append(atoms)
    return frames


class ScriptedCalculator:
    """A stand-in for the uncertainty calculator: each frame carries its own prediction.

    ``atoms.arrays["pred_forces"]`` is the predicted force, ``atoms.info["std"]`` the
    ``max_force_std`` and ``atoms.info["estd"]`` the ``energy_std``; ``threshold`` the absolute
    force threshold (``calc.thresholds.max_force_std``)."""

    implemented_properties = ["energy", "forces", "energy_std", "max_force_std", "flag"]

    def __init__(self, threshold: float | None):
        self.thresholds = SimpleNamespace(max_force_std=threshold, energy_std_per_atom=None)
        self.results: dict = {}
        self.calls: list[list[str]] = []

    def calculate(self, atoms, properties):
        self.calls.append(list(properties))
        std = float(atoms.info["std"])
        self.results = {
            "energy": float(atoms.info.get("pred_energy", 0.0)),
            "forces": np.array(atoms.arrays["pred_forces"]),
            "max_force_std": std,
            "energy_std": float(atoms.info.get("estd", 0.0)),
            "flag": self.thresholds.max_force_std is not None
            and std > self.thresholds.max_force_std,
        }

    def get_forces(self, atoms):
        return np.array(atoms.arrays["pred_forces"])

    def energy_std_per_atom(self, results):
        return results["energy_std"] / 4


def _labelled(ref_forces: np.ndarray, pred_forces: np.ndarray, std: float) -> Atoms:
    """A 4-atom frame with reference forces (a SinglePointCalculator) and a scripted prediction."""
    atoms = bulk("Cu", cubic=True, a=3.61)
    atoms.arrays["pred_forces"] = np.asarray(pred_forces, dtype=float)
    atoms.info["std"] = std
    atoms.calc = SinglePointCalculator(atoms, energy=0.0, forces=np.asarray(ref_forces, float))
    return atoms


# --- visited_frames ----------------------------------------------------------------------------


def test_visited_frames_reads_every_md_folder_in_order_without_labels(tmp_path):
    a, b = _rattled(3, seed=0), _rattled(2, seed=10)
    for frames, name in ((a, "md_0"), (b, "md_1")):
        (tmp_path / name).mkdir()
        for f in frames:  # labelled frames in the trajectory: the copies must drop them
            f.calc = SinglePointCalculator(f, energy=1.0, forces=np.ones((len(f), 3)))
        write(tmp_path / name / "md.traj", frames)
    (tmp_path / "md_empty").mkdir()
    (tmp_path / "md_empty" / "md.traj").write_bytes(b"")  # an MD killed before its first frame
    folders = [tmp_path / "md_0", tmp_path / "md_missing", tmp_path / "md_empty", tmp_path / "md_1"]
    got = visited_frames(folders)
    assert len(got) == 5
    for frame, expected in zip(got, a + b, strict=True):
        assert np.allclose(frame.positions, expected.positions)
        assert np.allclose(frame.cell.array, expected.cell.array)
        assert frame.calc is None
    assert visited_frames([]) == []


# --- max_force and candidate_scores --------------------------------------------------------------


def test_max_force_is_the_largest_atomic_force_norm_computed_on_a_copy():
    atoms = _rattled(1, seed=3, stdev=0.1)[0]
    ref = atoms.copy()
    ref.calc = EMT()
    expected = np.linalg.norm(ref.get_forces(), axis=1).max()
    assert expected > 0.05
    assert max_force(EMT(), atoms) == pytest.approx(expected, rel=1e-12)
    assert atoms.calc is None  # computed on a copy

    scripted = _labelled(np.zeros((4, 3)), [[3, 4, 0], [0, 0, 1], [0, 0, 0], [1, 1, 1]], 0.0)
    assert max_force(ScriptedCalculator(None), scripted) == pytest.approx(5.0)


def test_candidate_scores_random_is_the_seeded_uniform_draw():
    frames = _rattled(5)
    scores = candidate_scores(None, frames, "random", np.random.default_rng(42))
    assert np.allclose(scores, np.random.default_rng(42).random(5))
    other = candidate_scores(None, frames, "random", np.random.default_rng(43))
    assert not np.allclose(scores, other)
    assert candidate_scores(None, [], "random", np.random.default_rng(0)).shape == (0,)
    assert candidate_scores(None, [], "max_force_std", np.random.default_rng(0)).shape == (0,)


def test_candidate_scores_max_force_ranks_by_predicted_force():
    frames = [_rattled(1, seed=s, stdev=0.02 * (1 + s))[0] for s in range(3)]
    scores = candidate_scores(EMT(), frames, "max_force", np.random.default_rng(0))
    assert scores.shape == (3,)
    assert np.allclose(scores, [max_force(EMT(), a) for a in frames])
    # a stored max_force_std in info must not replace the max_force baseline
    for a in frames:
        a.info["max_force_std"] = 1.0
    assert np.allclose(
        candidate_scores(EMT(), frames, "max_force", np.random.default_rng(0)), scores
    )


def test_candidate_scores_from_info_or_computed():
    calc = ScriptedCalculator(0.5)
    frames = [_labelled(np.zeros((4, 3)), np.zeros((4, 3)), std) for std in (0.3, 0.9, 0.1)]
    for a, estd in zip(frames, (4.0, 8.0, 2.0), strict=True):
        a.info["estd"] = estd
    # computed by the calculator: none of the frames has the score in its info
    scores = candidate_scores(calc, frames, "max_force_std", np.random.default_rng(0))
    assert np.allclose(scores, [0.3, 0.9, 0.1])
    assert "max_force_std" in calc.calls[0]
    energy = candidate_scores(calc, frames, "energy_std_per_atom", np.random.default_rng(0))
    assert np.allclose(energy, [1.0, 2.0, 0.5])  # energy_std / 4 atoms
    # the monitor's score already in every frame's info: used as it is, nothing computed
    for a, v in zip(frames, (7.0, 5.0, 6.0), strict=True):
        a.info["max_force_std"] = v
    n_calls = len(calc.calls)
    scores = candidate_scores(calc, frames, "max_force_std", np.random.default_rng(0))
    assert np.allclose(scores, [7.0, 5.0, 6.0]) and len(calc.calls) == n_calls
    # one frame without it: every score is computed again
    del frames[1].info["max_force_std"]
    scores = candidate_scores(calc, frames, "max_force_std", np.random.default_rng(0))
    assert np.allclose(scores, [0.3, 0.9, 0.1])


# --- audit_flags and precision_recall -------------------------------------------------------------


def _audit_frames() -> list[Atoms]:
    """Frames with a known largest force error (atom 2's error norm) and max_force_std."""
    rng = np.random.default_rng(0)
    frames = []
    #            (error, std) vs threshold 0.5: tp, tp, fp, fn, tn, tn
    for error, std in ((1.0, 0.8), (0.6, 2.0), (0.2, 0.7), (0.9, 0.1), (0.3, 0.4), (0.0, 0.5)):
        ref = rng.normal(size=(4, 3))
        pred = ref.copy()
        pred[2] += np.array([0.0, 0.6, 0.8]) * error  # |delta| = error on atom 2 only
        pred[0] += np.array([0.6, 0.0, 0.8]) * error / 2  # smaller error elsewhere
        frames.append(_labelled(ref, pred, std))
    return frames


def test_audit_flags_counts_against_the_force_threshold():
    frames = _audit_frames()
    out = audit_flags(ScriptedCalculator(0.5), frames)
    assert {k: out[k] for k in FLAG_COUNTS} == {
        "audit_tp": 2,
        "audit_fp": 1,
        "audit_fn": 1,
        "audit_tn": 2,  # std == threshold is not flagged (strictly above)
    }
    assert out["audit_threshold"] == 0.5
    assert np.allclose(out["audit_max_force_error"], [1.0, 0.6, 0.2, 0.9, 0.3, 0.0])
    assert np.allclose(out["audit_max_force_std"], [0.8, 2.0, 0.7, 0.1, 0.4, 0.5])
    precision, recall = precision_recall(out)
    assert precision == pytest.approx(2 / 3) and recall == pytest.approx(2 / 3)
    # the labelled frames keep their reference forces
    assert np.allclose(frames[0].get_forces(), frames[0].calc.results["forces"])


def test_audit_flags_without_a_force_threshold_counts_nothing():
    out = audit_flags(ScriptedCalculator(None), _audit_frames())
    assert [out[k] for k in FLAG_COUNTS] == [0, 0, 0, 0]
    assert out["audit_threshold"] is None
    assert len(out["audit_max_force_error"]) == len(out["audit_max_force_std"]) == 6
    empty = audit_flags(ScriptedCalculator(0.5), [])
    assert [empty[k] for k in FLAG_COUNTS] == [0, 0, 0, 0] and empty["audit_max_force_std"] == []


def test_precision_recall_pools_counts_and_is_nan_where_undefined():
    p, r = precision_recall({"audit_tp": 3, "audit_fp": 1, "audit_fn": 3, "audit_tn": 10})
    assert (p, r) == (pytest.approx(0.75), pytest.approx(0.5))
    p, r = precision_recall({"audit_tp": 0, "audit_fp": 0, "audit_fn": 2})
    assert math.isnan(p) and r == 0.0
    p, r = precision_recall({"audit_tp": 0, "audit_fp": 2, "audit_fn": 0})
    assert p == 0.0 and math.isnan(r)
    assert all(math.isnan(v) for v in precision_recall({}))


# --- evaluate_structures' MAEs ---------------------------------------------------------------------


def test_evaluate_structures_force_and_energy_mae():
    calc = ScriptedCalculator(None)
    frames = []
    for k, (de, df) in enumerate(((0.4, 0.1), (-0.8, -0.3))):
        ref = np.full((4, 3), float(k))
        atoms = _labelled(ref, ref + df, 0.2)
        atoms.calc = SinglePointCalculator(atoms, energy=-1.0, forces=ref)
        atoms.info["pred_energy"] = -1.0 + de
        frames.append(atoms)
    metrics = evaluate_structures(calc, frames)
    assert metrics["n"] == 2
    assert metrics["force_mae"] == pytest.approx(0.2)  # mean of |0.1| and |-0.3| over components
    assert metrics["force_rmse"] == pytest.approx(math.sqrt((0.1**2 + 0.3**2) / 2))
    assert metrics["energy_mae"] == pytest.approx(0.6)  # eV, per structure
    assert metrics["energy_mae_per_atom"] == pytest.approx(0.15)
    assert metrics["mean_max_force_std"] == pytest.approx(0.2)
    assert evaluate_structures(calc, []) == {"n": 0}


# --- configuration -------------------------------------------------------------------------------


def _config(**extra) -> ActiveLearningConfig:
    return validate(ActiveLearningConfig, {"structures": CU, "bootstrap": {}, **extra})


def test_md_settings_per_round_temperature_and_seed():
    config = _config(md={"temperature": 500, "seed": 7}, temperatures=[300, 600, 900])
    assert [config.md_settings(r).temperature for r in range(5)] == [300, 600, 900, 900, 900]
    assert config.md_settings(2, 3).seed == 7 + 2000 + 3
    assert config.md_settings(0).seed == 7
    assert config.md.temperature == 500 and config.md.seed == 7  # the config is unchanged
    plain = _config(md={"temperature": 500, "seed": 1, "steps": 33})
    settings = plain.md_settings(4, 1)
    assert (settings.temperature, settings.seed, settings.steps) == (500, 4002, 33)


def test_new_config_fields_defaults_and_validation():
    config = _config()
    assert (config.temperatures, config.committee, config.test_sets, config.audit) == (
        None,
        1,
        {},
        0,
    )
    assert (config.selection.metric, config.selection.candidates) == ("max_force_std", "flagged")
    config = _config(
        committee=3,
        audit=4,
        test_sets={"hot": "hot.xyz"},
        selection={"metric": "max_force", "candidates": "visited"},
    )
    assert (config.committee, config.audit, config.test_sets) == (3, 4, {"hot": "hot.xyz"})
    assert (config.selection.metric, config.selection.candidates) == ("max_force", "visited")
    assert _config(selection={"metric": "random"}).selection.metric == "random"
    with pytest.raises(ConfigError, match=r"^committee"):
        _config(committee=0)
    with pytest.raises(ConfigError, match=r"^audit"):
        _config(audit=-1)
    with pytest.raises(ConfigError, match=r"^selection\.candidates"):
        _config(selection={"candidates": "all"})
    with pytest.raises(ConfigError, match=r"^selection\.metric"):
        _config(selection={"metric": "force"})


# --- build_structure({file, index}) ---------------------------------------------------------------


def test_build_structure_file_and_index(tmp_path):
    frames = _rattled(3, seed=5)
    path = tmp_path / "starts.xyz"
    write(path, frames, format="extxyz")
    every = build_structure({"file": str(path)})
    assert len(every) == 3
    for k in (0, 2, -1):
        (one,) = build_structure({"file": str(path), "index": k})
        assert np.allclose(one.positions, frames[k].positions)
    assert len(build_structure(str(path))) == 3
    with pytest.raises(ValueError, match=r"index 3 is out of range: .*starts\.xyz has 3 frames"):
        build_structure({"file": str(path), "index": 3})
    with pytest.raises(ValueError, match=r"index -4 is out of range"):
        build_structure({"file": str(path), "index": -4})
    with pytest.raises(ValueError, match=r"unknown keys \['frame'\]"):
        build_structure({"file": str(path), "frame": 1})
