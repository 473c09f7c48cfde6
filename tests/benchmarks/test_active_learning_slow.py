"""The active-learning benchmark end to end with the real xTB oracle (slow tier): the two-round
``--quick`` run of every strategy, and ``ours`` equal to ``mlip-unc active-learn`` with the
shipped config for the same seed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.active_learning import benchmark
from benchmarks.active_learning import reference_sets as rs
from benchmarks.common.records import read_jsonl

pytestmark = pytest.mark.slow
ROOT = Path(os.environ.get("MLIP_UNC_DATA", Path(__file__).resolve().parents[3] / "shared/data"))
needs_data = pytest.mark.skipif(
    not (ROOT / "structures" / "3BPA" / "train_300K.xyz").is_file(),
    reason="the 3BPA data set (MLIP_UNC_DATA) is not here",
)


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Path:
    pytest.importorskip("tblite")
    out = tmp_path_factory.mktemp("references")
    rs.main(["--quick", "--out", str(out), "--data-root", str(ROOT)])
    return out


@needs_data
def test_quick_benchmark_runs_every_strategy_with_xtb(tmp_path, references, monkeypatch):
    monkeypatch.setenv("MLIP_UNC_DATA", str(ROOT))
    out, work = tmp_path / "results", tmp_path / "work"
    benchmark.main(
        [
            "--quick",
            "--seeds",
            "0",
            "--out",
            str(out),
            "--work",
            str(work),
            "--references",
            str(references),
        ]
    )
    records = read_jsonl(out / benchmark.RECORDS)
    for strategy in benchmark.STRATEGIES:
        rounds = sorted(r["round"] for r in records if r["strategy"] == strategy)
        assert rounds == [0, 1, 2], strategy
    summary = json.loads((out / "active_learning.json").read_text())
    assert set(summary["strategies"]) == set(benchmark.STRATEGIES)
    assert summary["strategies"]["committee5"]["model_cpu_s"]["mean"] > 0
    stability = read_jsonl(out / benchmark.STABILITY_RECORDS)
    assert {r["strategy"] for r in stability} == set(benchmark.STRATEGIES)
    page = (out / "active_learning.md").read_text()
    assert "Targets of the issue" in page and (out / "active_learning.png").is_file()


@needs_data
def test_ours_equals_the_cli_with_the_shipped_config(tmp_path, references, monkeypatch):
    """The benchmark's ``ours`` (shared initial model) and ``mlip-unc active-learn --config
    configs/al_xtb_3bpa.yaml`` with the same seed, data and sizes make the same learning curve."""
    import torch
    from typer.testing import CliRunner

    from mlip_unc.cli import app

    monkeypatch.setenv("MLIP_UNC_DATA", str(ROOT))
    torch.set_num_threads(1)  # as the CLI sets it: training is reproducible per thread count
    folder = tmp_path / "seed_0"
    folder.mkdir()
    settings = benchmark.QUICK
    benchmark.seed_data(folder, 0, settings, references)
    rows = benchmark.run_one("ours", 0, folder, settings, tmp_path, "quick")
    items = [
        i
        for i in benchmark.run_overrides("ours", 0, folder, None, settings)
        if not i.startswith("out=")
    ]
    args = ["active-learn", "--config", str(benchmark.CONFIG), "--out", str(tmp_path / "cli")]
    for item in items:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    state = json.loads((tmp_path / "cli" / "state.json").read_text())
    cli_rows = [r["row"] for r in state["rounds"]]
    keys = ("oracle_calls", "n_train", "n_valid", "md_1200K_force_mae", "torsion_scan_force_mae")
    for ours, cli in zip(rows, cli_rows, strict=False):
        assert {k: ours[k] for k in keys} == pytest.approx({k: cli[k] for k in keys}, rel=1e-6)
    assert len(cli_rows) == len(rows) - 1  # the final row is evaluated, not committed
