"""How often the σ trigger fires on frames the model should know: the share of each oracle
reference set's frames whose force uncertainty exceeds a finished run's final threshold.

For a run triggered by the uncertainty, its final model's ``max_force_std`` is computed on its
own fixed validation set (the level: the mean there, as the trigger does with ``level: mean``)
and on every frame of the reference sets (oracle MD at 300, 600 and 1200 K and the torsion
scan). The shares say how often a relative threshold flags in-distribution frames at each
temperature: a share of a few percent at the top temperature means MD will rarely hold
``hold_ps`` without a flag there. One JSONL record per run::

    python -m benchmarks.active_learning --trigger-check
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.pages import environment
from benchmarks.common.records import append_jsonl, read_jsonl
from mlip_unc import keys


def records_name(runs_name: str) -> str:
    """The trigger-check JSONL beside a system's runs JSONL."""
    return runs_name.replace(".jsonl", "_trigger.jsonl")


def max_force_std(calc: Any, frames: Sequence[Any]) -> np.ndarray:
    """(n_frames,) ``max_force_std`` of ``calc`` (eV/A) on copies of ``frames``."""
    out = []
    for ref in frames:
        atoms = ref.copy()
        atoms.calc = calc
        atoms.get_forces()
        out.append(float(calc.get_property(keys.CALC_MAX_FORCE_STD, atoms)))
    return np.asarray(out)


def shares(
    model: Path, valid: Sequence[Any], sets: dict[str, list[Any]], threshold: float
) -> dict[str, Any]:
    """The level (mean σ on ``valid``) and, per set, the share of frames over
    ``threshold`` x level and the set's mean σ / level."""
    from mlip_unc.calculator import UncertaintyCalculator

    calc = UncertaintyCalculator(str(model), uncertainty="lowrank")
    level = float(max_force_std(calc, valid).mean())
    out: dict[str, Any] = {"level": level, "threshold": threshold, "sets": {}}
    for name, frames in sets.items():
        sigma = max_force_std(calc, frames)
        out["sets"][name] = {
            "share_over": float((sigma > threshold * level).mean()),
            "mean_over_level": float(sigma.mean() / level),
            "frames": len(frames),
        }
    return out


def run_trigger_check(
    results: Path,
    runs_name: str,
    work: Path,
    sets: dict[str, list[Any]],
    threshold: float,
    command: str,
    variant: str | None = None,
) -> int:
    """Check every finished uncertainty-triggered run of ``variant`` not yet recorded; returns
    how many were checked."""
    from benchmarks.active_learning.stability import final_model
    from mlip_unc.data.readers import read_structures

    path = results / records_name(runs_name)
    done = {(r["arm"], r["seed"]) for r in read_jsonl(path) if r.get("variant") == variant}
    checked = 0
    for run in read_jsonl(results / runs_name):
        key = (run["arm"], run["seed"])
        if run.get("variant") != variant or run["arm"] != "ours" or key in done:
            continue
        model = final_model(work, *key)
        if model is None or not model.is_file():
            continue
        valid = read_structures(work / f"{key[0]}_s{key[1]}" / "data" / "valid.xyz")
        row = shares(model, valid, sets, threshold)
        append_jsonl(
            path,
            {
                "arm": key[0],
                "seed": key[1],
                "variant": variant,
                "model": str(model),
                **row,
                "command": command,
                "environment": environment(),
            },
        )
        checked += 1
    return checked


def page_line(rows: Sequence[dict[str, Any]], variant: str | None = None) -> str | None:
    """One line for the page: the shares of ``ours``'s first checked run of ``variant``."""
    mine = [r for r in rows if r.get("variant") == variant]
    if not mine:
        return None
    r = mine[0]
    parts = ", ".join(
        f"{name} {100 * s['share_over']:.0f} % (mean σ {s['mean_over_level']:.2f}x the level)"
        for name, s in r["sets"].items()
    )
    return (
        f"Oracle frames over the σ threshold ({r['threshold']:g}x the validation level) for the "
        f"final model of `ours` seed {r['seed']}{f' ({variant})' if variant else ''}: {parts}."
    )
