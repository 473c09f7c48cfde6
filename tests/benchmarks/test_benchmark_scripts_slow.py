"""Slow tier: every benchmark script runs end to end from its command line on tiny settings.

force_uncertainty.py and reliability.py have a ``--quick`` mode (tiny EMT data made on the
spot; reliability's is in test_reliability_quick.py) that takes minutes, so it stays here.
potential.py, paper_study.py and speed.py ``--quick`` run in the default suite
(test_quick_smoke.py); here potential.py and paper_study.py also run on tiny budgets of the
shared data (skipped without it), the path their ``--quick`` does not take."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("MLIP_UNC_DATA") or ROOT.parent / "shared" / "data")


def _run(*args: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_force_uncertainty_quick_from_the_command_line(tmp_path):
    _run("-m", "benchmarks.force_uncertainty", "--quick", "--out", tmp_path, "--threads", "1")
    results = json.loads((tmp_path / "force_uncertainty.json").read_text())
    assert results["meta"]["status"] == "complete" and results["meta"]["quick"] is True
    assert {"committee5", "force_magnitude"} <= set(results["cu_emt"])
    assert (tmp_path / "force_uncertainty.md").is_file() and (
        tmp_path / "force_uncertainty.png"
    ).stat().st_size


@pytest.mark.slow
@pytest.mark.data
def test_potential_benchmark_on_a_tiny_budget(tmp_path):
    if not (DATA / "structures" / "ethanol" / "train.xyz").is_file():
        pytest.skip(f"shared data not present under {DATA}")
    _run(
        "-m",
        "benchmarks.potential",
        "--data-root",
        DATA,
        "--datasets",
        "ethanol",
        "--backbones",
        "gin",
        "--budget-minutes",
        "0.05",
        "--no-cost",
        "--max-eval-frames",
        "20",
        "--out",
        tmp_path,
    )
    results = json.loads((tmp_path / "potential.json").read_text())
    assert results["status"] == "complete"
    assert "gin" in results["datasets"]["ethanol"]
    assert (tmp_path / "potential.md").is_file() and (
        tmp_path / "checkpoints" / "ethanol_gin" / "model.pt"
    ).is_file()


@pytest.mark.slow
@pytest.mark.data
def test_paper_study_on_a_tiny_budget(tmp_path):
    if not (DATA / "splits" / "esol.json").is_file():
        pytest.skip(f"shared data not present under {DATA}")
    _run(
        "-m",
        "benchmarks.paper.study",
        "--dataset",
        "esol",
        "--data-root",
        DATA,
        "--fractions",
        "50",
        "100",
        "--seeds",
        "0",
        "--epochs",
        "2",
        "--variants",
        "bgnn",
        "agl",
        "--frozen-at",
        "none",
        "--hidden",
        "16",
        "--layers",
        "2",
        "--latent-dim",
        "8",
        "--out",
        tmp_path,
        "--work-dir",
        tmp_path / "work",
    )
    records = [
        json.loads(line)
        for line in (tmp_path / "paper_study.jsonl").read_text().splitlines()
        if line
    ]
    assert sorted((r["variant"], r["fraction"]) for r in records) == [
        ("agl", 50),
        ("agl", 100),
        ("bgnn", 50),
        ("bgnn", 100),
    ]
    assert (tmp_path / "paper_study.md").is_file() and (tmp_path / "paper_study.json").is_file()
