"""benchmarks/accuracy.py: run bookkeeping, acceptance lines, the mace-side metrics (with EMT
standing in for a MACE calculator) and, in the slow tier, the --quick run with its resume."""

import json

import ase.io
import numpy as np
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.units import GPa

from benchmarks import accuracy as bench
from benchmarks.common import evaluation as ev
from benchmarks.common import mace_torch as mt
from benchmarks.common.force_frames import CONFIGS
from benchmarks.common.format import numbers
from benchmarks.common.tables import read_csv

SETTINGS = {"quick": True, "budget_minutes": 1.0, "split_seed": 0, "overrides": []}


def _run(dataset, row, seed, force, energy=1.0, tests=("test",), stress=None):
    metrics = {
        "energy_mae_meV_atom": energy,
        "force_mae_meV_A": force,
        "stress_mae_GPa": stress,
        "n_frames": 3,
    }
    return {
        "kind": "run",
        "dataset": dataset,
        "row": row,
        "seed": seed,
        "train_minutes": 10.0,
        "parameters": 100,
        "tests": {
            label: {**metrics, "force_mae_meV_A": force + k} for k, label in enumerate(tests)
        },
    }


def _cells(n=4):
    frames = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
        atoms.rattle(0.1, seed=k)
        atoms.set_cell(atoms.cell * (1.0 + 0.01 * k), scale_atoms=True)
        atoms.calc = EMT()
        atoms.get_stress()
        frames.append(atoms)
    return frames


class ShiftedEMT(EMT):
    """EMT plus 10 meV per atom and 2 meV/A on every force component."""

    def calculate(self, *args, **kwargs):
        super().calculate(*args, **kwargs)
        self.results["energy"] = self.results["energy"] + 0.010 * len(self.atoms)
        self.results["forces"] = self.results["forces"] + 0.002


def test_runs_are_all_kept_mean_std_n(tmp_path):
    runs = bench.Runs(tmp_path / "accuracy.jsonl", SETTINGS)
    for rec in (
        _run("ethanol", "native", 0, 10.0),
        _run("ethanol", "native", 1, 14.0),
        _run("ethanol", "mace_torch", 0, 11.0),
        _run("3BPA", "gin", 0, 50.0, tests=("test_300K", "mixedT")),
    ):
        runs.add(rec)
    results = bench.assemble(runs, {"x": 1})
    native = results["ethanol"]["native"]
    assert native["n"] == 2 and [r["force_mae_meV_A"] for r in native["runs"]] == [10.0, 14.0]
    assert native["force_mae_meV_A"] == pytest.approx(12.0)
    assert native["spread"]["force_mae_meV_A"] == pytest.approx(np.std([10.0, 14.0], ddof=1))
    assert results["ethanol"]["mace_torch"]["spread"]["force_mae_meV_A"] is None  # n = 1
    assert results["ethanol"]["native"]["stress_mae_GPa"] is None
    assert list(results["ethanol"]) == ["native", "mace_torch"]  # row order of ROWS
    assert (
        results["3BPA"]["gin"]["force_mae_meV_A"] == 50.0
        and results["3BPA_mixedT"]["gin"]["force_mae_meV_A"] == 51.0
    )
    assert runs.done("ethanol", "native", 1) and not runs.done("ethanol", "native", 2)
    meta = {
        "commands": ["python -m benchmarks.accuracy  (python: x)"],
        "budget_minutes": 10.0,
        "threads": 1,
        "seeds": [0, 1],
        "status": "partial",
        "updated": "now",
        "mace_torch_method": "m",
        "overrides": [],
        "skipped": {},
        "failed": {},
    }
    bench.write_markdown({**results, "meta": meta}, tmp_path / "accuracy.md")
    md = (tmp_path / "accuracy.md").read_text()
    assert "| ethanol | native | 1 ± 0 | 12 ± 2.8 | n/a | 10 ± 0 | 100 | 2 |" in md  # mean ± std, n
    assert "| ethanol | mace_torch | 1 | 11 | n/a | 10 | 100 | 1 |" in md
    assert md.index("| ethanol | native |") < md.index("## Run")  # the table first
    assert (
        "- ethanol: best of our rows F-MAE (native) 12.0 vs mace_torch 11.0 meV/A: missed by 1.0"
        in md
    )
    # the file is the record: a new Runs reads the same runs; other settings are refused
    assert len(bench.Runs(tmp_path / "accuracy.jsonl", SETTINGS).runs()) == 4
    with pytest.raises(SystemExit, match="was made with"):
        bench.Runs(tmp_path / "accuracy.jsonl", {**SETTINGS, "budget_minutes": 2.0})


