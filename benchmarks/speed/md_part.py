"""Part ``md`` of the speed suite: steps/s of ASE Langevin MD, plain and monitored.

In ONE process, per thread count and per system (:mod:`benchmarks.speed.sizes`, the size
part's structures at about 27, 1,000 and 10,000 atoms: by default the 3BPA molecule and boxes of
its copies), five rows of MD, each its own ``Atoms`` and integrator:

- ``ours E+F``: ``UncertaintyCalculator(uncertainty="none")``, nothing attached (plain MD);
- ``ours monitored /10`` and ``/1``: the calculator's default mode with the package's
  :class:`~mlip_unc.active.monitor.UncertaintyMonitor` attached every 10th / every step, as
  :func:`~mlip_unc.active.monitor.run_md` attaches it (its CSV log written; the trajectory and
  the plot, which plain MD would write too, left out);
- ``mace E+F`` and ``mace committee5 /10``: mace-torch's ``MACECalculator`` on one and on five
  untrained models (:func:`benchmarks.speed.size_part.build_models`), the committee's force
  spread read from ``forces_comm`` every 10th step (the committee runs its five models at every
  step), where mace-torch imports.

The integrator is run_md's: Langevin with :class:`~mlip_unc.config.MDSettings`' defaults
(1 fs, 300 K, friction 0.01/fs), Maxwell-Boltzmann momenta. Steps are timed in chunks of 10
(one monitored step per chunk at interval 10); every chunk restarts from the system's positions
and the row's first momenta, and the force call of the restart is made before the clock
starts: with untrained weights the forces are weak and the structure would drift apart (a lone
molecule dissociates within a few hundred fs), changing the neighbour count and the cost
between rows and rounds. The rows of a system are timed in interleaved rounds of one chunk per
row, the order rotated (as the size part does), so load drifts hit all rows alike; steps/s =
10 / the median chunk time; every ratio is of the same run; each step is timed too (an observer
after the others), so the JSON splits a row's time into steps with and without a σ read. A row takes as many chunks as fit
in ``row_budget_s`` by its warm-up step and stops once its chunks took that long (at most
``max_chunks``; ours E+F and ours /10, whose ratio is the verdict,
take the same number, at least ``min_chunks``), after ``warmup_steps`` single steps; a row is
skipped where one chunk is predicted (the previous size of the kind scaled by the atom count,
or its warm-up step) to take over ``max_chunk_s``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ase import Atoms, units
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import Stationary, thermalize_momenta

from benchmarks.speed import size_part
from benchmarks.speed.size_part import ROW_ERRORS, Models, build_models, load_avg
from benchmarks.speed.size_report import NOT_MEASURED, QUIET_LOAD
from benchmarks.speed.sizes import FULL, QUICK, System, build
from mlip_unc import UncertaintyCalculator
from mlip_unc.active.monitor import UncertaintyMonitor
from mlip_unc.config import MDSettings

PART = "md"
KINDS = ("molecules",)  # the default: a molecule and boxes of its copies
SIZE_INDEX = (0, 2, 3)  # of sizes.FULL[kind]: about 27 (liquid 12, crystal 8), 1,000, 10,000 atoms
CHUNK = 10  # steps per timed chunk: one monitored step at interval 10
INTERVAL = 10  # the monitoring interval of the verdict (and of the committee)
TARGET = 0.9  # the target: monitored /10 at >= 0.9x the steps/s of plain MD
NOISY = 0.2  # chunk times spread (IQR / median) over this: the load sets the ratio
PLAIN, MONITORED = "ours E+F", f"ours monitored /{INTERVAL}"
VERDICT = (PLAIN, MONITORED)
ROWS = (PLAIN, MONITORED, "ours monitored /1", "mace E+F", f"mace committee5 /{INTERVAL}")


@dataclass(frozen=True)
class Settings:
    """What the part measures and how long (defaults: the full part, ~10 min on 2 loaded cores)."""

    threads: tuple[int, ...] = (1,)
    kinds: tuple[str, ...] = KINDS
    max_atoms: int | None = None
    row_budget_s: float = 12.0  # timed seconds per row (a row takes as many chunks as fit)
    min_chunks: int = 2  # of the verdict rows, whatever the budget
    max_chunks: int = 40
    max_chunk_s: float = 120.0
    warmup_steps: int = 2
    quick: bool = False


def systems(data_root: Path, settings: Settings) -> list[System]:
    """The size part's systems at about 27, 1,000 and 10,000 atoms (quick: its quick ones)."""
    out = []
    for kind in settings.kinds:
        table = QUICK[kind] if settings.quick else [FULL[kind][i] for i in SIZE_INDEX]
        for reps in table:
            system = build(kind, reps, data_root)
            if settings.max_atoms is None or system.n_atoms <= settings.max_atoms:
                out.append(system)
    return out


