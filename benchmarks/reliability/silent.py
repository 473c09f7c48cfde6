"""Silent defects -> a loud, correct outcome: inputs a careful user gets wrong without noticing.

Each case (:mod:`~benchmarks.reliability.silent_cases`) runs the real ``mlip-unc`` CLI: in this
process through Typer's CliRunner, or as a child process where it needs one (Ctrl-C, mace-torch's
Python for ``attach``). It checks two things: the expected message (a substring; for a refusal
in the one ``error:`` line of an exit-1 run, for a warning in the output of a run that worked)
and that nothing was silently wrong (the input unchanged, no ``model.pt`` or run folder left,
the raw std returned, no label key in an output). A case that says nothing, says something
else, or leaves a wrong result behind is **silent**. The issue's cases come first, then our
own; a case may try several commands (its ``tried``).

    python -m benchmarks.reliability --group silent --out benchmarks/results   # a few minutes

runs only this group (and the tiny training it needs) and merges it into ``reliability.json``
and the page; the full run (no ``--group``) runs it after the other groups.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.reliability.harness import MARKER_ENV, MODULE, PAUSE_ENV, REPO, record

GROUP = "silent defect -> loud, correct outcome"
MEANING = (
    "loud: the expected message (a substring) in the one 'error:' line of an exit-1 run "
    "(refusals) or in the output of a run that worked (warnings), and nothing silently wrong "
    "(input unchanged, no model.pt or run folder left, raw std, no label keys: as the case "
    "says); silent: anything else. A case may try several commands (tried)."
)


# ============================================================ running the CLI
@dataclass
class Ran:
    """What one command did: exit code, output (stdout and stderr), the command line."""

    code: int
    output: str
    command: str
    traceback: str | None = None  # an exception other than SystemExit (in this process)

    def lines(self) -> list[str]:
        return [line.strip() for line in self.output.splitlines() if line.strip()]


def cli(*args: Any, env: dict[str, str | None] | None = None) -> Ran:
    """``mlip-unc -q ARGS`` in this process; every Python warning is shown (not once per place)."""
    from typer.testing import CliRunner

    from mlip_unc.cli import app

    argv = ["-q", *(str(a) for a in args)]
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # resets the once-per-location registry
        result = CliRunner().invoke(app, argv, env=env)
    error = result.exception
    other = None if error is None or isinstance(error, SystemExit) else error
    trace = None if other is None else f"{type(other).__name__}: {other}"
    return Ran(result.exit_code, result.output, shlex.join(["mlip-unc", *argv]), trace)


def child(args: list[str], log: Path, *, python: str = sys.executable, cwd: Path = REPO) -> Ran:
    """``mlip-unc -q ARGS`` as a child process (the harness module: the real CLI), one thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with log.open("w") as out:
        done = subprocess.run(
            [python, "-m", MODULE, "-q", *args],
            stdout=out,
            stderr=out,
            env=env,
            cwd=cwd,
            timeout=600,
            check=False,
        )
    return Ran(done.returncode, log.read_text(), shlex.join(["mlip-unc", "-q", *args]))


def interrupt(args: list[str], spec: dict[str, Any], case: Path) -> Ran:
    """The CLI paused at ``spec`` (:func:`~benchmarks.reliability.harness.install_pause`) gets
    Ctrl-C (SIGINT) there; the pause's sleep raises KeyboardInterrupt as a terminal's would."""
    marker, log = case / "paused", case / "interrupted.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", PAUSE_ENV: json.dumps(spec)}
    env[MARKER_ENV] = str(marker)
    command = [sys.executable, "-m", MODULE, "-q", *args]
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=out, env=env, cwd=REPO)
        t0 = time.monotonic()
        while not marker.exists() and proc.poll() is None and time.monotonic() - t0 < 600:
            time.sleep(0.01)
        if proc.poll() is None and marker.exists():
            os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    missed = "" if marker.exists() else "the pause point was never reached\n"
    return Ran(proc.returncode, missed + log.read_text(), shlex.join(["mlip-unc", "-q", *args]))


