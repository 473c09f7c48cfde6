"""Atomic writes and their stale temporary files: a real kill -9 mid-write leaves
``.<name>.<8 random>.tmp`` beside the intact target; :func:`remove_stale_temps` deletes exactly
those, and the training core removes them when it (re)opens its run folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlip_unc.atomic_write import TEMP_PATTERN, atomic_write, atomic_write_text, remove_stale_temps

ROOT = Path(__file__).resolve().parents[1]

# writes half of the new content to the temporary file, announces it, then waits to be killed
_CHILD = """
import sys, time
from pathlib import Path
from mlip_unc.atomic_write import atomic_write

def write(handle):
    handle.write(b"new-half")
    handle.flush()
    Path(sys.argv[2]).write_text("writing")
    time.sleep(60)

atomic_write(sys.argv[1], write)
"""


def test_atomic_write_replaces_and_cleans_up_on_error(tmp_path):
    target = tmp_path / "a.json"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError):
        atomic_write(
            target,
            lambda handle: (handle.write(b"partial"), (_ for _ in ()).throw(RuntimeError("boom"))),
        )
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_kill_9_mid_write_leaves_a_temp_file_that_is_removed(tmp_path):
    target, ready = tmp_path / "last.pt", tmp_path / "ready"
    target.write_bytes(b"previous")
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(target), str(ready)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the writer did not start"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    stale = [p for p in tmp_path.iterdir() if TEMP_PATTERN.match(p.name)]
    assert (
        len(stale) == 1
        and stale[0].name.startswith(".last.pt.")
        and stale[0].read_bytes() == b"new-half"
    )
    assert target.read_bytes() == b"previous"  # the target is the previous version
    assert remove_stale_temps(tmp_path) == stale
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "ready"]


def test_remove_stale_temps_only_touches_our_pattern(tmp_path):
    ours = [tmp_path / ".model.pt.a1b2_c3d.tmp", tmp_path / ".state.json.zzzzzzzz.tmp"]
    others = [
        tmp_path / "notes.tmp",
        tmp_path / ".hidden.tmp",
        tmp_path / ".x.json.SHORT.tmp",
        tmp_path / ".x.json.abc.tmp",
        tmp_path / "model.pt",
        tmp_path / ".y.json.abcdefgh.tmp.bak",
    ]
    nested = tmp_path / "round_0" / "labels" / ".0123.json.abcdefgh.tmp"
    nested.parent.mkdir(parents=True)
    for path in (*ours, *others, nested):
        path.write_bytes(b"")  # 0-byte leftovers, as after a kill right after mkstemp
    (tmp_path / ".dir.abcdefgh.tmp").mkdir()  # a folder of that name is not ours
    assert remove_stale_temps(tmp_path) == sorted(ours)
    assert all(p.exists() for p in (*others, nested)) and not any(p.exists() for p in ours)
    assert remove_stale_temps(tmp_path, recursive=True) == [nested] and not nested.exists()
    assert (tmp_path / ".dir.abcdefgh.tmp").is_dir()
    assert remove_stale_temps(None) == [] and remove_stale_temps(tmp_path / "missing") == []


def test_the_training_core_removes_stale_temps_on_start_and_resume(tmp_path):
    import torch
    from torch_geometric.utils import from_smiles

    from mlip_unc.config import PropertyConfig
    from mlip_unc.models.factory import build_model
    from mlip_unc.train.property import property_trainer, target_statistics

    graphs = []
    for k, smi in enumerate(
        ["C", "CC", "CCC", "CO", "CCO", "CCCO", "CN", "CCN", "c1ccccc1", "CC(=O)O"]
    ):
        g = from_smiles(smi)
        g.y, g.row_id = torch.tensor([[0.3 * g.x.shape[0]]]), torch.tensor([k])
        graphs.append(g)
    cfg = PropertyConfig.from_dict(
        {
            "model": {"method": "bgnn", "hidden": 8, "layers": 1, "latent_dim": 4},
            "train": {"epochs": 2, "batch_size": 4, "progress": False},
        }
    )

    def trainer():
        torch.manual_seed(0)
        mean, std = target_statistics(graphs[:8])
        return property_trainer(
            build_model(cfg, y_mean=mean, y_std=std), cfg, graphs[:8], graphs[8:], out_dir=tmp_path
        )

    stale = tmp_path / ".last.pt.k1ll3d_x.tmp"
    stale.write_bytes(b"half a checkpoint")
    trainer().fit(stop_after=1)  # a fresh start in a folder with a leftover
    assert not stale.exists() and (tmp_path / "last.pt").is_file()
    stale.write_bytes(b"")
    (tmp_path / "keep.tmp").write_bytes(b"")
    trainer().fit(resume=True)
    assert not stale.exists() and (tmp_path / "keep.tmp").exists()


def test_written_files_get_the_permissions_open_would_give(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # open() honours the umask
    atomic_write_text(tmp_path / "a.txt", "x")
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    os.chmod(tmp_path / "a.txt", 0o640)
    atomic_write_text(tmp_path / "a.txt", "y")  # a rewrite keeps the file's permissions
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o640


def test_json_safe_makes_standard_json_of_numpy_and_non_finite_values():
    import json

    import numpy as np

    from mlip_unc.train.text_files import json_safe

    data = {
        1: np.float32(0.5),
        "a": (np.int64(2), float("nan")),
        "b": np.array([[1.0, np.inf], [2.0, 3.0]]),
        "c": np.bool_(True),
    }
    out = json_safe(data)
    assert out == {"1": 0.5, "a": [2, None], "b": [[1.0, None], [2.0, 3.0]], "c": True}
    assert json.loads(json.dumps(out, allow_nan=False)) == out