# ================================================================ rows
def dynamics(atoms: Atoms, md: MDSettings) -> Langevin:
    """run_md's integrator: Maxwell-Boltzmann momenta (seeded), Langevin of ``md``."""
    rng = np.random.default_rng(md.seed)
    thermalize_momenta(atoms, temperature_K=md.temperature, rng=rng)
    Stationary(atoms)
    return Langevin(
        atoms,
        md.timestep * units.fs,
        temperature_K=md.temperature,
        friction=md.friction / units.fs,
        fixcm=False,
        rng=rng,
    )


class SpreadReader:
    """The committee's σ: the largest per-atom norm of the members' force spread."""

    def __init__(self, calc: Any, atoms: Atoms) -> None:
        self.calc, self.atoms, self.last = calc, atoms, float("nan")

    def __call__(self) -> None:
        members = np.asarray(self.calc.get_property("forces_comm", self.atoms))  # (m, n, 3)
        self.last = float(np.linalg.norm(members.std(axis=0), axis=1).max())


@dataclass
class MDRow:
    """One MD run of a system: its atoms, calculator, integrator, observer and chunk times."""

    key: str
    model: str  # "ours" | "mace"
    mode: str  # "none", our default mode, "E+F", "committee5"
    interval: int | None  # σ read every this many steps (None: plain MD)
    calc: Any
    atoms: Atoms
    dyn: Langevin
    start: tuple[np.ndarray, np.ndarray]  # positions, momenta of every chunk's restart
    chunk_s: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    reads: int = 0  # observer calls in timed chunks
    passes: dict[str, int] = field(default_factory=dict)  # ours: forward / σ passes, timed
    warmup_s: float | None = None
    error: str | None = None
    steps_s: list[tuple[float, bool]] = field(default_factory=list)  # (s, σ read), timed
    _last: float | None = None  # perf_counter at the end of the previous timed step
    _stamping: bool = False

    def observe(self, observer: Callable[[], None]) -> None:
        def read() -> None:
            self.reads += 1
            observer()

        assert self.interval is not None
        self.dyn.attach(read, interval=self.interval)

    def restart(self) -> None:
        """The system's positions and the row's first momenta, forces computed (untimed)."""
        self.atoms.set_positions(self.start[0])
        self.atoms.set_momenta(self.start[1])
        self.atoms.get_forces()

    def counts(self) -> dict[str, int]:
        return {
            "forward": int(getattr(self.calc, "n_model_calls", 0)),
            "sigma": int(getattr(self.calc, "n_uncertainty_calls", 0)),
        }

    def stamp(self) -> None:
        """An observer after every other one: each timed step's seconds, and whether σ was read."""
        if self._last is None:
            return
        now = time.perf_counter()
        read = self.interval is not None and self.dyn.nsteps % self.interval == 0
        self.steps_s.append((now - self._last, read))
        self._last = now

    def chunk(self) -> float:
        """One timed chunk of ``CHUNK`` steps after an untimed restart; seconds."""
        if not self._stamping:  # attached after the monitor: called last
            self.dyn.attach(self.stamp, interval=1)
            self._stamping = True
        self.restart()
        reads, before = self.reads, self.counts()
        start = self._last = time.perf_counter()
        self.dyn.run(CHUNK)
        seconds = time.perf_counter() - start
        self._last = None
        after = self.counts()
        for name, value in after.items():
            self.passes[name] = self.passes.get(name, 0) + value - before[name]
        self.passes["reads"] = self.passes.get("reads", 0) + self.reads - reads
        return seconds


