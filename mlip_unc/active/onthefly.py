"""On-the-fly active learning: the reference is called when the model needs it, not on a schedule.

``mlip-unc active-learn`` with ``mode: on_the_fly`` runs :func:`run_on_the_fly` (what FLARE and
VASP's on-the-fly force fields do, with this package's closed-form uncertainty as the trigger):

1. **Start.** The seed set and the fixed validation set come from oracle MD
   (:func:`~mlip_unc.active.seed.seed_frames`), the per-element energies from the oracle's
   isolated atoms (``isolated_atoms: oracle``); the first model is trained on them.
2. **Explore.** Langevin MD with the current model, in segments of ``segment_fs``; every
   ``md.interval`` steps the frame is checked: an unphysical geometry
   (:class:`~mlip_unc.active.guard.GeometryGuard`) stops the segment and MD restarts from the
   segment's start (the last frame MD left intact and committed) with fresh velocities; otherwise the trigger
   (:class:`~mlip_unc.active.triggers.Trigger`) decides whether the frame needs a label.
3. **Label and update.** After the first flagged frame MD goes on for ``window`` monitored
   frames collecting more; the first flagged frame and the most diverse of the others (up to
   ``labels_per_update``) are labelled, the model is fine-tuned on the grown training set, and
   MD continues from the first flagged frame. A segment that broke with nothing flagged labels
   its last good frame instead (the model failed where nothing warned: a *rescue* label).
4. **Climb.** After ``hold_ps`` without a label at one temperature of ``temperatures`` the
   next one follows. The run ends when MD spends ``final_ps`` at the top temperature without a
   label (``ended: completed``) or when ``max_calls`` oracle calls are spent (``budget``).
   With ``final_refit`` (the default) the final model is then trained from scratch on every
   labelled frame: fine-tuning after each label keeps the forces but lets energies drift.
   With ``ladder: time`` (and always for the ``periodic`` and ``random`` triggers, which
   judge nothing) the ladder keeps time instead: ``hold_ps`` of MD at a rung, labels or not,
   and ``final_ps`` of MD at the top end the run.

Every update and every clean segment is committed to ``out/state.json``; ``resume=True``
continues from the last commit (the MD state is restored, the labels of a replayed update come
from the label cache). ``out/updates.jsonl`` holds one row per update, ``out/report.md`` and
``out/updates.png`` sum the run up.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from ase import Atoms, units
from tqdm.auto import tqdm

from mlip_unc.active.data import build_structure, write_frames
from mlip_unc.active.evaluation import evaluate_structures
from mlip_unc.active.guard import GeometryGuard
from mlip_unc.active.onthefly_report import OnTheFlyResult, write_report
from mlip_unc.active.oracles import check_oracle_elements, label_structures, make_oracle
from mlip_unc.active.selection import distance_histograms, farthest_point_sampling
from mlip_unc.active.state import CachedLabels, RunState, structure_hash
from mlip_unc.active.training import train_members
from mlip_unc.active.triggers import Trigger
from mlip_unc.atomic_write import remove_stale_temps
from mlip_unc.config import ActiveLearningConfig, OnTheFlySettings

__all__ = ["run_on_the_fly", "OnTheFlyResult", "choose_labels"]

log = logging.getLogger(__name__)


@dataclass
class _MD:
    """The exploration state committed between segments."""

    positions: np.ndarray  # (n, 3) A
    momenta: np.ndarray  # (n, 3) amu A / fs-ish ASE units
    t_index: int = 0  # rung of the temperature ladder
    clean_fs: float = 0.0  # MD time since the last label at this rung
    md_fs: float = 0.0  # all MD time
    geometry_stops: int = 0
    kept_fs: float = 0.0  # MD time of the kept trajectory (no window after a flag, no breakage)

    def to_dict(self) -> dict[str, Any]:
        return {
            "positions": self.positions.tolist(),
            "momenta": self.momenta.tolist(),
            "t_index": self.t_index,
            "clean_fs": self.clean_fs,
            "md_fs": self.md_fs,
            "geometry_stops": self.geometry_stops,
            "kept_fs": self.kept_fs,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _MD:
        return cls(
            positions=np.asarray(d["positions"]),
            momenta=np.asarray(d["momenta"]),
            t_index=int(d["t_index"]),
            clean_fs=float(d["clean_fs"]),
            md_fs=float(d["md_fs"]),
            geometry_stops=int(d["geometry_stops"]),
            kept_fs=float(d.get("kept_fs", 0.0)),
        )


@contextmanager
def _quiet_training() -> Iterator[None]:
    """The trainer's per-epoch lines off while a model is updated (the run's bar and its
    per-update summary say what matters; ``updates.jsonl`` keeps the numbers)."""
    names = (
        "mlip_unc.train",
        "mlip_unc.posthoc",
        "mlip_unc.evaluation",
        "mlip_unc.active.training",
        "mlip_unc.data",
    )
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _quiet(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with _quiet_training():
        return fn(*args, **kwargs)


def choose_labels(flagged: list[Atoms], k: int) -> list[Atoms]:
    """The first flagged frame and up to ``k - 1`` of the others, farthest-point sampled in the
    distance-histogram descriptor starting from the first (one excursion is not labelled k
    times)."""
    if len(flagged) <= 1 or k <= 1:
        return flagged[:1]
    features = distance_histograms(flagged)  # (n, n_bins)
    order = farthest_point_sampling(features, min(k, len(flagged)), start=0)
    return [flagged[int(i)] for i in order]


def _temperatures(config: ActiveLearningConfig) -> list[float]:
    return [float(t) for t in (config.temperatures or [config.md.temperature])]


def _segment(
    atoms: Atoms,
    calc: Any,
    config: ActiveLearningConfig,
    md: _MD,
    guard: GeometryGuard,
    trigger: Trigger,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """One MD segment from ``md``'s state at its rung's temperature; returns the flagged frames
    (with their momenta in ``info``), the stop reason, and the last good state."""
    from ase.md.langevin import Langevin

    from mlip_unc.active.monitor import CALCULATOR_FAILURES

    s, otf = config.md, config.on_the_fly
    temperature = _temperatures(config)[md.t_index]
    atoms.positions = md.positions
    atoms.set_momenta(md.momenta)
    atoms.calc = calc
    dyn = Langevin(
        atoms,
        s.timestep * units.fs,
        temperature_K=temperature,
        friction=s.friction / units.fs,
        fixcm=False,
        rng=rng,
    )
    n_checks = max(1, int(round(otf.segment_fs / (s.timestep * s.interval))))
    good = (atoms.positions.copy(), atoms.get_momenta().copy())
    flagged: list[Atoms] = []
    broken: str | None = None
    window_left: int | None = None
    checks = 0
    flag_fs = 0.0  # MD time of the segment up to its first flagged frame
    for _ in range(n_checks):
        try:
            dyn.run(s.interval)
            checks += 1
            broken = guard.check(atoms)
            if broken is None:
                fires, score = trigger.fires(calc, atoms, temperature)
        except CALCULATOR_FAILURES as err:
            checks += 1
            broken = f"the model refused the frame: {err}"
        if broken is not None:
            break
        good = (atoms.positions.copy(), atoms.get_momenta().copy())
        if fires:
            frame = atoms.copy()
            frame.calc = None
            frame.info.update(temperature=temperature, md_fs=md.md_fs)
            if np.isfinite(score):
                frame.info["score"] = score
            frame.info["momenta"] = atoms.get_momenta().copy()
            flagged.append(frame)
            if window_left is None:
                window_left = otf.window
                flag_fs = checks * s.interval * s.timestep
        elif window_left is not None:
            window_left -= 1
        if window_left is not None and (
            window_left <= 0 or len(flagged) >= 4 * otf.labels_per_update
        ):
            break
    return {
        "flagged": flagged,
        "broken": broken,
        "good": good,
        "fs": checks * s.interval * s.timestep,
        "flag_fs": flag_fs,
        "temperature": temperature,
    }


def _climb(md: _MD, otf: OnTheFlySettings, ladder: list[float], temperature: float) -> bool:
    """Move ``md`` one rung up once it has ``hold_ps`` of (clean) MD at its rung; True when it
    has ``final_ps`` at the top (the run is complete)."""
    top = md.t_index == len(ladder) - 1
    if top:
        return md.clean_fs >= 1000 * otf.final_ps
    if md.clean_fs >= 1000 * otf.hold_ps:
        md.t_index, md.clean_fs = md.t_index + 1, 0.0
        log.info("MD held %g ps at %g K: on to %g K", otf.hold_ps, temperature, ladder[md.t_index])
    return False


def _fresh_momenta(
    atoms: Atoms, positions: np.ndarray, temperature: float, rng: np.random.Generator
) -> np.ndarray:
    """(n, 3) Maxwell-Boltzmann momenta at ``temperature``, centre of mass at rest."""
    from ase.md.velocitydistribution import Stationary, thermalize_momenta

    fresh = atoms.copy()
    fresh.positions = positions
    thermalize_momenta(fresh, temperature_K=temperature, rng=rng)
    Stationary(fresh)
    return fresh.get_momenta().copy()


def _label(
    frames: list[Atoms], oracle: Any, cache: CachedLabels, max_force: float | None
) -> tuple[list[Atoms], int]:
    """Labelled frames (oracle failures and frames over ``max_force`` eV/A left out) and the
    number left out."""
    labelled = label_structures(frames, oracle, cache=cache, skip_failed=True)
    if max_force is not None:
        labelled = [a for a in labelled if np.abs(a.get_forces()).max() <= max_force]
    for a in labelled:
        a.info.pop("momenta", None)
    return labelled, len(frames) - len(labelled)


def _training(config: ActiveLearningConfig, out: Path, train: list[Atoms]) -> dict[str, Any]:
    """The training mapping with the isolated-atom energies of ``config.isolated_atoms`` as
    the fixed energy offsets (``reference_energies: isolated``, never refit)."""
    training = json.loads(json.dumps(config.training))
    spec = config.isolated_atoms
    if spec is None:
        return training
    path = out / "data" / "isolated_atoms.xyz"
    if spec == "oracle":
        if not path.is_file():
            from mlip_unc.active.seed import isolated_atoms

            elements = sorted({int(z) for a in train for z in a.numbers})
            write_frames(path, isolated_atoms(config.oracle, elements))
    else:
        path = Path(spec)
    training.setdefault("data", {})["isolated_atoms"] = str(path)
    model = training.setdefault("model", {})
    model.setdefault("reference_energies", "isolated")
    model["refit_offsets"] = False  # the free atoms fix them: no refit on a changing set
    return training


def _train(
    config: ActiveLearningConfig,
    training: dict[str, Any],
    data: tuple[list[Atoms], list[Atoms]],
    folder: Path,
    *,
    init_from: list[Path] | None,
    update: int,
    resume: bool,
) -> list[Path]:
    """The models of update ``update`` (trained on ``data``: training, validation frames) in
    ``folder``: fine-tuned from ``init_from`` (``retrain_epochs`` at ``retrain_lr``) or, with
    None, trained from scratch with the training config's own schedule."""
    tune = init_from is not None
    return list(
        _quiet(
            train_members,
            data[0],
            data[1],
            training,
            folder,
            members=config.committee,
            init_from=init_from,
            epochs=config.retrain_epochs if tune else None,
            seed=config.seed + update,
            resume=resume,
            lr=config.retrain_lr if tune else None,
        )
    )


