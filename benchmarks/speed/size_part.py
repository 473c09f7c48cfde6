"""Part ``size`` of the speed suite: the calculator's cost from 10 to 10,000 atoms.

In ONE process, per thread count and per system (:mod:`benchmarks.speed.sizes`: molecules,
a liquid and a crystal at about 10, 100, 1,000 and 10,000 atoms), rows of calculator calls:

- ``ours E+F``: ``UncertaintyCalculator(uncertainty="none")``, ``get_forces()``;
- ``ours <mode>`` for EVERY mode of ``UncertaintyMode`` but ``none`` (read from the enum, the
  calculator's default marked), each asked in the README's order (``get_forces()`` then
  ``get_property("max_force_std")``; ``energy_std`` where the mode has no force σ) and in the
  reverse order;
- ``mace E+F`` and ``mace committee5``: mace-torch's own ``MACECalculator`` on one and on five
  untrained models (``get_forces()``; the committee then ``forces_comm``, whose spread is σ),
  where mace-torch imports.

Each call is on a new structure (positions moved by 1e-4 A, alternately up and down) so that no
cache hides work; the wall time of the ``get_*`` calls is timed. The rows of a system are timed
in interleaved rounds (the order rotated), so drifts of the machine's load hit all rows alike,
and every ratio (to ours E+F, to mace E+F) is of medians of the same run. Per row: at most
``repeats`` timed calls, fewer when they would take more than ``row_budget_s`` (at least one;
for ours E+F and the default mode, whose ratio is the page's verdict: a warm-up, at least
``verdict_calls`` and at most ``verdict_repeats``, so that the verdict's medians at small sizes,
where a call takes milliseconds and the load moves it most, rest on many calls); one untimed
warm-up call first when a call is predicted to be short; a row is skipped where one call is
predicted (its time at the previous size of the kind, scaled by the atom count) to take more
than ``max_call_s`` (the exact mode and the committee at the large sizes).

Peak memory is probed on each row's first warm-up call, or on the first timed call of a row
without a warm-up: the probe trims the heap, and a call after a trim pays for faulting its
memory in again, which a user's MD loop does not.

Per system also: the floor of the method (graph + forward ``f``, a one-vector backward ``b``,
the batched K-vector backward ``linear_gradients`` as the model runs it), the peak resident
memory of each row (:mod:`benchmarks.speed.instruments`), and, on the mid sizes, MD throughput (ASE
Langevin, σ read every step) for ours E+F, ours default mode with σ, and mace.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ase import Atoms, units
from ase.md.langevin import Langevin
from torch_geometric.data import Batch

from benchmarks.common.pages import versions
from benchmarks.speed import fixtures as setup
from benchmarks.speed import instruments
from benchmarks.speed.size_report import QUIET_LOAD
from benchmarks.speed.sizes import KINDS, System, size_series
from mlip_unc import UncertaintyCalculator, keys
from mlip_unc.data.graphs import atoms_to_graph
from mlip_unc.data.typemap import TypeMap
from mlip_unc.models.full_posterior import basis_state
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.models.potential_uncertainty import UncertaintyMode
from mlip_unc.uncertainty.moments import linear_gradients

PART = "size"
FORCE_SIGMA, ENERGY_SIGMA = keys.CALC_MAX_FORCE_STD, keys.CALC_ENERGY_STD
ORDERS = ("README", "reverse")
COMMITTEE = 5
STEP_A = 1e-4  # A: the move between calls
QUICK_OURS = [  # the equivariant config shrunk for --quick (a smoke test, not a timing)
    "model.backbone_kwargs={channels: 8, l_max: 1, num_layers: 1, num_basis: 4, radial_hidden: 8}",
    "model.latent_dim=8",
]
QUICK_MACE = {
    "num_channels": 8,
    "max_L": 1,
    "max_ell": 2,
    "correlation": 2,
    "num_interactions": 2,
    "num_radial_basis": 4,
}
MD_ATOMS = (50, 2000)  # MD on the systems of this many atoms (the ~100 and ~1,000 ones)
FLOOR_REPEATS = 3  # rounds of the floor's timing (medians)
MAX_FLOOR_K = 64  # the batched backward is timed up to this many vectors


@dataclass(frozen=True)
class Settings:
    """What the part measures and how often (defaults: the full part)."""

    threads: tuple[int, ...] = (1,)
    kinds: tuple[str, ...] = KINDS
    max_atoms: int | None = None
    repeats: int = 10
    row_budget_s: float = 5.0
    warmup_below_s: float = 5.0
    max_call_s: float = 60.0
    md_budget_s: float = 3.0
    md_max_step_s: float = 10.0
    md_max_steps: int = 20
    memory_fraction: float = 0.8
    first_warmup: int = 2
    verdict_calls: int = 3  # timed calls (and one warm-up) at least, of the rows the verdict reads
    verdict_repeats: int = 40  # and at most, within row_budget_s
    quick: bool = False


# ================================================================ models and rows
@dataclass
class Models:
    """Everything timed: our potential, its modes and default, mace-torch's calculators."""

    ours: BayesianPotential
    modes: list[str]
    default: str
    mace: Any | None
    committee: Any | None
    mace_missing: str | None


