"""Default-suite smoke tests: the speed and potential suites and the paper study (with its
optimum re-evaluation and summary) ``--quick`` from the command line (``python -m benchmarks.<suite>``
in a subprocess each, tiny data made on the spot, < 1 min each), with their output layout checked.

The other suites' ``--quick`` runs stay in the slow tier (force_uncertainty, accuracy, reliability:
see test_benchmark_scripts_slow.py and their own test files); they take minutes. ``test_the_checks_fail_on_a_broken_layout`` shows that each
check below fails when a key or a section of the output goes missing.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.common.tables import read_csv

ROOT = Path(__file__).resolve().parents[2]
CPU_LIMIT_S = 60.0  # the quick modes' promise, in CPU seconds: wall time on the shared CI machine varies with its load


def _run(module: str, out: Path, *extra: str) -> tuple[float, float]:
    """Run ``python -m module --quick``; (wall seconds, CPU seconds of it and its children)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--out", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert cpu < CPU_LIMIT_S, f"{module} --quick used {cpu:.0f} CPU s"
    return wall, cpu


# ---------------------------------------------------------------- the layout checks
SPEED_ROWS = {
    "energy",
    "E+F",
    "E+F+energy_var",
    "E+F+exact",
    "E+F+lowrank",
    "E+F+sampled4",
    "committee5",
}


def check_speed(out: Path) -> None:
    results = json.loads((out / "speed.json").read_text())
    main = results["parts"]["main"]
    meta = main["meta"]
    assert meta["command"].startswith("python -m benchmarks.speed --quick") and meta["threads"] == 1
    assert (
        len(meta["load_avg_start"]) == 3
        and len(meta["load_avg_end"]) == 3
        and meta["quick"] is True
    )
    groups: dict[tuple, dict[str, dict]] = {}
    for call in main["calls"]:
        groups.setdefault((call["model"], call["system"]), {})[call["row"]] = call
        assert call["ms_median"] > 0 and call["repeats"] == meta["repeats"]
    assert len(groups) >= 2
    for (model, system), rows in groups.items():
        expected = SPEED_ROWS | ({"E+F+stress"} if meta["systems"][system]["periodic"] else set())
        assert set(rows) == expected, (model, system, set(rows) ^ expected)
        assert rows["E+F"]["ratio"] == pytest.approx(1.0)
        for row in rows.values():
            assert row["ratio"] == pytest.approx(row["ms_median"] / rows["E+F"]["ms_median"])
    assert {t["trainer"] for t in main["training"]} == {"potential", "property"}
    assert all(t["per_s"] > 0 for t in main["training"])
    assert main["memory"] and all(m["peak_mib"] >= m["setup_mib"] > 0 for m in main["memory"])
    md = (out / "speed.md").read_text()
    for section in (
        "## Calculator: per-call time (parts `main`",
        "## Training throughput",
        "## Peak memory",
    ):
        assert section in md, section
    assert meta["command"] in md and "| main | gin | ethanol_9 | 9 |" in md  # per model, system
    every = read_csv(out / "speed_calls.csv")  # every row, beside the page
    assert {(r["model"], r["system"], r["row"]) for r in every} == {
        (c["model"], c["system"], c["row"]) for c in main["calls"]
    }


def check_potential(out: Path) -> None:
    results = json.loads((out / "potential.json").read_text())
    assert results["status"] == "complete" and results["quick"] is True
    rows = results["datasets"]["cu_emt"]
    assert set(rows) == {"gin", "equivariant"}
    for row in rows.values():
        assert (
            0 < row["force_mae_meV_A"] < 1e4
            and row["n_frames"] == 8
            and row["ood"]["n_frames"] == 8
        )
    for backbone in ("gin", "equivariant"):
        ratio = results["cost_ratio"][backbone]
        assert set(ratio) == {"energy", "local", "sampled_k4", "exact", "ensemble5"} and all(
            r > 0 for r in ratio.values()
        )
        assert set(results["quality"][backbone]["exact"]) >= {"spearman", "auroc"}
    md = (out / "potential.md").read_text()
    for section in (
        "## Accuracy and force-uncertainty quality (exact mode)",
        "## Cost and flagging quality on 4-atom",
    ):
        assert section in md, section
    assert "QUICK run" in md and results["command"] in md


def check_paper_study(out: Path) -> None:
    records = [
        json.loads(line) for line in (out / "paper_study.jsonl").read_text().splitlines() if line
    ]
    variants = {"bgnn", "agl", "isotropy", "anti", "rotation"}
    frozen = {f"{v}_frozen" for v in ("isotropy", "anti", "rotation")}
    got = sorted((r["variant"], r["fraction"]) for r in records)
    assert got == sorted(
        [(v, f) for v in variants for f in (50.0, 100.0)] + [(v, 100.0) for v in frozen]
    )
    assert all(r["settings"]["dataset"] == "synthetic" and r["seed"] == 0 for r in records)
    summary = json.loads((out / "paper_study.json").read_text())
    assert summary["n_runs"] == len(records) and summary["rows"] and "acceptance" in summary
    md = (out / "paper_study.md").read_text()
    assert "QUICK smoke run" in md and "python -m benchmarks.paper.study --quick" in md
    assert (out / "paper_study.png").stat().st_size > 0