# ============================================================ verdicts
@dataclass
class Verdict:
    """One command of a case: loud (and correct) or not, and what was seen."""

    loud: bool
    seen: str
    command: str = ""


def short(text: str, n: int = 220) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def says(
    ran: Ran, expected: str | Iterable[str], *, refused: bool, code: int | None = None
) -> Verdict:
    """Loud when the run refused (exit 1, one ``error:`` line holding every expected word) or,
    with ``refused=False``, ended with ``code`` (default 0) and some line holds every word."""
    words = [expected] if isinstance(expected, str) else list(expected)
    errors = [line for line in ran.lines() if line.startswith("error:")]
    pool = errors if refused else ran.lines()
    hit = [line for line in pool if all(w.lower() in line.lower() for w in words)]
    shape = (ran.code == 1 and len(errors) == 1) if refused else ran.code == (code or 0)
    if ran.traceback:
        seen = f"TRACEBACK {ran.traceback}"
    elif hit and shape:
        seen = hit[0]
    else:
        last = (errors or ran.lines() or ["no output"])[-1]
        want = " ... ".join(words)
        seen = f"SILENT: exit {ran.code}, no line with {want!r}; last line: {last}"
    return Verdict(bool(hit) and shape and not ran.traceback, short(seen), ran.command)


def also(verdict: Verdict, ok: bool, what: str) -> Verdict:
    """``verdict`` and one more check of the outcome (``what``, in upper case when it failed)."""
    seen = f"{verdict.seen}; {what if ok else what.upper()}"
    return Verdict(verdict.loud and ok, seen, verdict.command)


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (or the file itself) by relative name, with its bytes."""
    if path.is_file():
        return {"": path.read_bytes()}
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): p.read_bytes() for p in files}


# ============================================================ the group
def silent_cases(
    files: dict[str, Path], work: Path, train_run: Path, only: Iterable[str] | None = None
) -> list[dict]:
    """Every case (or those named in ``only``), one record each (``tried``: its commands,
    ``recovered``: the loud ones). Paths in the details are relative to ``work``'s parent."""
    from benchmarks.reliability.silent_cases import Ctx, cases

    work.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(files=files, work=work, model=train_run / "model.pt")
    out = []
    for case in cases():
        if only is not None and case.name not in only:
            continue
        try:
            verdicts, why_not = case.run(ctx), "not run here"
        except Exception as err:  # noqa: BLE001 - a case that crashes is reported, not hidden
            verdicts = [Verdict(False, f"CASE FAILED: {type(err).__name__}: {short(str(err))}")]
        if not verdicts and case.needs:
            why_not = f"not run: needs {case.needs}"
        detail = " // ".join(v.seen for v in verdicts) or why_not
        detail = detail.replace(f"{work.parent}/", "").replace(f"{REPO}/", "")
        loud = sum(v.loud for v in verdicts)
        rec = record(GROUP, case.name, ok=loud, tried=len(verdicts), detail=detail)
        rec.update(
            source=case.source, expected=case.expected, commands=[v.command for v in verdicts]
        )
        print(f"[silent] {case.name}: {loud} of {len(verdicts)} loud - {short(detail)}", flush=True)
        out.append(rec)
    return out