def build_models(quick: bool, *, mace: bool = True) -> Models:
    """Untrained models of the shipped configs' sizes (3BPA equivariant, random full posterior,
    the config's per-element basis; mace-torch at the accuracy benchmark's sizes, unless
    ``mace`` is False or mace-torch does not import)."""
    ours = setup.potential(
        "equivariant", quick=quick, config_basis=True, overrides=QUICK_OURS if quick else []
    )
    modes = [m.value for m in UncertaintyMode if m is not UncertaintyMode.NONE]
    default = UncertaintyCalculator(ours, domain=False).uncertainty  # default_uncertainty_mode
    if not mace or not setup.mace_available():
        missing = "mace-torch not importable in this Python (run the part in .venv-mace)"
        return Models(ours, modes, default, None, None, missing if mace else "not asked for")
    base = setup.mace_model(0, QUICK_MACE if quick else setup.MACE_SIZES)
    single = setup.mace_calculator(1, base=base)
    committee = setup.mace_calculator(COMMITTEE, base=base)
    return Models(ours, modes, default, single, committee, None)


@dataclass
class Row:
    """One row of a system: a calculator, what is asked of it in order, and what was measured."""

    key: str
    model: str  # "ours" | "mace"
    mode: str  # "E+F", an uncertainty mode, "committee5"
    order: str  # "README" | "reverse" | "" (E+F rows)
    props: tuple[str, ...]
    calc: Any
    atoms: Atoms
    ms: list[float] = field(default_factory=list)
    peak_mib: list[float] = field(default_factory=list)
    added_mib: list[float] = field(default_factory=list)
    vectors: list[int] = field(default_factory=list)
    moves: int = 0
    error: str | None = None

    def call(self) -> None:
        """Move the structure (a new geometry for every cache), then ask ``props`` in order."""
        self.moves += 1
        self.atoms.positions += STEP_A if self.moves % 2 else -STEP_A
        for name in self.props:
            self.calc.get_property(name, self.atoms)


def _row(
    key: str, model: str, mode: str, order: str, props: Sequence[str], calc: Any, system: System
) -> Row:
    atoms = system.atoms.copy()
    atoms.calc = calc
    return Row(key, model, mode, order, tuple(props), calc, atoms)


def sigma_property(calc: UncertaintyCalculator) -> str | None:
    """The σ a user reads of this calculator: the force σ, else the energy σ (energy mode)."""
    for name in (FORCE_SIGMA, ENERGY_SIGMA):
        if name in calc.implemented_properties:
            return name
    return None


