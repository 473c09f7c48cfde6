"""Configuration of molecular dynamics (``mlip-unc md``) and active learning
(``mlip-unc active-learn --config AL.yaml``, see ``configs/al_emt.yaml``)::

    out: runs/al_emt
    oracle: emt                      # emt | pyscf | xtb | {name: snap, element: Si} | package.module:factory | {name: ..., ...}
    structures: {bulk: Cu, crystalstructure: fcc, a: 3.61, cubic: true, repeat: [2, 2, 2]}
    bootstrap: {temperature: 300, frames: 40, valid_frames: 10}   # or train_data: file.xyz
    test: {temperature: 1200, frames: 20}                          # or test_data: file.xyz
    training: {...}                  # a `mlip-unc train` config without data.train/out
    rounds: 2
    md: {ensemble: langevin, temperature: 1200, steps: 400, timestep: 1.0, interval: 10}
    # md: {..., bias: udd, bias_strength: 0.5, bias_width: 0.01}  # uncertainty-driven exploration
    thresholds: {energy_std_per_atom: 2.0, relative: true}
    selection: {top_k: 10, diverse: true}
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from mlip_unc.config.loader import Section, apply_overrides, load_raw, validate

__all__ = [
    "MDSettings",
    "SelectionSettings",
    "GenerateSettings",
    "SeedSettings",
    "GuardSettings",
    "OnTheFlySettings",
    "ActiveLearningConfig",
    "load_active_config",
]


class MDSettings(Section):
    """Molecular dynamics for ``mlip-unc md`` and the active-learning rounds.

    Attributes:
        ensemble: ``"nve"`` (velocity Verlet) or ``"langevin"`` (NVT).
        temperature: K; initial Maxwell-Boltzmann velocities and the Langevin target.
        steps: MD steps; timestep: fs.
        interval: log (and trajectory) every this many steps.
        friction: Langevin friction, 1/fs.
        max_flags: stop after this many flagged frames (``None``: run all steps).
        seed: velocities and Langevin noise.
        bias: uncertainty-driven exploration (``mlip_unc.active.biased_md``): ``none``,
            ``variance`` (``E_bias = -k sigma_E^2``) or ``udd`` (``E_bias = A [exp(-sigma_E^2 /
            (N B^2)) - 1]``, bounded), ``sigma_E^2`` the epistemic energy variance.
        bias_strength: ``k`` (1/eV) for ``variance``, ``A`` (eV) for ``udd``; > 0 when biased.
        bias_width: ``B`` (eV/atom^(1/2)), ``udd`` only.
    """

    ensemble: Literal["nve", "langevin"] = "langevin"
    temperature: float = Field(300.0, ge=0)
    steps: int = Field(1000, gt=0)
    timestep: float = Field(1.0, gt=0)
    interval: int = Field(10, gt=0)
    friction: float = Field(0.01, gt=0)
    max_flags: int | None = None
    seed: int = 0
    bias: Literal["none", "variance", "udd"] = "none"
    bias_strength: float | None = None
    bias_width: float | None = None

    @model_validator(mode="after")
    def _check_bias(self) -> MDSettings:
        if self.bias == "none":
            for name in ("bias_strength", "bias_width"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"md.{name}: set, but md.bias is none; choose md.bias: variance or udd"
                    )
            return self
        unit = (
            "1/eV: E_bias = -k sigma_E^2"
            if self.bias == "variance"
            else "eV: the depth A of the udd bias"
        )
        if self.bias_strength is None or not (
            math.isfinite(self.bias_strength) and self.bias_strength > 0
        ):
            raise ValueError(
                f"md.bias_strength: md.bias {self.bias} needs a strength > 0 ({unit}), "
                f"got {self.bias_strength!r}"
            )
        if self.bias == "udd":
            if self.bias_width is None or not (
                math.isfinite(self.bias_width) and self.bias_width > 0
            ):
                raise ValueError(
                    f"md.bias_width: md.bias udd needs a width B > 0 (eV/atom^(1/2)), got {self.bias_width!r}"
                )
        elif self.bias_width is not None:
            raise ValueError(
                "md.bias_width: only the udd bias has a width; remove it for md.bias variance"
            )
        return self


class SelectionSettings(Section):
    """Which flagged frames go to the oracle.

    Attributes:
        metric: ranking score: ``max_force_std`` or ``energy_std_per_atom`` (the model's
            uncertainty), or the baselines ``max_force`` (largest predicted ``|F_i|``) and
            ``random`` (uniform, seeded by the run's seed and the round).
        candidates: ``flagged`` (the frames the MD monitor flagged over ``thresholds``) or
            ``visited`` (every logged MD frame: ``top_k`` labels each round whatever the
            thresholds, a fixed reference budget).
        top_k: label at most this many per round.
        diverse: farthest-point sampling among the ``pool_factor * top_k`` most uncertain
            candidates (in the distance-histogram descriptor), so one excursion is not labelled
            k times. Where the pool holds every candidate, the score only picks the first frame.
        pool_factor: size of that pool relative to ``top_k`` (1: the ``top_k`` most uncertain,
            no diversity).
        valid_fraction: share of the labelled frames added to the validation set.
        max_label_force: drop labelled frames whose largest reference force component exceeds
            this (eV/A): MD with a poor model can squeeze atoms together, and such frames teach
            nothing about the region of interest while dominating the loss (``None``: keep all).
    """

    metric: Literal["max_force_std", "energy_std_per_atom", "max_force", "random"] = "max_force_std"
    candidates: Literal["flagged", "visited"] = "flagged"
    top_k: int = Field(10, gt=0)
    diverse: bool = True
    pool_factor: int = Field(4, ge=1)
    valid_fraction: float = Field(0.2, ge=0, lt=1)
    max_label_force: float | None = None


class GenerateSettings(Section):
    """Reference data made by running oracle MD (Langevin) from the starting structure.

    Attributes:
        temperature: K; frames: number of frames kept.
        valid_frames: extra frames from an independent trajectory (validation); 0 = none.
        interval: MD steps between kept frames; timestep: fs.
        equilibration: steps before the first kept frame.
        seed: velocities and thermostat noise.
    """

    temperature: float = 300.0
    frames: int = 40
    valid_frames: int = 0
    interval: int = 10
    timestep: float = 2.0
    equilibration: int = 100
    seed: int = 0


class SeedSettings(Section):
    """The seed set: decorrelated oracle-MD frames that round 0 trains on, and a fixed thermal
    validation set labelled once at the start (active-learning labels never join it, so the
    uncertainty levels and relative thresholds measured on it do not drift).

    One oracle trajectory per temperature for the training frames and an independent one per
    temperature for the validation frames; kept frames are ``spacing_fs`` apart.

    Attributes:
        temperatures: K; the frames are shared out evenly over these temperatures.
        frames: training frames in all (at least 24 is the shipped default's recommendation).
        valid_frames: validation frames in all (the fixed validation set).
        valid_temperatures: K; the validation frames are shared out over these (``None``: the
            ``temperatures``). Spanning the MD ladder lets an on-the-fly trigger measure its
            level at each temperature (``on_the_fly.level: per_temperature``).
        spacing_fs: oracle MD time between kept frames (fs, at least 100: closer frames are
            correlated and teach little).
        timestep: oracle MD timestep (fs).
        equilibration_fs: oracle MD time before the first kept frame (fs).
        seed: velocities and thermostat noise of the oracle MD.
    """

    temperatures: list[float] = Field(default_factory=lambda: [300.0], min_length=1)
    frames: int = Field(24, ge=1)
    valid_frames: int = Field(12, ge=1)
    valid_temperatures: list[float] | None = Field(None, min_length=1)
    spacing_fs: float = Field(100.0, ge=100.0)
    timestep: float = Field(0.5, gt=0)
    equilibration_fs: float = Field(200.0, ge=0)
    seed: int = 0


class GuardSettings(Section):
    """When an exploration frame is unphysical: MD stops there and starts its segment again
    with fresh velocities, and the frame is never a candidate nor sent to the oracle.

    Attributes:
        bonds: check the bonds of the starting structure (pairs closer than 1.15 x the sum of
            ASE's natural radii); ``None``: for non-periodic structures (molecules) only, since
            bonds in a hot crystal or liquid may rearrange legitimately.
        stretch: a bond longer than this multiple of its starting length is broken.
        compress: a bond shorter than this multiple of its starting length is crushed.
        min_distance: two atoms closer than this (A; minimum image) are unphysical.
    """

    bonds: bool | None = None
    stretch: float = Field(1.5, gt=1)
    compress: float = Field(0.7, gt=0, lt=1)
    min_distance: float = Field(0.7, ge=0)


class OnTheFlySettings(Section):
    """On-the-fly labelling (``mode: on_the_fly``): MD runs with the current model and the
    reference is called only when a monitored frame's trigger score crosses the threshold.

    The run climbs the ``temperatures`` ladder: after ``hold_ps`` of MD without a label at one
    temperature it moves to the next; it ends when MD spends ``final_ps`` at the top temperature
    without a label, or when ``max_calls`` oracle calls are spent.

    Attributes:
        trigger: the score that decides when to call the oracle: ``uncertainty`` (the model's
            ``max_force_std``; the committee's force spread when ``committee`` > 1),
            ``max_force`` (the largest predicted force), ``true_error`` (the largest force error
            against the oracle: a control whose oracle calls are not counted), ``periodic``
            (every ``every``-th monitored frame) or ``random`` (each monitored frame with
            probability ``probability``).
        threshold: a frame is flagged when its score exceeds ``threshold`` x the score's level
            on the fixed validation set (measured again after every model update).
        level: ``mean``: the score's mean over the validation set, one level for every
            temperature; ``per_temperature``: a straight line through the validation frames'
            scores against their MD temperature, read at the temperature MD runs at (a hot frame
            is then compared with hot validation frames, so the trigger does not fire on every
            hot frame merely for being hot; the validation set must span two temperatures or
            more: ``seed_set.valid_temperatures``).
        every: ``periodic``: label every this many monitored frames.
        probability: ``random``: chance that a monitored frame is labelled.
        labels_per_update: label at most this many frames per model update: the first flagged
            frame and the most diverse of the frames flagged after it in the same segment.
        window: monitored frames that MD goes on for after the first flag, collecting more
            flagged frames before the update.
        segment_fs: MD time of one segment (fs); MD state and progress are committed between
            segments.
        hold_ps: MD time without a label needed at a temperature before the next one (ps).
        final_ps: MD time without a label at the top temperature that ends the run (ps).
        ladder: ``hold``: MD climbs to the next temperature after ``hold_ps`` without a label
            and the run completes after ``final_ps`` without one at the top; ``time``: the
            ladder is a fixed MD schedule, ``hold_ps`` of MD at each temperature and
            ``final_ps`` at the top, labels or not (what the ``periodic`` and ``random``
            triggers always do: they judge nothing), so every trigger explores the same
            temperatures for the same MD time and differs only in when it calls the oracle.
        max_calls: oracle-call budget (seed set included).
        refresh_every: train from scratch every this many updates (0: fine-tune only).
        final_refit: when the run ends, train the final model from scratch on every labelled
            frame with the training config's own schedule (VASP's ``refit`` step). Fine-tuning
            keeps forces but lets the energies drift (on 3BPA the fine-tuned final model's
            validation energy MAE was about twice the refit's); the refit row is the last of
            ``updates.jsonl`` (``refit: true``, no new oracle call).
    """

    trigger: Literal["uncertainty", "max_force", "true_error", "periodic", "random"] = "uncertainty"
    threshold: float = Field(2.0, gt=0)
    level: Literal["mean", "per_temperature"] = "mean"
    every: int = Field(10, gt=0)
    probability: float = Field(0.1, gt=0, le=1)
    labels_per_update: int = Field(4, gt=0)
    window: int = Field(10, ge=0)
    segment_fs: float = Field(500.0, gt=0)
    hold_ps: float = Field(1.0, ge=0)
    final_ps: float = Field(2.0, gt=0)
    ladder: Literal["hold", "time"] = "hold"
    max_calls: int = Field(150, gt=0)
    refresh_every: int = Field(0, ge=0)
    final_refit: bool = True


class ActiveLearningConfig(Section):
    """The whole active-learning run (see the module docstring).

    Attributes:
        out: output folder.
        oracle: oracle spec (``mlip_unc.active.oracles.make_oracle``).
        structures: MD starting structures: a file, or ``{bulk: El, ..., repeat: [n, n, n]}``.
        training: a training config mapping (``mlip-unc train``); ``data.train``,
            ``data.valid`` and ``out`` are set per round.
        train_data, valid_data, test_data: labelled files (extxyz); or generated by
            ``bootstrap`` (train/valid) and ``test`` (held-out).
        model: start from this checkpoint instead of training on the initial data.
        rounds: number of MD -> label -> retrain rounds.
        retrain_epochs: epochs of each retraining (``None``: the training config's).
        retrain_lr: peak learning rate of each retraining (``None``: the training config's); a
            warm start at the first training's rate undoes much of what it learned.
        retrain_from_scratch: train each round's model anew with the training config's own
            epochs and rate instead of fine-tuning the last one (``retrain_epochs`` and
            ``retrain_lr`` then unused). It costs a full training per round; in exchange each
            round's model depends on the labels alone, not on the path of warm starts before it
            (the two protocols compared:
            ``benchmarks/results/active_learning/rounds_protocol.md``).
        uncertainty: calculator mode during MD (``exact``, ``lowrank``, ``sketch``, ``auto``
            or ``sampled``).
        thresholds: ``mlip_unc.uncertainty.thresholds.Thresholds`` fields (checked when the run starts).
        refit_offsets: refit the per-element energy offsets after each training, for small
            energy weights.
        seed: seed of the MD and of the calculator.
        temperatures: MD temperature (K) of each round, overriding ``md.temperature``; the last
            value holds for any later round.
        committee: models trained on the same data with seeds ``seed + m``; more than 1 runs
            the MD and the scoring with their committee (force std across members).
        test_sets: named labelled files (extxyz) evaluated after every round besides the test set.
        audit: per round, this many random logged MD frames are labelled (not trained on) to
            measure the monitor's flags against the true force error (precision, recall).
        mode: ``rounds`` (MD, then a fixed number of labels per round) or ``on_the_fly`` (the
            oracle is called when a monitored MD frame crosses the threshold; see
            ``on_the_fly``).
        seed_set: the round-0 training frames and the fixed validation set from oracle MD at
            several temperatures (instead of ``bootstrap``).
        isolated_atoms: per-element reference energies for the training: ``oracle`` (each
            element's single atom labelled by the oracle, in its lowest spin state where the
            oracle has spin), a file of one-atom frames, or ``None`` (fitted offsets).
        guard: the geometry rules that stop exploration MD at an unphysical frame.
        on_the_fly: the on-the-fly mode's trigger, ladder and budget.
    """

    out: str = "runs/active_learning"
    oracle: Any = "emt"
    structures: Any = None
    training: dict[str, Any] = Field(default_factory=dict)
    train_data: str | None = None
    valid_data: str | None = None
    test_data: str | None = None
    bootstrap: GenerateSettings | None = None
    test: GenerateSettings | None = None
    model: str | None = None
    rounds: int = Field(1, gt=0)
    retrain_epochs: int | None = None
    retrain_lr: float | None = Field(None, gt=0)
    retrain_from_scratch: bool = False
    uncertainty: Literal["exact", "lowrank", "sketch", "auto", "sampled"] = "exact"
    md: MDSettings = MDSettings()
    thresholds: dict[str, Any] = Field(
        default_factory=lambda: {"max_force_std": 2.0, "relative": True}
    )
    selection: SelectionSettings = SelectionSettings()
    refit_offsets: bool = False
    seed: int = 0
    temperatures: list[float] | None = None
    committee: int = Field(1, ge=1)
    test_sets: dict[str, str] = Field(default_factory=dict)
    audit: int = Field(0, ge=0)
    mode: Literal["rounds", "on_the_fly"] = "rounds"
    seed_set: SeedSettings | None = None
    isolated_atoms: str | None = None
    guard: GuardSettings = GuardSettings()
    on_the_fly: OnTheFlySettings = OnTheFlySettings()

    def md_settings(self, round_index: int, k: int = 0) -> MDSettings:
        """The MD settings of round ``round_index`` from starting structure ``k``: the round's
        temperature (``temperatures``) and seed ``md.seed + 1000 round + k``."""
        changes: dict[str, Any] = {"seed": self.md.seed + 1000 * round_index + k}
        if self.temperatures:
            changes["temperature"] = self.temperatures[min(round_index, len(self.temperatures) - 1)]
        return self.md.updated(**changes)

    @model_validator(mode="after")
    def _check(self) -> ActiveLearningConfig:
        if (
            self.train_data is None
            and self.bootstrap is None
            and self.seed_set is None
            and self.model is None
        ):
            raise ValueError(
                "train_data: give train_data, seed_set, bootstrap or model: there is nothing "
                "to start from"
            )
        if self.seed_set is not None and (self.bootstrap is not None or self.train_data):
            raise ValueError("seed_set: give seed_set or bootstrap/train_data, not both")
        if (
            self.mode == "on_the_fly"
            and self.committee > 1
            and self.on_the_fly.trigger != ("uncertainty")
        ):
            raise ValueError("committee: a committee only serves on_the_fly.trigger uncertainty")
        if self.mode == "on_the_fly" and self.on_the_fly.level == "per_temperature":
            seed = self.seed_set
            temps = set((seed.valid_temperatures or seed.temperatures) if seed else [])
            if len(temps) < 2:
                raise ValueError(
                    "on_the_fly.level: per_temperature needs validation frames at two "
                    "temperatures or more (seed_set.valid_temperatures)"
                )
        if self.structures is None and self.train_data is None:
            raise ValueError("structures: give structures (MD starting points)")
        return self


def load_active_config(
    path: str | os.PathLike, overrides: Sequence[str] = ()
) -> ActiveLearningConfig:
    """Read a YAML file, apply ``key.sub=value`` overrides, validate."""
    return validate(
        ActiveLearningConfig, apply_overrides(load_raw(path), overrides, ActiveLearningConfig)
    )
