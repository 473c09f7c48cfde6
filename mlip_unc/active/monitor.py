"""Watch uncertainty during ASE molecular dynamics: CSV log, flagged frames, optional stop.

::

    calc = UncertaintyCalculator("model.pt", thresholds={"max_force_std": 0.1})
    atoms.calc = calc
    dyn = VelocityVerlet(atoms, 0.5 * units.fs)
    monitor = UncertaintyMonitor(atoms, "md.csv", flagged_path="flagged.xyz", dyn=dyn, max_flags=20)
    dyn.attach(monitor, interval=10)
    try:
        dyn.run(10_000)
    except UncertaintyLimitReached as stop:
        print(stop)          # the run ended early after 20 flagged frames
    monitor.close()

Stopping: when ``max_flags`` flagged frames have been seen, the monitor sets
``monitor.stop_requested = True`` and, with ``on_limit="raise"`` (the default), raises
:class:`UncertaintyLimitReached`, which propagates out of ``dyn.run`` (ASE observers run
inside the integration loop). With ``on_limit="flag"`` it only sets the attribute; a driver
that runs MD in chunks checks it between chunks.

The monitor reads the uncertainties at the current positions from the calculator. With an
:class:`~mlip_unc.calculator.UncertaintyCalculator` (force uncertainties on demand) the MD
steps run plain energy + forces, and a monitored step adds only the uncertainty's backward
passes on the forward pass already made: monitoring every ``interval`` steps pays for sigma
on those steps only, and adds no model call.
A frame is flagged by the calculator's ``flag`` property: its :class:`Thresholds` on sigma
(CSV column ``uncertainty_flag``) or its domain guard (column ``out_of_domain``), recorded
separately; flagged frames carry ``info["flag_reason"]`` (``uncertainty``, ``out_of_domain`` or
``uncertainty+out_of_domain``) and ``info["out_of_domain_reason"]``. All CSV columns are numbers.

Failures: when the calculator refuses a frame (:class:`~mlip_unc.calculator.NonFiniteResultError`,
:class:`~mlip_unc.data.domain.CoincidentAtomsError`), the monitor logs the error, records the
frame as failed (a CSV row of NaN with ``failed = 1``; the message in ``monitor.failure``) and
stops the run with :class:`MDFailed`; :func:`run_md` catches it (and the same errors raised by
the integrator's own force call) and returns normally with ``MDResult.failure`` set.
"""

from __future__ import annotations

import csv
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
from ase import Atoms, units
from ase.io import read, write
from tqdm.auto import tqdm

from mlip_unc import keys
from mlip_unc.calculator import NonFiniteResultError
from mlip_unc.config import MDSettings
from mlip_unc.data.domain import CoincidentAtomsError
from mlip_unc.data.provenance import predicted_frame

__all__ = [
    "UncertaintyMonitor",
    "UncertaintyLimitReached",
    "MDFailed",
    "CALCULATOR_FAILURES",
    "CSV_COLUMNS",
    "frame_uncertainties",
    "flag_reason",
    "MDResult",
    "run_md",
]

#: Columns of the CSV log (all numbers): energies eV, time ps, temperature K, stds eV, eV/atom,
#: eV/A; max/mean_force_std and energy_std_per_atom epistemic; flags 0/1.
CSV_COLUMNS = (
    "step",
    "time_ps",
    "epot",
    "ekin",
    "etot",
    "temperature",
    "energy_std",
    keys.CALC_ENERGY_STD_PER_ATOM,
    keys.CALC_MAX_FORCE_STD,
    "mean_force_std",
    "alignment",
    "flag",
    "uncertainty_flag",
    "out_of_domain",
    "failed",
)
#: the calculator's refusals of a frame that end a run as failed (not as a crash)
CALCULATOR_FAILURES: tuple[type[Exception], ...] = (NonFiniteResultError, CoincidentAtomsError)

log = logging.getLogger(__name__)