def ours_rows(models: Models, system: System) -> tuple[list[Row], dict[str, str]]:
    """E+F and every mode in both orders; (rows, {key: why not measured})."""
    plain = UncertaintyCalculator(models.ours, uncertainty="none", domain=False)
    rows = [_row("ours E+F", "ours", "E+F", "", ["forces"], plain, system)]
    skipped: dict[str, str] = {}
    for mode in models.modes:
        try:
            calc = UncertaintyCalculator(models.ours, uncertainty=mode, domain=False)
        except ValueError as err:
            skipped[f"ours {mode}"] = f"the calculator refuses it: {err}"
            continue
        sigma = sigma_property(calc)
        if sigma is None:
            skipped[f"ours {mode}"] = "the mode gives neither max_force_std nor energy_std"
            continue
        for order, props in zip(ORDERS, (["forces", sigma], [sigma, "forces"]), strict=True):
            if order != ORDERS[0]:  # a calculator of its own per row
                calc = UncertaintyCalculator(models.ours, uncertainty=mode, domain=False)
            rows.append(_row(f"ours {mode} {order}", "ours", mode, order, props, calc, system))
    return rows, skipped


def mace_rows(models: Models, system: System) -> tuple[list[Row], dict[str, str]]:
    """mace-torch single E+F and its 5-model committee with σ (none without mace-torch)."""
    if models.mace is None:
        reason = models.mace_missing or "not built"
        return [], {"mace E+F": reason, "mace committee5": reason}
    return [
        _row("mace E+F", "mace", "E+F", "", ["forces"], models.mace, system),
        _row(
            "mace committee5",
            "mace",
            "committee5",
            "",
            ["forces", "forces_comm"],
            models.committee,
            system,
        ),
    ], {}


# ================================================================ timing
def measured_call(
    row: Row, counter: instruments.VectorCounter, *, timed: bool, probe: bool = False
) -> float:
    """One call of ``row`` with its backward vectors recorded, and with ``probe`` its peak
    memory; seconds. The probe trims the heap first, so the call faults its memory in again
    (a 12-atom call of the default mode took twice as long): time calls without it."""
    before = instruments.start_peak() if probe else None
    counter.reset()
    start = time.perf_counter()
    row.call()
    seconds = time.perf_counter() - start
    peak = instruments.read_peak() if probe else None
    if peak is not None and before is not None:
        row.peak_mib.append(peak)
        row.added_mib.append(peak - before)
    row.vectors.append(counter.count)
    if timed:
        row.ms.append(1e3 * seconds)
    return seconds


@dataclass(frozen=True)
class Prediction:
    """One call of a row at a new size, from its previous size scaled by the atom count."""

    seconds: float
    added_mib: float | None


@dataclass(frozen=True)
class Plan:
    """How a row is timed on one system: warm-up calls, at most ``calls`` timed ones (at least
    ``min_calls``, whatever the row budget; at most ``max_calls`` once the warm-up has timed
    a call)."""

    warmup: int
    calls: int
    predicted_s: float | None
    min_calls: int = 1
    max_calls: int | None = None  # None: settings.repeats


def plan_row(
    pred: Prediction | None,
    settings: Settings,
    available_mib: float | None = None,
    *,
    verdict: bool = False,
) -> Plan | str:
    """The row's plan, or why it is skipped: one call predicted over ``max_call_s``, or to need
    more than ``memory_fraction`` of the memory available now. A ``verdict`` row (ours E+F, the
    default mode: the page's <= 2x column reads them) gets one warm-up and at least
    ``verdict_calls`` timed calls at every size, so that no verdict rests on a single call, and
    up to ``verdict_repeats`` within the row budget."""
    most = max(settings.verdict_repeats, settings.repeats) if verdict else settings.repeats
    least = min(settings.verdict_calls, most) if verdict else 1
    if pred is None:  # the first size of a kind: its first call pays one-time costs
        return Plan(settings.first_warmup, most, None, least, most)
    if pred.seconds > settings.max_call_s:
        return f"one call predicted to take {pred.seconds:.3g} s (> {settings.max_call_s:g} s)"
    limit = None if available_mib is None else settings.memory_fraction * available_mib
    if pred.added_mib is not None and limit is not None and pred.added_mib > limit:
        return (
            f"does not fit in memory: one call predicted to add {pred.added_mib / 1024:.1f} GiB "
            f"(> {settings.memory_fraction:g} x {available_mib / 1024:.1f} GiB available)"
        )
    warm = int(verdict or pred.seconds < settings.warmup_below_s)
    return Plan(warm, calls_for(pred.seconds, settings, least, most), pred.seconds, least, most)


