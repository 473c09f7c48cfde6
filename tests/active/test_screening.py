"""Streamed, sharded screening equals the all-in-memory ``flag_structures``."""

from __future__ import annotations

import csv
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import ase.io
import numpy as np
import pytest
from ase.build import bulk

from mlip_unc.active.screening import plan_chunks, screen_file
from mlip_unc.active.selection import flag_structures, score_structures
from mlip_unc.calculator import UncertaintyCalculator
from mlip_unc.data import DataError, read_structures

ROOT = Path(__file__).resolve().parents[2]


def _trajectory(path: Path, n: int = 29) -> Path:
    """Rattled 4-atom Cu cells; frames 7 and 20 repeat frame 3 (tied scores across chunks)."""
    frames = []
    for k in range(n):
        atoms = bulk("Cu", cubic=True, a=3.61)
        atoms.rattle(0.01 + 0.004 * (k % 11), seed=k)
        frames.append(atoms)
    frames[7] = frames[20] = frames[3].copy()
    ase.io.write(path, frames, format="extxyz")
    return path


@pytest.fixture
def setup(tmp_path, tiny_checkpoint):
    traj = _trajectory(tmp_path / "traj.xyz")
    make_calc = functools.partial(UncertaintyCalculator, tiny_checkpoint, uncertainty="exact")
    return traj, make_calc


def _same(a: list, b: list) -> None:
    assert [x.info["source_index"] for x in a] == [y.info["source_index"] for y in b]
    for x, y in zip(a, b, strict=False):
        assert (
            x.info.keys() == y.info.keys()
        )  # same rank, index and score values, exactly (NaN: not computed)
        assert all(np.array_equal(x.info[k], y.info[k], equal_nan=True) for k in x.info)
        assert np.array_equal(x.positions, y.positions) and np.array_equal(
            x.cell.array, y.cell.array
        )


CASES = [
    {"top_k": 5},
    {"threshold": 2.0, "relative": True},
    {"top_k": 4, "threshold": 1.5, "relative": True, "metric": "energy_std_per_atom"},
    {"top_k": 3, "diverse": "descriptor"},
    {"top_k": 2, "diverse": "latent"},
]


@pytest.mark.parametrize("case", CASES)
def test_chunked_and_sharded_equal_all_at_once(setup, case):
    traj, make_calc = setup
    frames = read_structures(traj, require_energy=False, require_forces=False)
    expected, _ = flag_structures(make_calc(), frames, **case)
    assert expected  # the case selects something
    at_once = screen_file(traj, make_calc, chunk_size=10_000, **case)
    chunked = screen_file(traj, make_calc, chunk_size=4, **case)
    sharded = screen_file(traj, make_calc, chunk_size=5, workers=2, **case)
    for result in (at_once, chunked, sharded):
        assert result.n_frames == len(frames)
        _same(result.selected, expected)


