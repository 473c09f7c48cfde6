"""The mace-torch peer: MACE trained by mace-torch's own CLI (``mace_run_train`` beside the
running python) for a wall-time budget, the model flags of the accuracy table, and the stop rule
(the epoch running at the deadline finishes, then its checkpoint is taken)."""

from __future__ import annotations

import contextlib
import importlib
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ase.io
import numpy as np

from benchmarks.common.evaluation import isolated_energies, read_frames, truth

MACE_MODEL = {
    "num_channels": 32,
    "max_L": 1,
    "max_ell": 3,
    "correlation": 3,
    "num_interactions": 2,
    "num_radial_basis": 8,
}

#: mace_run_train's flag for each key of our MACE backbone's backbone_kwargs
BACKBONE_TO_MACE = {
    "channels": "num_channels",
    "max_L": "max_L",
    "l_max": "max_ell",
    "correlation": "correlation",
    "num_layers": "num_interactions",
    "num_basis": "num_radial_basis",
}


# ================================================================ mace-torch's own MACE
def write_mace_xyz(frames: list, spec: dict[str, Any], path: Path) -> Path:
    """extxyz with REF_energy / REF_forces / REF_stress (ASE Voigt, eV/A^3) from our reader."""
    t = truth(frames, spec)
    out, start = [], 0
    for k, atoms in enumerate(frames):
        a = atoms.copy()
        a.calc, n = None, len(atoms)
        a.info = {"REF_energy": float(t["energy"][k])} if t["has_energy"][k] else {}
        if t["has_forces"][k]:
            a.arrays["REF_forces"] = t["forces"][start : start + n]
        if t["has_stress"][k]:
            s = t["stress"][k]
            a.info["REF_stress"] = np.array([s[0, 0], s[1, 1], s[2, 2], s[1, 2], s[0, 2], s[0, 1]])
        start += n
        out.append(a)
    ase.io.write(path, out, format="extxyz")
    return path


def mace_command(
    spec: dict[str, Any], cfg: Any, seed: int, work: Path, model: dict[str, Any], batch_size: int
) -> list[str]:
    """``mace_run_train``'s command for the training frames of ``spec``: ``model``'s flags,
    ``batch_size``, r_max, validation fraction and dtype of our config ``cfg``, E0s from the
    one-atom frames, lr 0.01, EMA 0.99, no epoch limit (the caller stops it)."""
    frames = read_frames(Path(spec["train"]), spec)
    e0 = isolated_energies(
        [spec["train"], *([cfg.data.isolated_atoms] if cfg.data.isolated_atoms else [])], spec
    )
    elements = sorted({int(z) for a in frames for z in a.numbers})
    e0s = (
        "{" + ", ".join(f"{z}: {e0[z]!r}" for z in elements) + "}"
        if all(z in e0 for z in elements)
        else "average"
    )
    cmd = [
        str(Path(sys.executable).parent / "mace_run_train"),
        "--name",
        "mace",
        "--seed",
        str(seed),
        "--work_dir",
        str(work),
        "--train_file",
        str(write_mace_xyz(frames, spec, work / "train.xyz")),
        "--valid_fraction",
        str(cfg.data.valid_fraction or 0.05),
        "--E0s",
        e0s,
        "--model",
        "MACE",
        *(x for k, v in model.items() for x in (f"--{k}", str(v))),
        "--r_max",
        str(cfg.data.r_max),
        "--batch_size",
        str(batch_size),
        "--valid_batch_size",
        "16",
        "--lr",
        "0.01",
        "--ema",
        "--ema_decay",
        "0.99",
        "--max_num_epochs",
        "1000000",
        "--eval_interval",
        "1",
        "--device",
        "cpu",
        "--default_dtype",
        cfg.dtype.value,
        "--energy_key",
        "REF_energy",
        "--forces_key",
        "REF_forces",
        "--save_cpu",
        "--num_workers",
        "0",
    ]
    if spec["stress_key"]:
        cmd += ["--stress_key", "REF_stress", "--loss", "stress", "--compute_stress", "True"]
    cmd += ["--error_table", "PerAtomMAEstressvirials" if spec["stress_key"] else "PerAtomMAE"]
    return cmd


