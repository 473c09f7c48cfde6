"""benchmarks/speed part ``md``: its systems, rows, chunk rules, page table and a ``--quick`` run.

Tiny models (the size part's quick ones) on a few atoms: seconds on 2 shared cores. In
.venv-mace the mace-torch rows run too; elsewhere they are "not measured".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from ase.build import bulk

from benchmarks.common.format import numbers
from benchmarks.speed import fixtures, md_part, size_part, sizes, suite

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models() -> size_part.Models:
    return size_part.build_models(quick=True, mace=False)


@pytest.fixture
def crystal() -> sizes.System:
    return sizes.System("crystal", bulk("Cu", "fcc", a=3.61, cubic=True), "test")


@pytest.fixture
def torch_threads():
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def test_systems_are_the_size_parts_at_about_27_1000_and_10000_atoms(tmp_path):
    settings = md_part.Settings(kinds=("molecules", "liquid"))
    counts = [s.n_atoms for s in md_part.systems(tmp_path, settings)]  # RDKit 3BPA
    assert counts == [27, 972, 10206, 12, 1008, 10080]
    small = md_part.Settings(max_atoms=1000)
    assert [s.n_atoms for s in md_part.systems(tmp_path, small)] == [27, 972]
    assert md_part.Settings().kinds == ("molecules",)


def test_chunks_fit_the_row_budget_and_long_chunks_are_skipped():
    settings = md_part.Settings(row_budget_s=10.0, max_chunks=40, max_chunk_s=120.0)
    assert md_part.chunks_for(0.001, settings) == 40  # capped
    assert md_part.chunks_for(0.1, settings) == 10  # 10 chunks of 10 steps of 0.1 s
    assert md_part.chunks_for(5.0, settings, least=2) == 2  # at least the verdict's two
    assert md_part.chunks_for(None, settings, least=2) == 2
    assert md_part.too_long(13.0, settings, "took") == (
        "took 13 s: 10 steps over 120 s (the part's time budget)"
    )
    assert md_part.too_long(13.0, md_part.Settings(max_chunk_s=200.0), "took") is None


def test_monitored_rows_pay_for_sigma_on_their_monitored_steps_only(models, crystal, tmp_path):
    rows, skipped = md_part.md_rows(models, crystal, tmp_path)
    assert [r.key for r in rows] == list(md_part.ROWS[:3])
    assert set(skipped) == {"mace E+F", "mace committee5 /10"}  # built without mace
    kept, chunks, why = md_part.plan(rows, {}, crystal.n_atoms, md_part.Settings(warmup_steps=1))
    assert kept == rows and not why
    chunks = dict.fromkeys(chunks, 3)
    md_part.time_rows(rows, chunks, md_part.Settings(row_budget_s=60.0))
    records = {r["key"]: r for r in md_part.summarise(rows)}
    for key, interval in ((md_part.PLAIN, None), (md_part.MONITORED, 10), ("ours monitored /1", 1)):
        rec = records[key]
        assert rec["steps"] == 30 and rec["chunks"] == 3 and rec["interval"] == interval
        assert rec["forward_passes"] == 30  # one forward per step: the restarts are untimed
        reads = 0 if interval is None else 30 // interval
        assert rec["sigma_reads"] == reads and rec["sigma_passes"] == reads
        assert rec["steps_per_s"] > 0 and rec["x_plain_paired"] is not None
        assert len(rec["chunk_s"]) == 3
        assert (rec["step_s_median"] is None) == (interval == 1)  # every step reads σ
        assert (rec["read_step_s_median"] is None) == (interval is None)
    assert records[md_part.PLAIN]["x_plain"] == pytest.approx(1.0)
    assert records[md_part.MONITORED]["mode"] == models.default
    assert (tmp_path / f"{crystal.name}_10.csv").read_text().count("\n") == 1 + 3 + 1  # + warm-up
    row = rows[0]
    row.restart()  # every chunk starts from the system's structure and the first momenta
    assert (row.atoms.positions == crystal.atoms.positions).all()
    assert (row.atoms.get_momenta() == row.start[1]).all()


def test_rows_predicted_or_warmed_up_over_the_chunk_limit_are_skipped(models, crystal, tmp_path):
    rows, _ = md_part.md_rows(models, crystal, tmp_path)
    settings = md_part.Settings(max_chunk_s=1e-9, warmup_steps=1)
    history = {md_part.PLAIN: (2, 1.0)}  # 1 s a step at 2 atoms: 2 s at 4
    kept, chunks, why = md_part.plan(rows, history, crystal.n_atoms, settings)
    assert kept == [] and chunks == {}
    assert why[md_part.PLAIN].startswith("one step predicted (previous size x atoms) to take 2 s")
    assert rows[0].warmup_s is None  # skipped before its warm-up
    assert why[md_part.MONITORED].startswith("its warm-up step took")


def entry(ratios: list[float], *, threads: tuple[int, ...] = (1, 2)) -> dict:
    """A synthetic part: 3 systems per thread count, monitored /10 at ``ratios``; chunk times
    spread 5% at 1 thread, 150% at 2."""
    groups, x = [], iter(ratios)
    for t in threads:
        spread = {"chunk_spread": 0.05 if t == 1 else 1.5}
        for n in (27, 972, 10206):
            rows = [
                {"key": md_part.PLAIN, "steps_per_s": 100.0 / n, "x_plain": 1.0, **spread},
                {"key": md_part.MONITORED, "x_plain": next(x), **spread},
                {"key": "ours monitored /1", "x_plain": 0.5},
                {"key": "mace E+F", "x_plain": 0.1},
            ]
            groups.append({"threads": t, "system": f"molecules_{n}", "n_atoms": n, "rows": rows})
    meta = {
        "default_mode": "auto",
        "quick": False,
        "load_avg_start": [2.0, 2.5, 3.0],
        "load_avg_end": [2.1, 2.4, 2.9],
        "settings": {"max_chunk_s": 120.0},
        "command": "python -m benchmarks.speed --part md --threads 1,2",
        "started": "2026-12-07 10:00",
        "cpu_count": 2,
        "versions": {"torch": "2.13.0"},
    }
    return {"meta": meta, "groups": groups}


def test_the_page_table_is_short_and_says_whether_the_target_is_met():
    lines = md_part.render_md(entry([0.95, 0.91, 0.80, 0.96, 0.90, 0.85]))
    assert len(lines) <= 15 and lines[0].startswith("## MD throughput")
    table = [
        line.split(" | ") for line in lines if line.startswith("| 1 |") or line.startswith("| 2 |")
    ]
    assert [row[4] for row in table] == ["0.95", "0.91", "0.80", "0.96", "0.90", "0.85"]  # /10
    assert table[0][:4] == ["| 1", "molecules_27", "27", "3.70"] and table[3][-1] == "150% / 150% |"
    # range, target, cells met of all; the missed cells; the noisy cells and their threshold
    summary = md_part.verdict(entry([0.95, 0.91, 0.80, 0.96, 0.90, 0.85]))
    assert summary in lines[2]
    head, missed, noisy = re.split(r" \(missed: |\)\. In ", summary)
    assert numbers(head) == [md_part.INTERVAL, 0.80, 0.96, md_part.TARGET, 4, 6]
    assert [numbers(m)[-1] for m in missed.split("; ")] == [0.80, 0.85]  # 10206 atoms
    assert numbers(noisy)[:2] == [3, 100 * md_part.NOISY]
    load = next(line for line in lines if line.startswith("Load average (1, 5, 15 min)"))
    assert numbers(load)[3:9] == [2.0, 2.5, 3.0, 2.1, 2.4, 2.9] and "torch 2.13.0" in load
    met = md_part.verdict(entry([0.95] * 6))
    assert numbers(met)[4:6] == [6, 6] and "missed" not in met
    quiet = md_part.verdict(entry([0.95] * 3, threads=(1,)))
    assert numbers(quiet) == [md_part.INTERVAL, 0.95, 0.95, md_part.TARGET, 3, 3]


def test_a_row_stops_once_its_chunks_took_the_budget(models, crystal, tmp_path):
    rows, _ = md_part.md_rows(models, crystal, tmp_path)
    settings = md_part.Settings(row_budget_s=1e-9, min_chunks=2)
    md_part.time_rows(rows, dict.fromkeys((r.key for r in rows), 5), settings)
    assert [len(r.chunk_s) for r in rows] == [2, 2, 1]  # the pair's least, the others' one
    assert rows[0].rounds == rows[1].rounds == [0, 1]


def test_the_table_goes_to_the_top_of_speed_md_and_the_rest_stays():
    results = json.loads((REPO / "benchmarks" / "results" / "speed.json").read_text())
    results["parts"].pop("md", None)
    without = fixtures.render(results).splitlines()
    results["parts"]["md"] = entry([0.9] * 6)
    page = fixtures.render(results).splitlines()
    section = md_part.render_md(results["parts"]["md"])
    assert page == without[:2] + section + without[2:]


def test_quick_part_writes_every_row_and_the_table(tmp_path: Path, torch_threads):
    argv = ["--part", "md", "--quick", "--kinds", "crystal", "--threads", "1,2"]
    suite.main([*argv, "--out", str(tmp_path)])
    part = json.loads((tmp_path / "speed.json").read_text())["parts"]["md"]
    meta = part["meta"]
    assert meta["status"] == "complete" and meta["part"] == "md" and meta["threads"] == [1, 2]
    assert meta["chunk_steps"] == 10 and meta["interval"] == 10 and meta["target"] == 0.9
    assert meta["md"]["timestep"] == 1.0 and len(meta["load_avg_end"]) == 3
    assert {"python", "torch", "ase"} <= set(meta["versions"])
    assert [(g["threads"], g["n_atoms"]) for g in part["groups"]] == [
        (1, 4),
        (1, 8),
        (2, 4),
        (2, 8),
    ]
    for group in part["groups"]:
        assert group["torch_threads"] == group["threads"]
        rows = {r["key"]: r for r in group["rows"]}
        assert set(rows) | set(group["skipped"]) == set(md_part.ROWS)
        assert rows[md_part.MONITORED]["sigma_passes"] == rows[md_part.MONITORED]["steps"] // 10
        if suite.setup.mace_available():
            assert rows["mace committee5 /10"]["sigma_reads"] >= 1
            assert rows["mace E+F"]["x_mace_plain"] == pytest.approx(1.0)
        else:
            assert "not importable" in group["skipped"]["mace E+F"]
    page = (tmp_path / "speed.md").read_text()
    assert page.startswith("# Speed") and "## MD throughput: plain and monitored" in page
    assert "QUICK mode" in page and meta["command"] in page
    assert page.count("| 1 | crystal_") == 2 and page.count("| 2 | crystal_") == 2