def calls_for(
    seconds: float | None, settings: Settings, least: int = 1, most: int | None = None
) -> int:
    """Timed calls of a row whose call takes ``seconds``: ``most`` (default ``repeats``), fewer
    beyond the budget, never fewer than ``least``."""
    most = settings.repeats if most is None else most
    if not seconds:
        return most
    return max(least, min(most, int(settings.row_budget_s / seconds)))


ROW_ERRORS = (RuntimeError, ValueError, MemoryError, NotImplementedError, FloatingPointError)


def guarded_call(
    row: Row, counter: instruments.VectorCounter, *, timed: bool, probe: bool = False
) -> float | None:
    """:func:`measured_call`, or None with ``row.error`` set when the call fails (out of
    memory, a mode the model refuses, ...): the run goes on without the row."""
    if row.error is not None:
        return None
    try:
        return measured_call(row, counter, timed=timed, probe=probe)
    except ROW_ERRORS as err:  # PropertyNotImplementedError is a NotImplementedError
        row.error = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return None


def time_rows(rows: list[Row], plans: dict[str, Plan], settings: Settings) -> None:
    """Warm-ups (which also fix each row's number of calls, and on which the memory is
    probed), then interleaved rotated rounds of timed calls, which run no memory probe but
    for the first call of a row without a warm-up (over ``warmup_below_s`` a call)."""
    calls: dict[str, int] = {}
    with instruments.counting_vectors() as counter:
        for row in rows:
            plan = plans[row.key]
            seconds = [
                guarded_call(row, counter, timed=False, probe=k == 0) for k in range(plan.warmup)
            ]
            last = seconds[-1] if seconds else None
            calls[row.key] = (
                calls_for(last, settings, plan.min_calls, plan.max_calls) if last else plan.calls
            )
        for r in range(max(calls.values(), default=0)):
            shift = (r * 7) % len(rows)
            for row in rows[shift:] + rows[:shift]:
                if r < calls[row.key]:
                    probe = r == 0 and plans[row.key].warmup == 0
                    guarded_call(row, counter, timed=True, probe=probe)


def summarise(rows: list[Row], default: str) -> list[dict[str, Any]]:
    """One record per row: median and quartiles (ms), ratios to ours E+F and to mace E+F of the
    same system and run, peak and added memory (MiB), backward vectors of one call."""
    ref = {row.key: statistics.median(row.ms) for row in rows if row.ms}
    ours_ef, mace_ef = ref.get("ours E+F"), ref.get("mace E+F")
    out = []
    for row in rows:
        if not row.ms:
            continue
        med = ref[row.key]
        out.append(
            {
                "key": row.key,
                "model": row.model,
                "mode": row.mode,
                "order": row.order,
                "default": row.model == "ours" and row.mode == default,
                "props": list(row.props),
                "ms_median": med,
                "ms_q25": float(np.percentile(row.ms, 25)),
                "ms_q75": float(np.percentile(row.ms, 75)),
                "calls": len(row.ms),
                "x_ours_ef": med / ours_ef if ours_ef else None,
                "x_mace_ef": med / mace_ef if mace_ef else None,
                "peak_mib": max(row.peak_mib) if row.peak_mib else None,
                "added_mib": max(row.added_mib) if row.added_mib else None,
                "vectors": max(row.vectors) if row.vectors else None,
            }
        )
    return out


# ================================================================ the floor
def floor_times(
    pot: BayesianPotential, atoms: Atoms, ks: Sequence[int], reps: int, warmup: int
) -> dict[str, float]:
    """Median ms of the graph build, the forward (latents in the posterior's basis), a
    one-vector backward (a plain backward, as E+F runs it) and the batched backward of ``K``
    vectors (``linear_gradients`` with the model's gradient method, as the uncertainty modes
    run it) for each ``K`` in ``ks``; ``warmup`` untimed rounds first."""
    times: dict[str, list[float]] = {"graph": [], "forward": [], "backward": []}
    times.update({f"backward_{k}": [] for k in ks})
    for rep in range(warmup + reps):
        lap = _floor_round(pot, atoms, ks)
        if rep >= warmup:
            for name, ms in lap.items():
                times[name].append(ms)
    return {name: statistics.median(v) for name, v in times.items()}