def verdict(lines: list[str], start: str) -> tuple[list[float], str]:
    """The numbers after ``start`` on the line that begins with it, and its verdict word."""
    line = next(x for x in lines if x.startswith(start))
    return numbers(line[len(start) :]), line.rsplit(": ", 1)[-1].split()[0]


def test_acceptance_lines_from_results():
    def row(f, e=1.0):
        return {"force_mae_meV_A": f, "energy_mae_meV_atom": e}

    results = {
        "ethanol": {"native": row(20.0), "gin": row(30.0), "mace_torch": row(22.0)},
        "3BPA": {"native": row(40.0), "mace_torch": row(30.0)},
        "Si": {"native": row(50.0, 4.0), "mace_torch": row(40.0, 12.5)},
    }
    lines = bench.acceptance(results)
    assert verdict(lines, "- ethanol:") == ([20.0, 22.0], "met")  # the best of ours: native
    assert "(native)" in lines[0]
    assert verdict(lines, "- 3BPA:") == ([40.0, 30.0, 10.0, 1.33], "missed")
    assert verdict(lines, "- Si native:") == ([4.0, 10.0], "met")  # E MAE <= 10 meV/atom
    assert verdict(lines, "- Si mace_torch:") == ([12.5, 10.0, 12.5, 10.0], "missed")
    assert bench.acceptance({})[0].endswith("n/a (runs missing)")

    # Each of our runs beside the mace_torch run of its seed (the same invocation).
    def runs(*fs):
        return [{"seed": k, "force_mae_meV_A": f} for k, f in enumerate(fs)]

    results["3BPA"]["native"]["runs"] = runs(45.0, 35.0)
    results["3BPA"]["mace_torch"]["runs"] = runs(30.0, 36.0)
    lines = bench.acceptance(results)
    assert verdict(lines, "  - same run (seed 0): native") == ([45.0, 30.0, 1.5], "missed")
    assert verdict(lines, "  - same run (seed 1): native") == ([35.0, 36.0, 0.97], "met")
    # mlearn: the rows of the configs held now (CURRENT_MLEARN) get one summary line
    assert not any("CURRENT_MLEARN" in line for line in lines)  # none of them ran

    def label(row):
        return f"{row} [{bench.CURRENT_MLEARN[row]}]"

    results["Si"].update({label("native"): row(60.0, 9.0), label("gin"): row(60.0, 10.5)})
    lines = bench.acceptance(results)
    summary = next(line for line in lines if "CURRENT_MLEARN" in line)
    per_row = dict(part.rsplit(": ", 1) for part in summary.split(": ", 1)[1].split("; "))
    assert per_row == {f"Si {label('native')} 9": "met", f"Si {label('gin')} 10.5": "missed"}
    assert verdict(lines, "- Si mace_torch:")[1] == "missed"  # every row, listed after


def test_mace_side_metrics_and_labels(tmp_path):
    """The mace row's metrics: a calculator's predictions against our reader's float64 labels,
    stress compared as full tensors (a Voigt permutation would show)."""
    frames = _cells()
    path = tmp_path / "cells.xyz"
    ase.io.write(path, frames)
    spec = {"energy_key": "energy", "forces_key": "forces", "stress_key": "stress"}
    read = ev.read_frames(path, spec)
    exact = ev.metrics(ev.calculator_predictions(EMT(), read, spec))
    # (the file rounds positions: EMT on the read positions differs from the labels by ~1e-6)
    assert exact["energy_mae_meV_atom"] == pytest.approx(0.0, abs=1e-3)
    assert exact["force_mae_meV_A"] == pytest.approx(0.0, abs=1e-2)
    assert exact["stress_mae_GPa"] == pytest.approx(0.0, abs=1e-4)
    shifted = ev.metrics(ev.calculator_predictions(ShiftedEMT(), read, spec))
    assert shifted["energy_mae_meV_atom"] == pytest.approx(10.0, abs=1e-3)
    assert shifted["force_mae_meV_A"] == pytest.approx(2.0, abs=1e-2)
    assert shifted["n_frames"] == 4
    # what mace_run_train reads: REF_* keys, stress in ASE's Voigt order and sign
    back = ase.io.read(mt.write_mace_xyz(read, spec, tmp_path / "mace.xyz"), ":")
    for atoms, ref in zip(back, frames, strict=False):
        assert atoms.info["REF_energy"] == pytest.approx(ref.get_potential_energy(), abs=1e-9)
        np.testing.assert_allclose(atoms.arrays["REF_forces"], ref.get_forces(), atol=1e-9)
        np.testing.assert_allclose(atoms.info["REF_stress"], ref.get_stress(), atol=1e-12)
    assert np.abs(frames[0].get_stress()).max() / GPa > 0.1  # the check is not vacuous