class UncertaintyLimitReached(RuntimeError):
    """Raised by :class:`UncertaintyMonitor` after ``max_flags`` flagged frames."""

    def __init__(self, n_flags: int, step: int) -> None:
        super().__init__(f"stopped after {n_flags} flagged frames (MD step {step})")
        self.n_flags = n_flags
        self.step = step


class MDFailed(RuntimeError):
    """Raised by :class:`UncertaintyMonitor` when the calculator refused a frame (NaN, overlap)."""

    def __init__(self, step: int, error: BaseException) -> None:
        super().__init__(f"MD stopped at step {step}: {error}")
        self.step = step
        self.error = error


def flag_reason(unc: dict[str, Any]) -> str:
    """Why a frame is flagged: ``"uncertainty"`` (a sigma threshold), ``"out_of_domain"`` (the
    domain guard), ``"uncertainty+out_of_domain"``, or ``""`` (not flagged)."""
    if not unc.get("flag"):
        return ""
    parts = [
        name
        for name, key in (("uncertainty", "uncertainty_flag"), ("out_of_domain", "out_of_domain"))
        if unc.get(key)
    ]
    return "+".join(parts) or "uncertainty"


def frame_uncertainties(atoms: Atoms) -> dict[str, Any]:
    """Uncertainty results of ``atoms.calc`` at the current positions (computed if needed).

    Returns a dict with scalar ``energy_std`` (total), ``energy_std_per_atom`` (epistemic),
    ``max_force_std`` and ``mean_force_std`` (epistemic, eV/A), ``alignment``, ``flag``,
    ``uncertainty_flag`` (sigma thresholds), ``out_of_domain`` and ``out_of_domain_reason``
    (NaN/False/"" when the calculator lacks them) and the arrays ``forces_std`` (n, 3, total)
    and ``energies_std`` (n,) when available.

    Raises:
        NonFiniteResultError, CoincidentAtomsError: the calculator refused the frame.
    """
    calc = atoms.calc
    available = set(getattr(calc, "implemented_properties", ()))
    # Most demanding first: with an UncertaintyCalculator the first request computes all the
    # rest in the same model call; the others then come from its cache.
    for name in (keys.CALC_MAX_FORCE_STD, "forces", "energy", "energy_std", "flag"):
        if name in available:
            calc.get_property(name, atoms)
    res = calc.results
    n = len(atoms)
    out: dict[str, Any] = {
        "energy_std": float(res.get("energy_std", math.nan)),
        keys.CALC_MAX_FORCE_STD: float(res.get(keys.CALC_MAX_FORCE_STD, math.nan)),
        "alignment": float(res.get("alignment", math.nan)),
        "flag": bool(res.get("flag", False)),
        "out_of_domain": bool(res.get("out_of_domain", False)),
        "out_of_domain_reason": str(res.get("out_of_domain_reason", "")),
    }
    # a calculator without the split: its flag is the sigma part unless the domain guard fired
    out["uncertainty_flag"] = bool(
        res.get("uncertainty_flag", out["flag"] and not out["out_of_domain"])
    )
    epi = res.get("energy_epistemic_var")
    out[keys.CALC_ENERGY_STD_PER_ATOM] = (
        math.sqrt(max(float(epi), 0.0)) / n if epi is not None else math.nan
    )
    out["mean_force_std"] = math.nan
    if "forces_std" in res:
        out["forces_std"] = np.asarray(res["forces_std"])
        # epistemic like max_force_std (older calculators: forces_std)
        fvar = np.asarray(res.get("forces_epistemic_var", out["forces_std"] ** 2))  # (n, 3)
        out["mean_force_std"] = float(np.sqrt(fvar.sum(axis=1)).mean())
    if "energies_std" in res:
        out["energies_std"] = np.asarray(res["energies_std"])
    return out