def _row(key: str, model: str, mode: str, interval: int | None, calc: Any, system: System) -> MDRow:
    atoms = system.atoms.copy()
    atoms.calc = calc
    dyn = dynamics(atoms, MDSettings())
    return MDRow(
        key, model, mode, interval, calc, atoms, dyn, (atoms.positions.copy(), atoms.get_momenta())
    )


def md_rows(models: Models, system: System, log_dir: Path) -> tuple[list[MDRow], dict[str, str]]:
    """The five rows of ``system`` (the mace ones where mace-torch imports); (rows, {key: why
    not measured}). The monitors write their CSV logs into ``log_dir``."""
    default = models.default
    rows = [
        _row(
            PLAIN,
            "ours",
            "none",
            None,
            UncertaintyCalculator(models.ours, uncertainty="none", domain=False),
            system,
        )
    ]
    for interval in (INTERVAL, 1):
        calc = UncertaintyCalculator(models.ours, uncertainty=default, domain=False)
        row = _row(f"ours monitored /{interval}", "ours", default, interval, calc, system)
        csv = log_dir / f"{system.name}_{interval}.csv"
        row.observe(UncertaintyMonitor(row.atoms, csv, dyn=row.dyn))
        rows.append(row)
    if models.mace is None:
        reason = models.mace_missing or "not built"
        return rows, {key: reason for key in ROWS if key.startswith("mace")}
    rows.append(_row("mace E+F", "mace", "E+F", None, models.mace, system))
    committee = _row(ROWS[-1], "mace", "committee5", INTERVAL, models.committee, system)
    committee.observe(SpreadReader(models.committee, committee.atoms))
    rows.append(committee)
    return rows, {}


# ================================================================ timing
def guarded(row: MDRow, fn: Callable[[], float]) -> float | None:
    """``fn()``, or None with ``row.error`` set when the calculator or the integrator fails."""
    if row.error is not None:
        return None
    try:
        return fn()
    except ROW_ERRORS as err:  # NaN, coincident atoms (a ValueError), out of memory
        row.error = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return None


def warm_up(row: MDRow, steps: int) -> float | None:
    """``steps`` single steps (the first pays one-time costs); the last step's seconds."""

    def one() -> float:
        start = time.perf_counter()
        row.dyn.run(1)
        return time.perf_counter() - start

    last = None
    for _ in range(steps):
        last = guarded(row, one)
    return last


def chunks_for(seconds: float | None, settings: Settings, least: int = 1) -> int:
    """Chunks of a row whose step takes ``seconds``: as many as fit in the row budget, at
    least ``least``, at most ``max_chunks``."""
    if not seconds:
        return max(least, 1)
    fit = int(settings.row_budget_s / (CHUNK * seconds))
    return max(least, min(settings.max_chunks, fit))


History = dict[str, tuple[int, float]]  # key -> (atoms, seconds per step) at the previous size


def too_long(seconds: float | None, settings: Settings, how: str) -> str | None:
    """Why a row is skipped when one chunk of a ``seconds`` step exceeds ``max_chunk_s``."""
    if seconds is None or CHUNK * seconds <= settings.max_chunk_s:
        return None
    return (
        f"{how} {seconds:.3g} s: {CHUNK} steps over {settings.max_chunk_s:g} s "
        "(the part's time budget)"
    )


