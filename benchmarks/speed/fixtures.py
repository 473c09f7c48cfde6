"""The pieces of the speed suite: systems, models, calculator calls, trainers and the report.

Models are built from the model sections of the shipped configs with untrained weights (the cost
of a call does not depend on the weights' values) and a random full posterior, so that the
``exact`` and ``lowrank`` modes run what a trained checkpoint runs (d + 1 and rank + 1
vector-Jacobian products).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ase.io
import numpy as np
import torch
from ase import Atoms
from ase.build import bulk, molecule
from ase.calculators.calculator import all_changes
from ase.calculators.emt import EMT

from benchmarks.common.format import fmt
from benchmarks.common.pages import rerun_command
from benchmarks.common.tables import Table
from mlip_unc import UncertaintyCalculator
from mlip_unc.config import PropertyConfig, load_potential_config
from mlip_unc.config import PropertyModelConfig as ModelConfig
from mlip_unc.config import PropertyTrainConfig as TrainConfig
from mlip_unc.data.molecules import TOY_SMILES as SMILES  # the paper study's quick molecules
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.committee import Committee
from mlip_unc.models.potential import BayesianPotential

REPO = Path(__file__).resolve().parents[2]
TYPE_MAP = [1, 6, 7, 8, 29]  # H C N O Cu: one model covers every system
CONFIGS = {"equivariant": "3bpa_equivariant.yaml", "gin": "ethanol_gin.yaml"}
QUICK_MODEL = [
    "model.backbone_kwargs={hidden: 16, num_layers: 2, num_basis: 4}",
    "model.latent_dim=8",
]
MACE_SIZES = {
    "num_channels": 32,
    "max_L": 1,
    "max_ell": 3,
    "correlation": 3,
    "num_interactions": 2,
    "num_radial_basis": 8,
}  # benchmarks/accuracy.py MACE_MODEL
THREE_BPA = "Nc1ncccc1OCc1ccccc1"  # 3-(benzyloxy)pyridin-2-amine, C12H12N2O, 27 atoms
UNC_ROWS = {
    "E+F+energy_var": ("energy", "energy_std"),
    "E+F+exact": ("exact", "forces_std"),
    "E+F+lowrank": ("lowrank", "forces_std"),
    "E+F+sampled4": ("sampled", "forces_std"),
}


# ================================================================ systems
def mace_available() -> bool:
    return importlib.util.find_spec("mace") is not None


def _three_bpa(data_root: Path) -> tuple[Atoms, str]:
    path = Path(data_root) / "structures" / "3BPA" / "train_300K.xyz"
    if path.is_file():
        atoms = ase.io.read(path, index=0)
        atoms.calc = None
        return atoms, f"first frame of {path.name} (--data-root)"
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles(THREE_BPA))
    AllChem.EmbedMolecule(mol, randomSeed=0)
    return Atoms(
        [a.GetSymbol() for a in mol.GetAtoms()], mol.GetConformer().GetPositions()
    ), "RDKit-embedded 3BPA"


@functools.lru_cache(maxsize=4)
def _systems(data_root: str, quick: bool) -> tuple[tuple[str, Atoms, str], ...]:
    ethanol = molecule("CH3CH2OH")
    cells = (2, 1, 1) if quick else (3, 3, 3)
    cu = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(cells)
    cu.rattle(0.05, seed=0)
    out = [("ethanol_9", ethanol, "ase.build.molecule('CH3CH2OH')")]
    if not quick:
        bpa, source = _three_bpa(Path(data_root))
        out.append(("3bpa_27", bpa, source))
    out.append(
        (f"cu_{len(cu)}", cu, f"fcc Cu a = 3.61 A, cubic cell x {cells}, rattled 0.05 A, periodic")
    )
    return tuple(out)


def systems(data_root: Path, *, quick: bool) -> dict[str, Atoms]:
    """name -> Atoms (copies): ethanol_9, 3bpa_27, cu_108 (quick: ethanol_9, cu_8)."""
    return {name: atoms.copy() for name, atoms, _ in _systems(str(data_root), quick)}


def describe(name: str, atoms: Atoms, data_root: Path, quick: bool) -> dict[str, Any]:
    source = next(s for n, _, s in _systems(str(data_root), quick) if n == name)
    return {
        "n_atoms": len(atoms),
        "formula": atoms.get_chemical_formula(),
        "periodic": bool(atoms.pbc.all()),
        "source": source,
    }


# ================================================================ models
def config_of(model: str, quick: bool, overrides: list[str] = ()) -> Any:
    extra = list(QUICK_MODEL) if quick and model == "gin" else []
    return load_potential_config(
        REPO / "configs" / CONFIGS[model], ["data_root=/nonexistent", *extra, *overrides]
    )


def potential(
    model: str,
    *,
    quick: bool,
    seed: int = 0,
    full_posterior: bool = True,
    config_basis: bool = False,
    overrides: Sequence[str] = (),
) -> BayesianPotential:
    """An untrained potential of the config's model section over H C N O Cu (+ random full posterior).

    ``config_basis``: the posterior basis of the config (``per_element`` for 3BPA: what a trained
    checkpoint of it runs) instead of ``shared``; ``overrides``: config keys (``--set`` syntax).
    """
    cfg = config_of(model, quick, list(overrides))
    kwargs = {
        "num_types": len(TYPE_MAP),
        "r_max": cfg.data.r_max,
        "latent_dim": cfg.model.latent_dim,
        "avg_num_neighbors": 10.0,
        **cfg.model.backbone_kwargs,
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pot = BayesianPotential(
            build_backbone(cfg.model.backbone.value, **kwargs),
            TYPE_MAP,
            cfg.data.r_max,
            posterior_rank=cfg.model.posterior_rank,
            **({"posterior_basis": cfg.model.posterior_basis} if config_basis else {}),
        )
        if full_posterior:
            d = pot.posterior_width
            factor = (
                torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))[0]
                * torch.logspace(-1, -3, d)[:, None]
            )
            pot.set_full_posterior(
                factor, torch.tensor([1.0, 1.0, 1e-4, 1e-2], dtype=torch.float64)
            )
    return pot.to(cfg.dtype.torch).eval()


def mace_calculator(
    members: int = 1, sizes: dict[str, int] | None = None, base: Any | None = None
) -> Any:
    """mace-torch's MACECalculator on an untrained ScaleShiftMACE (accuracy benchmark sizes,
    float32, or ``base``); ``members`` > 1: mace-torch's own committee (``models=[...]``) of
    that many perturbed copies."""
    from mace.calculators import MACECalculator

    base = base if base is not None else mace_model(0, sizes or MACE_SIZES)
    models = [base] if members == 1 else [_perturbed(base, k) for k in range(1, members + 1)]
    return MACECalculator(models=models, device="cpu", default_dtype="float32")


def _perturbed(model: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """A copy of ``model`` with every weight moved by ``scale`` x N(0, 1) (seeded): a committee
    member of the same architecture, made in a fraction of a second (a mace-torch model takes
    seconds to build)."""
    member = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in member.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return member


def mace_model(seed: int, s: dict[str, int]) -> Any:
    """An untrained mace-torch ScaleShiftMACE of sizes ``s`` over H C N O Cu."""
    from e3nn import o3
    from mace import modules

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = modules.ScaleShiftMACE(
            r_max=5.0,
            num_bessel=s["num_radial_basis"],
            num_polynomial_cutoff=5,
            max_ell=s["max_ell"],
            interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes[
                "RealAgnosticResidualInteractionBlock"
            ],
            num_interactions=s["num_interactions"],
            num_elements=len(TYPE_MAP),
            hidden_irreps=o3.Irreps(f"{s['num_channels']}x0e + {s['num_channels']}x1o"),
            MLP_irreps=o3.Irreps("16x0e"),
            atomic_energies=np.zeros(len(TYPE_MAP)),
            avg_num_neighbors=10.0,
            atomic_numbers=TYPE_MAP,
            correlation=s["correlation"],
            gate=torch.nn.functional.silu,
            radial_MLP=[64, 64, 64],
            atomic_inter_scale=1.0,
            atomic_inter_shift=0.0,
        ).float()
    return model


def models_for(quick: bool, *, mace_only: bool) -> list[str]:
    if mace_only:
        return ["equivariant", "mace"]
    names = ["gin"] if quick else ["equivariant", "gin"]
    return names + (["mace"] if mace_available() and not quick else [])


def _call(calc: Any, atoms: Atoms, properties: list[str]) -> Callable[[], Any]:
    def run() -> Any:
        calc.calculate(
            atoms, properties, all_changes
        )  # what get_forces() etc. run on a new geometry
        return calc.results

    return run


def calls(
    model: str, atoms: Atoms, *, quick: bool, only: str | None = None, mace_only: bool = False
) -> dict[str, Callable[[], Any]]:
    """Row name -> one calculator call on ``atoms`` (``only``: build just that row)."""
    periodic = bool(atoms.pbc.all())
    if model == "mace":
        return {
            "E+F": _call(mace_calculator(), atoms, ["energy", "forces"])
        }  # MACECalculator also computes stress
    pot = potential(model, quick=quick)

    def calc(mode: str, model_: Any = pot) -> UncertaintyCalculator:
        return UncertaintyCalculator(model_, uncertainty=mode, domain=False, n_samples=4)

    wanted = ["energy", "E+F", *UNC_ROWS, "E+F+stress", "committee5"]
    if mace_only:
        wanted = ["E+F", "E+F+stress"]
    if not periodic:
        wanted.remove("E+F+stress")
    if only is not None:
        wanted = [only]
    plain = calc("none") if {"energy", "E+F", "E+F+stress"} & set(wanted) else None
    out: dict[str, Callable[[], Any]] = {}
    for row in wanted:
        if row == "energy":
            out[row] = _call(plain, atoms, ["energy"])
        elif row == "E+F":
            out[row] = _call(plain, atoms, ["energy", "forces"])
        elif row == "E+F+stress":
            out[row] = _call(plain, atoms, ["energy", "forces", "stress"])
        elif row == "committee5":
            members = [
                potential(model, quick=quick, seed=k, full_posterior=False) for k in range(1, 6)
            ]
            out[row] = _call(
                calc("exact", Committee(members).eval()), atoms, ["energy", "forces", "forces_std"]
            )
        else:
            mode, key = UNC_ROWS[row]
            out[row] = _call(calc(mode), atoms, ["energy", "forces", key])
    return out


# ================================================================ trainers
def train_cases(quick: bool) -> list[tuple[str, str]]:
    """(model, system) of the potential-trainer throughput."""
    if quick:
        return [("gin", "ethanol_9")]
    return [
        ("equivariant", "ethanol_9"),
        ("equivariant", "3bpa_27"),
        ("gin", "ethanol_9"),
        ("gin", "3bpa_27"),
    ]


def train_data_label(system: str, n: int) -> str:
    return f"{n} rattled {system} frames, EMT labels"


def _labelled_frames(atoms: Atoms, n: int) -> list[Atoms]:
    frames = []
    for k in range(n):
        a = atoms.copy()
        a.rattle(0.05, seed=k)
        a.calc = EMT()
        a.get_forces()
        frames.append(a)
    return frames


def potential_trainer(model: str, atoms: Atoms, work: Path, *, quick: bool) -> tuple[Any, int, int]:
    """The training core over ``model`` on EMT-labelled rattled copies of ``atoms``: (trainer, n_train, batch)."""
    from mlip_unc.train.core import Trainer
    from mlip_unc.train.potential import PotentialTask
    from mlip_unc.train.potential_data import prepare_data

    path = work / f"{model}_{len(atoms)}.xyz"
    ase.io.write(path, _labelled_frames(atoms, 10 if quick else 34))
    cfg = config_of(
        model,
        quick,
        [
            f"data.train={path}",
            "data.valid_fraction=0.1",
            "data.isolated_atoms=null",
            "data.test=null",
            f"out={work / model}",
            "train.progress=false",
        ],
    )
    data = prepare_data(cfg)
    task = PotentialTask(cfg, data, Path(cfg.out))
    return Trainer(task, cfg.train, seed=0, out=None), len(data.train), cfg.train.batch_size


def property_trainer(*, quick: bool) -> tuple[Any, int, int]:
    """The property trainer (GIN bgnn, paper-study sizes) on generated SMILES: (trainer, n_train, batch)."""
    from mlip_unc.data.molecules import smiles_to_graph
    from mlip_unc.train.property import property_trainer as make
    from mlip_unc.train.property import seeded_model

    smiles = SMILES if quick else SMILES * 5
    graphs = [smiles_to_graph(s, y=0.3 * len(s) + 0.1 * (k % 7)) for k, s in enumerate(smiles)]
    sizes = (
        {"hidden": 16, "layers": 2, "latent_dim": 8}
        if quick
        else {"hidden": 64, "layers": 3, "latent_dim": 32}
    )
    config = PropertyConfig(
        model=ModelConfig(method="bgnn", **sizes),
        train=TrainConfig(
            epochs=100, batch_size=32, lr_schedule="cosine", patience=0, progress=False
        ),
    )
    train, val = graphs[: -len(graphs) // 10], graphs[-len(graphs) // 10 :]
    return make(seeded_model(config, train), config, train, val), len(train), 32


def throughput(trainer: Any, n: int, *, epochs: int) -> float:
    """Items per second of ``epochs`` training epochs after one warm-up epoch (no validation)."""
    trainer.train_epoch()
    start = time.perf_counter()
    for _ in range(epochs):
        trainer.train_epoch()
    return n * epochs / (time.perf_counter() - start)


# ================================================================ report
def versions() -> dict[str, str]:
    out = {"torch": torch.__version__}
    for name in ("e3nn", "torch_geometric", "ase", "mace"):
        if importlib.util.find_spec(name) is not None:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
    return out


CALLS_CSV = "speed_calls.csv"


def _native(entry: dict[str, Any]) -> dict[str, float]:
    """The native equivariant E+F median per system (a mace row's reference)."""
    return {
        c["system"]: c["ms_median"]
        for c in entry["calls"]
        if c["model"] == "equivariant" and c["row"] == "E+F"
    }


def calls_table(parts: dict[str, Any]) -> Table:
    """Every timed row of the per-call parts, as the page showed them."""
    table = Table(
        CALLS_CSV,
        ("part", "model", "system", "atoms", "row", "ms (median)", "IQR ms", "x E+F",
         "x E+F paired", "x native equivariant E+F"),
    )  # fmt: skip
    for name, entry in parts.items():
        native = _native(entry)
        for c in entry["calls"]:
            x_native = (
                f"{c['ms_median'] / native[c['system']]:.2f}"
                if c["model"] == "mace" and c["system"] in native
                else ""
            )
            table.rows.append(
                (name, c["model"], c["system"], c["n_atoms"], c["row"], f"{c['ms_median']:.2f}",
                 f"{c['ms_q25']:.2f}-{c['ms_q75']:.2f}", fmt(c["ratio"]), fmt(c["ratio_paired"]),
                 x_native)
            )  # fmt: skip
    return table


def _calls_pivot(parts: dict[str, Any]) -> list[str]:
    """One line per part, model and system: the E+F time and every row's time x E+F."""
    names: dict[str, None] = {}
    cells: dict[tuple[str, str, str, int], dict[str, str]] = {}
    for part, entry in parts.items():
        native = _native(entry)
        for c in entry["calls"]:
            cell = cells.setdefault((part, c["model"], c["system"], c["n_atoms"]), {})
            if c["row"] != "E+F":
                names[c["row"]] = None
                cell[c["row"]] = fmt(c["ratio"])
                continue
            cell["E+F"] = f"{c['ms_median']:.2f}"
            if c["model"] == "mace" and c["system"] in native:
                cell["native"] = f"{c['ms_median'] / native[c['system']]:.2f}"
    extra = ["x native equivariant E+F"] if any("native" in c for c in cells.values()) else []
    table = Table("", ("part", "model", "system", "atoms", "E+F ms", *names, *extra))
    for key, cell in cells.items():
        table.rows.append(
            (*key, cell.get("E+F", "n/a"), *[cell.get(n, "") for n in names],
             *([cell.get("native", "")] if extra else []))
        )  # fmt: skip
    return table.markdown()


def tables(results: dict[str, Any]) -> list[Table]:
    """The tables of every row kept beside speed.md."""
    from benchmarks.speed.size_report import size_tables

    parts = {k: v for k, v in results["parts"].items() if k not in ("size", "md")}
    size = results["parts"].get("size")
    return (size_tables(size) if size is not None else []) + ([calls_table(parts)] if parts else [])


def render(results: dict[str, Any]) -> str:
    """speed.md: part ``md`` first (one table), part ``size`` (its own section), then the
    per-call parts, training, memory and their runs."""
    from benchmarks.speed.md_part import render_md
    from benchmarks.speed.size_report import render_size

    parts = dict(results["parts"])
    size, md = parts.pop("size", None), parts.pop("md", None)
    lines = ["# Speed: the ASE calculator, the trainers, peak memory", ""]
    if md is not None:  # the MD throughput table first: the page's headline
        lines += render_md(md)
        if size is None and not parts:
            return "\n".join(lines)
    if size is not None:
        lines += render_size(size)
        if not parts:
            return "\n".join(lines)
    if parts:
        lines += [
            f"## Calculator: per-call time (parts {', '.join(f'`{n}`' for n in parts)})",
            "",
            *_calls_pivot(parts),
            "",
            "E+F ms: the median; the other columns: median x E+F of the same part, model and "
            f"system (medians, quartiles, paired ratios: [`{CALLS_CSV}`]({CALLS_CSV})).",
            "",
        ]
    notes: dict[str, None] = {}
    for name, entry in parts.items():
        m = entry["meta"]
        notes[
            f"{m['threads']} torch thread(s); {m['repeats']} timed rounds after {m['warmup']} "
            "warm-up calls per row; in each round every row is called once (order rotated "
            f"between rounds), so load drifts hit all rows alike; weights: {m['weights']}"
            + ("; QUICK mode (tiny models and systems)" if m["quick"] else "")
            + "."
        ] = None
        notes[
            "Systems: "
            + "; ".join(f"{k}: {v['formula']} ({v['source']})" for k, v in m["systems"].items())
            + "."
        ] = None
        done = {
            "mace": "mace" in parts,
            "memory": bool(entry.get("memory")),
        }  # a later invocation filled it in
        skipped = {k: v for k, v in m.get("skipped", {}).items() if not done.get(k)}
        if skipped:
            notes[
                f"Skipped (part `{name}`): " + "; ".join(f"{k}: {v}" for k, v in skipped.items())
            ] = None
    lines += [line for note in notes for line in (note, "")]
    train = [(n, t) for n, e in parts.items() for t in e.get("training", [])]
    lines += ["## Training throughput", ""]
    if train:
        lines += [
            (
                "Training-core epochs (`Trainer.train_epoch`: step, loss with forces, backward, Adam, EMA; no "
                "validation) after one warm-up epoch, untrained models of the configs' sizes."
            ),
            "",
            "| part | trainer | model | data | batch | throughput |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {n} | {t['trainer']} | {t['model']} | {t['data']} | {t['batch_size']} | "
            f"{t['per_s']:.1f} {t['unit']} |"
            for n, t in train
        ]
    else:
        lines.append("(not measured)")
    mem = [(n, r) for n, e in parts.items() for r in e.get("memory", [])]
    lines += ["", "## Peak memory", ""]
    if mem:
        lines += [
            (
                "`resource.getrusage(RUSAGE_SELF).ru_maxrss` of a fresh subprocess per section (a selection: a probe costs a process start): after its set-up "
                "(imports, model, structure or data) and after 3 calls of the section (training: one epoch); the "
                "increase is what the section added to the process's high-water mark."
            ),
            "",
            "| part | section | peak RSS MiB | after set-up MiB | increase MiB |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {n} | {r['section']} | {r['peak_mib']:.0f} | {r['setup_mib']:.0f} | {r['increase_mib']:.0f} |"
            for n, r in mem
        ]
    else:
        lines.append("(not measured)")
    lines += [
        "",
        (
            "Rows: energy = energy only (one forward pass); E+F = energy and forces (one backward pass); "
            "+energy_var = the closed-form energy variance (same passes); +exact / +lowrank / +sampled4 = force "
            "variances of those modes (d + 1, rank + 1 and 4 + 1 vector-Jacobian products); +stress = E, F and "
            "stress; committee5 = 5 members, E+F with the members' force variance; mace = mace-torch's "
            "MACECalculator (which always computes the stress too). x E+F = median / median of E+F of the same "
            "model and system; paired = median over rounds of the per-round ratio."
        ),
        "",
        "## Run",
        "",
    ]
    for name, entry in parts.items():
        m = entry["meta"]
        runs = m.get("invocations") or [{**m, "stages": ["calls"]}]
        commands = list(dict.fromkeys(rerun_command(inv["command"]) for inv in runs))
        shown = f"`{commands[0]}`" + (
            f" (+{len(commands) - 1} resumed command(s) for later stages)"
            if len(commands) > 1
            else ""
        )
        lines += [
            f"- Part `{name}` (status: {m.get('status', 'complete')}): {shown}, with `{m['python']}`",
            f"  - Date: calculator timing {m['started']} - {m['finished']}",
            f"  - Machine: {m.get('cpu', 'n/a')}; load average (1, 5, 15 min) "
            f"{m['load_avg_start']} at the start of the timing, {m['load_avg_end']} at its end",
            "  - Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        ]
    lines += [
        "- Full provenance (every invocation with its stages, dates and load): `speed.json`",
        "",
    ]
    return "\n".join(lines)
