"""benchmarks/reliability/suite.py: the report's failures line is computed, a kill point is really
hit by SIGKILL (fast), and the --quick run finds no failure (slow tier)."""

from __future__ import annotations

import json

import pytest

from benchmarks.common.format import numbers
from benchmarks.reliability import harness
from benchmarks.reliability import suite as bench

META = {
    "command": "python -m benchmarks.reliability --out x",
    "mode": "full",
    "minutes": 1.0,
    "jobs": 2,
    "date": "2025-01-01 00:00",
}


def test_the_failures_line_is_the_sum_of_the_lost_column():
    ok = [bench.record("g", "a", ok=True), bench.record("g", "b", ok=3, tried=3)]
    text = bench.render(ok, META)
    lines = text.rstrip().splitlines()
    assert "failures: 0" in lines and lines.index("failures: 0") < lines.index("## Run")
    assert f"- Command: `{META['command']}`" in lines and f"- Date: {META['date']}" in lines
    assert "| g (2 faults) | 4 | 4 | 0 |" in text
    bad = [*ok, bench.record("h", "c", ok=8, tried=10, detail="x | y")]
    text = bench.render(bad, META)
    assert "failures: 2" in text and "failures: 0" not in text
    assert "| c | 10 | 8 | 2 | x / y |" in text  # a '|' in a detail does not break the table


def test_a_kill_point_is_hit_and_killed(tmp_path):
    """The harness pauses the real CLI at the named call (here the root command's logging set-up)
    and the parent kills it with SIGKILL; a point the command never reaches is reported."""
    spec = {"kind": "call", "target": "logging:basicConfig", "n": 1}
    args = ["eval", "--help"]
    assert harness.kill_at(args, spec, tmp_path, {}, timeout=120) is None
    assert json.loads((tmp_path / "paused").read_text()) == spec
    assert (
        "Usage" not in (tmp_path / "killed.log").read_text()
    )  # killed before the help was printed
    missed = harness.kill_at(args, {**spec, "n": 2}, tmp_path, {}, timeout=120)  # called once only
    assert missed == "point not reached: the command ended with code 0"
    assert "Usage" in (tmp_path / "killed.log").read_text()


