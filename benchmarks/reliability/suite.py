"""Reliability benchmark: faults injected into the real commands, and whether each was survived.

Everything runs on tiny EMT-labelled Cu/Al data made in a work folder (nothing is read from the
data root). Groups (one table each in ``OUT/reliability.md``, records in ``reliability.json``):

1. ``kill -9`` during ``mlip-unc train`` at named points, then ``--resume`` (killed before the
   first ``last.pt``: ``--resume`` must refuse, and the plain command is rerun). Recovered: the
   history (minus wall times) and every tensor of ``model.pt`` equal those of an uninterrupted
   run with the same seed, and no stale ``*.tmp`` file is left.
2. ``kill -9`` during ``mlip-unc active-learn`` (oracle: EMT that appends the hash of every
   finished call to a log), then ``--resume``. Recovered: the same final data set (train,
   valid, test: structure hashes and labels in order) as an uninterrupted run, no structure of
   the label cache computed twice (beyond the one in flight at the kill, when the oracle had
   returned but its result was not stored yet) and no stale ``*.tmp``.
3. Corrupted checkpoints (flipped bits inside tensors or anywhere, truncations, a pickled
   object, a foreign file, NaN weights): a clear error, or results identical to the intact
   model; never NaN, never another exception.
4. The bad inputs of the reliability list through the CLI: the expected clear outcome, never a traceback.
5. Fuzzed structures (the strategy of tests/test_fuzz_calculator.py, derandomised) through the
   calculator and the graph builder: a clear error or finite results, never NaN, never a hang.
6. Silent defects (:mod:`~benchmarks.reliability.silent`): inputs that a careful user gets wrong
   without noticing; each must end in the expected message and leave nothing silently wrong.

How a kill point is hit: the command runs as ``python -m benchmarks.reliability.harness ARGS``
(the real ``mlip-unc`` CLI) with one pause installed: at the n-th call of a named function
(before or after it), or in the n-th atomic write of a matching file after half of the bytes
went to the temporary file; there the child writes a marker and sleeps, and the parent sends
SIGKILL. ``failures`` counts lost runs, mishandled faults and kill points never reached.

    python -m benchmarks.reliability --out benchmarks/results            # about 10 min, 2 jobs
    python -m benchmarks.reliability --quick --out /tmp/rel               # about 2 min
    python -m benchmarks.reliability --report-only --out benchmarks/results  # the page from the JSON
    python -m benchmarks.reliability --group silent --out benchmarks/results  # group 6 alone, merged
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common.pages import environment, run_section
from benchmarks.reliability import silent
from benchmarks.reliability.checks import bad_inputs, corruptions, fuzz, make_inputs
from benchmarks.reliability.harness import (
    ORACLE_LOG_ENV,
    REPO,
    kill_at,
    lines,
    record,
    run_child,
    stale_temps,
)

TIMING_KEYS = {"seconds", "elapsed_s", "train_minutes"}


# ============================================================ group 1: kill -9 during train
def train_points(n_batches: int, quick: bool) -> list[tuple[str, dict[str, Any]]]:
    core, task = "mlip_unc.train.core:Trainer", "mlip_unc.train.potential:PotentialTask"
    points = [
        (
            "right after config.yaml is written",
            {"kind": "call", "target": f"{task}.on_start", "n": 1, "after": True},
        ),
        ("during the initial validation", {"kind": "call", "target": f"{core}.validate", "n": 1}),
        ("during epoch 1 (batch 2)", {"kind": "call", "target": f"{task}.loss", "n": 2}),
        (
            "during epoch 3 (batch 3)",
            {"kind": "call", "target": f"{task}.loss", "n": 2 * n_batches + 3},
        ),
        (
            "during the validation of epoch 2",
            {"kind": "call", "target": f"{core}.validate", "n": 3},
        ),
        (
            "during the checkpoint write (last.pt) of epoch 2",
            {"kind": "write", "target": "*/last.pt", "n": 2},
        ),
        (
            "during the best-model write (model.pt) of epoch 1",
            {"kind": "write", "target": "*/model.pt", "n": 1},
        ),
        (
            "during the history.json write of epoch 3",
            {"kind": "write", "target": "*/history.json", "n": 3},
        ),
        (
            "during the checkpoint write (last.pt) of the last epoch",
            {"kind": "write", "target": "*/last.pt", "n": 4},
        ),
        (
            "during the posterior fit after the last epoch",
            {"kind": "call", "n": 1, "target": "mlip_unc.train.potential:finalize_checkpoint"},
        ),
    ]
    return [points[2], points[5]] if quick else points


def train_state(run: Path) -> dict[str, Any]:
    import torch

    history = json.loads((run / "history.json").read_text())
    epochs = [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in history["epochs"]]
    payload = torch.load(run / "model.pt", weights_only=True)
    return {
        "epochs": epochs,
        "initial": history["initial"],
        "best_epoch": history["best_epoch"],
        "tensors": _tensors(payload),
    }


def _tensors(node: Any, name: str = "") -> dict[str, Any]:
    import torch

    if isinstance(node, torch.Tensor):
        return {name: node}
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, (list, tuple))
        else ()
    )
    return {k: v for key, item in items for k, v in _tensors(item, f"{name}/{key}").items()}


def train_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """None when the two runs agree exactly, else what differs."""
    if (
        a["epochs"] != b["epochs"]
        or a["initial"] != b["initial"]
        or a["best_epoch"] != b["best_epoch"]
    ):
        return "history differs"
    if set(a["tensors"]) != set(b["tensors"]):
        return "model.pt holds other tensors"
    worst = max(
        (
            float((x.double() - b["tensors"][k].double()).abs().max())
            for k, x in a["tensors"].items()
            if x.numel() and x.is_floating_point()
        ),
        default=0.0,
    )
    unequal = [k for k, x in a["tensors"].items() if not bool((x == b["tensors"][k]).all())]
    return f"{len(unequal)} tensors differ (max abs {worst:.3g})" if unequal else None


def train_case(
    label: str, spec: dict[str, Any], files: dict[str, Path], case: Path, base: dict[str, Any]
) -> dict:
    import torch

    run = case / "run"
    args = ["train", "-c", str(files["train.yaml"]), "--out", str(run), "--threads", "1"]
    missed = kill_at(args, spec, case, {})
    if missed:
        return record("train: kill -9, then --resume", label, ok=False, detail=missed)
    tmp = len(stale_temps(run))
    last = (
        torch.load(run / "last.pt", weights_only=True)["epoch"]
        if (run / "last.pt").is_file()
        else None
    )
    refused = None
    if last is None:  # nothing to continue: --resume must refuse, a plain rerun is the recovery
        refused = run_child([*args, "--resume"], case / "refused.log") != 0
        code = run_child(args, case / "resumed.log")
    else:
        code = run_child([*args, "--resume"], case / "resumed.log")
    left = stale_temps(run)
    diff = (
        f"the rerun exited with code {code}" if code else train_difference(train_state(run), base)
    )
    if refused is False:
        diff = "--resume without last.pt was not refused" + (f"; {diff}" if diff else "")
    detail = (
        (
            f"last.pt at epoch {last} when killed"
            if last is not None
            else "killed before any last.pt; --resume refused, rerun without it"
        )
        + (f"; {tmp} partial temporary file(s) then" if tmp else "")
        + (f"; {len(left)} stale *.tmp left" if left else "")
    )
    return record(
        "train: kill -9, then --resume",
        label,
        ok=diff is None and not left,
        detail=detail + ("; identical history and model.pt" if diff is None else f"; {diff}"),
    )


# ============================================================ group 2: kill -9 during active-learn
def al_points(quick: bool) -> list[tuple[str, dict[str, Any]]]:
    emt, label = (
        "benchmarks.reliability.harness:CountingEMT.calculate",
        "mlip_unc.active.state:CachedLabels.label",
    )
    points = [
        (
            "during an oracle call of the bootstrap MD (call 10)",
            {"kind": "call", "target": emt, "n": 10},
        ),
        (
            "during the initial training (epoch 1, batch 2)",
            {"kind": "call", "target": "mlip_unc.train.potential:PotentialTask.loss", "n": 2},
        ),
        (
            "during an oracle call labelling round 0 (label 2)",
            {"kind": "call", "target": emt, "n": 2, "within": label},
        ),
        (
            "during the label-cache write of round 0 (label 1)",
            {"kind": "write", "target": "*/labels/*.json", "n": 1, "within": label},
        ),
        (
            "during the checkpoint write (last.pt) of the round-0 retraining",
            {"kind": "write", "target": "*/round_0/retrained/last.pt", "n": 2},
        ),
        (
            "during the state.json commit of round 0",
            {"kind": "write", "target": "*/state.json", "n": 3},
        ),
        (
            "during the MD of round 1 (monitor call 6)",
            {
                "kind": "call",
                "target": "mlip_unc.active.monitor:UncertaintyMonitor.__call__",
                "n": 6,
            },
        ),
        (
            "during an oracle call labelling round 1 (label 3)",
            {"kind": "call", "target": emt, "n": 3, "within": label},
        ),
        (
            "during the energy-offset refit after the round-1 retraining",
            {"kind": "call", "target": "mlip_unc.active.training:refit_energy_offsets", "n": 3},
        ),
    ]
    return [points[2], points[4]] if quick else points


def al_state(run: Path) -> dict[str, Any]:
    import ase.io

    from mlip_unc.active.state import structure_hash

    state = json.loads((run / "state.json").read_text())
    last = run / f"round_{len(state['rounds']) - 1}" / "retrained"
    data = {}
    for name, path in (
        ("train", last / "train.xyz"),
        ("valid", last / "valid.xyz"),
        ("test", run / "data" / "test.xyz"),
    ):
        frames = ase.io.read(path, ":") if path.is_file() else []
        data[name] = [
            (structure_hash(a), a.get_potential_energy(), a.get_forces().tolist()) for a in frames
        ]
    return {
        "data": data,
        "sizes": [(r["row"]["n_train"], r["row"]["n_valid"]) for r in state["rounds"]],
    }


def al_case(
    label: str, spec: dict[str, Any], files: dict[str, Path], case: Path, base: dict[str, Any]
) -> dict:
    run, oracle_log = case / "run", case / "oracle.log"
    env = {ORACLE_LOG_ENV: str(oracle_log)}
    args = ["active-learn", "-c", str(files["al.yaml"]), "--out", str(run), "--threads", "1"]
    missed = kill_at(args, spec, case, env)
    group = "active-learn: kill -9, then --resume"
    if missed:
        return record(group, label, ok=False, detail=missed)
    tmp = len(stale_temps(run))
    logged_at_kill = set(lines(oracle_log))
    cached_at_kill = {p.name[: -len(".json")] for p in (run / "labels").glob("*.json")}
    code = run_child([*args, "--resume"], case / "resumed.log", env=env)
    if code:
        return record(group, label, ok=False, detail=f"resume exited with code {code}")
    cached = {p.name[: -len(".json")] for p in (run / "labels").glob("*.json")}
    counts = Counter(lines(oracle_log))
    twice = sum(c - 1 for h, c in counts.items() if h in cached)
    in_flight = len((logged_at_kill - cached_at_kill) & cached)  # returned, not stored when killed
    extra = sum(counts.values()) - base["calls"]
    same = al_state(run) == base["state"]
    left = stale_temps(run)
    detail = (
        f"{'same' if same else 'DIFFERENT'} final data; oracle calls {sum(counts.values())} "
        f"(uninterrupted {base['calls']}, {extra:+d}); cached labels computed twice: {twice}"
        + (f" (in flight at the kill: {in_flight})" if in_flight else "")
        + (f"; {tmp} partial temporary file(s) when killed" if tmp else "")
        + (f"; {len(left)} stale *.tmp left" if left else "")
    )
    return record(group, label, ok=same and twice <= in_flight and not left, detail=detail)


# ============================================================ records, report, main
MEANING = {
    "train: kill -9, then --resume": (
        "recovered: history and every model.pt tensor identical to the uninterrupted run (same seed), no stale *.tmp"
    ),
    "active-learn: kill -9, then --resume": (
        "recovered: same final train/valid/test data (structure hashes and labels, in order) as the uninterrupted "
        "run, no cached label computed twice (beyond one in flight), no stale *.tmp; oracle calls counted by the "
        "oracle itself"
    ),
    "corrupted checkpoint -> calculator": (
        "recovered: a clear error naming the file (or NonFiniteResultError), or energy, forces, their std and all "
        "non-tensor content (config, metadata) identical to the intact model (a flip in zip padding or unused "
        "header bytes); lost: NaN, changed results or metadata without an error, or another exception"
    ),
    "bad input -> clear outcome": (
        "recovered: the expected outcome (one 'error:' line with the cause, exit 1, run folder untouched; or a run "
        "that works), never a traceback"
    ),
    silent.GROUP: silent.MEANING,
    "fuzzed structures (hypothesis, derandomised)": (
        "recovered: a clear error (ValueError and subclasses, NonFiniteResultError) or finite results within 60 s; "
        "strategy of tests/test_fuzz_calculator.py; model: the uninterrupted training run's model.pt"
    ),
}


def render(records: list[dict], meta: dict[str, Any]) -> str:
    """The markdown report; its ``failures:`` line is the sum of the lost column."""
    text = [
        "# Reliability: injected faults and what survived them",
        "",
        "| group | tried | recovered | lost |",
        "|---|---:|---:|---:|",
    ]
    groups = list(dict.fromkeys(r["group"] for r in records))
    for g in groups:
        rows = [r for r in records if r["group"] == g]
        text.append(
            f"| {g} ({len(rows)} faults) | {sum(r['tried'] for r in rows)} | "
            f"{sum(r['recovered'] for r in rows)} | {sum(r['lost'] for r in rows)} |"
        )
    for g in groups:
        text += ["", f"## {g}", "", MEANING.get(g, ""), ""]
        if g == silent.GROUP:  # its own columns: expected message, loud, silent
            text += silent.section([r for r in records if r["group"] == g])
            continue
        text += ["| fault | tried | recovered | lost | detail |", "|---|---:|---:|---:|---|"]
        text += [
            f"| {r['fault']} | {r['tried']} | {r['recovered']} | {r['lost']} | {r['detail'].replace('|', '/')} |"
            for r in records
            if r["group"] == g
        ]
    failures = sum(r["lost"] for r in records)
    env = meta.get("environment") or {}
    text += [
        "",
        f"failures: {failures}",
        "",
        *run_section(
            meta["command"],
            date=meta["date"],
            json_name="reliability.json",
            machine=env.get("machine"),
            load_avg=env.get("load_avg"),
            versions=env.get("versions")
            or ({"torch": meta["torch"]} if meta.get("torch") else None),
            extra=[
                f"{meta['mode']} mode, {meta['minutes']:.1f} min, {meta['jobs']} parallel jobs; tiny "
                "EMT Cu/Al data made in the work folder; the docstring of "
                "benchmarks/reliability/suite.py says how each fault is injected.",
                *silent.run_line(meta),
            ],
        ),
        "",
    ]
    return "\n".join(text)


def source_digest() -> str:
    """SHA-256 of the imported mlip_unc sources: the runs compared must all use the same code."""
    import mlip_unc

    root, digest = Path(mlip_unc.__file__).resolve().parent, hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", type=Path, required=True, help="folder of reliability.md and reliability.json"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="2 kill points per command, fewer corruptions, 60 fuzzed",
    )
    p.add_argument(
        "--work", type=Path, default=None, help="work folder (default runs/reliability[_quick])"
    )
    p.add_argument(
        "--jobs", type=int, default=2, help="kill cases run at once (one torch thread each)"
    )
    p.add_argument(
        "--fuzz", type=int, default=None, help="fuzzed structures (default 1000; quick 60)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the work folder; skip the faults already recorded",
    )
    p.add_argument(
        "--group",
        choices=("all", "silent"),
        default="all",
        help="silent: only the silent-defect group (and the tiny training it needs), merged into OUT",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite OUT/reliability.md from OUT/reliability.json",
    )
    args = p.parse_args(argv)
    name = "reliability_silent" if args.group == "silent" else "reliability"
    args.work = args.work or REPO / "runs" / (f"{name}_quick" if args.quick else name)
    args.fuzz = args.fuzz if args.fuzz is not None else (60 if args.quick else 1000)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    if args.report_only:
        from mlip_unc.atomic_write import atomic_write_text

        result = json.loads((args.out / "reliability.json").read_text())
        atomic_write_text(args.out / "reliability.md", render(result["records"], result["meta"]))
        return result["meta"]
    command = shlex.join(
        ["python", "-m", "benchmarks.reliability", *(sys.argv[1:] if argv is None else argv)]
    )
    if args.group == "silent":
        return silent.run_group(args, command)
    t0, source = time.monotonic(), source_digest()
    torch.set_num_threads(1)
    if args.work.exists() and not args.resume:
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True, exist_ok=True)
    stamp = args.work / "source.sha256"
    if args.resume and stamp.is_file() and stamp.read_text() != source:
        raise SystemExit(
            f"error: mlip_unc changed since the run in {args.work} began; run again without --resume"
        )
    stamp.write_text(source)
    journal = args.work / "records.jsonl"
    done = {(r["group"], r["fault"]): r for r in map(json.loads, _lines_of(journal))}
    files = make_inputs(args.work / "inputs")

    def keep(rec: dict[str, Any]) -> dict[str, Any]:
        if (rec["group"], rec["fault"]) not in done:
            with journal.open("a") as handle:
                handle.write(json.dumps(rec) + "\n")
        print(
            f"[{rec['group']}] {rec['fault']}: {'ok' if not rec['lost'] else 'LOST'} - {rec['detail']}",
            flush=True,
        )
        return rec

    def baseline(name: str, args_: list[str], env: dict[str, str] | None = None) -> Path:
        folder = args.work / name
        if not (folder / "done").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            if run_child(
                [*args_, "--out", str(folder / "run"), "--threads", "1"], folder / "log", env=env
            ):
                raise SystemExit(f"error: the uninterrupted {name} failed; see {folder / 'log'}")
            (folder / "done").write_text("")
        return folder

    oracle_log = args.work / "base_al" / "oracle.log"
    with ThreadPoolExecutor(args.jobs) as pool:
        jobs = [
            pool.submit(baseline, "base_train", ["train", "-c", str(files["train.yaml"])]),
            pool.submit(
                baseline,
                "base_al",
                ["active-learn", "-c", str(files["al.yaml"])],
                {ORACLE_LOG_ENV: str(oracle_log)},
            ),
        ]
        train_base, al_base = (j.result() / "run" for j in jobs)
        base_t = train_state(train_base)
        base_a = {"state": al_state(al_base), "calls": len(lines(oracle_log))}
        n_batches = math.ceil(json.loads((train_base / "history.json").read_text())["n_train"] / 2)
        todo = [
            (train_case, "train", k, *p, base_t)
            for k, p in enumerate(train_points(n_batches, args.quick))
        ]
        todo += [(al_case, "al", k, *p, base_a) for k, p in enumerate(al_points(args.quick))]
        group = {
            "train": "train: kill -9, then --resume",
            "al": "active-learn: kill -9, then --resume",
        }

        def run_case(fn: Callable, kind: str, k: int, label: str, spec: dict, base: dict) -> dict:
            if (group[kind], label) in done:
                return done[(group[kind], label)]
            case = args.work / f"{kind}_{k}"
            shutil.rmtree(case, ignore_errors=True)
            case.mkdir(parents=True)
            return fn(label, spec, files, case, base)

        records = [keep(f.result()) for f in [pool.submit(run_case, *item) for item in todo]]
    for name, make in (
        ("corrupted", lambda: corruptions(train_base / "model.pt", args.work, args.quick)),
        ("bad", lambda: bad_inputs(files, args.work / "bad", train_base, al_base)),
        ("fuzz", lambda: fuzz(train_base / "model.pt", args.fuzz)),
        ("silent", lambda: silent.silent_cases(files, args.work / "silent", train_base)),
    ):
        stored = [r for r in done.values() if r.get("section") == name]
        if not stored:
            shutil.rmtree(
                args.work / "bad", ignore_errors=True
            )  # a section cut short is run again whole
        records += stored or [keep({**r, "section": name}) for r in make()]
    if source_digest() != source:  # an edit during the run: the runs compared used different code
        records.append(
            record(
                "benchmark integrity",
                "mlip_unc sources unchanged during the run",
                ok=False,
                detail="the package changed while the benchmark ran; rerun it on a quiet tree",
            )
        )
    meta = {
        "command": command,
        "source_sha256": source,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "mode": "quick" if args.quick else "full",
        "jobs": args.jobs,
        "minutes": (time.monotonic() - t0) / 60,
        "failures": sum(r["lost"] for r in records),
        "tried": sum(r["tried"] for r in records),
        "torch": torch.__version__,
        "environment": environment(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    from mlip_unc.atomic_write import atomic_write_text

    atomic_write_text(
        args.out / "reliability.json", json.dumps({"meta": meta, "records": records}, indent=1)
    )
    atomic_write_text(args.out / "reliability.md", render(records, meta))
    print(
        f"failures: {meta['failures']} of {meta['tried']} tried; wrote {args.out / 'reliability.md'}"
    )
    return {"meta": meta, "records": records}


def _lines_of(path: Path) -> list[str]:
    return (
        [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    )


if __name__ == "__main__":
    main()