class UncertaintyMonitor:
    """An ASE dynamics observer logging energies, temperature and uncertainties.

    Args:
        atoms: the atoms being integrated (with an uncertainty-aware calculator).
        csv_path: CSV log, one row per call (columns :data:`CSV_COLUMNS`; energies in eV,
            time in ps, temperature in K, stds in eV, eV/atom and eV/A).
        flagged_path: extended XYZ file receiving flagged frames (appended), with
            ``info``: step, time_ps, energy_std, energy_std_per_atom, max_force_std, alignment,
            ``flag_reason``, ``out_of_domain`` (bool), ``out_of_domain_reason``, ``mlip_energy``;
            ``arrays``: ``forces_std``, ``energies_std``, ``mlip_forces``.
            Model predictions are stored under ``mlip_*`` names, never as labels.
        dyn: the dynamics object (for the step count and time); without it the monitor counts
            its own calls and ``timestep`` (fs) x ``interval`` gives the time.
        max_flags: stop after this many flagged frames (``None``: never).
        on_limit: ``"raise"`` (raise :class:`UncertaintyLimitReached`) or ``"flag"`` (only set
            ``stop_requested``).
        interval, timestep: used for step/time only when ``dyn`` is ``None``.
    """

    def __init__(
        self,
        atoms: Atoms,
        csv_path: str | Path,
        *,
        flagged_path: str | Path | None = None,
        dyn: Any = None,
        max_flags: int | None = None,
        on_limit: str = "raise",
        interval: int = 1,
        timestep: float | None = None,
    ) -> None:
        if on_limit not in ("raise", "flag"):
            raise ValueError(f"on_limit must be 'raise' or 'flag', got {on_limit!r}")
        if max_flags is not None and max_flags < 1:
            raise ValueError(f"max_flags must be >= 1 or None, got {max_flags}")
        self.atoms = atoms
        self.dyn = dyn
        self.csv_path = Path(csv_path)
        self.flagged_path = None if flagged_path is None else Path(flagged_path)
        self.max_flags = max_flags
        self.on_limit = on_limit
        self.interval = int(interval)
        self.timestep = timestep
        self.n_calls = 0
        self.n_flags = 0
        self.stop_requested = False
        self.failure: str | None = None  # the calculator's error message when a frame failed
        self.rows: list[dict[str, Any]] = []
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: IO[str] | None = self.csv_path.open("w", newline="")
        self._writer = csv.DictWriter(self._handle, fieldnames=CSV_COLUMNS)
        self._writer.writeheader()
        if self.flagged_path is not None:
            self.flagged_path.parent.mkdir(parents=True, exist_ok=True)
            self.flagged_path.write_text("")

    # ------------------------------------------------------------------ observer
    def _step_and_time(self) -> tuple[int, float]:
        if self.dyn is not None:
            step = int(getattr(self.dyn, "nsteps", self.n_calls))
            time_fs = (
                float(self.dyn.get_time()) / units.fs if hasattr(self.dyn, "get_time") else math.nan
            )
        else:
            step = self.n_calls * self.interval
            time_fs = step * self.timestep if self.timestep is not None else math.nan
        return step, time_fs / 1000.0

    def __call__(self) -> None:
        atoms = self.atoms
        step, time_ps = self._step_and_time()
        try:
            unc = frame_uncertainties(atoms)
            epot = float(atoms.get_potential_energy())
        except CALCULATOR_FAILURES as err:
            self.record_failure(err, step=step)
            raise MDFailed(step, err) from err
        ekin = float(atoms.get_kinetic_energy())
        row = {
            "step": step,
            "time_ps": time_ps,
            "epot": epot,
            "ekin": ekin,
            "etot": epot + ekin,
            "temperature": float(atoms.get_temperature()) if len(atoms) else 0.0,
            "energy_std": unc["energy_std"],
            keys.CALC_ENERGY_STD_PER_ATOM: unc[keys.CALC_ENERGY_STD_PER_ATOM],
            keys.CALC_MAX_FORCE_STD: unc[keys.CALC_MAX_FORCE_STD],
            "mean_force_std": unc["mean_force_std"],
            "alignment": unc["alignment"],
            "flag": int(unc["flag"]),
            "uncertainty_flag": int(unc["uncertainty_flag"]),
            "out_of_domain": int(unc["out_of_domain"]),
            "failed": 0,
        }
        self._append(row)
        if unc["flag"]:
            self.n_flags += 1
            if self.flagged_path is not None:
                self._write_flagged(row, unc)
            if self.max_flags is not None and self.n_flags >= self.max_flags:
                self.stop_requested = True
                if self.on_limit == "raise":
                    raise UncertaintyLimitReached(self.n_flags, step)

    def _append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self._handle is not None:
            self._writer.writerow(row)
            self._handle.flush()
        self.n_calls += 1

    def record_failure(self, error: BaseException, *, step: int | None = None) -> None:
        """Log ``error``, append a failed row (NaN values, ``failed = 1``), keep the message in
        :attr:`failure` and request a stop. ``step`` defaults to the current step."""
        now, time_ps = self._step_and_time()
        if step is not None and step != now and self.dyn is not None and hasattr(self.dyn, "dt"):
            time_ps = step * float(self.dyn.dt) / units.fs / 1000.0
        step = now if step is None else step
        log.warning("MD frame failed at step %d, stopping: %s", step, error)
        row: dict[str, Any] = {k: math.nan for k in CSV_COLUMNS}
        row.update(
            step=step, time_ps=time_ps, flag=0, uncertainty_flag=0, out_of_domain=0, failed=1
        )
        self._append(row)
        self.failure = str(error)
        self.stop_requested = True

    def _write_flagged(self, row: dict[str, Any], unc: dict[str, Any]) -> None:
        if self.flagged_path is None:  # called only with a flagged file
            return
        calc = self.atoms.calc
        frame = self.atoms.copy()  # copy() drops the calculator: no model values pass as labels
        columns = (
            "step",
            "time_ps",
            "energy_std",
            keys.CALC_ENERGY_STD_PER_ATOM,
            keys.CALC_MAX_FORCE_STD,
            "alignment",
        )
        frame.info.update({k: row[k] for k in columns})
        frame.info["mlip_energy"] = row["epot"]
        frame.info["flag_reason"] = flag_reason(unc)
        frame.info["out_of_domain"] = bool(unc["out_of_domain"])
        if unc["out_of_domain"]:
            frame.info["out_of_domain_reason"] = unc["out_of_domain_reason"]
        if "forces" in calc.results:
            frame.arrays["mlip_forces"] = np.asarray(calc.results["forces"], dtype=np.float64)
        for key in ("forces_std", "energies_std"):
            if key in unc:
                frame.arrays[key] = np.asarray(unc[key], dtype=np.float64)
        write(self.flagged_path, frame, format="extxyz", append=True)

    # ------------------------------------------------------------------ helpers
    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> UncertaintyMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def column(self, name: str) -> np.ndarray:
        """One logged column as an array (from memory, no file read)."""
        return np.asarray([r[name] for r in self.rows], dtype=np.float64)