def test_ties_keep_the_earlier_frame_and_scores_csv_matches(setup, tmp_path):
    traj, make_calc = setup
    frames = read_structures(traj, require_energy=False, require_forces=False)
    scores = score_structures(make_calc(), frames)
    k_top = (
        int(np.sum(scores["max_force_std"] > scores["max_force_std"][3])) + 2
    )  # cuts through the tie
    expected, _ = flag_structures(make_calc(), frames, top_k=k_top)
    assert 3 in [a.info["source_index"] for a in expected] and 20 not in [
        a.info["source_index"] for a in expected
    ]
    result = screen_file(
        traj, make_calc, top_k=k_top, chunk_size=3, workers=2, scores_csv=tmp_path / "s.csv"
    )
    _same(result.selected, expected)
    with open(tmp_path / "s.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["frame"]) for r in rows] == list(range(len(frames)))
    assert np.array_equal([float(r["max_force_std"]) for r in rows], scores["max_force_std"])
    stats = result.stats["max_force_std"]
    assert stats["max"] == scores["max_force_std"].max() and stats["mean"] == pytest.approx(
        scores["max_force_std"].mean()
    )


def test_chunks_cover_the_file_and_bad_frames_are_named(setup, tmp_path):
    traj, make_calc = setup
    n, tasks = plan_chunks(traj, 4)
    assert n == 29 and [t[1] for t in tasks] == [4] * 7 + [1] and tasks[2][0].frame == 8
    text = traj.read_text().splitlines()
    bad = tmp_path / "bad.xyz"
    bad.write_text("\n".join(text[: 6 * 13] + ["not-a-count"] + text[6 * 13 + 1 :]) + "\n")
    with pytest.raises(
        DataError, match=r"bad.xyz', frame 13 \(line 79\): expected the number of atoms"
    ):
        screen_file(bad, make_calc, top_k=2, workers=2, chunk_size=4)
    with pytest.raises(ValueError, match="give top_k, threshold or both"):
        screen_file(traj, make_calc)


def test_cli_flag_with_workers(setup, tmp_path):
    from typer.testing import CliRunner

    from mlip_unc.cli import app

    traj, make_calc = setup
    out = tmp_path / "flagged.xyz"
    args = [
        "flag",
        "-m",
        str(make_calc.args[0]),
        "-d",
        str(traj),
        "--top-k",
        "3",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(
        app, [*args, "--workers", "2", "--chunk-size", "6", "--scores", str(tmp_path / "s.csv")]
    )
    assert result.exit_code == 0, result.output
    assert "29 structures" in result.output and (tmp_path / "s.csv").is_file()
    expected, _ = flag_structures(
        make_calc(), read_structures(traj, require_energy=False, require_forces=False), top_k=3
    )
    assert [a.info["source_index"] for a in ase.io.read(out, ":")] == [
        a.info["source_index"] for a in expected
    ]


def test_scale_benchmark_quick_runs_under_30_s(tmp_path):
    """CPU seconds of the run (wall time on the shared 2-core machine depends on its load)."""
    import resource

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale", "--quick", "--out", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert cpu < 30, f"--quick used {cpu:.1f} CPU s ({wall:.1f} s wall)"
    data = json.loads((tmp_path / "scale.json").read_text())
    assert {(r["frames"], r["workers"]) for r in data["rows"]} == {
        (100, 1),
        (100, 2),
        (300, 1),
        (300, 2),
    }
    assert all(
        r["finished"] and r["frames_per_s"] > 0 and r["peak_rss_MiB"] > 0 for r in data["rows"]
    )
    assert all(
        r["worker_rss_MiB"] for r in data["rows"] if r["workers"] == 2
    )  # the pool really ran
    assert "frames_per_s" in (tmp_path / "scale.md").read_text()
    # an earlier run kept beside it is rendered under its own heading by --report-only
    earlier = {
        **data,
        "command": "python benchmarks/scale.py --time-limit 1",
        "rows": data["rows"][:1],
    }
    (tmp_path / "scale_earlier.json").write_text(json.dumps([earlier]))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.scale",
            "--report-only",
            "--out",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "scale.md").read_text()
    # the recorded path-form command is printed in the form that runs today
    assert md.count("## Earlier flag run") == 1
    assert "python -m benchmarks.scale --time-limit 1`" in md
    assert md.index("## Earlier flag run") < md.index(
        data["command"]
    )  # tables first, then commands


@pytest.mark.parametrize("name", ["empty.xyz", "empty.traj"])
def test_an_empty_file_is_an_error_naming_it_not_zero_structures(tmp_path, tiny_checkpoint, name):
    from ase.io.trajectory import Trajectory
    from typer.testing import CliRunner

    from mlip_unc.cli import app

    empty = tmp_path / name
    if name.endswith(".traj"):
        Trajectory(empty, "w").close()
    else:
        empty.write_text("")
    make_calc = functools.partial(UncertaintyCalculator, tiny_checkpoint)
    scores = tmp_path / "scores.csv"
    with pytest.raises(DataError, match=f"file '{empty}' holds no frames"):
        screen_file(empty, make_calc, top_k=1, scores_csv=scores)
    assert not scores.exists()  # no header-only score file
    out = tmp_path / "flagged.xyz"
    args = ["flag", "-m", str(tiny_checkpoint), "--data", str(empty), "--out", str(out), "-k", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and f"error: file '{empty}' holds no frames" in result.output
    assert not out.exists()


def test_out_of_domain_frames_left_out_by_the_ranking_are_named(tmp_path, caplog):
    import logging

    import torch

    from mlip_unc.data.domain import DomainGuard
    from mlip_unc.models.potential import BayesianPotential, build_backbone

    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=1, r_max=4.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(backbone, [29], 4.0, torch.tensor([-0.01]), init_std=0.3).double()
    guard = DomainGuard.fit([bulk("Cu", "fcc", a=3.6, cubic=True)], 4.0)
    model.save(tmp_path / "guarded.pt", metadata={"domain": guard.to_dict()})
    frames = [bulk("Cu", "fcc", a=a, cubic=True) for a in (3.6, 4.6, 3.6)]  # frame 1: stretched
    for k, atoms in enumerate(frames):
        atoms.rattle(0.01, seed=k)
    ase.io.write(tmp_path / "cands.xyz", frames)
    make_calc = functools.partial(UncertaintyCalculator, tmp_path / "guarded.pt")
    with caplog.at_level(logging.WARNING, logger="mlip_unc"):
        result = screen_file(tmp_path / "cands.xyz", make_calc, threshold=1e9)
    assert result.out_of_domain == [1] and result.selected == []
    assert "1 of 3 frames of" in caplog.text and "(frames 1)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mlip_unc"):
        result = screen_file(tmp_path / "cands.xyz", make_calc, top_k=3, workers=2, chunk_size=1)
    assert result.out_of_domain == [1] and len(result.selected) == 3
    assert "out of the training domain" not in caplog.text  # selected: nothing to say