def _seed_data(
    config: ActiveLearningConfig, oracle: Any, start: Atoms, out: Path, cache: CachedLabels
) -> tuple[list[Atoms], list[Atoms]]:
    """The seed and validation sets, made once (``out/data``) and read back afterwards."""
    from mlip_unc.active.seed import seed_frames
    from mlip_unc.data.readers import read_structures

    files = out / "data" / "train.xyz", out / "data" / "valid.xyz"
    if all(f.is_file() for f in files):
        return read_structures(files[0]), read_structures(files[1])
    if config.seed_set is None:
        if not (config.train_data and config.valid_data):
            raise ValueError(
                "mode on_the_fly: give seed_set, or train_data and valid_data (the fixed "
                "validation set)"
            )
        train, valid = read_structures(config.train_data), read_structures(config.valid_data)
    else:
        train, valid = seed_frames(start, cache.calculator(oracle), config.seed_set)
    for f, frames in zip(files, (train, valid), strict=True):
        write_frames(f, frames)
    return train, valid


def run_on_the_fly(
    config: ActiveLearningConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    on_update: Callable[[dict[str, Any]], None] | None = None,
) -> OnTheFlyResult:
    """Run on-the-fly active learning (see the module docstring).

    Row ``u`` (the model after ``u`` updates): ``calls`` (oracle labels its training set cost,
    seed and validation sets and dropped labels included), ``md_ps``, ``temperature``,
    ``n_train``, ``valid_force_mae`` (eV/A) and ``valid_energy_mae`` (eV) on the fixed
    validation set, ``level`` and ``threshold`` of the trigger score, ``n_flagged``,
    ``n_labelled``, ``n_dropped``, ``rescue`` (a label after an unflagged geometry stop),
    ``geometry_stops`` and ``monitored`` frames so far (``kept_frames``: those on the trajectory
    MD kept, without the windows after flags and the segments that broke), ``control_calls`` (``true_error``'s oracle calls, not labels),
    ``cpu_md_s``, ``cpu_oracle_s``, ``cpu_train_s``, ``model``; the seed set's oracle CPU is
    ``cpu_seed_s`` in ``out/state.json``. ``on_update(row)`` is called for each.

    Raises:
        FileExistsError: ``out`` holds a run and neither ``resume`` nor ``overwrite``.
    """
    from mlip_unc.active.loop import _calculator

    starts = build_structure(config.structures) if config.structures is not None else []
    check_oracle_elements(config.oracle, starts)  # before any folder or work
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    state = RunState.start(out, config.to_dict(), resume=resume, overwrite=overwrite)
    remove_stale_temps(out, recursive=True)
    cache = CachedLabels(out / "labels")
    oracle = make_oracle(config.oracle)
    start = starts[0] if starts else None
    cpu = time.process_time()
    train, valid = _seed_data(config, oracle, start if start is not None else Atoms(), out, cache)
    state.data.setdefault("cpu_seed_s", time.process_time() - cpu)
    start = start if start is not None else train[0].copy()
    guard = GeometryGuard.from_structure(start, config.guard)
    training = _training(config, out, train)
    otf = config.on_the_fly
    ladder = _temperatures(config)
    rng = np.random.default_rng(config.seed)
    control = {"calls": 0}

    def reference(atoms: Atoms) -> np.ndarray:
        before = cache.calls
        forces = label_structures([atoms], oracle, cache=cache)[0].get_forces()
        control["calls"] += cache.calls - before
        return np.asarray(forces)

    trigger = Trigger(otf, np.random.default_rng([config.seed, 7]), reference)
    data = state.data
    rows: list[dict[str, Any]] = data.setdefault("updates", [])
    calls = len(train) + len(valid)
    if rows:  # resume: the last committed update
        last = rows[-1]
        models = [Path(m) for m in last["models"]]
        from mlip_unc.data.readers import read_structures

        train = read_structures(models[0].parent / "train.xyz")
        calls = int(last["calls"])
        control["calls"] = int(last.get("control_calls", 0))
        md = _MD.from_dict(data["md"])
        rng.bit_generator.state = data["rng"]
        trigger.rng.bit_generator.state = data["trigger_rng"]
        trigger.seen = int(data["trigger_seen"])
    else:
        cpu = time.process_time()
        models = (
            [Path(config.model)]
            if config.model
            else _quiet(
                train_members,
                train,
                valid,
                training,
                out / "update_0",
                members=config.committee,
                seed=config.seed,
            )
        )
        from ase.md.velocitydistribution import Stationary, thermalize_momenta

        atoms0 = start.copy()
        thermalize_momenta(atoms0, temperature_K=ladder[0], rng=rng)
        Stationary(atoms0)
        md = _MD(positions=atoms0.positions.copy(), momenta=atoms0.get_momenta().copy())
        row0 = {"update": 0, "calls": calls, "cpu_train_s": time.process_time() - cpu}
    calc = _calculator(config, models, valid, None)
    trigger.level_for(calc, valid)

    def commit(row: dict[str, Any] | None) -> None:
        if row is not None:
            metrics = evaluate_structures(calc, valid)
            row.update(
                calls=calls,
                md_ps=md.md_fs / 1000,
                temperature=ladder[md.t_index],
                n_train=len(train),
                valid_force_mae=metrics["force_mae"],
                valid_energy_mae=metrics["energy_mae"],
                level=trigger.level_at(ladder[md.t_index]),
                threshold=trigger.threshold_at(ladder[md.t_index]),
                geometry_stops=md.geometry_stops,
                monitored=trigger.seen,
                kept_frames=int(round(md.kept_fs / (config.md.interval * config.md.timestep))),
                control_calls=control["calls"],
                model=str(models[0]),
                models=[str(m) for m in models],
            )
            rows.append(row)
            with (out / "updates.jsonl").open("a") as fh:
                fh.write(json.dumps({k: v for k, v in row.items() if k != "models"}) + "\n")
            if on_update is not None:
                on_update(row)
            log.info(
                "update %d: %d oracle calls, %.2f ps of MD at %g K, validation force MAE "
                "%.1f meV/A, energy MAE %.1f meV",
                row["update"],
                calls,
                md.md_fs / 1000,
                ladder[md.t_index],
                1000 * row["valid_force_mae"],
                1000 * row["valid_energy_mae"],
            )
            bar.set_postfix_str(
                f"MD {md.md_fs / 1000:.2f} ps at {ladder[md.t_index]:g} K, "
                f"valid force MAE {row['valid_force_mae']:.3f} eV/A"
            )
        data.update(
            md=md.to_dict(),
            rng=rng.bit_generator.state,
            trigger_rng=trigger.rng.bit_generator.state,
            trigger_seen=trigger.seen,
        )
        state.commit()

    bar = tqdm(
        total=otf.max_calls, initial=calls, unit="call", desc="oracle calls", disable=not progress
    )
    if not rows:
        commit(row0)
    ended = str(data.get("ended", "budget"))
    atoms = start.copy()
    cpu_md = 0.0
    while "ended" not in data and calls < otf.max_calls:
        cpu = time.process_time()
        seg = _segment(atoms, calc, config, md, guard, trigger, rng)
        cpu_md += time.process_time() - cpu
        if md.md_fs == 0 and seg["broken"] is not None:
            log.warning(
                "the seed model's MD at %g K broke within its first segment (%.0f fs): %s; the "
                "seed set is probably too small or too narrow for this temperature",
                seg["temperature"],
                seg["fs"],
                seg["broken"],
            )
            data["first_segment_broke"] = seg["broken"]
        md.md_fs += seg["fs"]
        if not seg["flagged"] and seg["broken"] is None:  # a clean segment
            md.positions, md.momenta = seg["good"]
            md.clean_fs += seg["fs"]
            md.kept_fs += seg["fs"]
            if _climb(md, otf, ladder, seg["temperature"]):
                ended = "completed"
                commit(None)
                break
            commit(None)
            continue
        rescue = False
        if seg["broken"] is not None:
            md.geometry_stops += 1
            log.info(
                "MD stopped at %g K: %s; back to the segment's start with fresh velocities",
                seg["temperature"],
                seg["broken"],
            )
        if seg["flagged"]:
            chosen = choose_labels(seg["flagged"], otf.labels_per_update)
            first = seg["flagged"][0]
            restart = (first.positions.copy(), np.asarray(first.info["momenta"]))
        else:  # broken with nothing flagged: the model failed where nothing warned
            rescue = True
            frame = atoms.copy()
            frame.positions, frame.calc = seg["good"][0], None
            known = {structure_hash(a) for a in train}
            chosen = [] if structure_hash(frame) in known else [frame]
            restart = (md.positions, md.momenta)
        if seg["broken"] is not None:
            # the segment's start (a frame MD left intact), not the frame before the breakage:
            # from there, with any velocities, the same breakage follows within femtoseconds
            restart = (md.positions, md.momenta)
        chosen = chosen[: otf.max_calls - calls]
        if not chosen:  # a breakage at a frame labelled before: start the segment again
            md.positions, md.momenta = restart
            md.momenta = _fresh_momenta(atoms, restart[0], seg["temperature"], rng)
            commit(None)
            continue
        cpu = time.process_time()
        labelled, dropped = _label(chosen, oracle, cache, config.selection.max_label_force)
        cpu_oracle = time.process_time() - cpu
        calls += len(chosen)
        bar.update(len(chosen))
        md.positions, md.momenta = restart
        if seg["broken"] is not None:  # fresh velocities after a breakage
            md.momenta = _fresh_momenta(atoms, restart[0], seg["temperature"], rng)
        if seg["broken"] is None:  # MD goes on from the first flagged frame
            md.kept_fs += seg["flag_fs"]
        keeps_time = trigger.score is None or otf.ladder == "time"  # no judge, or a schedule
        if keeps_time and seg["broken"] is None:
            md.clean_fs += seg["flag_fs"]
            ended = "completed" if _climb(md, otf, ladder, seg["temperature"]) else ended
        else:
            md.clean_fs = 0.0
        row: dict[str, Any] = {
            "update": len(rows),
            "n_flagged": len(seg["flagged"]),
            "n_labelled": len(labelled),
            "n_dropped": dropped,
            "rescue": rescue,
            "cpu_md_s": cpu_md,
            "cpu_oracle_s": cpu_oracle,
        }
        cpu_md = 0.0
        if labelled:
            train = train + labelled
            u = len(rows)
            scratch = otf.refresh_every > 0 and u % otf.refresh_every == 0
            cpu = time.process_time()
            models = _train(
                config,
                training,
                (train, valid),
                out / f"update_{u}",
                init_from=None if scratch else models,
                update=u,
                resume=resume,
            )
            row["cpu_train_s"] = time.process_time() - cpu
            calc = _calculator(config, models, valid, None)
            trigger.level_for(calc, valid)
        commit(row)
        if ended == "completed":
            break
    bar.close()
    if ended == "budget" and "ended" not in data:
        log.info("oracle-call budget of %d spent", otf.max_calls)
    data["ended"] = ended
    state.commit()
    if otf.final_refit and len(rows) > 1 and not rows[-1].get("refit"):
        log.info("refit: the final model from scratch on all %d training frames", len(train))
        cpu = time.process_time()
        models = _train(
            config, training, (train, valid), out / "refit", init_from=None, update=0, resume=resume
        )
        calc = _calculator(config, models, valid, None)
        trigger.level_for(calc, valid)
        refit = {"update": len(rows), "refit": True, "n_labelled": 0, "cpu_md_s": cpu_md}
        commit({**refit, "cpu_oracle_s": 0.0, "cpu_train_s": time.process_time() - cpu})
    result = OnTheFlyResult(rows=rows, model=Path(rows[-1]["model"]), ended=ended, calls=calls)
    write_report(result, out, config)
    return result
