"""Process harness of the reliability suite: the counting oracle, the pause points, kill -9.

``python -m benchmarks.reliability.harness ARGS`` is the ``mlip-unc`` CLI with one pause
installed from ``$RELIABILITY_PAUSE`` (:func:`install_pause`): at the n-th call of a named
function (before or after it), or in the n-th atomic write of a matching file after half of the
bytes went to the temporary file. There it writes the marker ``$RELIABILITY_MARKER`` and sleeps;
:func:`kill_at` waits for the marker and sends SIGKILL.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from ase.calculators.calculator import Calculator, all_changes
from ase.calculators.emt import EMT

REPO = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.reliability.harness"  # run as a child with ``python -m`` from REPO
PAUSE_ENV, MARKER_ENV, ORACLE_LOG_ENV = (
    "RELIABILITY_PAUSE",
    "RELIABILITY_MARKER",
    "RELIABILITY_ORACLE_LOG",
)


# ============================================================ child side: the oracle, the pauses
class CountingEMT(Calculator):
    """A fresh ASE EMT for every call (energy, forces, stress), which appends the structure hash
    of every finished call to ``$RELIABILITY_ORACLE_LOG``. Fresh: one EMT object reuses its
    neighbour list from call to call, and its results then depend in the last bit on the
    structure labelled before; a DFT oracle is a function of the structure alone."""

    implemented_properties = ("energy", "free_energy", "forces", "stress")

    def calculate(
        self, atoms: Any = None, properties: Any = None, system_changes: Any = all_changes
    ) -> None:
        super().calculate(atoms, properties, system_changes)
        work = self.atoms.copy()
        work.calc = EMT()
        self.results = {"energy": work.get_potential_energy(), "forces": work.get_forces()}
        if work.pbc.all():
            self.results["stress"] = work.get_stress()
        self.results["free_energy"] = self.results["energy"]
        if os.environ.get(ORACLE_LOG_ENV):
            from mlip_unc.active.state import structure_hash

            with open(os.environ[ORACLE_LOG_ENV], "a") as handle:
                handle.write(structure_hash(self.atoms) + "\n")
                handle.flush()
                os.fsync(handle.fileno())


def counting_emt() -> CountingEMT:
    """Oracle factory (``oracle: benchmarks.reliability.harness:counting_emt``)."""
    return CountingEMT()


def _resolve(target: str) -> tuple[Any, str]:
    module, _, qualname = target.partition(":")
    owner: Any = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def install_pause(spec: dict[str, Any], marker: Path) -> None:
    """Pause the process (marker, then sleep) at the point ``spec`` names:
    ``{"kind": "call", "target": "module:Qual.name", "n", "after"?, "within"?}`` or
    ``{"kind": "write", "target": path glob, "n", "within"?}`` (the n-th matching event;
    with ``within``, only events inside a call of that function count)."""
    state = {"n": 0, "depth": 0}

    def pause() -> None:
        marker.write_text(json.dumps(spec))
        time.sleep(3600)

    def hit() -> bool:
        if spec.get("within") and state["depth"] == 0:
            return False
        state["n"] += 1
        return state["n"] == spec["n"]

    def wrap(target: str, make: Callable[[Callable], Callable]) -> None:
        owner, name = _resolve(target)
        setattr(owner, name, make(getattr(owner, name)))

    if spec.get("within"):

        def within(original: Callable) -> Callable:
            def inner(*args: Any, **kwargs: Any) -> Any:
                state["depth"] += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    state["depth"] -= 1

            return inner

        wrap(spec["within"], within)
    if spec["kind"] == "call":

        def paused(original: Callable) -> Callable:
            def inner(*args: Any, **kwargs: Any) -> Any:
                matched = hit()
                if matched and not spec.get("after"):
                    pause()
                out = original(*args, **kwargs)
                if matched and spec.get("after"):
                    pause()
                return out

            return inner

        wrap(spec["target"], paused)
        return
    from mlip_unc import atomic_write as writes
    from mlip_unc.models import checkpoint

    original = writes.atomic_write

    def slow_write(path: Any, write: Callable) -> Path:
        if not (fnmatch(str(path), spec["target"]) and hit()):
            return original(path, write)

        def half(handle: Any) -> None:
            buffer = io.BytesIO()
            write(buffer)
            data = buffer.getvalue()
            handle.write(data[: len(data) // 2])
            handle.flush()
            os.fsync(handle.fileno())
            pause()

        return original(path, half)

    writes.atomic_write = checkpoint.atomic_write = slow_write  # atomic_write_text calls the former


def child(argv: list[str]) -> None:
    """``python -m benchmarks.reliability.harness ARGS``: the mlip-unc CLI with the pause of ``$RELIABILITY_PAUSE`` installed."""
    if os.environ.get(PAUSE_ENV):
        install_pause(json.loads(os.environ[PAUSE_ENV]), Path(os.environ[MARKER_ENV]))
    from mlip_unc.cli import app

    app(args=argv, prog_name="mlip-unc")


# ============================================================ parent side: processes
def run_child(
    args: list[str], log: Path, *, env: dict[str, str] | None = None, timeout: float = 600
) -> int:
    """Run the CLI to the end; returns its exit code (output in ``log``)."""
    with log.open("a") as out:
        done = subprocess.run(
            [sys.executable, "-m", MODULE, "-q", *args],
            stdout=out,
            stderr=out,
            env={**os.environ, **(env or {})},
            cwd=REPO,
            timeout=timeout,
            check=False,
        )
    return done.returncode


def kill_at(
    args: list[str], spec: dict[str, Any], case: Path, env: dict[str, str], timeout: float = 600
) -> str | None:
    """Run the CLI with the pause ``spec`` and SIGKILL it there; None, or why the point was missed."""
    marker = case / "paused"
    marker.unlink(missing_ok=True)
    env = {**os.environ, **env, PAUSE_ENV: json.dumps(spec), MARKER_ENV: str(marker)}
    with (case / "killed.log").open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", MODULE, "-q", *args], stdout=out, stderr=out, env=env, cwd=REPO
        )
        t0 = time.monotonic()
        while not marker.exists():
            if proc.poll() is not None:
                return f"point not reached: the command ended with code {proc.returncode}"
            if time.monotonic() - t0 > timeout:
                proc.kill()
                proc.wait()
                return "point not reached: timed out"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return None if proc.returncode == -signal.SIGKILL else f"exit {proc.returncode}, not SIGKILL"


def stale_temps(folder: Path) -> list[Path]:
    from mlip_unc.atomic_write import TEMP_PATTERN

    return [p for p in folder.rglob(".*.tmp") if TEMP_PATTERN.match(p.name)]


def record(
    group: str, fault: str, *, ok: bool | int, tried: int = 1, detail: str = ""
) -> dict[str, Any]:
    """One row of the report: ``tried`` attempts of ``fault``, ``ok`` of them recovered."""
    ok = int(ok)
    return {
        "group": group,
        "fault": fault,
        "tried": tried,
        "recovered": ok,
        "lost": tried - ok,
        "detail": detail,
    }


def lines(path: Path) -> list[str]:
    """Whitespace-separated entries of a log file (none when it is missing)."""
    return path.read_text().split() if path.is_file() else []


if __name__ == "__main__":
    child(sys.argv[1:])