def _floor_round(pot: BayesianPotential, atoms: Atoms, ks: Sequence[int]) -> dict[str, float]:
    """One round of :func:`floor_times`: ms of each stage on a fresh graph."""
    out: dict[str, float] = {}
    start = time.perf_counter()
    graph = atoms_to_graph(
        atoms, float(pot.r_max), TypeMap.from_list(pot.type_map), dtype=pot.dtype
    )
    batch = Batch.from_data_list([graph])
    stamp = _lap(out, "graph", start)
    with torch.enable_grad():
        state = pot._state(batch, forces=True, stress=bool(atoms.pbc.all()))
        state = basis_state(state, pot.posterior_blocks)
    stamp = _lap(out, "forward", stamp)
    phi, inputs = state.phi, state.inputs
    one = torch.ones(1, phi.shape[1], dtype=phi.dtype)
    linear_gradients(phi, inputs, one, method="loop", retain_graph=True)
    stamp = _lap(out, "backward", stamp)
    for k in ks:
        weights = torch.randn(k, phi.shape[1], dtype=phi.dtype)
        linear_gradients(phi, inputs, weights, method=pot.gradient_method, retain_graph=True)
        stamp = _lap(out, f"backward_{k}", stamp)
    return out


def _lap(out: dict[str, float], name: str, start: float) -> float:
    now = time.perf_counter()
    out[name] = 1e3 * (now - start)
    return now


def floor_ratio(t: dict[str, float], k: int) -> float:
    """``(f + K b) / (f + b)`` with ``f`` = graph + forward: the cost of K backward vectors
    against one, if nothing else were paid."""
    f = t["graph"] + t["forward"]
    return (f + k * t["backward"]) / (f + t["backward"])


def batched_floor(t: dict[str, float], k: int) -> float | None:
    """``(f + b_K) / (f + b)`` with ``b_K`` the measured batched backward of ``K`` vectors."""
    bk = t.get(f"backward_{k}")
    if bk is None:
        return None
    f = t["graph"] + t["forward"]
    return (f + bk) / (f + t["backward"])


# ================================================================ MD throughput
def md_steps_per_s(calc: Any, atoms: Atoms, sigma: str | None, steps: int) -> float:
    """Steps/s of ASE Langevin (0.5 fs, 300 K) over ``steps`` after one warm-up step, reading
    ``sigma`` from the calculator after every step (as in the README)."""
    a = atoms.copy()
    a.calc = calc
    dyn = Langevin(
        a,
        0.5 * units.fs,
        temperature_K=300,
        friction=0.02,
        fixcm=False,
        rng=np.random.default_rng(0),
    )
    if sigma is not None:
        dyn.attach(lambda: calc.get_property(sigma, a), interval=1)
    dyn.run(1)
    start = time.perf_counter()
    dyn.run(steps)
    return steps / (time.perf_counter() - start)


def md_rows(
    models: Models, system: System, timing: dict[str, float], settings: Settings
) -> list[dict[str, Any]]:
    """MD throughput of ours E+F, ours default mode with σ every step, mace E+F and the mace
    committee with σ; steps fixed by ``md_budget_s`` from the call times just measured."""
    default = models.default
    ours_default = UncertaintyCalculator(models.ours, uncertainty=default, domain=False)
    cases: list[tuple[str, Any, str | None, str]] = [
        (
            "ours E+F",
            UncertaintyCalculator(models.ours, uncertainty="none", domain=False),
            None,
            "ours E+F",
        ),
        (
            f"ours {default} (default), σ every step",
            ours_default,
            sigma_property(ours_default),
            f"ours {default} README",
        ),
    ]
    if models.mace is not None:
        cases += [
            ("mace E+F", models.mace, None, "mace E+F"),
            ("mace committee5, σ every step", models.committee, "forces_comm", "mace committee5"),
        ]
    out = []
    for label, calc, sigma, timed_as in cases:
        per_call = timing.get(timed_as)
        if per_call is None or per_call / 1e3 > settings.md_max_step_s:
            out.append(
                {
                    "row": label,
                    "skipped": f"one step over {settings.md_max_step_s:g} s (or not timed)",
                }
            )
            continue
        budget_steps = int(settings.md_budget_s / (per_call / 1e3))
        steps = max(2, min(settings.md_max_steps, budget_steps))
        try:
            rate = md_steps_per_s(calc, system.atoms, sigma, steps)
        except ROW_ERRORS as err:
            out.append({"row": label, "skipped": f"failed: {type(err).__name__}: {err}"[:200]})
            continue
        out.append({"row": label, "steps": steps, "steps_per_s": rate})
    base = next(
        (r["steps_per_s"] for r in out if r["row"] == "ours E+F" and "steps_per_s" in r), None
    )
    for r in out:
        if base and "steps_per_s" in r:
            r["x_ours_ef_time"] = base / r["steps_per_s"]  # time per step, x ours E+F
    return out


