"""Scale of ``mlip-unc flag``: throughput and peak memory of streamed, sharded screening.

    python -m benchmarks.scale                  # 10^4 and 10^5 frames, 1 and 2 workers
    python -m benchmarks.scale --quick          # 10^2 and 3x10^2 frames in one process (smoke test)

Writes ``OUT/scale.json`` and ``OUT/scale.md`` (default ``benchmarks/results``). Each run is
:func:`mlip_unc.active.screening.screen_file` (what ``mlip-unc flag --top-k 10 --workers N``
calls) in a fresh child process on a generated trajectory (8-atom fcc Cu cells, positions
rattled with a 0.05 A Gaussian, written in a temporary folder) with a tiny UNTRAINED
potential (GIN, 8 hidden, 4 latent, 1 layer, exact force uncertainty, ``max_force_std``):
the cost per frame is the calculator's, the memory is what streaming keeps.

Memory: peak resident set size (``VmHWM`` in ``/proc/PID/status``, the quantity of
``getrusage().ru_maxrss``) of the screening process and of each worker process, polled every
0.2 s, and for finished runs the child's own ``getrusage`` (self, and children = the largest
worker). A run past ``--time-limit`` seconds is stopped; its throughput is then the frames
scored so far (rows of the per-frame scores file) over the time limit.

``scale.md`` also renders ``OUT/scale_earlier.json`` (earlier results of this script, kept),
``OUT/scale_train.json`` (training throughput, written by
``benchmarks/scale/train.py``) and ``OUT/exploration.json`` (``benchmarks/exploration.py``)
when present.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common.pages import environment, rerun_command
from mlip_unc import keys

ROOT = Path(__file__).resolve().parents[2]


def write_trajectory(path: Path, n_frames: int, seed: int) -> None:
    """``n_frames`` rattled 8-atom Cu cells as extxyz (written directly: fast for 10^5)."""
    rng = np.random.default_rng(seed)
    cell = 3.61 * np.eye(3) * np.array([1.0, 1.0, 2.0])  # two cubic 4-atom cells stacked: 8 atoms
    base = np.vstack(
        [
            np.array([[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]]) * 3.61 + [0, 0, z]
            for z in (0.0, 3.61)
        ]
    )
    lattice = " ".join(f"{x:.8f}" for x in cell.reshape(-1))
    header = f'8\nLattice="{lattice}" Properties=species:S:1:pos:R:3 pbc="T T T"\n'
    with open(path, "w") as handle:
        for _ in range(n_frames):
            pos = base + rng.normal(scale=0.05, size=base.shape)
            handle.write(header + "".join(f"Cu {x:.8f} {y:.8f} {z:.8f}\n" for x, y, z in pos))


def write_model(path: Path, seed: int) -> None:
    """A tiny untrained Cu potential with validation levels (relative thresholds work)."""
    import torch

    from mlip_unc.models.potential import BayesianPotential, build_backbone

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        backbone = build_backbone(
            "gin", num_types=1, r_max=4.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
        )
        model = BayesianPotential(backbone, [29], 4.0, torch.tensor([-0.01]), init_std=0.3).double()
    model.save(
        path,
        metadata={
            "uncertainty_levels": {
                keys.CALC_MAX_FORCE_STD: 1e-3,
                keys.CALC_ENERGY_STD_PER_ATOM: 1e-3,
            }
        },
    )


def child(args: argparse.Namespace) -> None:
    """One screening run in this process; prints a JSON line."""
    import torch

    torch.set_num_threads(1)
    from mlip_unc.active.screening import screen_file
    from mlip_unc.calculator import UncertaintyCalculator

    make_calc = functools.partial(UncertaintyCalculator, args.model, uncertainty="exact")
    start = time.perf_counter()
    result = screen_file(
        args.data,
        make_calc,
        top_k=10,
        workers=args.workers[0],
        chunk_size=args.chunk_size,
        scores_csv=args.scores,
    )
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "seconds": seconds,
                "n_frames": result.n_frames,
                "n_selected": len(result.selected),
                "rss_self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "rss_children_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
            }
        )
    )


def run_in_process(data: Path, model: Path, n_frames: int, workers: int, chunk_size: int) -> dict:
    """``--quick``: a run in this process (one interpreter start for all runs; peaks cumulative)."""
    import torch

    from mlip_unc.active.screening import screen_file
    from mlip_unc.calculator import UncertaintyCalculator

    torch.set_num_threads(1)
    make_calc = functools.partial(UncertaintyCalculator, model, uncertainty="exact")
    start = time.perf_counter()
    result = screen_file(data, make_calc, top_k=10, workers=workers, chunk_size=chunk_size)
    seconds = time.perf_counter() - start
    assert result.n_frames == n_frames
    parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if workers > 1 else 0
    return {
        "frames": n_frames,
        "workers": workers,
        "finished": True,
        "seconds": round(seconds, 2),
        "frames_per_s": round(n_frames / seconds, 1),
        "peak_rss_MiB": round(max(parent, worker) / 1024, 1),
        "parent_rss_MiB": round(parent / 1024, 1),
        "worker_rss_MiB": round(worker / 1024, 1) if worker else None,
    }


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return out


def _hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_one(
    data: Path, model: Path, n_frames: int, workers: int, chunk_size: int, limit: float, tmp: Path
) -> dict:
    scores = tmp / f"scores_{n_frames}_{workers}.csv"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.scale",
        "--child",
        "--data",
        str(data),
        "--model",
        str(model),
        "--workers",
        str(workers),
        "--chunk-size",
        str(chunk_size),
        "--scores",
        str(scores),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        cwd=ROOT,
    )
    hwm: dict[int, int] = {}
    finished = True
    while proc.poll() is None:
        for pid in _tree(proc.pid):
            hwm[pid] = max(hwm.get(pid, 0), _hwm_kib(pid))
        if time.perf_counter() - start > limit:
            finished = False
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    out, err = proc.communicate()
    row = {"frames": n_frames, "workers": workers, "finished": finished}
    parent = hwm.get(proc.pid, 0)
    worker_peak = max(
        [v for k, v in hwm.items() if k != proc.pid] or [0]
    )  # none: one chunk, run here
    if finished:
        if proc.returncode != 0:
            raise RuntimeError(f"screening run failed:\n{err[-3000:]}")
        report = json.loads(out.strip().splitlines()[-1])
        assert report["n_frames"] == n_frames, report
        parent = max(parent, report["rss_self_kib"])
        worker_peak = max(worker_peak, report["rss_children_kib"]) if workers > 1 else 0
        row.update(
            seconds=round(report["seconds"], 2), frames_per_s=round(n_frames / report["seconds"], 1)
        )
    else:
        temps = list(tmp.glob(f".{scores.name}.*.tmp"))
        done = max(0, len(temps[0].read_text().splitlines()) - 1) if temps else 0
        row.update(
            seconds=None, frames_done=done, time_limit_s=limit, frames_per_s=round(done / limit, 1)
        )
    row.update(
        peak_rss_MiB=round(max(parent, worker_peak) / 1024, 1),
        parent_rss_MiB=round(parent / 1024, 1),
        worker_rss_MiB=round(worker_peak / 1024, 1) if worker_peak else None,
    )
    return row


FLAG_COLUMNS = [
    "frames",
    "workers",
    "finished",
    "seconds",
    "frames_per_s",
    "peak_rss_MiB",
    "parent_rss_MiB",
    "worker_rss_MiB",
    "frames_done",
    "time_limit_s",
]


def _table(rows: list[dict], columns: list[str] | None = None) -> list[str]:
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return lines


def _cell(value: object) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def render(result: dict, out: Path) -> str:
    """The page: the flag table first, then earlier runs, training throughput and exploration
    (read from their JSON files in ``out`` when present), then the commands and machines."""
    lines = [
        "# Scale: streamed, sharded screening (`mlip-unc flag`)",
        "",
        *_table(result["rows"], FLAG_COLUMNS),
        "",
        (
            "Rows with `finished` False were stopped after `time_limit_s`; their `frames_per_s` is "
            "`frames_done / time_limit_s` (start-up included), their peaks those reached by then."
        ),
        "",
        f"Setup: {result['setup']}",
        "",
        f"Memory: {result['memory_measure']}",
        "",
    ]
    runs = [
        f"- Command: `{rerun_command(result['command'])}` (seed {result['seed']})",
        f"- Machine: {result['machine']}",
    ]
    earlier = out / "scale_earlier.json"  # earlier results of this script, kept (every run shown)
    if earlier.is_file():
        for old in json.loads(earlier.read_text()):
            lines += ["## Earlier flag run", "", *_table(old["rows"], FLAG_COLUMNS), ""]
            runs.append(
                f"- Earlier flag run: `{rerun_command(old['command'])}` (seed {old['seed']}); machine: {old['machine']}"
            )
    train = out / "scale_train.json"
    if train.is_file():
        data = json.loads(train.read_text())
        lines += [
            "## Training throughput (torchrun processes)",
            "",
            *_table(
                data.get("rows", []),
                [
                    "processes",
                    "mode",
                    "batch_per_process",
                    "structures_per_s",
                    "speedup",
                    "oversubscribed",
                    "steps",
                ],
            ),
            "",
            *[f"{k.capitalize()}: {data[k]}." for k in ("setup",) if data.get(k)],
            "",
            (
                "mode allreduce: this project's gradient all-reduce (what `mlip-unc train` uses under torchrun); "
                "ddp_wrapper: torch's DistributedDataParallel around the same model, for comparison."
            ),
            "",
            (
                "GPU: not measured. Every run of this project so far was on a CPU-only machine; `train.device: cuda` "
                "(mlip_unc/train/device.py) and its CUDA tests (skipped without a GPU) are in place for a run "
                "on one."
            ),
            "",
        ]
        runs.append(
            f"- Training throughput: `{rerun_command(data.get('command', '?'))}` (seed {data.get('seed', '?')})"
            + (f"; machine: {data['machine']}" if data.get("machine") else "")
        )
    exploration = out / "exploration.json"
    if exploration.is_file():
        data = json.loads(exploration.read_text())
        lines += [
            "## Exploration (uncertainty-biased MD)",
            "",
            "Every row; the summary over seeds is in [exploration.md](exploration.md).",
            "",
            *_table(data.get("rows", [])),
            "",
        ]
        runs.append(f"- Exploration: `{rerun_command(data.get('command', '?'))}`")
    lines += [
        "## Run",
        "",
        *runs,
        *(
            [
                "- Versions: "
                + ", ".join(f"{k} {v}" for k, v in result["environment"]["versions"].items())
            ]
            if result.get("environment")
            else []
        ),
        "- Full provenance: `scale.json`, `scale_train.json`, `exploration.json`",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="10^2 and 3x10^2 frames in this process (smoke test, < 30 s of CPU).",
    )
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=None, help="Frame counts (default 10^4 10^5)."
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--chunk-size", type=int, default=None, help="Frames per chunk (default 256; quick 32)."
    )
    parser.add_argument(
        "--time-limit", type=float, default=600.0, help="Seconds per run before it is stopped."
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--report-only", action="store_true", help="Only rewrite scale.md from OUT/*.json."
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scores", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from mlip_unc.atomic_write import atomic_write_text

    if args.report_only:
        result = json.loads((args.out / "scale.json").read_text())
        atomic_write_text(args.out / "scale.md", render(result, args.out) + "\n")
        return

    sizes = args.sizes or ([100, 300] if args.quick else [10_000, 100_000])
    args.chunk_size = args.chunk_size or (32 if args.quick else 256)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlip-unc-scale-") as tmp:
        tmp = Path(tmp)
        model = tmp / "model.pt"
        write_model(model, args.seed)
        for n in sizes:
            data = tmp / f"traj_{n}.xyz"
            start = time.perf_counter()
            write_trajectory(data, n, args.seed)
            print(
                f"{n} frames written in {time.perf_counter() - start:.1f} s ({data.stat().st_size / 2**20:.1f} MiB)",
                file=sys.stderr,
            )
            for workers in args.workers:
                row = (
                    run_in_process(data, model, n, workers, args.chunk_size)
                    if args.quick
                    else run_one(data, model, n, workers, args.chunk_size, args.time_limit, tmp)
                )
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
            data.unlink()
    argv, skip = [], False
    for a in sys.argv[1:]:  # the command without --out (a temporary folder in the tests)
        if skip or a.startswith("--out"):
            skip = a == "--out"
            continue
        argv.append(a)
    result = {
        "command": " ".join(["OMP_NUM_THREADS=1 python -m benchmarks.scale", *argv]),
        "seed": args.seed,
        "setup": "Trajectories: 8-atom fcc Cu cells, Gaussian rattle 0.05 A, extxyz. Model: tiny UNTRAINED GIN "
        "potential (8 hidden, 4 latent, 1 layer), exact force uncertainty; `--top-k 10`, metric "
        f"max_force_std, chunk size {args.chunk_size}, 1 torch thread per process, OMP_NUM_THREADS=1.",
        "memory_measure": "peak RSS (VmHWM of /proc/PID/status = getrusage ru_maxrss) of the screening process "
        "(parent_rss_MiB) and of the largest worker process (worker_rss_MiB); peak_rss_MiB is "
        "the larger. Not tracemalloc: torch's own memory is included."
        + (
            " --quick: all runs in one process, so the peaks are cumulative over the rows."
            if args.quick
            else " Each row is a fresh process."
        ),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs; "
        f"load average at the end {os.getloadavg()[0]:.1f})",
        "environment": environment(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "scale.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(args.out / "scale.md", render(result, args.out) + "\n")
    print(f"wrote {args.out / 'scale.json'} and {args.out / 'scale.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