@pytest.mark.slow
def test_quick_run_has_no_failures(tmp_path):
    """No injected fault is lost; the silent-defect group runs every case, and its silent ones
    (defects still open, reported on the page) are the only failures counted."""
    from benchmarks.reliability import silent
    from benchmarks.reliability.silent_cases import cases

    results = bench.main(
        ["--quick", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    )
    meta = results["meta"]
    on_disk = json.loads((tmp_path / "out" / "reliability.json").read_text())
    quiet = [r for r in on_disk["records"] if r["group"] == silent.GROUP]
    assert [r["fault"] for r in quiet] == [c.name for c in cases()]
    lost = [r for r in results["records"] if r["lost"] and r["group"] != silent.GROUP]
    assert not lost, lost
    assert on_disk["meta"]["failures"] == meta["failures"] == sum(r["lost"] for r in quiet)
    groups = {r["group"] for r in on_disk["records"]}
    assert {
        "train: kill -9, then --resume",
        "active-learn: kill -9, then --resume",
        "corrupted checkpoint -> calculator",
        "bad input -> clear outcome",
    } <= groups
    kills = [r for r in on_disk["records"] if "kill -9" in r["group"]]
    assert len(kills) == 4 and all(r["recovered"] == r["tried"] == 1 for r in kills)
    assert "1 partial temporary file(s)" in " ".join(
        r["detail"] for r in kills
    )  # a write was really cut
    fuzzed = [r for r in on_disk["records"] if r["group"].startswith("fuzzed")]
    assert [r["tried"] for r in fuzzed] == [60, 60]
    md = (tmp_path / "out" / "reliability.md").read_text()
    assert f"failures: {meta['failures']}" in md.splitlines() and meta["command"] in md


# ---------------------------------------------------------------- the silent-defect group
def test_silent_cases_are_the_issues_and_at_least_ten_more():
    from benchmarks.reliability.silent_cases import cases

    all_cases = cases()
    names = [c.name for c in all_cases]
    assert len(names) == len(set(names))
    sources = [c.source for c in all_cases]
    assert sources == sorted(sources)  # the issue's first ("issue" < "own")
    assert sources.count("issue") == 12 and sources.count("own") >= 10
    assert all(c.expected and callable(c.run) for c in all_cases)


def test_a_verdict_is_loud_only_with_the_expected_line_and_exit_code():
    from benchmarks.reliability.silent import Ran, also, says

    one = Ran(1, "note\nerror: file 'x.xyz' holds no frames\n", "mlip-unc eval")
    assert says(one, ("x.xyz", "no frames"), refused=True).loud
    assert not says(one, "y.xyz", refused=True).loud
    two = Ran(1, "error: a\nerror: x.xyz holds no frames\n", "c")  # two error lines
    assert not says(two, "x.xyz", refused=True).loud
    ran = Ran(0, "wrote 0 structures\n", "c")  # a run that worked where a refusal was due
    verdict = says(ran, "no frames", refused=True)
    assert not verdict.loud and verdict.seen.startswith("SILENT: exit 0")
    assert not says(Ran(1, "error: x\n", "c", traceback="KeyError: 1"), "x", refused=True).loud
    warned = Ran(130, "interrupted: no model.pt was written\n", "c")
    assert says(warned, "no model.pt", refused=False, code=130).loud
    assert not says(warned, "no model.pt", refused=False).loud  # exit 0 expected
    loud = says(one, "x.xyz", refused=True)
    assert not also(loud, False, "input unchanged").loud and also(loud, True, "ok").loud


def test_the_silent_section_counts_commands_and_merges_into_the_page():
    from benchmarks.reliability import silent

    rows = [
        {**bench.record(silent.GROUP, "a", ok=2, tried=2), "source": "issue", "expected": "x"},
        {**bench.record(silent.GROUP, "b", ok=0, tried=1), "source": "own", "expected": "y|z"},
    ]
    other = bench.record("g", "c", ok=True)
    run = {"command": "python -m benchmarks.reliability --group silent", "date": "d", "minutes": 1}
    merged, meta = silent.merge({"meta": META, "records": [other, rows[0]]}, rows, run)
    assert merged == [other, *rows] and meta["failures"] == 1 and meta["tried"] == 4
    text = bench.render(merged, meta)
    lines = text.splitlines()
    assert f"| {silent.GROUP} (2 faults) | 3 | 2 | 1 |" in lines
    assert "| a | issue | 2 | 2 | 0 | x |" in text and "| b | own | 1 | 0 | 1 | y/z |" in text
    silent_line = next(line for line in lines if line.startswith("silent: "))
    assert numbers(silent_line) == [1, 3, 2, 1, 1]  # lost, commands, cases: from the issue, own
    assert "failures: 1" in lines and any(run["command"] in line for line in lines)


def test_silent_cases_run_the_real_cli_and_count_each_command(tmp_path):
    """Four cases on an untrained tiny Cu/Al checkpoint: each record's numbers add up, the
    commands ran, and the md case left no run folder."""
    import torch

    from benchmarks.reliability import silent
    from benchmarks.reliability.checks import make_inputs
    from benchmarks.reliability.silent_cases import cases
    from mlip_unc.models.potential import BayesianPotential, build_backbone

    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=2, r_max=4.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(backbone, [13, 29], 4.0, torch.zeros(2), init_std=0.3).double()
    run = tmp_path / "run"
    run.mkdir()
    model.save(run / "model.pt", metadata={"uncertainty_levels": {"max_force_std": 1e-3}})
    files = make_inputs(tmp_path / "inputs")
    only = [
        "eval: NaN coordinate",
        "md: element the potential never saw",
        "empty xyz (eval, train, flag, md)",
        "--out = --data (flag, property predict)",
    ]
    records = silent.silent_cases(files, tmp_path / "silent", run, only=only)
    order = [c.name for c in cases() if c.name in only]  # issue's cases first
    assert [r["fault"] for r in records] == order
    tried = {r["fault"]: r["tried"] for r in records}
    assert tried == dict(zip(only, [1, 1, 4, 2], strict=True))
    for r in records:
        assert r["group"] == silent.GROUP and r["recovered"] + r["lost"] == r["tried"]
        assert len(r["commands"]) == r["tried"] and all(
            c.startswith("mlip-unc") for c in r["commands"]
        )
    by_name = {r["fault"]: r for r in records}
    assert by_name["eval: NaN coordinate"]["recovered"] == 1
    assert by_name["md: element the potential never saw"]["recovered"] == 1
    assert not (tmp_path / "silent" / "md_ni").exists()