def epochs_logged(log_path: Path) -> list[int]:
    """Epoch numbers of mace's validation lines ("Epoch N: head: ...") so far."""
    return [int(n) for n in re.findall(r"Epoch (\d+): head", log_path.read_text(errors="replace"))]


def stop_after_epoch(proc: subprocess.Popen, log_path: Path, work: Path) -> None:
    """Once an epoch's validation line is logged, give mace up to 30 s to write that epoch's
    checkpoint (it saves after the line, when the loss improved), then SIGTERM it."""
    epoch = epochs_logged(log_path)[-1]
    for _ in range(60):
        files = [*work.rglob(f"*_epoch-{epoch}.pt"), *work.rglob(f"*_epoch-{epoch}_swa.pt")]
        size = files[0].stat().st_size if files else None
        time.sleep(0.5)
        if (
            files
            and files[0].is_file()
            and files[0].stat().st_size == size
            or proc.poll() is not None
        ):
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=60)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def run_mace(cmd: list[str], log_path: Path, budget_s: float | None, env: dict[str, str]) -> float:
    """Run ``cmd``. With ``budget_s``: once ``budget_s`` has passed since mace logged "Started
    training", let it finish the epoch in progress (its validation line), then stop it (the
    peer gets its partial epoch, up to one epoch more than the budget). Returns the seconds
    from "Started training" to that last validation line (0 when never reached)."""
    with log_path.open("a") as handle:
        proc = subprocess.Popen(
            cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=log_path.parent
        )
        started, seen = None, 0
        while proc.poll() is None:
            time.sleep(0.5)
            if started is None and "Started training" in log_path.read_text(errors="replace"):
                started = time.monotonic()
            if budget_s is None or started is None:
                continue
            if time.monotonic() - started < budget_s:
                seen = len(epochs_logged(log_path))
            elif len(epochs_logged(log_path)) > seen:  # the epoch running at the deadline is done
                seconds = time.monotonic() - started
                stop_after_epoch(proc, log_path, log_path.parent)
                return seconds
        if proc.returncode != 0:
            raise RuntimeError(
                f"{cmd[0]} exited with {proc.returncode}; see {log_path}: "
                f"{log_path.read_text(errors='replace')[-1500:]}"
            )
    return 0.0 if started is None else time.monotonic() - started


def last_epoch(work: Path, *, swa: bool, budget: float) -> int:
    """The epoch of mace's newest checkpoint in ``work`` (``swa``: of stage two, ``*_swa.pt``)."""
    files = [p for p in work.rglob("*_epoch-*.pt") if p.name.endswith("_swa.pt") == swa]
    if not files:
        raise RuntimeError(
            f"mace_run_train saved no {'stage-two ' if swa else ''}checkpoint in {budget} min; see {work}"
        )
    return max(int(re.findall(r"epoch-(\d+)", p.name)[-1]) for p in files)


def flags(cmd: list[str], names: tuple[str, ...]) -> dict[str, str]:
    """The values of ``--name value`` pairs of ``cmd`` for ``names`` (those present)."""
    return {n: cmd[cmd.index(f"--{n}") + 1] for n in names if f"--{n}" in cmd}


def mace_missing() -> str | None:
    """Why the mace rows cannot run in this interpreter (None: they can)."""
    try:
        importlib.import_module("mace.calculators")
    except Exception as err:  # noqa: BLE001  ImportError, or e3nn failing at import
        return f"mace-torch not importable in {sys.executable}: {type(err).__name__}: {err}"
    if not (Path(sys.executable).parent / "mace_run_train").is_file():
        return f"no mace_run_train beside {sys.executable}"
    return None