# ====================================================================== MD driver
@dataclass
class MDResult:
    """What :func:`run_md` produced: paths, the in-memory log and the flagged frames."""

    out_dir: Path
    log: dict[str, np.ndarray]
    flagged: list[Atoms]
    steps_done: int
    stopped_early: bool
    trajectory: Path
    csv: Path
    flagged_path: Path
    plot: Path | None = None
    final: Atoms | None = field(default=None, repr=False)
    failure: str | None = None  # the calculator's error when a frame failed (then in failed.xyz)


def run_md(
    atoms: Atoms,
    calc: Any,
    settings: MDSettings,
    out_dir: str | Path,
    *,
    plot: bool = True,
    reference_level: float | None = None,
    title: str = "",
    progress: bool = False,
) -> MDResult:
    """Run MD on a copy of ``atoms`` with ``calc`` and an :class:`UncertaintyMonitor`.

    Writes ``md.traj`` (every ``interval`` steps; the model's results marked as predictions,
    :func:`~mlip_unc.data.provenance.predicted_frame`), ``md.csv``, ``flagged.xyz`` and, with
    ``plot``, ``md.png`` (uncertainty and energy against time) into ``out_dir``.
    A run stopped by ``settings.max_flags`` ends normally with ``stopped_early=True``; a run
    whose frame the calculator refused (:data:`CALCULATOR_FAILURES`: NaN results, coincident
    atoms) ends normally too, with ``failure`` set, a failed row in ``md.csv`` and the frame in
    ``failed.xyz``. ``progress``: a tqdm bar of the MD steps (the caller decides: terminal, ``-q``).
    A run that raises before its first frame is logged (an element the model never saw) leaves
    none of these files (nor ``out_dir`` when this call made it): no empty ``md.traj`` looks
    like a run.
    """
    from ase.io.trajectory import Trajectory
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import Stationary, thermalize_momenta
    from ase.md.verlet import VelocityVerlet

    out_dir = Path(out_dir)
    made_dir = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    atoms = atoms.copy()
    atoms.calc = calc
    rng = np.random.default_rng(settings.seed)
    thermalize_momenta(atoms, temperature_K=settings.temperature, rng=rng)
    Stationary(atoms)
    dt = settings.timestep * units.fs
    dyn: VelocityVerlet | Langevin
    if settings.ensemble == "nve":
        dyn = VelocityVerlet(atoms, dt)
    else:
        dyn = Langevin(
            atoms,
            dt,
            temperature_K=settings.temperature,
            friction=settings.friction / units.fs,
            fixcm=False,
            rng=rng,
        )
    paths = {
        "trajectory": out_dir / "md.traj",
        "csv": out_dir / "md.csv",
        "flagged_path": out_dir / "flagged.xyz",
    }
    stopped, failure = False, None
    bar = tqdm(
        total=settings.steps, desc=title or "md", unit="step", disable=not progress, leave=False
    )
    monitor: UncertaintyMonitor | None = None
    try:
        with (
            Trajectory(paths["trajectory"], "w", atoms) as traj,
            UncertaintyMonitor(
                atoms,
                paths["csv"],
                flagged_path=paths["flagged_path"],
                dyn=dyn,
                max_flags=settings.max_flags,
            ) as monitor,
            bar,
        ):
            dyn.attach(monitor, interval=settings.interval)  # first: computes the uncertainties
            dyn.attach(lambda: traj.write(predicted_frame(atoms)), interval=settings.interval)
            dyn.attach(lambda: bar.update(int(dyn.nsteps) - bar.n), interval=settings.interval)
            try:
                dyn.run(settings.steps)
            except UncertaintyLimitReached:
                stopped = True
            except MDFailed as err:  # the monitor's own calculator call failed (row recorded)
                failure = str(err.error)
            except CALCULATOR_FAILURES as err:  # the integrator's force call failed
                monitor.record_failure(err, step=int(dyn.nsteps) + (1 if monitor.n_calls else 0))
                failure = str(err)
            md_log = {k: monitor.column(k) for k in CSV_COLUMNS}
    except BaseException:
        if monitor is None or not monitor.rows:  # raised before the first logged frame
            for path in paths.values():
                path.unlink(missing_ok=True)
            if made_dir and not any(out_dir.iterdir()):
                out_dir.rmdir()
        raise
    if failure is not None:
        failed = atoms.copy()  # no calculator: nothing passes as a label
        failed.info.update(step=int(monitor.rows[-1]["step"]), error=failure)
        write(out_dir / "failed.xyz", failed, format="extxyz")
    flagged = (
        cast(list[Atoms], read(paths["flagged_path"], ":", format="extxyz"))  # ":": a list
        if monitor.n_flags
        else []
    )
    result = MDResult(
        out_dir=out_dir,
        log=md_log,
        flagged=flagged,
        steps_done=int(dyn.nsteps),
        stopped_early=stopped,
        final=atoms,
        failure=failure,
        **paths,
    )
    if plot and len(monitor.rows) > 1:
        from mlip_unc.active.report import plot_md_log

        threshold = getattr(getattr(calc, "thresholds", None), keys.CALC_MAX_FORCE_STD, None)
        result.plot = plot_md_log(
            md_log, out_dir / "md.png", threshold=threshold, reference=reference_level, title=title
        )
    return result
