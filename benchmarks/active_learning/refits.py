"""What a run's labels are worth at each call count: the model a user would get by ending the
run there, trained from scratch on the labels spent so far.

A run's fine-tuned models drift in energy (the loop ends with a refit from scratch for that
reason: ``on_the_fly.final_refit``), so "calls to usable" read off them mixes the worth of the
labels with the fine-tuning path. For every finished run and every milestone of
:data:`~benchmarks.active_learning.onthefly.MILESTONES` below its final calls, the training set
of the run's last model at or below the milestone is refit from scratch with the run's own
training recipe (what ``final_refit`` does at the end of a run with that budget) and scored on
the reference sets. One JSONL record per (arm, seed, milestone); resumes::

    python -m benchmarks.active_learning --refits [--arms ours,random]
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common.pages import environment
from benchmarks.common.records import append_jsonl, read_jsonl


def records_name(runs_name: str) -> str:
    """The refit JSONL beside a system's runs JSONL."""
    return runs_name.replace(".jsonl", "_refits.jsonl")


def milestone_sets(
    rows: Sequence[dict[str, Any]], milestones: Sequence[int]
) -> dict[int, tuple[int, Path]]:
    """Per milestone below the run's final calls: (the calls, the training file) of the run's
    last fine-tuned model at or below it (rows: a run's ``updates``; a refit row is skipped,
    and so is a milestone before the first label)."""
    rows = [r for r in rows if not r.get("refit")]
    out = {}
    for m in milestones:
        before = [r for r in rows if r["calls"] <= m]
        if len(before) > 1 and rows[-1]["calls"] > m:
            out[m] = (int(before[-1]["calls"]), Path(before[-1]["model"]).parent / "train.xyz")
    return out


def run_refits(
    config_path: Path,
    system_name: str,
    results: Path,
    runs_name: str,
    work: Path,
    sets: Callable[[], dict[str, list[Any]]],
    score: Callable[[Path, dict[str, list[Any]]], dict[str, Any]],
    milestones: Sequence[int],
    command: str,
    arms: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> int:
    """Refit and score every (run, milestone) not yet recorded, of ``arms`` when given
    (default-config runs only); returns how many ran."""
    from mlip_unc.active.onthefly import _train, _training
    from mlip_unc.config import load_active_config
    from mlip_unc.data.readers import read_structures

    path = results / records_name(runs_name)
    ran = 0
    for run in read_jsonl(results / runs_name):
        if run.get("variant") or (arms and run["arm"] not in arms):
            continue
        out = work / f"{run['arm']}_s{run['seed']}"
        rows = json.loads((out / "state.json").read_text())["updates"]
        config = load_active_config(config_path, [f"out={out}", f"seed={run['seed']}", *extra])
        valid = read_structures(out / "data" / "valid.xyz")
        done = {(r["arm"], r["seed"], r["milestone"]) for r in read_jsonl(path)}
        for milestone, (calls, train_file) in milestone_sets(rows, milestones).items():
            if (run["arm"], run["seed"], milestone) in done:
                continue
            train = read_structures(train_file)
            cpu = time.process_time()
            model = _train(  # what final_refit trains at the end of a run
                config,
                _training(config, out, train),
                (train, valid),
                out / f"refit_{milestone}",
                init_from=None,
                update=0,
                resume=True,
            )[0]
            cpu_train = time.process_time() - cpu
            errors = score(model, sets())
            print(
                f"{system_name} refit: {run['arm']} seed {run['seed']} at {calls} calls "
                f"({len(train)} frames)",
                flush=True,
            )
            append_jsonl(
                path,
                {
                    "system": system_name,
                    "arm": run["arm"],
                    "seed": run["seed"],
                    "milestone": milestone,
                    "calls": calls,
                    "frames": len(train),
                    "errors": errors,
                    "cpu_train_s": cpu_train,
                    "model": str(model),
                    "command": command,
                    "environment": environment(),
                },
            )
            ran += 1
    return ran
