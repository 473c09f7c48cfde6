"""How long MD with a final model stays physical: the stability part of "usable".

For every finished run of ``onthefly.py`` (its final model) and the reference model, NVT
Langevin MD (friction 0.02/fs, the shipped config's timestep) from the shipped config's start
structure, 5 runs x 10 ps at 600 K and at 1200 K, checked every 10 steps with the geometry
guard the loop itself uses (:class:`mlip_unc.active.guard.GeometryGuard`); a run fails at the
first unphysical frame or when the calculator refuses one (non-finite energy, coincident
atoms). One JSONL record per trajectory, so the work resumes::

    python -m benchmarks.active_learning --stability [--system si]
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.pages import environment
from benchmarks.common.records import append_jsonl, read_jsonl


@dataclass(frozen=True)
class Stability:
    """The stability protocol.

    Attributes:
        temperatures: NVT temperatures (K).
        runs: trajectories per temperature and model (velocity seeds 0..runs-1).
        length_ps: each trajectory's length (ps).
        check_every: MD steps between two geometry checks.
    """

    temperatures: tuple[float, ...] = (600.0, 1200.0)
    runs: int = 5
    length_ps: float = 10.0
    check_every: int = 10


QUICK = Stability(temperatures=(600.0,), runs=1, length_ps=0.05)


def records_name(runs_name: str) -> str:
    """The stability JSONL beside a system's runs JSONL."""
    return runs_name.replace(".jsonl", "_stability.jsonl")


def trajectory(
    calc: Any,
    start: Any,
    guard: Any,
    temperature: float,
    run: int,
    timestep_fs: float,
    protocol: Stability,
) -> dict[str, Any]:
    """One NVT trajectory with calculator ``calc`` (plain energy and forces) from ``start``
    until ``guard`` names a reason, the calculator refuses a frame, or ``protocol.length_ps``
    is reached."""
    from ase import units
    from ase.constraints import FixCom
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import Stationary, ZeroRotation, thermalize_momenta

    atoms = start.copy()
    atoms.calc = calc
    rng = np.random.default_rng(10_000 + run)
    thermalize_momenta(atoms, temperature_K=temperature, rng=rng)
    Stationary(atoms)
    periodic = bool(atoms.pbc.any())
    if not periodic:
        ZeroRotation(atoms)
        atoms.set_constraint(FixCom())
    dyn = Langevin(
        atoms,
        timestep_fs * units.fs,
        temperature_K=temperature,
        friction=0.02 / units.fs,
        fixcm=False,
        rng=rng,
    )
    steps = int(round(protocol.length_ps * 1000 / timestep_fs))
    failed_at: float | None = None
    reason = ""
    cpu = time.process_time()
    for step in range(0, steps, protocol.check_every):
        try:
            dyn.run(protocol.check_every)
            why = guard.check(atoms)
            if why is None and not np.isfinite(atoms.get_potential_energy()):
                why = "non-finite energy"
        except Exception as err:  # the calculator refused a frame
            why = f"{type(err).__name__}: {err}"[:120]
        if why is not None:
            failed_at, reason = (step + protocol.check_every) * timestep_fs / 1000, why
            break
    return {
        "temperature": temperature,
        "run": run,
        "length_ps": protocol.length_ps,
        "survived_ps": protocol.length_ps if failed_at is None else failed_at,
        "failed": failed_at is not None,
        "reason": reason,
        "cpu_s": time.process_time() - cpu,
    }


def final_model(work: Path, arm: str, seed: int) -> Path | None:
    """The last model of run ``<arm>_s<seed>`` under ``work`` (None if it has none)."""
    state = work / f"{arm}_s{seed}" / "state.json"
    if not state.is_file():
        return None
    updates = json.loads(state.read_text()).get("updates") or []
    return Path(updates[-1]["model"]) if updates else None


def models(
    work: Path, runs: Sequence[dict[str, Any]], references: Sequence[dict[str, Any]]
) -> list[tuple[str, int | None, Path]]:
    """(arm, seed, final model) of every finished run and of the shipped-recipe reference."""
    shipped = [r for r in references if r.get("recipe", "shipped") == "shipped"]
    out: list[tuple[str, int | None, Path]] = [
        ("reference", None, Path(r["model"])) for r in shipped[-1:]
    ]
    for r in runs:
        model = final_model(work, r["arm"], r["seed"])
        if model is not None and model.is_file():
            out.append((r["arm"], r["seed"], model))
    return out


def run_stability(
    config_path: Path,
    system_name: str,
    results: Path,
    runs_name: str,
    references_name: str,
    work: Path,
    command: str,
    protocol: Stability = Stability(),
    extra: Sequence[str] = (),
    variant: str | None = None,
    arms: Sequence[str] | None = None,
) -> int:
    """Run every trajectory not yet recorded (of ``variant``'s runs when given, whose
    folders lie under ``work``; of the models of ``arms`` when given, ``reference`` naming the
    reference model); returns how many ran."""
    from mlip_unc.active.data import build_structure
    from mlip_unc.active.guard import GeometryGuard
    from mlip_unc.calculator import UncertaintyCalculator
    from mlip_unc.config import load_active_config

    config = load_active_config(config_path, list(extra))
    start = build_structure(config.structures)[0]
    start.calc = None
    guard = GeometryGuard.from_structure(start, config.guard)
    path = results / records_name(runs_name)
    done = {
        (r["arm"], r["seed"], r["temperature"], r["run"], r["length_ps"])
        for r in read_jsonl(path)
        if r.get("variant") == variant
    }
    runs = [r for r in read_jsonl(results / runs_name) if r.get("variant") == variant]
    references = [] if variant else read_jsonl(results / references_name)
    todo = [m for m in models(work, runs, references) if arms is None or m[0] in arms]
    ran = 0
    for arm, seed, model in todo:
        calc: Any = None  # loaded once per model, when a trajectory of it is still to run
        for temperature in protocol.temperatures:
            for run in range(protocol.runs):
                if (arm, seed, temperature, run, protocol.length_ps) in done:
                    continue
                calc = calc or UncertaintyCalculator(str(model), uncertainty="none")
                row = trajectory(calc, start, guard, temperature, run, config.md.timestep, protocol)
                tag = arm if seed is None else f"{arm} seed {seed}"
                print(
                    f"{system_name} stability: {tag}, {temperature:.0f} K run {run}: "
                    f"{row['survived_ps']:.2f} ps"
                    + (f" ({row['reason']})" if row["failed"] else ""),
                    flush=True,
                )
                append_jsonl(
                    path,
                    {
                        "system": system_name,
                        "arm": arm,
                        "seed": seed,
                        "variant": variant,
                        "model": str(model),
                        **row,
                        "command": command,
                        "environment": environment(),
                    },
                )
                ran += 1
    return ran


def summary(
    rows: Sequence[dict[str, Any]],
    arm: str,
    temperature: float,
    protocol: Stability = Stability(),
    variant: str | None = None,
) -> tuple[int, int, float | None]:
    """(trajectories that lasted the full length, trajectories, median ps survived) of
    ``arm`` (of ``variant``) at ``temperature`` over all its seeds."""
    mine = [
        r
        for r in rows
        if r["arm"] == arm
        and r.get("variant") == variant
        and r["temperature"] == temperature
        and r["length_ps"] == protocol.length_ps
    ]
    if not mine:
        return 0, 0, None
    ok = sum(not r["failed"] for r in mine)
    return ok, len(mine), float(np.median([r["survived_ps"] for r in mine]))