def section(rows: list[dict]) -> list[str]:
    """The page's table of the group, one row per case (the commands are in the JSON)."""
    text = [
        "| case | from | tried | loud | silent | expected | what happened |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        expected, detail = (r.get("expected", "").replace("|", "/"), short(r["detail"], 300))
        text.append(
            f"| {r['fault']} | {r.get('source', '')} | {r['tried']} | {r['recovered']} | "
            f"{r['lost']} | {expected} | {detail.replace('|', '/')} |"
        )
    own = sum(r.get("source") == "own" for r in rows)
    silent = sum(r["lost"] for r in rows)
    text += [
        "",
        f"silent: {silent} of {sum(r['tried'] for r in rows)} commands in {len(rows)} cases "
        f"({len(rows) - own} from the issue, {own} our own)",
    ]
    return text


def run_line(meta: dict[str, Any]) -> list[str]:
    """The page's line on this group's own run (when it ran apart from the rest)."""
    run = meta.get("silent_run")
    if not run:
        return []
    load = " / ".join(f"{x:g}" for x in (run.get("environment") or {}).get("load_avg") or [])
    return [
        f"{GROUP}: `{run['command']}`, {run['date']}, {run['minutes']:.1f} min on one thread"
        + (f", load average {load}" if load else "")
    ]


def run_group(args: Any, command: str) -> dict[str, Any]:
    """``--group silent``: the tiny training, the cases, merged into OUT's JSON and page."""
    import shutil

    import torch

    from benchmarks.common.pages import environment
    from benchmarks.reliability.checks import make_inputs
    from benchmarks.reliability.suite import render, source_digest
    from mlip_unc.atomic_write import atomic_write_text

    t0, source = time.monotonic(), source_digest()
    torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    files = make_inputs(args.work / "inputs")
    base = args.work / "base_train"
    base.mkdir(parents=True)
    train = ["train", "-c", str(files["train.yaml"]), "--out", str(base / "run"), "--threads", "1"]
    if child(train, base / "log").code:
        raise SystemExit(f"error: the tiny training failed; see {base / 'log'}")
    records = silent_cases(files, args.work / "silent", base / "run")
    if source_digest() != source:
        raise SystemExit("error: mlip_unc changed during the run; run again on a quiet tree")
    path = args.out / "reliability.json"
    old = json.loads(path.read_text()) if path.is_file() else {"meta": {}, "records": []}
    run = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "minutes": (time.monotonic() - t0) / 60,
        "source_sha256": source,
        "environment": environment(),
    }
    merged, meta = merge(old, records, run)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"meta": meta, "records": merged}, indent=1))
    atomic_write_text(args.out / "reliability.md", render(merged, meta))
    silent, tried = sum(r["lost"] for r in records), sum(r["tried"] for r in records)
    print(f"silent: {silent} of {tried} commands; wrote {args.out / 'reliability.md'}")
    return {"meta": meta, "records": merged}


def merge(
    old: dict[str, Any], records: list[dict], run: dict[str, Any]
) -> tuple[list[dict], dict[str, Any]]:
    """The records of ``old`` (a reliability.json) with this group's replaced by ``records``,
    and its meta with ``run`` as ``silent_run`` and the totals (failures, tried) recounted."""
    merged = [r for r in old["records"] if r["group"] != GROUP] + records
    meta = {**old["meta"], "silent_run": run}
    for key, value in (("command", run["command"]), ("date", run["date"]), ("jobs", 1)):
        meta.setdefault(key, value)
    meta.setdefault("mode", "silent group only")
    meta.setdefault("minutes", run["minutes"])
    meta.update(failures=sum(r["lost"] for r in merged), tried=sum(r["tried"] for r in merged))
    return merged, meta


def tiny_mace(path: str) -> None:
    """An untrained tiny mace-torch ScaleShiftMACE over Al and Cu, saved whole (the file that
    ``attach`` reads); with mace-torch's Python: ``python -m benchmarks.reliability.silent PATH``."""
    import numpy as np
    import torch

    import mlip_unc.nn  # noqa: F401 - registers the global e3nn 0.4 needs from torch.load

    from e3nn import o3  # isort: skip
    from mace import modules  # isort: skip

    torch.manual_seed(0)
    block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    model = modules.ScaleShiftMACE(
        r_max=4.0,
        num_bessel=4,
        num_polynomial_cutoff=5,
        max_ell=1,
        interaction_cls=block,
        interaction_cls_first=block,
        num_interactions=1,
        num_elements=2,
        hidden_irreps=o3.Irreps("8x0e + 8x1o"),
        MLP_irreps=o3.Irreps("8x0e"),
        atomic_energies=np.zeros(2),
        avg_num_neighbors=10.0,
        atomic_numbers=[13, 29],
        correlation=2,
        gate=torch.nn.functional.silu,
        radial_MLP=[8, 8],
        atomic_inter_scale=1.0,
        atomic_inter_shift=0.0,
    ).double()
    torch.save(model, path)


if __name__ == "__main__":
    tiny_mace(sys.argv[1])
