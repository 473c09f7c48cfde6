"""``mlip-unc flag`` over a trajectory of any length: streamed in chunks, sharded over processes.

The same selection as :func:`~mlip_unc.active.selection.flag_structures` (same frames, same
order, same values), with memory flat in the trajectory length:

* the file is read a chunk of frames at a time (:mod:`mlip_unc.data.stream`; extxyz is split
  at byte offsets found by one line scan, so a process starts reading at its chunk);
* sharding: contiguous chunks of ``chunk_size`` frames are handed to ``workers`` processes
  (``multiprocessing.Pool.imap``, in file order; a free process takes the next chunk, so
  uneven chunks balance). Each chunk returns only its candidates: the frames above the
  threshold, at most ``keep`` of them when ``top_k`` is given (``keep = top_k``, or the FPS
  pool ``pool_factor * top_k`` with ``diverse``), the best kept by a heap;
* the parent merges the candidates into one heap of ``keep`` (ties: the earlier frame wins,
  as in the stable ranking of :func:`~mlip_unc.active.selection.select`) and runs ``select``
  on them. The global top ``keep`` is always among the chunks' top ``keep``, and the FPS of a
  diverse selection sees only the pool, so the result equals the all-in-memory one.

Only ``threshold`` without ``top_k`` keeps every frame above it (those are the result).
"""

from __future__ import annotations

import contextlib
import csv
import heapq
import logging
import multiprocessing as mp
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ase
import numpy as np
from tqdm.auto import tqdm

from mlip_unc import keys
from mlip_unc.active.selection import (
    INFO_SCORES,
    SCORE_KEYS,
    absolute_threshold,
    distance_histograms,
    flagged_copy,
    score_one,
    score_properties,
    select,
)
from mlip_unc.data.errors import DataError, no_frames, where
from mlip_unc.data.labels import validate_atoms
from mlip_unc.data.stream import (
    Checkpoint,
    extxyz_checkpoints,
    is_extxyz,
    iter_extxyz,
    iter_frames,
)

__all__ = ["ScreenResult", "plan_chunks", "screen_file"]

log = logging.getLogger(__name__)

Task = tuple[Checkpoint | None, int | None]  # (start, frame count); (None, None): the whole file


@dataclass
class ScreenResult:
    """What :func:`screen_file` found.

    Attributes:
        selected: copies of the chosen structures, best first (or FPS order), ``info`` with
            ``source_index``, ``rank`` and the scores (as :func:`flag_structures`).
        n_frames: frames scored.
        stats: per score name, ``mean``, ``min``, ``max`` over all frames (NaN-free scores).
        n_above_threshold: frames with the metric above the threshold (None without one).
        out_of_domain: indices of the frames the checkpoint's domain guard calls out of
            domain (selected or not; a warning names those not selected).
    """

    selected: list[ase.Atoms]
    n_frames: int
    stats: dict[str, dict[str, float]]
    n_above_threshold: int | None = None
    out_of_domain: list[int] = field(default_factory=list)


@dataclass
class _Chunk:
    """One chunk's result: candidates (score, -index, atoms, scores), sums, per-frame rows."""

    candidates: list[tuple[float, int, ase.Atoms, dict[str, float]]] = field(default_factory=list)
    n: int = 0
    n_above: int = 0
    sums: dict[str, list[float]] = field(default_factory=dict)  # name -> [sum, min, max, count]
    rows: list[list[Any]] = field(default_factory=list)
    out_of_domain: list[int] = field(default_factory=list)  # frame indices