def plan(
    rows: list[MDRow], history: History, n_atoms: int, settings: Settings
) -> tuple[list[MDRow], dict[str, int], dict[str, str]]:
    """Skip by prediction, warm up, skip by the warm-up step; (rows, chunks, {key: why})."""
    skipped: dict[str, str] = {}
    kept = []
    for row in rows:
        previous = history.get(row.key)
        predicted = None if previous is None else previous[1] * n_atoms / previous[0]
        why = too_long(predicted, settings, "one step predicted (previous size x atoms) to take")
        if why is None:
            row.warmup_s = warm_up(row, settings.warmup_steps)
            why = row.error or too_long(row.warmup_s, settings, "its warm-up step took")
        if why is None:
            kept.append(row)
        else:
            skipped[row.key] = why
    chunks = {row.key: chunks_for(row.warmup_s, settings) for row in kept}
    pair = [key for key in VERDICT if key in chunks]
    if pair:  # the verdict pair: the same chunks, at least min_chunks
        both = max(settings.min_chunks, min(chunks[key] for key in pair))
        chunks.update(dict.fromkeys(pair, both))
    return kept, chunks, skipped


def time_rows(rows: list[MDRow], chunks: dict[str, int], settings: Settings) -> None:
    """Interleaved rounds of one chunk per row, the order rotated from round to round. A row
    stops once its timed chunks took ``row_budget_s`` (the load can make chunks far slower than
    the warm-up said), after ``min_chunks`` for the verdict pair, which stops as one (the same
    rounds for both), and after one chunk for the others."""
    pair = [row for row in rows if row.key in VERDICT]

    def goes_on(row: MDRow, r: int) -> bool:
        unit = pair if row in pair else [row]
        least = settings.min_chunks if row in pair else 1
        spent = max(sum(u.chunk_s) for u in unit)
        return r < chunks[row.key] and (r < least or spent < settings.row_budget_s)

    for r in range(max(chunks.values(), default=0)):
        shift = (r * 7) % len(rows)
        going = [row for row in rows[shift:] + rows[:shift] if goes_on(row, r)]
        for row in going:
            seconds = guarded(row, row.chunk)
            if seconds is not None:
                row.chunk_s.append(seconds)
                row.rounds.append(r)


def summarise(rows: list[MDRow]) -> list[dict[str, Any]]:
    """One record per timed row: steps/s (10 / median chunk), its ratios to ours E+F (and to
    mace E+F), the paired ratio (median over rounds of ours E+F's chunk / the row's chunk),
    the median time of a step without and with a σ read, and the passes of ours rows over the
    timed steps."""
    rate = {row.key: CHUNK / statistics.median(row.chunk_s) for row in rows if row.chunk_s}
    plain = next((row for row in rows if row.key == PLAIN and row.chunk_s), None)
    out = []
    for row in (row for row in rows if row.chunk_s):
        steps = CHUNK * len(row.chunk_s)
        paired = None
        if plain is not None:
            mine = dict(zip(row.rounds, row.chunk_s, strict=True))
            pairs = [
                s / mine[r] for r, s in zip(plain.rounds, plain.chunk_s, strict=True) if r in mine
            ]
            paired = statistics.median(pairs) if pairs else None
        rec: dict[str, Any] = {
            "key": row.key,
            "model": row.model,
            "mode": row.mode,
            "interval": row.interval,
            "steps": steps,
            "chunks": len(row.chunk_s),
            "steps_per_s": rate[row.key],
            "steps_per_s_total": steps / sum(row.chunk_s),
            "chunk_s_q25": float(np.percentile(row.chunk_s, 25)),
            "chunk_s_q75": float(np.percentile(row.chunk_s, 75)),
            "chunk_spread": float(np.subtract(*np.percentile(row.chunk_s, [75, 25])))
            / statistics.median(row.chunk_s),
            "x_plain": rate[row.key] / rate[PLAIN] if PLAIN in rate else None,
            "x_plain_paired": paired,
            "x_mace_plain": rate[row.key] / rate["mace E+F"] if "mace E+F" in rate else None,
            "sigma_reads": row.passes.get("reads", 0),
            "warmup_step_s": row.warmup_s,
            "chunk_s": [round(x, 5) for x in row.chunk_s],
            "step_s_median": _median([x for x, read in row.steps_s if not read]),
            "read_step_s_median": _median([x for x, read in row.steps_s if read]),
        }
        if row.model == "ours":
            rec["forward_passes"] = row.passes.get("forward", 0)
            rec["sigma_passes"] = row.passes.get("sigma", 0)
        out.append(rec)
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure_system(
    models: Models, system: System, settings: Settings, history: History, log_dir: Path
) -> dict[str, Any]:
    """Every row of one system at the current thread count; updates ``history``."""
    start, load_start = time.perf_counter(), load_avg()
    rows, skipped = md_rows(models, system, log_dir)
    rows, chunks, too_big = plan(rows, history, system.n_atoms, settings)
    skipped.update(too_big)
    print(f"[md] {system.name}: {len(rows)} rows, chunks {chunks}", flush=True)
    time_rows(rows, chunks, settings)
    skipped.update({row.key: row.error for row in rows if row.error is not None})
    records = summarise([row for row in rows if row.error is None])
    for rec in records:
        history[rec["key"]] = (system.n_atoms, 1.0 / rec["steps_per_s"])
    return {
        "system": system.name,
        "kind": system.kind,
        "n_atoms": system.n_atoms,
        "rows": records,
        "skipped": skipped,
        "load_avg_start": load_start,
        "load_avg_end": load_avg(),
        "wall_s": time.perf_counter() - start,
    }