# ================================================================ one system, the part
History = dict[str, tuple[int, float, float | None]]  # key -> (atoms, s per call, added MiB)


def predict(history: History, key: str, n_atoms: int) -> Prediction | None:
    """One call of ``key`` at ``n_atoms``: its median time and largest added memory at the
    previous size of the kind, scaled by the atom count (None at the first size)."""
    if key not in history:
        return None
    n_prev, seconds, mib = history[key]
    scale = n_atoms / n_prev
    return Prediction(seconds * scale, None if mib is None else mib * scale)


def verdict_keys(default: str) -> set[str]:
    """The rows the page's <= 2x verdict reads: ours E+F and the default mode in both orders."""
    return {"ours E+F", *(f"ours {default} {order}" for order in ORDERS)}


def plan_rows(
    rows: list[Row], history: History, n_atoms: int, settings: Settings, verdict: set[str]
) -> tuple[list[Row], dict[str, Plan], dict[str, str]]:
    """(rows to time, their plans, {key: why skipped}); ``verdict``: keys of the verdict rows."""
    plans: dict[str, Plan] = {}
    skipped: dict[str, str] = {}
    available = instruments.available_mib()
    for row in rows:
        pred = predict(history, row.key, n_atoms)
        plan = plan_row(pred, settings, available, verdict=row.key in verdict)
        if isinstance(plan, str):
            skipped[row.key] = plan
        else:
            plans[row.key] = plan
    return [row for row in rows if row.key in plans], plans, skipped


def add_floor(
    records: list[dict[str, Any]], pot: BayesianPotential, atoms: Atoms, settings: Settings
) -> dict[str, float] | None:
    """Measure the floor (if ours E+F was timed) and put each ours row's floor in its record."""
    ef = next((rec for rec in records if rec["key"] == "ours E+F"), None)
    if ef is None:
        return None
    short = ef["ms_median"] / 1e3 < settings.warmup_below_s  # else: f and b only (time)
    ks = sorted(
        {
            rec["vectors"]
            for rec in records
            if rec["model"] == "ours" and rec["vectors"] and 1 < rec["vectors"] <= MAX_FLOOR_K
        }
    )
    ks = ks if short else []
    warm = int(short)
    floor = floor_times(pot, atoms, ks, min(FLOOR_REPEATS, ef["calls"]), warm)
    for rec in records:
        if rec["model"] == "ours" and rec["vectors"]:
            rec["floor"] = floor_ratio(floor, rec["vectors"])
            rec["floor_batched"] = batched_floor(floor, rec["vectors"])
    return floor