@pytest.mark.slow
def test_quick_run_layout_and_resume(tmp_path):
    argv = ["--quick", "--out", str(tmp_path), "--rows", "native,gin,mace_torch"]
    results = bench.main(argv)
    on_disk = json.loads((tmp_path / "accuracy.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    meta = on_disk["meta"]
    assert meta["commands"][0].startswith(
        "python -m benchmarks.accuracy " + " ".join(argv) + "  (python: "
    )
    assert meta["budget_minutes"] == pytest.approx(1 / 6) and meta["seeds"] == [0]
    rows = on_disk["cu_emt"]
    assert {"native", "gin"} <= set(rows)
    for name, row in rows.items():
        assert set(bench.COLUMNS) <= set(row) and row["n"] == 1, name
        assert (
            0 < row["force_mae_meV_A"] < 2000 and row["stress_mae_GPa"] is not None
        )  # periodic: stress
        assert row["parameters"] > 0 and 0 < row["train_minutes"] < 1.0
    if mt.mace_missing():
        assert "cu_emt/mace_torch" in meta["skipped"] and meta["status"] == "partial"
    else:
        assert "mace_torch" in rows
    md = (tmp_path / "accuracy.md").read_text()
    assert meta["commands"][0].split("  ")[0] in md and any(
        line.startswith("## Acceptance") for line in md.splitlines()
    )
    assert not list((tmp_path / "checkpoints").rglob("last.pt"))
    # resumable: a second call finds every run done, adds only its invocation line
    before = [
        r
        for r in map(json.loads, (tmp_path / "accuracy.jsonl").read_text().splitlines())
        if r["kind"] == "run"
    ]
    again = bench.main(argv)
    after = [
        r
        for r in map(json.loads, (tmp_path / "accuracy.jsonl").read_text().splitlines())
        if r["kind"] == "run"
    ]
    assert after == before and again["cu_emt"] == results["cu_emt"]


def test_a_variant_of_our_row_is_its_own_row_and_can_win(tmp_path):
    runs = bench.Runs(tmp_path / "accuracy.jsonl", SETTINGS)
    variant = {
        **_run("ethanol", "native", 0, 9.0),
        "variant": "ew0.01",
        "config": "c.yaml",
        "loss": {"energy_weight": 0.01},
    }
    for rec in (
        _run("ethanol", "native", 0, 14.0),
        variant,
        _run("ethanol", "mace_torch", 0, 11.0),
    ):
        runs.add(rec)
    assert runs.done("ethanol", "native", 0) and runs.done("ethanol", "native", 0, "ew0.01")
    assert not runs.done("ethanol", "native", 0, "other")
    results = bench.assemble(runs, {"x": 1})
    assert (
        results["ethanol"]["native"]["n"] == 1
        and results["ethanol"]["native [ew0.01]"]["force_mae_meV_A"] == 9.0
    )
    lines = bench.acceptance(results)
    assert verdict(lines, "- ethanol:") == ([9.0, 11.0], "met")  # ew0.01 wins
    assert "(native [ew0.01])" in lines[0]
    meta = {
        "commands": ["python -m benchmarks.accuracy  (python: x)"],
        "budget_minutes": 10.0,
        "threads": 1,
        "seeds": [0],
        "status": "partial",
        "updated": "now",
        "mace_torch_method": "m",
        "overrides": [],
        "skipped": {},
        "failed": {},
    }
    bench.write_markdown({**results, "meta": meta}, tmp_path / "accuracy.md")
    assert "| ethanol | native [ew0.01] | 1 | 9 |" in (tmp_path / "accuracy.md").read_text()
    run = results["ethanol"]["native [ew0.01]"]["runs"][0]  # its config stays in the JSON
    assert run["config"] == "c.yaml" and run["loss"] == {"energy_weight": 0.01}


def test_the_peers_stage_two_is_its_own_row_and_stays_the_peer(tmp_path):
    """mace_torch [stage2] (--mace-stage-two) is a row of its own, never counted as one of ours."""
    runs = bench.Runs(tmp_path / "accuracy.jsonl", SETTINGS)
    peer_two = {
        **_run("ethanol", "mace_torch", 0, 8.0, energy=3.0),
        "variant": "stage2",
        "stage_two_start": 0.75,
    }
    for rec in (
        _run("ethanol", "native", 0, 14.0),
        _run("ethanol", "mace_torch", 0, 11.0),
        peer_two,
        {
            **_run("Si", "mace_torch", 0, 90.0, energy=40.0),
            "variant": "stage2",
            "stage_two_start": 0.75,
        },
    ):
        runs.add(rec)
    assert runs.done("ethanol", "mace_torch", 0, "stage2") and runs.done("ethanol", "mace_torch", 0)
    results = bench.assemble(runs, {"x": 1})
    assert results["ethanol"]["mace_torch [stage2]"]["force_mae_meV_A"] == 8.0
    lines = bench.acceptance(results)
    assert verdict(lines, "- ethanol:") == ([14.0, 11.0, 3.0, 1.27], "missed")
    assert "(native)" in lines[0]  # the peer's stage two is not one of our rows
    assert not any("mace_torch [stage2] 8.0 vs" in line for line in lines)
    assert verdict(lines, "- Si mace_torch [stage2]:") == ([40.0, 10.0, 40.0, 10.0], "missed")
    meta = {
        "commands": ["python -m benchmarks.accuracy  (python: x)"],
        "budget_minutes": 10.0,
        "threads": 1,
        "seeds": [0],
        "status": "partial",
        "updated": "now",
        "mace_torch_method": "m",
        "overrides": [],
        "skipped": {},
        "failed": {},
    }
    bench.write_markdown({**results, "meta": meta}, tmp_path / "accuracy.md")
    assert "| ethanol | mace_torch [stage2] | 3 | 8 |" in (tmp_path / "accuracy.md").read_text()
    assert results["ethanol"]["mace_torch [stage2]"]["runs"][0]["stage_two_start"] == 0.75


def test_last_mace_epoch_by_stage(tmp_path):
    for name in (
        "mace_run-1_epoch-3.pt",
        "mace_run-1_epoch-12.pt",
        "mace_run-1_epoch-12_swa.pt",
        "mace_run-1_epoch-14_swa.pt",
    ):
        (tmp_path / "checkpoints").mkdir(exist_ok=True)
        (tmp_path / "checkpoints" / name).write_bytes(b"")
    assert mt.last_epoch(tmp_path, swa=False, budget=1.0) == 12
    assert mt.last_epoch(tmp_path, swa=True, budget=1.0) == 14
    with pytest.raises(RuntimeError, match="no stage-two checkpoint"):
        mt.last_epoch(tmp_path / "checkpoints" / "none", swa=True, budget=1.0)


@pytest.mark.slow
def test_quick_peer_stage_two(tmp_path):
    """--mace-stage-two: mace's CLI stopped at the fraction, restarted into its stage two, and the
    stage-two model evaluated (needs mace-torch: the [mace] extra)."""
    if mt.mace_missing():
        pytest.skip("mace-torch not importable")
    results = bench.main(
        ["--quick", "--out", str(tmp_path), "--rows", "mace_torch", "--mace-stage-two", "0.5"]
    )
    row = results["cu_emt"]["mace_torch [stage2]"]
    assert (
        row["n"] == 1
        and 0 < row["force_mae_meV_A"] < 2000
        and row["runs"][0]["stage_two_start"] == 0.5
    )
    folder = tmp_path / "checkpoints" / "accuracy" / "cu_emt_mace_torch_stage2_seed0"
    first, second = (folder / "command.txt").read_text().splitlines()
    assert "--start_swa 999999" in first and "--restart_latest --stage_two --start_swa" in second
    assert (
        "Changing loss based on Stage Two Weights"
        in (folder / "mace_run_train_stage_two.log").read_text()
    )
    assert "Loaded Stage two model" in (folder / "mace_run_train.log").read_text()


def test_peer_architecture_and_labels():
    """--mace-arch backbone: mace_torch takes the mace_backbone config's architecture and batch size."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(train=SimpleNamespace(batch_size=4))
    args = SimpleNamespace(quick=False, mace_arch="fixed", mace_stage_two=None)
    assert bench.peer_model({"set": "mlearn"}, cfg, args) == (mt.MACE_MODEL, 4)
    assert bench.peer_variant(args) == ""
    args.mace_arch, args.mace_stage_two = "backbone", 0.75
    model, batch = bench.peer_model({"set": "mlearn"}, cfg, args)
    kwargs = bench.yaml.safe_load((CONFIGS / "mlearn_mace.yaml").read_text())["model"][
        "backbone_kwargs"
    ]
    assert model["max_L"] == kwargs["max_L"] and model["max_ell"] == kwargs["l_max"]
    assert (
        model["num_channels"] == kwargs["channels"]
        and model["num_interactions"] == kwargs["num_layers"]
    )
    assert set(mt.MACE_MODEL) <= set(model) and model["radial_MLP"].startswith("[")
    assert (
        batch
        == bench.yaml.safe_load((CONFIGS / "mlearn_mace.yaml").read_text())["train"]["batch_size"]
    )
    assert bench.peer_variant(args) == "stage2+arch_backbone"
    cmd = ["mace_run_train", "--max_L", "0", "--batch_size", "2", "--seed", "1"]
    run = {
        "variant": "stage2+arch_backbone",
        "stage_two_start": 0.75,
        "mace_model": mt.flags(cmd, ("max_L", "batch_size", "max_ell")),
    }
    assert run["mace_model"] == {"max_L": "0", "batch_size": "2"}


def test_page_shows_the_headline_rows_csv_every_row_and_keeps_peer_sections(tmp_path):
    runs = bench.Runs(tmp_path / "accuracy.jsonl", SETTINGS)
    for rec in (
        _run("ethanol", "native", 0, 14.0),
        {**_run("ethanol", "native", 0, 9.0), "variant": "good"},
        {**_run("ethanol", "native", 0, 12.0), "variant": "worse"},
        _run("ethanol", "mace_torch", 0, 11.0),
    ):
        runs.add(rec)
    results = bench.assemble(runs, {"x": 1})
    assert bench.headline_rows(results) == {
        ("ethanol", "native"),
        ("ethanol", "mace_torch"),
        ("ethanol", "native [good]"),
    }
    meta = {
        "commands": ["python benchmarks/accuracy.py --seed 0  (python: x)"],
        "budget_minutes": 10.0,
        "threads": 1,
        "seeds": [0],
        "status": "partial",
        "updated": "now",
        "mace_torch_method": "m",
        "overrides": [],
        "skipped": {},
        "failed": {},
    }
    page = tmp_path / "accuracy.md"
    section = "<!-- peers/x: begin (written by y) -->\n## Peer\n<!-- peers/x: end -->"
    page.write_text(f"an earlier page\n\n{section}\n")
    bench.write_markdown({**results, "meta": meta}, page)
    text = page.read_text()
    rows = [line.split(" | ")[1] for line in text.splitlines() if line.startswith("| ethanol")]
    assert rows == ["native", "mace_torch", "native [good]"]
    every = read_csv(tmp_path / bench.ROWS_CSV)
    assert [(r["row"], r["F MAE (meV/Å)"]) for r in every] == [
        ("native", "14"),
        ("mace_torch", "11"),
        ("native [good]", "9"),
        ("native [worse]", "12"),
    ]
    assert (
        text.endswith(section + "\n") and "earlier page" not in text
    )  # the peer's section is kept
    assert "`python -m benchmarks.accuracy --seed 0`" in text  # the command as it runs today
