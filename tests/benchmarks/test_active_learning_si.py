"""The active-learning benchmark's periodic system (``--system si``, the SNAP oracle): the
shipped config under every strategy, the reference sets made with a stand-in oracle, the Si
stability runs, and the page's Si section (fast: no LAMMPS, no mlearn files, no data sets)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ase import Atoms
from ase.calculators.calculator import Calculator, all_changes
from ase.calculators.lj import LennardJones
from ase.calculators.singlepoint import SinglePointCalculator
from ase.io import read, write

from benchmarks.active_learning import benchmark, reference_sets, report
from benchmarks.active_learning import reference_sets_si as rsi
from benchmarks.common.records import append_jsonl, read_jsonl
from mlip_unc.config import load_active_config

SI = benchmark.SYSTEMS["si"]


def lj_si() -> LennardJones:
    """A stand-in oracle for Si: Lennard-Jones with its minimum at the diamond bond length."""
    bond = rsi.LATTICE * np.sqrt(3) / 4
    return LennardJones(sigma=bond / 2 ** (1 / 6), epsilon=0.2, rc=5.0, smooth=True)


# --- the config and the system ---------------------------------------------------------------------


@pytest.mark.parametrize("strategy", benchmark.STRATEGIES)
def test_si_config_under_every_strategy(tmp_path, strategy):
    from mlip_unc.active.data import build_structure

    items = benchmark.run_overrides(strategy, 1, tmp_path, tmp_path / "m.pt", SI.full, SI)
    items += benchmark.strategy_overrides(strategy, 0.05)
    config = load_active_config(SI.config, items)
    assert config.oracle == {"name": "snap", "element": "Si"}
    assert set(config.test_sets) == set(rsi.SETS) == set(SI.reference_sets)
    assert config.test_sets["md_melt"] == str(tmp_path / "test_md_melt.xyz")
    (start,) = build_structure(config.structures)
    assert len(start) == 64 and start.pbc.all()
    np.testing.assert_allclose(start.cell.lengths(), 2 * rsi.LATTICE)  # the reference sets' cell
    # the rounds heat the crystal up to the melt set's temperature; stability runs there too
    assert config.temperatures[0] == 300 and config.temperatures[-1] == rsi.Settings().melt_k
    assert SI.full["stability"]["temperatures"] == (1200.0, rsi.Settings().melt_k)
    assert ("model=" + str(tmp_path / "m.pt") in items) == (strategy != "committee5")


def test_systems_keep_their_records_apart():
    three = benchmark.THREE_BPA
    assert three.records == benchmark.RECORDS == "active_learning.jsonl.gz"
    assert three.stability_records == benchmark.STABILITY_RECORDS
    assert three.refit_records == benchmark.REFIT_RECORDS
    assert three.run_records == benchmark.RUN_RECORDS
    assert SI.records == f"{report.SI_PREFIX}.jsonl.gz" != three.records
    assert SI.stability_records == "active_learning_si_stability.jsonl"
    assert SI.work.name == "si" and three.work == benchmark.DEFAULT_WORK
    assert SI.default_references() == rsi.DEFAULT_OUT
    assert set(SI.whole_sets) == {"vacancy", "surface"}
    assert report.SI_SETS == rsi.SETS
    assert report.SI_MIN_DISTANCE_FRACTION == benchmark.SI_MIN_DISTANCE_FRACTION


def test_record_carries_the_system():
    row = {"round": 0, "oracle_calls": 20, "md_melt_force_mae": 0.1, "model": "m.pt"}
    assert benchmark.record("ours", 0, row, 1.0, "si")["system"] == "si"
    assert benchmark.record("ours", 0, row, 1.0)["system"] == "3bpa"


def test_parse_args_system_and_strategies():
    assert benchmark.parse_args(["--system", "si"]).system == "si"
    assert benchmark.parse_args([]).system == "3bpa"
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--system", "cu"])
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--strategies", "ours,ensemble"])


def test_seed_data_names_the_missing_reference_set(tmp_path):
    for name in ("seed_train.xyz", "seed_valid.xyz"):
        (tmp_path / name).write_text("")  # the seed set exists: no oracle needed
    with pytest.raises(FileNotFoundError, match=r"md_300K\.xyz: .* of si .*reference_sets_si"):
        benchmark.seed_data(tmp_path, 0, SI.full, tmp_path / "refs", SI)


def test_seed_data_takes_every_frame_of_the_defect_sets(tmp_path):
    refs = tmp_path / "refs"
    refs.mkdir()
    frames = []
    for k in range(6):
        atoms = rsi.crystal()
        atoms.rattle(0.01, seed=k)
        atoms.calc = SinglePointCalculator(atoms, energy=-1.0, forces=np.zeros((64, 3)))
        frames.append(atoms)
    for name in rsi.SETS:
        write(refs / f"{name}.xyz", frames, format="extxyz")
    for name in ("seed_train.xyz", "seed_valid.xyz"):
        (tmp_path / name).write_text("")
    benchmark.seed_data(tmp_path, 0, SI.full, refs, SI)
    assert len(read(tmp_path / "test_md_melt.xyz", ":")) == 3  # every other frame
    assert len(read(tmp_path / "test_vacancy.xyz", ":")) == 6  # every frame


# --- reference sets ------------------------------------------------------------------------------


def test_cells_of_the_reference_sets():
    crystal = rsi.crystal()
    assert len(crystal) == 64 and len(rsi.vacancy_cell()) == 63
    assert rsi.min_distance([crystal]) == pytest.approx(rsi.LATTICE * np.sqrt(3) / 4)
    slab = rsi.surface_cell(10.0)
    assert len(slab) == 64 and slab.pbc.all()
    assert slab.cell.lengths()[2] == pytest.approx(np.ptp(slab.positions[:, 2]) + 10.0)
    assert rsi.min_distance([slab]) == pytest.approx(rsi.min_distance([crystal]))


def test_oracle_min_distance_from_the_manifest():
    manifest = {"sets": {"md_300K": {"min_distance": 2.1}, "md_melt": {"min_distance": 1.9}}}
    assert rsi.oracle_min_distance(manifest) == 1.9
    assert rsi.oracle_min_distance(manifest, ["md_300K"]) == 2.1
    with pytest.raises(ValueError, match="holds none"):
        rsi.oracle_min_distance({"sets": {}})


def test_build_makes_every_set_once_and_records_it(tmp_path, capsys):
    out = tmp_path / "refs"
    manifest = rsi.build(out, rsi.QUICK, rsi.SETS, oracle=lj_si())
    for name in rsi.SETS:
        entry = manifest["sets"][name]
        frames = read(out / f"{name}.xyz", ":")
        assert entry["frames"] == len(frames) and entry["sha256"] == reference_sets.sha256(
            out / f"{name}.xyz"
        )
        assert entry["min_distance"] == pytest.approx(rsi.min_distance(frames), abs=1e-4)
        assert frames[0].get_forces().shape == (entry["atoms"], 3)
    assert manifest["sets"]["md_300K"]["frames"] == rsi.QUICK.n_frames
    vacancy = read(out / "vacancy.xyz", ":")
    assert len(vacancy) == rsi.QUICK.n_defect_frames + 1 and len(vacancy[0]) == 63
    assert vacancy[0].info["relaxed"] is True
    assert json.loads((out / "manifest.json").read_text()) == manifest
    rsi.build(out, rsi.QUICK, rsi.SETS, oracle=lj_si())  # resumable: nothing made again
    assert capsys.readouterr().out.count("up to date") == len(rsi.SETS)
    record = tmp_path / "record.json"
    record.write_text(json.dumps(manifest))
    rsi.main(["--verify", "--out", str(out), "--record", str(record)])
    (out / "surface.xyz").write_text("changed")
    with pytest.raises(SystemExit, match="surface"):
        rsi.main(["--verify", "--out", str(out), "--record", str(record)])


def test_unknown_set_is_named():
    with pytest.raises(ValueError, match="unknown set 'dimer'"):
        rsi.frames_of("dimer", lj_si(), rsi.QUICK)


# --- stability -----------------------------------------------------------------------------------


class _Free(Calculator):
    """No forces: the atoms drift with their thermal velocities."""

    implemented_properties = ["energy", "forces"]

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        self.results = {"energy": 0.0, "forces": np.zeros((len(self.atoms), 3))}


class _Collapsing(Calculator):
    """Strong forces towards the first atom: the cell collapses onto it."""

    implemented_properties = ["energy", "forces"]

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        r = self.atoms.positions - self.atoms.positions[0]
        self.results = {"energy": 0.0, "forces": -200.0 * r}


class _Refusing(Calculator):
    implemented_properties = ["energy", "forces"]

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        raise FloatingPointError("NaN in the forces")


def _patch_calculator(monkeypatch, make) -> list:
    import mlip_unc.calculator

    made: list = []

    def factory(model, **kwargs):
        made.append((model, kwargs))
        return make()

    monkeypatch.setattr(mlip_unc.calculator, "UncertaintyCalculator", factory)
    return made


SETTINGS = {
    "stability": {"temperatures": (1200.0, 2200.0), "runs": 1, "steps": 40, "timestep": 1.0}
}


def test_stability_si_survives_fails_and_refuses(monkeypatch):
    made = _patch_calculator(monkeypatch, _Free)  # free flight: no pair comes within 1.2 A
    row = benchmark.stability_si(Path("m.pt"), 1200.0, 0, SETTINGS, rsi.crystal(), 1.5)
    assert made == [(Path("m.pt"), {"uncertainty": "none"})]
    assert (row["failed"], row["survived_ps"], row["length_ps"]) == (False, 0.04, 0.04)
    assert row["min_distance_limit"] == pytest.approx(benchmark.SI_MIN_DISTANCE_FRACTION * 1.5)

    _patch_calculator(monkeypatch, _Collapsing)
    row = benchmark.stability_si(Path("m.pt"), 1200.0, 0, SETTINGS, rsi.crystal(), 2.0)
    assert row["failed"] is True and row["reason"].startswith("min distance")
    assert 0 < row["survived_ps"] < row["length_ps"]

    _patch_calculator(monkeypatch, _Refusing)
    row = benchmark.stability_si(Path("m.pt"), 2200.0, 0, SETTINGS, rsi.crystal(), 2.0)
    assert (row["failed"], row["reason"], row["survived_ps"]) == (True, "FloatingPointError", 0.01)


def _labelled(atoms: Atoms, energy: float) -> Atoms:
    atoms = atoms.copy()
    atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=np.zeros((len(atoms), 3)))
    return atoms


def test_stability_starts_from_the_crystal_or_the_melt(tmp_path):
    write(tmp_path / "seed_train.xyz", [_labelled(rsi.crystal(), -1.0)], format="extxyz")
    melt = rsi.crystal()
    melt.rattle(0.3, seed=1)
    write(tmp_path / "test_md_melt.xyz", [_labelled(melt, -2.0)], format="extxyz")
    cold = benchmark.si_stability_start(tmp_path, 1200.0)
    hot = benchmark.si_stability_start(tmp_path, rsi.Settings().melt_k)
    np.testing.assert_allclose(cold.positions, rsi.crystal().positions, atol=1e-6)
    np.testing.assert_allclose(hot.positions, melt.positions, atol=1e-6)
    assert cold.calc is None and hot.calc is None


def test_run_stability_of_si_records_with_the_system(tmp_path, monkeypatch):
    _patch_calculator(monkeypatch, _Free)
    folder, out, refs = tmp_path / "seed_0", tmp_path / "out", tmp_path / "refs"
    (folder / "ours").mkdir(parents=True)
    out.mkdir()
    refs.mkdir()
    write(folder / "seed_train.xyz", [_labelled(rsi.crystal(), -1.0)], format="extxyz")
    write(folder / "test_md_melt.xyz", [_labelled(rsi.crystal(), -1.0)], format="extxyz")
    (folder / "ours" / "state.json").write_text(
        json.dumps({"config": {"rounds": 1}, "rounds": [{"model": "/m/r0.pt"}]})
    )
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        benchmark.run_stability("ours", 0, folder, SETTINGS, out, "full", SI, refs)
    (refs / "manifest.json").write_text(json.dumps({"sets": {"md_melt": {"min_distance": 2.0}}}))
    benchmark.run_stability("ours", 0, folder, SETTINGS, out, "full", SI, refs)
    rows = read_jsonl(out / SI.stability_records)
    assert [(r["temperature"], r["system"]) for r in rows] == [(1200.0, "si"), (2200.0, "si")]
    assert not (out / benchmark.STABILITY_RECORDS).exists()  # 3BPA's file untouched
    benchmark.run_stability("ours", 0, folder, SETTINGS, out, "full", SI, refs)
    assert len(read_jsonl(out / SI.stability_records)) == 2


# --- the page's Si section -----------------------------------------------------------------------


def _si_run(strategy: str, seed: int, errors: list[float]) -> list[dict]:
    rows = []
    for k, e in enumerate(errors):
        row = {"strategy": strategy, "seed": seed, "round": k, "oracle_calls": 20 + 10 * k}
        row.update(tag="full", system="si")
        for name in report.SI_SETS:
            row.update({f"{name}_force_mae": e / 1000, f"{name}_force_rmse": e / 800})
            row[f"{name}_energy_mae"] = 0.01
        if k == 0:
            row["cpu_initial_train_s"] = 5.0
        if k < len(errors) - 1:
            row.update(cpu_md_s=1.0, cpu_score_s=1.0, cpu_retrain_s=2.0)
            row.update(n_md_frames=50, n_flagged=45)
        rows.append(row)
    return rows


def test_page_gets_a_si_section_from_its_own_records(tmp_path):
    report.write_report(tmp_path, "full")  # no records at all: the Si section says how to run
    text = (tmp_path / "active_learning.md").read_text()
    assert "## Si with the published SNAP potential as the oracle" in text
    assert "Not run yet" in text and "reference_sets_si" in text
    assert "the periodic system (Si with the SNAP oracle) is not run yet" in text

    path = tmp_path / f"{report.SI_PREFIX}.jsonl.gz"
    for strategy, errors in (("random", [90.0, 60.0]), ("ours", [90.0, 40.0])):
        for r in _si_run(strategy, 0, errors):
            append_jsonl(path, r)
    stab = {"strategy": "ours", "seed": 0, "tag": "full", "system": "si", "run": 0}
    stab.update(temperature=2200.0, length_ps=2.0, survived_ps=0.5, failed=True)
    append_jsonl(tmp_path / f"{report.SI_PREFIX}_stability.jsonl", stab)
    append_jsonl(
        tmp_path / f"{report.SI_PREFIX}_runs.jsonl",
        {"command": "python -m benchmarks.active_learning --system si", "tag": "full"},
    )
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("## Si with") :]
    assert "stand-in for DFT" in section and "Not run yet" not in section
    assert "Target = random's final error, 60.0 meV/Å." in section
    assert "| ours | 1 | 40.0 ± 0.0 | 30 ± 0 | 26 |" in section  # reached between the rounds
    assert (
        "md_melt F MAE / RMSE, E MAE" in section
        and "| ours | 2200 | 1 | 1 | 0.500 of 2 |" in section
    )
    assert "- Command: `python -m benchmarks.active_learning --system si`" in section
    assert "The strategies' final errors span 40.0-60.0 meV/Å" in section
    assert "monitor flagged: random 90 %, ours 90 %" in section
    assert "Why we think the target is missed here" in section
    assert "has its section below" in text[: text.index("## Si with")]
    summary = json.loads((tmp_path / f"{report.SI_PREFIX}.json").read_text())
    assert summary["target_meV_A"] == pytest.approx(60.0)
    assert (tmp_path / f"{report.SI_PREFIX}.png").stat().st_size > 0
    assert not json.loads((tmp_path / "active_learning.json").read_text())["strategies"]


# --- trained from scratch at every round ---------------------------------------------------------


def _frames(n: int, start: float) -> list[Atoms]:
    """``n`` labelled two-atom frames told apart by their first x coordinate and energy."""
    out = []
    for k in range(n):
        atoms = Atoms("Si2", positions=[[start + k, 0, 0], [0, 0, 2.3]], cell=[8] * 3, pbc=True)
        atoms.calc = SinglePointCalculator(atoms, energy=start + k, forces=np.zeros((2, 3)))
        out.append(atoms)
    return out


def _xs(frames: list[Atoms]) -> list[float]:
    return [round(float(a.positions[0, 0]), 6) for a in frames]


def test_replay_splits_draws_one_generator_round_after_round():
    """The loop's split: one generator seeded with the run's seed, 20 % of each round's labels
    to validation (none of fewer than 3), each part appended to the cumulative sets."""
    from mlip_unc.active.data import split_labelled

    seed_train, seed_valid = _frames(4, 0.0), _frames(1, 50.0)
    labelled = [_frames(10, 100.0), _frames(10, 200.0), _frames(2, 300.0)]
    sets = benchmark.replay_splits(seed_train, seed_valid, labelled, 0.2, 7)
    rng = np.random.default_rng(7)
    train, valid = list(seed_train), list(seed_valid)
    for (got_train, got_valid), frames in zip(sets, labelled, strict=True):
        t, v = split_labelled(frames, 0.2, rng)
        train, valid = train + t, valid + v
        assert _xs(got_train) == _xs(train) and _xs(got_valid) == _xs(valid)
    assert [(len(t), len(v)) for t, v in sets] == [(12, 3), (20, 5), (22, 5)]
    assert _xs(sets[0][0])[:4] == _xs(seed_train)  # the seed set first, as in the loop


def _scratch_run(tmp_path: Path, rounds: int = 3) -> Path:
    """A finished fake run ``seed_0/ours``: seed set, labels of every round, the state, and the
    retraining files of each round (written from the replayed split, as the loop wrote them)."""
    folder = tmp_path / "seed_0"
    run = folder / "ours"
    seed_train, seed_valid = _frames(4, 0.0), _frames(1, 50.0)
    folder.mkdir(parents=True)
    write(folder / "seed_train.xyz", seed_train, format="extxyz")
    write(folder / "seed_valid.xyz", seed_valid, format="extxyz")
    labelled = [_frames(5, 100.0 * (r + 1)) for r in range(rounds)]
    sets = benchmark.replay_splits(seed_train, seed_valid, labelled, 0.2, 3)
    state: dict = {"config": {"rounds": rounds, "seed": 3, "selection": {"valid_fraction": 0.2}}}
    state["rounds"] = []
    for r in range(rounds):
        (run / f"round_{r}" / "retrained").mkdir(parents=True)
        write(run / f"round_{r}" / "labelled.xyz", labelled[r], format="extxyz")
        write(run / f"round_{r}" / "retrained" / "train.xyz", sets[r][0], format="extxyz")
        write(run / f"round_{r}" / "retrained" / "valid.xyz", sets[r][1], format="extxyz")
        row = {"oracle_calls": 5 + 5 * r, "n_labelled": 4 if r == 1 else 5}
        row["n_dropped"] = 1 if r == 1 else 0
        model = run / f"round_{r}" / "retrained" / "model.pt"
        state["rounds"].append({"round": r, "row": row, "model": str(model)})
    (run / "state.json").write_text(json.dumps(state))
    return folder


def test_round_sets_reads_the_round_files_else_replays_the_split(tmp_path):
    folder = _scratch_run(tmp_path)
    run = folder / "ours"
    train2, valid2, calls2 = benchmark.round_sets(folder, "ours", 2)
    assert (len(train2), len(valid2), calls2) == (12, 3, 15)  # dropped labels are calls too
    assert benchmark.round_sets(folder, "ours", 1)[2] == 10
    # files gone: the same frames, in the same order, from the replayed split
    for name in ("train.xyz", "valid.xyz"):
        (run / "round_1" / "retrained" / name).unlink()
    train, valid, calls = benchmark.round_sets(folder, "ours", 2)
    assert (_xs(train), _xs(valid), calls) == (_xs(train2), _xs(valid2), 15)
    with pytest.raises(ValueError, match="round 4 not in 1..3"):
        benchmark.round_sets(folder, "ours", 4)
    assert benchmark.final_round("ours", folder) == 3


def test_refit_rounds_records_each_round_once_and_keeps_the_final_refit(tmp_path, monkeypatch):
    """One record per listed round (``round``, ``oracle_calls``), training stubbed; the final
    round is the existing record without ``round`` (not redone), a rerun adds nothing."""
    import mlip_unc.active.evaluation
    import mlip_unc.active.training

    folder = _scratch_run(tmp_path)
    for name in SI.reference_sets:
        write(folder / f"test_{name}.xyz", _frames(1, 0.0), format="extxyz")
    trained: list = []

    def train_model(train, valid, training, out_dir, **kwargs):
        trained.append((len(train), len(valid), Path(out_dir).name, kwargs["seed"]))
        return Path(out_dir) / "model.pt"

    monkeypatch.setattr(mlip_unc.active.training, "train_model", train_model)
    _patch_calculator(monkeypatch, lambda: None)
    monkeypatch.setattr(
        mlip_unc.active.evaluation,
        "evaluate_structures",
        lambda calc, frames: {"force_mae": 0.1, "energy_mae": 0.01},
    )
    out = tmp_path / "out"
    out.mkdir()
    append_jsonl(out / SI.refit_records, {"strategy": "ours", "seed": 0, "tag": "full"})
    for _ in range(2):
        benchmark.refit_final("ours", 0, folder, SI.full, out, "full", SI, rounds=[1, 2, 3])
    assert trained == [(8, 2, "refit_ours_round_1", 0), (12, 3, "refit_ours_round_2", 0)]
    rows = read_jsonl(out / SI.refit_records)[1:]
    assert [(r["round"], r["oracle_calls"], r["n_train"]) for r in rows] == [
        (1, 10, 8),
        (2, 15, 12),
    ]
    assert rows[0]["md_melt_force_mae"] == 0.1 and rows[0]["system"] == "si"
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--refit-rounds", "1,2"])  # only with --refit-only


def _refit(strategy: str, seed: int, error_meV: float, k: int | None = None) -> dict:
    row: dict = {"strategy": strategy, "seed": seed, "tag": "full", "system": "si"}
    if k is not None:
        row.update(round=k, oracle_calls=20 + 10 * k)
    row.update({f"{name}_force_mae": error_meV / 1000 for name in report.SI_SETS})
    return row


def test_labels_to_target_on_the_from_scratch_curves(tmp_path):
    """Target = random's mean final refit; calls where each complete from-scratch curve first
    reaches it (linear between rounds), the ratios against the issue's targets; round 0 is
    the shared initial model; a curve with a missing round is shown but not counted."""
    path = tmp_path / f"{report.SI_PREFIX}.jsonl.gz"
    refits = tmp_path / f"{report.SI_PREFIX}_refit.jsonl"
    warm = {"random": [100.0, 90.0, 90.0], "ours": [100.0, 95.0, 95.0]}
    warm["committee5"] = [120.0, 95.0, 95.0]  # its round 0 (the committee) is not the curve's
    scratch = {  # (round 1, final round 2) from scratch
        "random": {0: (90.0, 70.0), 1: (90.0, 50.0)},  # target 60
        "ours": {0: (60.0, 40.0), 1: (80.0, 50.0)},  # seed 0 reaches at 30, seed 1 at 36.7
        "committee5": {0: (80.0, 50.0), 1: (70.0, 40.0)},  # 36.7, 33.3: mean 35
    }
    for s, errors in warm.items():
        for seed in (0, 1):
            for r in _si_run(s, seed, errors):
                append_jsonl(path, r)
            append_jsonl(refits, _refit(s, seed, scratch[s][seed][1]))  # the final refit
            append_jsonl(refits, _refit(s, seed, scratch[s][seed][0], k=1))
    append_jsonl(refits, {**_refit("ours", 2, 10.0, k=1)})  # seed 2: no final refit, no run
    summary, _, _ = report.system_summary(
        tmp_path, report.SI_PREFIX, f"{report.SI_PREFIX}.jsonl.gz", "full", report.SI_SETS
    )
    assert summary["refit"]["ours"]["n"] == 2  # the final refits only
    sc = summary["scratch"]
    assert sc["target_meV_A"] == pytest.approx(60.0)
    ours = sc["strategies"]["ours"]
    assert [p["round"] for p in ours["curve"]] == [0, 1, 2]
    assert ours["curve"][0]["error_mean"] == pytest.approx(100.0)  # the shared initial model
    assert sc["strategies"]["committee5"]["curve"][0]["error_mean"] == pytest.approx(100.0)
    assert ours["curve"][1]["error_mean"] == pytest.approx(70.0)
    assert ours["curve"][1]["calls"] == pytest.approx(30.0)
    assert {k: v["calls"] for k, v in ours["calls_to_target"].items()} == pytest.approx(
        {"0": 30.0, "1": 30 + 10 * 2 / 3}
    )
    assert ours["calls_to_target_stat"]["mean"] == pytest.approx(30 + 10 / 3)
    rnd = sc["strategies"]["random"]
    assert rnd["calls_to_target"]["0"] == {"calls": 40.0, "reached": False}
    assert rnd["calls_to_target"]["1"]["calls"] == pytest.approx(37.5)  # random: 38.75
    assert sc["verdicts"][0].startswith("ours reaches random's final from-scratch error with 0.86x")
    assert "missed" in sc["verdicts"][0] and "0.95x" in sc["verdicts"][1]  # 33.3 / 35
    assert "(random: 1 of 2 seeds never reach it" in sc["verdicts"][0]  # an upper bound
    assert "upper bound" not in sc["verdicts"][1]
    assert "(target <= 1.1x): met" in sc["verdicts"][1]
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("### Trained from scratch at every round (Si)") :]
    assert (
        "| ours | 2 | 100.0 ± 0.0 @ 20 | 70.0 ± 10.0 @ 30 | 45.0 ± 5.0 @ 40 | 30, 37 | 33.3 ± 3.3 |"
        in section
    )
    assert "remains the one the acceptance is judged on" in section
    assert "Trained from scratch at every round (section below)" in text


# --- the loop retrained from scratch every round -------------------------------------------------


def test_retrain_from_scratch_runs_get_their_own_folders_tag_and_section(tmp_path):
    settings = {"overrides": ["rounds=2", benchmark.SCRATCH]}
    items = benchmark.run_overrides(
        "ours", 0, tmp_path, tmp_path / "m.pt", settings, benchmark.SYSTEMS["si"]
    )
    assert f"out={tmp_path / 'ours_scratch'}" in items and benchmark.SCRATCH in items
    assert benchmark.run_name("ours", {"overrides": []}) == "ours"
    assert benchmark.parse_args(["--system", "si", "--retrain-from-scratch"]).retrain_from_scratch

    path = tmp_path / f"{report.SI_PREFIX}.jsonl.gz"
    for strategy, errors in (("random", [90.0, 60.0]), ("ours", [90.0, 40.0])):
        for r in _si_run(strategy, 0, errors):
            append_jsonl(path, r)  # the fine-tuned runs (tag full)
    for strategy, errors in (("random", [90.0, 50.0]), ("ours", [90.0, 30.0])):
        for r in _si_run(strategy, 0, errors):
            append_jsonl(path, {**r, "tag": report.SCRATCH_TAG})
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("### The loop retrained from scratch every round (Si)") :]
    assert "Target = random's final error in these runs, 50.0 meV/Å." in section
    assert "| ours | 1 | 30.0 ± 0.0 |" in section
    assert "ours reaches random's final error with" in section and ": missed" in section
    assert "Final error: ours 30.0 ± 0.0 against random's 50.0 ± 0.0 meV/Å" in section
    # the fine-tuned table keeps its own target
    assert "Target = random's final error, 60.0 meV/Å." in text
    assert report.scratch_loop_section([]) == []
    assert "How much the score chooses (Si" not in text
    assert "A wider pool" not in text

    for tag, errors in (("full", [90.0, 55.0]), (report.SCRATCH_TAG, [90.0, 45.0])):
        for r in _si_run("true_error", 0, errors):
            append_jsonl(path, {**r, "tag": tag})
    pool = {"strategy": "true_error", "seed": 0, "system": "si", "round": 0, "n_frames": 51,
            "n_labelled": 51, "mean_max_force_error": 0.2, "spearman_sigma": 0.55,
            "spearman_force": 0.4}  # fmt: skip
    append_jsonl(tmp_path / f"{report.SI_PREFIX}_pool.jsonl", {**pool, "tag": "full"})
    text = report.write_report(tmp_path, "full").read_text()
    warm = text[text.index("### How much the score chooses (Si, fine-tuned each round)") :]
    assert "| true_error | 1 | 55.0 ± 0.0 |" in warm.split("###")[1]
    assert "| 0 | 1 | 51 | 0.20 ± 0.00 | 0.55 ± 0.00 | 0.40 ± 0.00 |" in warm.split("###")[1]
    loop = text[text.index("### How much the score chooses (Si, the loop retrained") :]
    assert "| true_error | 1 | 45.0 ± 0.0 |" in loop and "Spearman sigma_F" not in loop


def test_wide_pool_si_runs_five_times_the_steps_and_get_their_section(tmp_path):
    si = benchmark.SYSTEMS["si"]
    wide = benchmark.wide_pool({"overrides": [benchmark.SCRATCH]}, si)
    assert wide["overrides"] == [benchmark.SCRATCH, "md.steps=5000"]  # 5 x the shipped 1000
    path = tmp_path / f"{report.SI_PREFIX}.jsonl.gz"
    for strategy, errors in (("random", [90.0, 60.0]), ("ours", [90.0, 40.0])):
        for r in _si_run(strategy, 0, errors):
            append_jsonl(path, r)  # the fine-tuned runs (tag full)
            append_jsonl(path, {**r, "tag": "scratch_wide", "n_md_frames": 251})
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("### A wider pool, retrained from scratch every round (Si)") :]
    assert "a round logs 251 frames" in section
    assert "Choosing the labels among 5x more MD frames per round (retrained" in text
    assert "(a wider pool)" not in text  # no longer 'not yet tested'
    assert "Target = random's final error in these runs, 60.0 meV/Å." in section
    assert "| ours | 1 | 40.0 ± 0.0 |" in section
    assert "wide_pool" in json.loads((tmp_path / f"{report.SI_PREFIX}.json").read_text())
    # a run that ended a round early: its strategy's mean curve stops, the table says so
    for r in _si_run("random", 1, [90.0]):
        append_jsonl(path, {**r, "tag": "scratch_wide", "n_md_frames": 251})
    text = report.write_report(tmp_path, "full").read_text()
    section = text[text.index("### A wider pool, retrained from scratch every round (Si)") :]
    assert "| random | 90.0 @ 20 | – |" in section and "–: a run of that strategy ended" in section