def run(
    settings: Settings, data_root: Path, command: str, save: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """The whole part: every thread count, every system; ``save(entry)`` after each system."""
    wall, load_start = time.perf_counter(), load_avg()
    models = build_models(settings.quick)
    series = systems(data_root, settings)
    meta = size_part.meta(models, series, settings_as_size(settings), command, load_start)
    meta.update(
        part=PART,
        settings={k: getattr(settings, k) for k in Settings.__dataclass_fields__},
        md=MDSettings().model_dump(include={"timestep", "temperature", "friction", "seed"}),
        chunk_steps=CHUNK,
        interval=INTERVAL,
        target=TARGET,
    )
    for name in ("probe_untimed", "memory_probe"):
        meta.pop(name, None)
    entry: dict[str, Any] = {"meta": meta, "groups": []}
    with tempfile.TemporaryDirectory(prefix="mlip_unc_speed_md_") as logs:
        for threads in settings.threads:
            torch.set_num_threads(threads)
            history: dict[str, History] = {kind: {} for kind in settings.kinds}
            for system in series:
                group = measure_system(models, system, settings, history[system.kind], Path(logs))
                entry["groups"].append(
                    {"threads": threads, "torch_threads": torch.get_num_threads(), **group}
                )
                meta.update(status=f"{len(entry['groups'])} groups", load_avg_last=load_avg())
                print(
                    f"[md] {threads} thread(s) {system.name}: {group['wall_s']:.1f} s", flush=True
                )
                save(entry)
    meta.update(
        status="complete",
        finished=time.strftime("%Y-%m-%d %H:%M"),
        load_avg_end=load_avg(),
        wall_s=time.perf_counter() - wall,
    )
    save(entry)
    print(f"[md] done in {meta['wall_s'] / 60:.1f} min", flush=True)
    return entry


def settings_as_size(settings: Settings) -> size_part.Settings:
    """The size part's settings of the same threads, kinds and mode (for its ``meta``)."""
    return size_part.Settings(
        threads=settings.threads,
        kinds=settings.kinds,
        max_atoms=settings.max_atoms,
        quick=settings.quick,
    )


# ================================================================ the page
def _cell(rec: dict[str, Any] | None, key: str) -> str:
    return NOT_MEASURED if rec is None or rec.get(key) is None else f"{rec[key]:.2f}"


def spread(group: dict[str, Any]) -> float | None:
    """The larger chunk-time spread (IQR / median) of ours E+F and ours /10 in ``group``."""
    values = [r["chunk_spread"] for r in group["rows"] if r["key"] in VERDICT]
    return max(values) if len(values) == len(VERDICT) else None


def verdict(entry: dict[str, Any]) -> str:
    """The monitored /10 ratio's range over the groups, whether it meets the target, and in
    how many groups the load spread the chunk times over ``NOISY``."""
    cells = [
        (g, rec["x_plain"])
        for g in entry["groups"]
        for rec in g["rows"]
        if rec["key"] == MONITORED and rec["x_plain"] is not None
    ]
    if not cells:
        return f"Monitored at interval {INTERVAL}: {NOT_MEASURED}."
    low, high = min(x for _, x in cells), max(x for _, x in cells)
    missed = [f"{g['system']}, {g['threads']} thread(s): {x:.2f}" for g, x in cells if x < TARGET]
    met = len(cells) - len(missed)
    text = (
        f"**Monitored at interval {INTERVAL}: {low:.2f}-{high:.2f}x the steps/s of plain MD; "
        f"target >= {TARGET:g}x met in {met} of {len(cells)} cells**"
    )
    text += f" (missed: {'; '.join(missed)})." if missed else "."
    noisy = sum(1 for g, _ in cells if (spread(g) or 0.0) > NOISY)
    if noisy:
        text += (
            f" In {noisy} of them the chunk times spread over {NOISY:.0%} of their median (last "
            "column): there the machine's load, not the method, sets the ratio."
        )
    return text


def render_md(entry: dict[str, Any]) -> list[str]:
    """The part's section of speed.md: a sentence, one table, one line of provenance."""
    m = entry["meta"]
    quiet = m["load_avg_start"][0] < QUIET_LOAD
    lines = [
        "## MD throughput: plain and monitored (part `md`)",
        "",
        "Steps/s of ASE Langevin MD (run_md's: 1 fs, 300 K) with our calculator: plain (ours "
        f'E+F, `uncertainty="none"`) and the default mode `{m["default_mode"]}` with '
        f"`UncertaintyMonitor` reading σ every {INTERVAL}th step or every step; mace-torch plain "
        f"and a committee of 5 read every {INTERVAL}th step; one interleaved run"
        + (" (QUICK mode: tiny models, not a measurement)" if m["quick"] else "")
        + ". "
        + verdict(entry),
        "",
        f"| threads | system | atoms | ours E+F steps/s | monitored /{INTERVAL}, x E+F "
        f"| monitored /1, x E+F | mace E+F, x ours E+F | mace committee5 /{INTERVAL}, x ours E+F "
        f"| chunk spread, E+F / /{INTERVAL} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for g in entry["groups"]:
        rec = {r["key"]: r for r in g["rows"]}
        lines.append(
            f"| {g['threads']} | {g['system']} | {g['n_atoms']} | {_cell(rec.get(PLAIN), 'steps_per_s')} | "
            + " | ".join(_cell(rec.get(key), "x_plain") for key in ROWS[1:])
            + " | "
            + " / ".join(
                f"{rec[key]['chunk_spread']:.0%}" if key in rec else "n/a" for key in VERDICT
            )
            + " |"
        )
    lines += [
        "",
        f"Load average (1, 5, 15 min) {m['load_avg_start']} at the start, "
        f"{m.get('load_avg_end', m.get('load_avg_last', 'n/a'))} at the end"
        + ("" if quiet else f" (not a quiet machine: 1-min load >= {QUIET_LOAD:g})")
        + f"; untrained models; steps/s = {CHUNK} / the median time of a chunk of {CHUNK} steps, "
        "each chunk restarted from the same structure; chunk spread = (q75 - q25) / median of a row's chunk times; not measured: one chunk predicted over "
        f"{m['settings']['max_chunk_s']:g} s, or mace-torch missing (reasons, steps, quartiles, "
        "paired ratios, passes per row: speed.json). "
        f"`{m['command']}`, {m['started']}, {m['cpu_count']} CPUs; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + ".",
        "",
    ]
    return lines