def measure_system(
    models: Models, system: System, settings: Settings, history: History
) -> dict[str, Any]:
    """Every row, the floor and (mid sizes) MD on one system; updates ``history``."""
    start = time.perf_counter()
    ours, skipped = ours_rows(models, system)
    theirs, why = mace_rows(models, system)
    rows, plans, too_big = plan_rows(
        ours + theirs, history, system.n_atoms, settings, verdict_keys(models.default)
    )
    skipped = {**skipped, **why, **too_big}
    print(f"[size] {system.name}: {len(rows)} rows", flush=True)
    time_rows(rows, plans, settings)
    skipped.update({row.key: row.error for row in rows if row.error is not None})
    records = summarise([row for row in rows if row.error is None], models.default)
    for rec in records:
        history[rec["key"]] = (system.n_atoms, rec["ms_median"] / 1e3, rec["added_mib"])
    floor = add_floor(records, models.ours, system.atoms, settings)
    timing = {rec["key"]: rec["ms_median"] for rec in records}
    md = md_rows(models, system, timing, settings) if _md_here(system, settings) else []
    return {
        "system": system.name,
        "kind": system.kind,
        "n_atoms": system.n_atoms,
        "periodic": system.periodic,
        "rows": records,
        "skipped": skipped,
        "floor_ms": floor,
        "md": md,
        "wall_s": time.perf_counter() - start,
    }


def _md_here(system: System, settings: Settings) -> bool:
    """MD on the ~100 and ~1,000 atom systems (quick: the liquid's largest)."""
    if settings.quick:
        return system.kind == "liquid" and system.n_atoms >= 12
    return MD_ATOMS[0] <= system.n_atoms <= MD_ATOMS[1]


def describe(system: System) -> dict[str, Any]:
    return {
        "kind": system.kind,
        "n_atoms": system.n_atoms,
        "formula": system.atoms.get_chemical_formula(),
        "periodic": system.periodic,
        "source": system.source,
    }


def meta(
    models: Models,
    systems: list[System],
    settings: Settings,
    command: str,
    load_start: list[float],
) -> dict[str, Any]:
    """What the page records about the run (before it starts); ``load_start``: the load average
    when the part started, before its own work (building the models) added to it."""
    return {
        "part": PART,
        "command": command,
        "python": sys.executable,
        "quick": settings.quick,
        "threads": list(settings.threads),
        "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "load_avg_start": load_start,
        "load_avg_models_built": load_avg(),
        "probe_untimed": True,  # timed calls run no memory probe (time_rows)
        "versions": versions(),
        "settings": {k: getattr(settings, k) for k in Settings.__dataclass_fields__},
        "modes": models.modes,
        "default_mode": models.default,
        "posterior": {
            "basis": models.ours.posterior_basis,
            "width": models.ours.posterior_width,
            "rank": models.ours.posterior_rank,
            "gradient_method": models.ours.gradient_method,
        },
        "mace_missing": models.mace_missing,
        "memory_probe": instruments.peak_resettable(),
        "weights": "untrained (random init; ours: random full posterior)",
        "systems": {s.name: describe(s) for s in systems},
    }


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(
    settings: Settings, data_root: Path, command: str, save: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """The whole part: every thread count, every system; ``save(entry)`` after each system."""
    wall, load_start = time.perf_counter(), load_avg()
    if load_start[0] >= QUIET_LOAD:
        print(
            f"[size] WARNING: load average {load_start} (>= {QUIET_LOAD:g}): not quiet", flush=True
        )
    models = build_models(settings.quick)
    systems = size_series(
        data_root, quick=settings.quick, kinds=settings.kinds, max_atoms=settings.max_atoms
    )
    entry: dict[str, Any] = {
        "meta": meta(models, systems, settings, command, load_start),
        "groups": [],
    }
    total = len(settings.threads) * len(systems)
    for threads in settings.threads:
        torch.set_num_threads(threads)
        history: dict[str, History] = {kind: {} for kind in settings.kinds}
        for system in systems:
            group = measure_system(models, system, settings, history[system.kind])
            entry["groups"].append(
                {"threads": threads, "torch_threads": torch.get_num_threads(), **group}
            )
            entry["meta"].update(
                status=f"{len(entry['groups'])} of {total} systems", load_avg_last=load_avg()
            )
            print(f"[size] {threads} thread(s) {system.name}: {group['wall_s']:.1f} s", flush=True)
            save(entry)
    entry["meta"].update(
        status="complete",
        finished=time.strftime("%Y-%m-%d %H:%M"),
        load_avg_end=load_avg(),
        wall_s=time.perf_counter() - wall,
    )
    save(entry)
    print(f"[size] done in {entry['meta']['wall_s'] / 60:.1f} min", flush=True)
    return entry
