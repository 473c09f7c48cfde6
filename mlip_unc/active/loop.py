"""Active learning: MD -> flag -> label with an oracle -> add to the training set -> retrain.

``mlip-unc active-learn --config AL.yaml`` runs :func:`run_active_learning` on an
:class:`~mlip_unc.config.ActiveLearningConfig` (``mlip_unc.config.active`` documents the
YAML; see ``configs/al_emt.yaml``).

Round k: the current model drives MD from each starting structure under an
:class:`~mlip_unc.active.monitor.UncertaintyMonitor`; frames over the thresholds are
flagged; the most uncertain ``top_k`` (optionally diversified, :func:`select_flagged`) are
labelled by the oracle (:func:`label_selected`); 80 % go to the training set, 20 % to the
validation set; the model is retrained (:func:`~mlip_unc.active.training.train_model`). The
report (``out/report.md``, ``out/rounds.png``) lists per round the data size, the held-out
errors, the uncertainty levels and the flagged count; one log line per round sums it up.
With ``progress`` a tqdm bar counts the rounds, with inner bars for the MD steps and the oracle
calls of each round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from ase import Atoms
from tqdm.auto import tqdm

from mlip_unc import keys
from mlip_unc.active.biased_md import biased_calculator
from mlip_unc.active.candidates import audit_flags, candidate_scores, visited_frames
from mlip_unc.active.data import build_structure, initial_data, split_labelled, write_frames
from mlip_unc.active.evaluation import evaluate_structures
from mlip_unc.active.monitor import run_md
from mlip_unc.active.oracles import check_oracle_elements, label_structures, make_oracle
from mlip_unc.active.selection import distance_histograms, select
from mlip_unc.active.state import CachedLabels, RunState
from mlip_unc.active.training import committee_model, train_members
from mlip_unc.atomic_write import remove_stale_temps
from mlip_unc.config import ActiveLearningConfig, SelectionSettings

__all__ = ["select_flagged", "label_selected", "run_active_learning", "round_summary"]

log = logging.getLogger(__name__)


def select_flagged(
    flagged: list[Atoms],
    selection: SelectionSettings,
    *,
    calc: Any = None,
    rng: np.random.Generator | None = None,
    scores: np.ndarray | None = None,
) -> list[Atoms]:
    """The ``top_k`` candidate frames by ``selection.metric``, FPS-diversified when
    ``selection.diverse``: scores from the frames' info (the monitor's) where present, else
    computed with ``calc`` (:func:`~mlip_unc.active.candidates.candidate_scores`; ``rng`` for
    ``random``). ``scores`` (n,): given, they replace ``selection.metric``."""
    if not flagged:
        return []
    if scores is None:
        if calc is None and not all(selection.metric in a.info for a in flagged):
            raise ValueError(f"selection.metric {selection.metric}: the frames need a calculator")
        scores = candidate_scores(
            calc, flagged, selection.metric, rng if rng is not None else np.random.default_rng(0)
        )  # (n,)
    elif len(scores) != len(flagged):
        raise ValueError(f"{len(scores)} scores for {len(flagged)} candidate frames")
    scores = np.nan_to_num(scores, nan=-np.inf)
    features = distance_histograms(flagged) if selection.diverse else None  # (n, n_bins)
    chosen = select(
        scores, top_k=selection.top_k, features=features, pool_factor=selection.pool_factor
    )
    return [flagged[k] for k in chosen]


def label_selected(
    chosen: list[Atoms],
    oracle: Any,
    selection: SelectionSettings,
    *,
    cache: CachedLabels | None = None,
    progress: bool = False,
) -> tuple[list[Atoms], int]:
    """Label ``chosen`` with ``oracle`` (through ``cache`` when given); returns (kept frames,
    number dropped: the oracle failed on them, or their forces exceed ``max_label_force``).
    ``progress``: a bar of the oracle calls."""
    bar = tqdm(chosen, desc="oracle", unit="structure", disable=not progress, leave=False)
    labelled = label_structures(bar, oracle, cache=cache, skip_failed=True)
    if selection.max_label_force is None:
        return labelled, len(chosen) - len(labelled)
    kept = [a for a in labelled if np.abs(a.get_forces()).max() <= selection.max_label_force]
    return kept, len(chosen) - len(kept)


def no_labels_reason(row: dict[str, Any]) -> str:
    """Why a round labelled nothing (``row``: its ``n_dropped``): every chosen frame dropped,
    or none chosen."""
    if row.get("n_dropped"):
        return (
            f"all {row['n_dropped']} chosen frames dropped (the oracle failed on them, or their "
            "reference forces exceed selection.max_label_force)"
        )
    return "nothing to label (no frame over the thresholds)"


_TEST_KEYS = (
    "force_rmse",
    "force_mae",
    "energy_mae",
    "energy_mae_per_atom",
    "mean_max_force_std",
    "mean_energy_std_per_atom",
)


def _model_row(
    calc: Any,
    r: int,
    model: Path,
    train: list,
    valid: list,
    test: list,
    test_sets: dict[str, list[Atoms]] | None = None,
) -> dict[str, Any]:
    """Report row of one model: data sizes, levels, thresholds, held-out metrics (``test_*``
    on the test set, ``<name>_*`` on each of ``test_sets``) and ``cpu_eval_s``."""
    cpu = time.process_time()
    levels = calc.uncertainty_levels or {}
    row: dict[str, Any] = {
        "round": r,
        "model": str(model),
        "n_train": len(train),
        "n_valid": len(valid),
        "level_max_force_std": levels.get(keys.CALC_MAX_FORCE_STD),
        "level_energy_std_per_atom": levels.get(keys.CALC_ENERGY_STD_PER_ATOM),
        "threshold_max_force_std": calc.thresholds.max_force_std,
        "threshold_energy_std_per_atom": calc.thresholds.energy_std_per_atom,
    }
    for name, frames in {"test": test, **(test_sets or {})}.items():
        if frames:
            metrics = evaluate_structures(calc, frames)
            row.update({f"{name}_{k}": metrics[k] for k in _TEST_KEYS})
    row["cpu_eval_s"] = time.process_time() - cpu
    return row


def _explore(
    config: ActiveLearningConfig,
    calc: Any,
    starts: list[Atoms],
    rdir: Path,
    r: int,
    level: float | None,
    progress: bool = False,
) -> tuple[list[Atoms], int]:
    """MD from every starting structure at the round's temperature; returns (flagged frames,
    number of logged frames). With ``config.md.bias`` the MD runs on the biased energy
    (:mod:`mlip_unc.active.biased_md`); the logged frames are ``rdir/md_k/md.traj``."""
    flagged: list[Atoms] = []
    n_frames = 0
    md_calc = biased_calculator(calc, config.md)
    for k, start in enumerate(starts):
        settings = config.md_settings(r, k)
        md = run_md(
            start,
            md_calc,
            settings,
            rdir / f"md_{k}",
            reference_level=level,
            title=f"round {r}, structure {k}",
            progress=progress,
        )
        flagged.extend(md.flagged)
        n_frames += len(md.log["step"])
    return flagged, n_frames


def _check_thresholds(config: ActiveLearningConfig) -> None:
    """``config.thresholds`` as :class:`~mlip_unc.uncertainty.thresholds.Thresholds` (before any work)."""
    from mlip_unc.calculator import ThresholdError, Thresholds

    try:
        Thresholds.coerce(config.thresholds)
    except (ThresholdError, TypeError) as err:
        raise ThresholdError(f"thresholds: {err}") from None


def _data(
    config: ActiveLearningConfig,
    oracle: Any,
    starts: list[Atoms],
    out: Path,
    state: RunState,
    cache: CachedLabels,
) -> tuple[list[Atoms], list[Atoms], list[Atoms]]:
    """Round-0 data, generated once and committed to ``out/data`` (read back on resume); oracle
    MD goes through ``cache``, so a bootstrap killed half-way is read back, not recomputed."""
    from mlip_unc.data.readers import read_structures

    files = {name: out / "data" / f"{name}.xyz" for name in ("train", "valid", "test")}
    if state.data.get("data"):
        return tuple(read_structures(files[n]) if state.data["data"][n] else [] for n in files)  # type: ignore[return-value]
    parts = initial_data(config, cache.calculator(oracle), starts)
    for name, frames in zip(files, parts, strict=False):
        if frames:
            write_frames(files[name], frames)
    state.data["data"] = {name: bool(frames) for name, frames in zip(files, parts, strict=False)}
    state.commit()
    return parts


def run_active_learning(
    config: ActiveLearningConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    score: Callable[[Any, list[Atoms], int], np.ndarray] | None = None,
) -> list[dict[str, Any]]:
    """Run ``config.rounds`` rounds; returns one row per model (row k: the model after k rounds).

    Row k: the model's held-out errors, ``oracle_calls`` (labels spent on its training data,
    dropped ones included), CPU seconds (``cpu_initial_train_s`` in row 0, ``cpu_md_s``,
    ``cpu_score_s``, ``cpu_retrain_s``, ``cpu_eval_s``), the round's MD and labels and, with
    ``config.audit``, the flag audit. ``on_round(row)`` is called when a row is final.
    ``score(calc, candidates, round)``: (n,) ranking scores that replace ``selection.metric``
    (a benchmark's diagnostic, e.g. the true force error; the selection rules stay the same).

    Every finished stage is committed to ``out/state.json`` and every oracle result to
    ``out/labels/`` (:mod:`mlip_unc.active.state`): ``resume=True`` continues a killed run
    where it stopped, without labelling any structure twice; a folder that holds a run is
    never reused unless ``resume`` or ``overwrite`` is given; temporary files of writes killed
    mid-way are removed when it is opened. ``progress``: tqdm bars (rounds, MD steps, oracle calls).

    Raises:
        ThresholdError: ``config.thresholds`` are invalid (checked before anything is done).
        OracleError: the oracle cannot label the starting structures' elements (EMT on Si;
            checked before anything is done).
        FileExistsError: ``out`` holds a run, and neither ``resume`` nor ``overwrite``.
    """
    from mlip_unc.active.report import calls_sentence, oracle_calls_in_all, write_rounds_report
    from mlip_unc.data.readers import read_structures

    _check_thresholds(config)
    starts = build_structure(config.structures) if config.structures is not None else []
    check_oracle_elements(config.oracle, starts)  # e.g. EMT on Si: said before any work
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    state = RunState.start(out, config.to_dict(), resume=resume, overwrite=overwrite)
    remove_stale_temps(out, recursive=True)
    cache = CachedLabels(out / "labels")
    oracle = make_oracle(config.oracle)
    train, valid, test = _data(config, oracle, starts, out, state, cache)
    test_sets = {name: read_structures(path) for name, path in config.test_sets.items()}
    starts = starts or [train[0].copy()]
    rng = np.random.default_rng(config.seed)
    models = _initial_models(config, train, valid, out, state, resume)
    spent = len(train) + len(valid)  # oracle labels the current model was trained on (or dropped)
    rows: list[dict[str, Any]] = []
    rounds = tqdm(
        range(config.rounds + 1), desc="active learning", unit="round", disable=not progress
    )
    for r in rounds:
        rdir = out / f"round_{r}"
        if r < len(state.data["rounds"]):  # committed by an earlier invocation
            done = state.data["rounds"][r]
            rows.append(done["row"])
            if on_round is not None:  # again: a kill between the commit and the callback loses none
                on_round(done["row"])
            if done["model"] is None:
                break
            models = [Path(m) for m in done.get("models") or [done["model"]]]
            train = read_structures(models[0].parent / "train.xyz")
            valid = _read_optional(models[0].parent / "valid.xyz")
            spent = done["row"].get("oracle_calls", spent) + done["row"].get("n_labelled", 0)
            spent += done["row"].get("n_dropped", 0)
            rng.bit_generator.state = done["rng"]
            continue
        t0 = time.monotonic()
        calc = _calculator(config, models, valid or train)
        row = _model_row(calc, r, models[0], train, valid, test, test_sets)
        row.update(oracle_calls=spent, n_models=len(models))
        if r == 0:
            row["cpu_initial_train_s"] = state.data.get("initial_cpu_s")
        rows.append(row)
        if r == config.rounds:  # the final model: evaluated, no more MD
            log.info("final model (after %d rounds): %s", r, round_summary(row))
            if on_round is not None:
                on_round(row)
            break
        cpu = time.process_time()
        flagged, n_frames = _explore(
            config, calc, starts, rdir, r, row["level_max_force_std"], progress
        )
        row["cpu_md_s"] = time.process_time() - cpu
        row["md_temperature"] = config.md_settings(r).temperature
        cpu = time.process_time()
        visited = visited_frames([rdir / f"md_{k}" for k in range(len(starts))])
        candidates = visited if config.selection.candidates == "visited" else flagged
        chosen = select_flagged(
            candidates,
            config.selection,
            calc=calc,
            rng=np.random.default_rng([config.seed, r, 1]),
            scores=None if score is None or not candidates else score(calc, candidates, r),
        )
        row["cpu_score_s"] = time.process_time() - cpu
        labelled, n_dropped = label_selected(
            chosen, oracle, config.selection, cache=cache, progress=progress
        )
        row.update(
            {
                "n_md_frames": n_frames,
                "n_flagged": len(flagged),
                "n_labelled": len(labelled),
                "n_dropped": n_dropped,
            }
        )
        if config.audit and visited:
            row.update(_audit(config, calc, visited, r, oracle, cache))
        if not labelled:
            row["minutes"] = (time.monotonic() - t0) / 60
            log.info("round %d: %s; %s: stopping", r, round_summary(row), no_labels_reason(row))
            state.data["rounds"].append(
                {"round": r, "row": row, "model": None, "rng": rng.bit_generator.state}
            )
            state.commit()
            if on_round is not None:
                on_round(row)
            break
        write_frames(rdir / "labelled.xyz", labelled)
        new_train, new_valid = split_labelled(labelled, config.selection.valid_fraction, rng)
        train, valid = train + new_train, valid + new_valid
        spent += len(labelled) + n_dropped
        cpu, scratch = time.process_time(), config.retrain_from_scratch
        models = train_members(
            train,
            valid,
            config.training,
            rdir / "retrained",
            members=config.committee,
            init_from=None if scratch else models,  # anew: the training config's own recipe
            epochs=None if scratch else config.retrain_epochs,
            seed=config.seed + r + 1,
            refit_offsets=config.refit_offsets,
            resume=resume,
            lr=None if scratch else config.retrain_lr,
        )
        row["cpu_retrain_s"] = time.process_time() - cpu
        train = read_structures(models[0].parent / "train.xyz")  # as a resumed run reads them
        valid = _read_optional(models[0].parent / "valid.xyz")
        row["minutes"] = (time.monotonic() - t0) / 60
        state.data["rounds"].append(
            {
                "round": r,
                "row": row,
                "model": str(models[0]),
                "models": [str(m) for m in models],
                "rng": rng.bit_generator.state,
            }
        )
        state.commit()
        if on_round is not None:
            on_round(row)
        log.info(
            "round %d: %s; retrained on %d + %d structures",
            r,
            round_summary(row),
            len(train),
            len(valid),
        )
        write_rounds_report(rows, out)
    rounds.close()
    report = write_rounds_report(rows, out)
    log.info(
        "report: %s (%d oracle calls in this invocation). %s",
        report,
        cache.calls,
        calls_sentence(oracle_calls_in_all(rows)),
    )
    return rows


def _initial_models(
    config: ActiveLearningConfig,
    train: list[Atoms],
    valid: list[Atoms],
    out: Path,
    state: RunState,
    resume: bool,
) -> list[Path]:
    """The model(s) of round 0: ``config.model``, the committed ones, or trained now (the CPU
    seconds are kept in the state as ``initial_cpu_s``)."""
    done = state.data.get("initial_models") or state.data["initial_model"]
    if done:
        return [Path(m) for m in ([done] if isinstance(done, str) else done)]
    if config.model:
        return [Path(config.model)]
    log.info("training the initial model on %d structures", len(train))
    cpu = time.process_time()
    models = train_members(
        train,
        valid,
        config.training,
        out / "initial",
        members=config.committee,
        seed=config.seed,
        refit_offsets=config.refit_offsets,
        resume=resume,
    )
    state.data["initial_model"] = str(models[0])
    state.data["initial_models"] = [str(m) for m in models]
    state.data["initial_cpu_s"] = time.process_time() - cpu
    state.commit()
    return models


def _calculator(
    config: ActiveLearningConfig,
    models: list[Path],
    valid: list[Atoms],
    thresholds: Any = "config",
) -> Any:
    """The round's calculator: the model in ``config.uncertainty`` mode, or the committee of
    the models (its levels measured on ``valid``); ``thresholds``: the calculator's flag
    thresholds (default ``config.thresholds``; ``None``: no flag)."""
    from mlip_unc.calculator import UncertaintyCalculator

    model: Any = models[0] if len(models) == 1 else committee_model(models, valid)
    mode = config.uncertainty if len(models) == 1 else "exact"  # every mode: M backward passes
    return UncertaintyCalculator(
        model,
        uncertainty=mode,
        thresholds=config.thresholds if thresholds == "config" else thresholds,
        seed=config.seed,
    )


def _audit(
    config: ActiveLearningConfig,
    calc: Any,
    visited: list[Atoms],
    r: int,
    oracle: Any,
    cache: CachedLabels,
) -> dict[str, Any]:
    """``config.audit`` random logged frames labelled (not trained on): the monitor's flags
    against the true force error (:func:`~mlip_unc.active.candidates.audit_flags`)."""
    pick = np.random.default_rng([config.seed, r, 2]).permutation(len(visited))[: config.audit]
    labelled = label_structures([visited[k] for k in pick], oracle, cache=cache, skip_failed=True)
    return {"audit_calls": len(pick), **audit_flags(calc, labelled)}


def round_summary(row: dict[str, Any]) -> str:
    """One line of a round's row: the model's data and held-out error, MD flags, labels, time."""
    parts = [f"model on {row['n_train']} + {row['n_valid']} structures"]
    if row.get("test_force_rmse") is not None:
        parts.append(f"test force RMSE {row['test_force_rmse']:.4g} eV/A")
    if "n_flagged" in row:
        dropped = (
            f" ({row['n_dropped']} dropped: oracle failed or max_label_force)"
            if row.get("n_dropped")
            else ""
        )
        parts.append(
            f"{row['n_flagged']} of {row['n_md_frames']} MD frames flagged, {row['n_labelled']} labelled"
            + dropped
        )
    if row.get("minutes") is not None:
        parts.append(f"{row['minutes']:.2f} min")
    return "; ".join(parts)


def _read_optional(path: Path) -> list[Atoms]:
    from mlip_unc.data.readers import read_structures

    return read_structures(path) if path.is_file() else []