def check_paper_study_optimum(out: Path) -> None:
    r = json.loads((out / "paper_study_optimum.json").read_text())
    assert r["quick"] and r["command"].startswith("python -m benchmarks.paper.optimum --quick")
    (study,) = r["studies"]
    assert (
        study["n_models"] == 2 and study["max_abs_check_diff"] < 1e-9
    )  # re-evaluation = the study's record
    assert [row["fraction"] for row in study["table"]] == [50.0, 100.0]
    for row in study["table"]:  # the widths change, the means do not
        assert row["optimal_rmse"] == pytest.approx(row["trained_rmse"], rel=1e-9)
        assert row["optimal_mean_s"] != pytest.approx(row["trained_mean_s"], rel=1e-3)
    md = (out / "paper_study_optimum.md").read_text()
    assert "QUICK smoke run" in md and f"- At the optimal widths: {study['optimal']['line']}" in md
    assert not (out / "paper_study_optimum.jsonl").exists()  # --quick keeps nothing


CHECKS = {
    "benchmarks.speed": check_speed,
    "benchmarks.potential": check_potential,
    "benchmarks.paper.study": check_paper_study,
    "benchmarks.paper.optimum": check_paper_study_optimum,
}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, tuple[Path, tuple[float, float]]]:
    done = {}
    for module in CHECKS:
        out = tmp_path_factory.mktemp(module.rsplit(".", 1)[1])
        done[module] = (out, _run(module, out))
    return done


@pytest.mark.parametrize("module", list(CHECKS))
def test_quick_run_layout(outputs, module):
    out, (wall, cpu) = outputs[module]
    CHECKS[module](out)
    print(f"{module} --quick: {wall:.1f} s wall, {cpu:.1f} CPU s")


def _break_json(path: Path, drop: list[str]) -> None:
    data = json.loads(path.read_text())
    node = data
    for key in drop[:-1]:
        node = node[key]
    del node[drop[-1]]
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("module", "file", "drop", "section"),
    [
        ("benchmarks.speed", "speed.json", ["parts", "main", "training"], "## Peak memory"),
        (
            "benchmarks.potential",
            "potential.json",
            ["cost_ratio"],
            "## Accuracy and force-uncertainty quality",
        ),
        ("benchmarks.paper.study", "paper_study.json", ["acceptance"], "QUICK smoke run"),
    ],
)
def test_the_checks_fail_on_a_broken_layout(outputs, tmp_path, module, file, drop, section):
    out, _ = outputs[module]
    for kind in ("json", "md"):
        broken = tmp_path / kind
        shutil.copytree(out, broken)
        if kind == "json":
            _break_json(broken / file, drop)
        else:
            md = broken / file.replace(".json", ".md")
            md.write_text(md.read_text().replace(section, "## something else"))
        with pytest.raises((AssertionError, KeyError)):
            CHECKS[module](broken)


def test_paper_study_summary_marks_the_claims_from_the_records(outputs, tmp_path):
    """benchmarks.paper.summary on the quick study: verdicts equal the study's own acceptance block, a
    check folder identical to the study moves nothing, and the force-LPA section is said to be missing."""
    study, _ = outputs["benchmarks.paper.study"]
    optimum = outputs["benchmarks.paper.optimum"][0] / "paper_study_optimum.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.paper.summary",
            "--studies",
            str(study),
            "--check",
            str(study),
            "--expected-seeds",
            "1",
            "--optimum",
            str(optimum),
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "paper_study_summary.json").read_text())
    acc = json.loads((study / "paper_study.json").read_text())["acceptance"]
    claims = summary["studies"]["synthetic"]["claims"]
    assert claims["figure1"] == acc["figure1"]["epistemic"]
    assert claims["interventions"] == all(x["verdict"] for x in acc["interventions"])
    assert claims["agl"] == acc["agl"]["verdict"]
    assert summary["studies"]["synthetic"]["convergence"]["n_runs"] == 13
    rows = summary["checks"][0]["rows"]
    assert rows and all(row["rmse"][2] == pytest.approx(0.0) for row in rows)
    assert summary["checks"][0]["converged"] is True  # a check identical to the study moves nothing
    assert "PARTIAL" not in (tmp_path / "paper_study.md").read_text()
    md = (tmp_path / "paper_study.md").read_text()
    for section in (
        "| synthetic (smoke run) | 1 | 13 |",
        "## Training length: the rule and its check",
        "## Per dataset",
        "## Force LPA on 3BPA",
        "### Claim 1 at the ELBO-optimal posterior widths",
        "- synthetic (quick): epistemic std",
    ):
        assert section in md, section