def plan_chunks(path: str | Path, chunk_size: int) -> tuple[int | None, list[Task]]:
    """(number of frames or None, tasks): contiguous chunks of an extxyz file; any other format
    is one task read sequentially (``ase.io.iread``)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    path = Path(path)
    if not path.is_file():
        raise DataError(f"structure file not found: '{path}'")
    if not is_extxyz(path):
        return None, [(None, None)]
    n, marks = extxyz_checkpoints(path, every=chunk_size)
    return n, [(mark, min(chunk_size, n - mark.frame)) for mark in marks]


def _frames(path: Path, task: Task) -> Iterator[tuple[int, ase.Atoms]]:
    start, count = task
    return iter_frames(path) if start is None else iter_extxyz(path, start, count)


def _score_task(calc: Any, path: Path, task: Task, opts: dict[str, Any]) -> _Chunk:
    metric, threshold, keep = opts["metric"], opts["threshold"], opts["keep"]
    props = score_properties(calc, forces=metric == keys.CALC_MAX_FORCE_STD)
    out = _Chunk(sums={k: [0.0, np.inf, -np.inf, 0] for k in SCORE_KEYS if k != "flag"})
    for frame, atoms in _frames(path, task):
        validate_atoms(atoms, source=path, frame_index=frame)
        try:
            scores = score_one(calc, atoms, props)
        except (ValueError, FloatingPointError) as err:
            raise DataError(f"{where(path, frame)}: {err}") from err
        if calc.results.get("out_of_domain"):  # the domain guard's verdict on this frame
            out.out_of_domain.append(frame)
        value = scores[metric]
        if np.isnan(value):
            raise DataError(
                f"{where(path, frame)}: {metric} is NaN (the calculator gives no force uncertainty; "
                "use --metric energy_std_per_atom or a force-uncertainty mode)"
            )
        out.n += 1
        for name, acc in out.sums.items():
            v = scores[name]
            if not np.isnan(v):
                acc[0], acc[1], acc[2], acc[3] = (
                    acc[0] + v,
                    min(acc[1], v),
                    max(acc[2], v),
                    acc[3] + 1,
                )
        if opts["rows"]:
            out.rows.append([frame, *(scores[k] for k in SCORE_KEYS)])
        if threshold is not None and not value > threshold:
            continue
        out.n_above += 1
        item = (value, -frame, atoms, {k: scores[k] for k in INFO_SCORES})
        _push(out.candidates, item, keep)
    return out


def _push(heap: list, item: tuple, keep: int | None) -> None:
    """Keep the ``keep`` best by (score, earlier frame); ``keep`` None keeps everything."""
    if keep is None:
        heap.append(item)
    elif len(heap) < keep:
        heapq.heappush(heap, item)
    elif keep and item[:2] > heap[0][:2]:
        heapq.heapreplace(heap, item)


# ---------------------------------------------------------------- worker processes
_WORKER: dict[str, Any] = {}  # per worker process: its calculator (set by the pool initializer)


def _init_worker(make_calc: Callable[[], Any], threads: int) -> None:
    if threads > 0:
        import torch

        torch.set_num_threads(threads)
    _WORKER["calc"] = make_calc()


def _worker_task(args: tuple[Path, Task, dict[str, Any]]) -> _Chunk:
    path, task, opts = args
    return _score_task(_WORKER["calc"], path, task, opts)


def _context() -> mp.context.BaseContext:
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def screen_file(
    path: str | Path,
    make_calc: Callable[[], Any],
    *,
    metric: str = keys.CALC_MAX_FORCE_STD,
    top_k: int | None = None,
    threshold: float | None = None,
    relative: bool = False,
    diverse: str = "none",
    pool_factor: int = 4,
    workers: int = 1,
    chunk_size: int = 256,
    threads_per_worker: int = 1,
    scores_csv: str | Path | None = None,
    progress: bool = False,
) -> ScreenResult:
    """Score every frame of ``path`` and select as :func:`~mlip_unc.active.selection.flag_structures`.

    Args:
        make_calc: builds the ``UncertaintyCalculator`` (picklable, e.g. ``functools.partial``;
            called once per worker process, and in this process when ``workers`` is 1 or the
            selection needs it: ``relative`` thresholds, ``diverse="latent"``).
        workers: processes; 1 scores here.
        chunk_size: frames per task (memory per process: one frame plus the candidates).
        threads_per_worker: torch threads of each worker process (0: torch's default).
        scores_csv: write every frame's scores here, in file order (streamed, atomically).

    Raises:
        DataError: ``path`` holds no frames (named in the message).
    """
    if top_k is None and threshold is None:
        raise ValueError("give top_k, threshold or both")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if diverse not in ("none", "descriptor", "latent"):
        raise ValueError(f"diverse must be none, descriptor or latent, got {diverse!r}")
    if diverse != "none" and top_k is None:
        raise ValueError("a diverse selection picks top_k structures; give top_k")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    path = Path(path)
    local: dict[str, Any] = {}

    def calc() -> Any:
        if "calc" not in local:
            local["calc"] = make_calc()
        return local["calc"]

    if threshold is not None and relative:
        threshold = absolute_threshold(calc(), metric, threshold, relative)
    keep = (
        None if top_k is None else (max(top_k, pool_factor * top_k) if diverse != "none" else top_k)
    )
    opts = {"metric": metric, "threshold": threshold, "keep": keep, "rows": scores_csv is not None}
    n_total, tasks = plan_chunks(path, chunk_size)
    if n_total is not None and workers > len(tasks):
        workers = max(1, len(tasks))
    heap: list = []
    totals = _Chunk(sums={k: [0.0, np.inf, -np.inf, 0] for k in SCORE_KEYS if k != "flag"})
    with (
        _csv_rows(scores_csv) as write_rows,
        tqdm(total=n_total, desc="flag", unit="frame", disable=not progress) as bar,
    ):
        for chunk in _run(path, tasks, opts, make_calc, calc, workers, threads_per_worker):
            totals.n += chunk.n
            totals.n_above += chunk.n_above
            totals.out_of_domain += chunk.out_of_domain
            for name, acc in chunk.sums.items():
                t = totals.sums[name]
                t[0], t[1], t[2], t[3] = (
                    t[0] + acc[0],
                    min(t[1], acc[1]),
                    max(t[2], acc[2]),
                    t[3] + acc[3],
                )
            for item in chunk.candidates:
                _push(heap, item, keep)
            write_rows(chunk.rows)
            bar.update(chunk.n)
        if not totals.n:  # an empty file: an error, not "0 structures" (and no --scores file)
            raise DataError(no_frames(path))
    selected = _select(heap, top_k, threshold, diverse, calc)
    _warn_unselected(path, totals, selected, metric)
    stats = {
        name: {"mean": acc[0] / acc[3], "min": acc[1], "max": acc[2]}
        if acc[3]
        else {"mean": float("nan"), "min": float("nan"), "max": float("nan")}
        for name, acc in totals.sums.items()
    }
    return ScreenResult(
        selected,
        totals.n,
        stats,
        totals.n_above if threshold is not None else None,
        totals.out_of_domain,
    )


def _warn_unselected(path: Path, totals: _Chunk, selected: list[ase.Atoms], metric: str) -> None:
    """Warn about frames out of the training domain that the ranking by ``metric`` left out:
    the model extrapolates there, and a low std does not say so."""
    chosen = {int(atoms.info["source_index"]) for atoms in selected}
    missed = [k for k in totals.out_of_domain if k not in chosen]
    if missed:
        shown = ", ".join(map(str, missed[:10])) + (", ..." if len(missed) > 10 else "")
        log.warning(
            "%d of %d frames of '%s' are out of the training domain (the checkpoint's domain "
            "guard) but not selected by %s (frames %s): the model extrapolates there, whatever "
            "its std says; label them too",
            len(missed),
            totals.n,
            path,
            metric,
            shown,
        )


@contextlib.contextmanager
def _csv_rows(path: str | Path | None) -> Iterator[Callable[[list[list[Any]]], None]]:
    """A row writer into ``path`` (a temporary file renamed on success); a no-op for None."""
    if path is None:
        yield lambda rows: None
        return
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["frame", *SCORE_KEYS])
            yield writer.writerows
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _run(
    path: Path,
    tasks: list[Task],
    opts: dict[str, Any],
    make_calc: Callable[[], Any],
    calc: Callable[[], Any],
    workers: int,
    threads: int,
) -> Iterator[_Chunk]:
    """Chunk results in file order, here or from a pool of ``workers`` processes."""
    if workers == 1:
        for task in tasks:
            yield _score_task(calc(), path, task, opts)
        return
    log.info("flag: %d chunks over %d worker processes", len(tasks), workers)
    with _context().Pool(workers, initializer=_init_worker, initargs=(make_calc, threads)) as pool:
        yield from pool.imap(_worker_task, [(path, task, opts) for task in tasks], chunksize=1)


def _select(
    heap: list, top_k: int | None, threshold: float | None, diverse: str, calc: Callable[[], Any]
) -> list[ase.Atoms]:
    """:func:`select` on the merged candidates, in frame order as the in-memory ranking sees them."""
    cands = sorted(heap, key=lambda item: -item[1])  # by frame index
    if not cands:
        return []
    scores = np.array([c[0] for c in cands])
    features = None
    if diverse == "descriptor":
        features = distance_histograms([c[2] for c in cands])
    elif diverse == "latent":
        features = np.stack([calc().latent(c[2]) for c in cands])
    chosen = select(scores, top_k=top_k, threshold=threshold, features=features)
    return [
        flagged_copy(cands[int(k)][2], -cands[int(k)][1], rank, cands[int(k)][3])
        for rank, k in enumerate(chosen)
    ]
