"""The cases of the silent group (:mod:`~benchmarks.reliability.silent`): the issue's list, then
our own, each a function of the shared inputs (:class:`Ctx`) returning one verdict per command.

Commands are written as strings whose ``@`` tokens :meth:`Ctx.arg` resolves: ``@model`` (the
tiny Cu/Al potential, levels and posterior on 2 validation structures), ``@prop`` (a property
model trained on 30 C/H/N/O molecules, 3 of them validation), ``@x:NAME`` (a made input),
``@f:NAME`` (one of :func:`~benchmarks.reliability.checks.make_inputs`), ``@w:NAME`` (a path in
the work folder).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.reliability.harness import REPO
from benchmarks.reliability.silent import Verdict, also, child, cli, interrupt, says, snapshot

MACE_PYTHON_ENV = "RELIABILITY_MACE_PYTHON"  # a Python with mace-torch (default .venv-mace)
MOLECULES = (  # C, H, N, O only: Br, Cl and Si are unseen elements for the property model
    "C CC CCC CCCC CCCCC CO CCO CCCO CCCCO CN CCN CCCN c1ccccc1 Cc1ccccc1 CC(=O)O CC(C)O "
    "OCCO C1CCCCC1 CCOC CC#N C=C C=O CC=O NCCO CC(N)=O c1ccncc1 OC1CCCCC1 CCOCC COC CNC"
).split()
MD = "md -m @model --ensemble nve --interval 4 --steps 4"


@dataclass
class Ctx:
    """The inputs the cases share, each made once (the models through the CLI)."""

    files: dict[str, Path]
    work: Path
    model: Path
    made: dict[str, Any] = field(default_factory=dict)

    def path(self, name: str) -> Path:
        return self.work / name

    def arg(self, token: str) -> str:
        key, is_set, value = token.partition("=@")  # --set key=@...
        if is_set:
            return f"{key}={self.arg('@' + value)}"
        kind, _, name = token.partition(":")
        found = {
            "@model": lambda: self.model,
            "@prop": lambda: self.property_run()[0],
            "@prop.pt": lambda: self.property_run()[0] / "model.pt",
            "@x": lambda: self.inputs()[name],
            "@f": lambda: self.files[name],
            "@w": lambda: self.path(name),
        }
        return str(found[kind]()) if kind in found else token

    def args(self, line: str) -> list[str]:
        return [self.arg(token) for token in line.split()]

    def md_run(self) -> tuple[Path, Any]:
        """``md`` of 20 steps from test.xyz with the default (relative) threshold."""
        if "md" not in self.made:
            out = self.path("md")
            ran = cli(*self.args(f"{MD} -s @f:test.xyz --out {out} --steps 20 --timestep 0.5"))
            if ran.code:
                raise RuntimeError(f"the md run failed: {ran.output[-400:]}")
            self.made["md"] = (out, ran)
        return self.made["md"]

    def property_run(self) -> tuple[Path, Any]:
        """``property train`` on 30 molecules (random 80/10/10 split: 3 validation molecules)."""
        if "prop" not in self.made:
            data, out = self.inputs()["mols30"], self.path("prop")
            ran = cli(*self.args(f"property train --out {out} --data {data} --target-column y"))
            if ran.code:
                raise RuntimeError(f"property train failed: {ran.output[-400:]}")
            self.made["prop"] = (out, ran)
        return self.made["prop"]

    def inputs(self) -> dict[str, Path]:
        if "inputs" not in self.made:
            self.made["inputs"] = write_inputs(self.path("inputs"))
        return self.made["inputs"]


def write_inputs(folder: Path) -> dict[str, Path]:
    """Structure files (EMT labels on rattled Cu cells) with one defect each, and CSV files."""
    import ase.io
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator

    def cell(seed: int, a: float = 3.6, swap: str | None = None) -> Any:
        atoms = bulk("Cu", "fcc", a=a, cubic=True)
        if swap:
            atoms[0].symbol = swap
        atoms.rattle(0.02, seed=seed)
        atoms.calc = EMT()
        energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
        return atoms

    folder.mkdir(parents=True, exist_ok=True)
    out = {name: folder / f"{name}.xyz" for name in ("good", "nickel", "nan_energy", "zero_cell")}
    out.update({name: folder / f"{name}.xyz" for name in ("out_of_domain", "empty", "three")})
    ase.io.write(out["good"], cell(1))
    ase.io.write(out["nickel"], cell(2, swap="Ni"))
    bad = cell(3)
    bad.calc.results["energy"] = float("nan")
    ase.io.write(out["nan_energy"], [cell(4), bad])
    zero = cell(5)
    zero.cell[:] = 0.0
    zero.pbc = True
    ase.io.write(out["zero_cell"], zero)
    ase.io.write(out["out_of_domain"], [cell(6), cell(7, a=3.6 * 1.3)])  # frame 1: stretched
    out["empty"].write_text("")
    ase.io.write(out["three"], [cell(8), cell(9), cell(10)])
    lines = out["good"].read_text().splitlines()
    texts = {
        "nan_position": [*lines[:2], " ".join(["Cu", "nan", *lines[2].split()[2:]]), *lines[3:]],
        "forces_n2": [  # a forces column of 2 components
            lines[0],
            lines[1].replace("forces:R:3", "forces:R:2"),
            *(" ".join(line.split()[:-1]) for line in lines[2:]),
        ],
        "truncated": out["three"].read_text().splitlines()[:-2],  # the last frame lacks 2 atoms
    }
    for name, text in texts.items():
        out[name] = folder / f"{name}.xyz"
        out[name].write_text("\n".join(text) + "\n")
    csvs = {
        "mols30": "smiles,y\n" + "".join(f"{s},{0.3 * len(s):.2f}\n" for s in MOLECULES),
        "bad_smiles": "smiles\nCCO\nC1CC\nCC\n",
        "bad_target": "smiles,y\n" + "".join(f"{s},{k}\n" for k, s in enumerate(MOLECULES[:9])),
        "unseen": "smiles\nCCO\nCCBr\nCCCl\nC[Si](C)C\n",
    }
    csvs["bad_target"] += "CCCCCC,abc\n"
    for name, text in csvs.items():
        out[name] = folder / f"{name}.csv"
        out[name].write_text(text)
    return out


# ============================================================ the issue's cases
def predictions_as_labels(c: Ctx) -> list[Verdict]:
    import ase.io

    traj = c.md_run()[0] / "md.traj"
    out, metrics, run = c.path("flagged_md.xyz"), c.path("md_metrics.json"), c.path("train_md")
    ran = cli(*c.args(f"flag -m @model --data {traj} --out {out} -k 2"))
    frames = ase.io.read(out, ":") if ran.code == 0 and out.is_file() else []
    labels = sorted({k for a in frames for k in (a.calc.results if a.calc else {})})
    plain = sum("mlip_energy" in a.info for a in frames)
    flagged = also(
        says(ran, "wrote 2 structures", refused=False),
        bool(frames) and not labels and plain == len(frames),
        f"label keys: {labels or 'none'}; mlip_energy in {plain} of {len(frames)} frames",
    )
    evaluated = cli(*c.args(f"eval -m @model --data {traj} --out {metrics}"))
    trained = cli(*c.args(f"train -c @f:train.yaml --out {run} --set data.train={traj}"))
    return [
        flagged,
        also(
            says(evaluated, "--accept-predicted-labels", refused=True),
            not metrics.exists(),
            "no metrics",
        ),
        also(
            says(trained, "data.accept_predicted_labels", refused=True),
            not (run / "model.pt").exists(),
            "no model.pt",
        ),
    ]


def ctrl_c(c: Ctx) -> list[Verdict]:
    from mlip_unc.calculator import UncertaintyCalculator
    from mlip_unc.models.checkpoint import CheckpointError

    case = c.path("ctrl_c")
    case.mkdir(parents=True, exist_ok=True)
    run = case / "run"
    spec = {"kind": "call", "target": "mlip_unc.train.core:Trainer.validate", "n": 3}  # epoch 2
    ran = interrupt(c.args(f"train -c @f:train.yaml --out {run} --threads 1"), spec, case)
    verdict = says(ran, "no model.pt was written", refused=False, code=130)
    complete = (run / "model.pt").exists()
    if complete:
        try:
            UncertaintyCalculator(run / "model.pt")
        except CheckpointError:
            complete = False  # an unfinished model.pt that every loader refuses
    last = (run / "last.pt").is_file()
    return [also(verdict, not complete and last, f"exit {ran.code}; last.pt kept: {last}")]


def onto_inputs(c: Ctx) -> list[Verdict]:
    out = []
    for name, line in (
        ("cand.xyz", "flag -m @model --data {p} --out {p} -k 1"),
        ("mols.csv", "property predict --model @prop --data {p} --out {p}"),
    ):
        path = c.path(name)
        path.write_bytes(c.files["test.xyz" if name == "cand.xyz" else name].read_bytes())
        before = snapshot(path)
        ran = cli(*c.args(line.format(p=path)))
        out.append(
            also(says(ran, "is the input", refused=True), snapshot(path) == before, "unchanged")
        )
    return out


def md_again(c: Ctx) -> list[Verdict]:
    md = c.md_run()[0]
    before = snapshot(md)
    ran = cli(*c.args(f"{MD} -s @f:test.xyz --out {md}"))
    return [also(says(ran, "--overwrite", refused=True), snapshot(md) == before, "run unchanged")]


def three_molecules(c: Ctx) -> list[Verdict]:
    prop, trained = c.property_run()
    std = []
    for option in ("--recalibrate", "--no-recalibrate"):
        out = c.path(f"pred{option}.csv")
        ran = cli(*c.args(f"property predict --model {prop} --data @x:mols30 --out {out} {option}"))
        std.append([r["std"] for r in csv.DictReader(out.open())] if ran.code == 0 else None)
    raw = std[0] is not None and std[0] == std[1]
    verdict = says(trained, "fitted on 3 validation molecules", refused=False)
    return [also(verdict, raw, "predict gives the raw std")]


def few_structures(c: Ctx) -> list[Verdict]:
    words = "relative threshold on validation levels measured on 2 structure"
    line = "flag -m @model --data @f:test.xyz --threshold 3 --relative --out @w:relative.xyz"
    return [
        says(cli(*c.args(line)), words, refused=False),
        says(c.md_run()[1], words, refused=False),
    ]


def attach_three(c: Ctx) -> list[Verdict]:
    import ase.io

    python = os.environ.get(MACE_PYTHON_ENV) or str(REPO / ".venv-mace" / "bin" / "python")
    probe = [python, "-c", "import mace"]
    if not Path(python).is_file() or subprocess.run(probe, capture_output=True).returncode:
        return []  # not run: no Python with mace-torch
    folder = c.path("attach")
    folder.mkdir(parents=True, exist_ok=True)
    frames = [a for a in ase.io.read(c.files["train.xyz"], ":") if len(a) > 1]
    ase.io.write(folder / "valid.xyz", frames[:3])
    ase.io.write(folder / "train.xyz", frames[3:])
    model = folder / "tiny.model"
    make = [python, "-m", "benchmarks.reliability.silent", str(model)]
    subprocess.run(make, cwd=REPO, check=True, capture_output=True)
    line = f"attach -m {model} --data {folder}/train.xyz --valid {folder}/valid.xyz"
    ran = child(
        [*line.split(), "--out", str(folder / "unc.pt"), "--threads", "1"],
        folder / "log",
        python=python,
    )
    verdict = says(ran, "fitted on 3 structures", refused=False)
    return [also(verdict, (folder / "unc.pt").is_file(), "checkpoint written")]


def cuda_missing(c: Ctx) -> list[Verdict]:
    import torch

    if torch.cuda.is_available():
        return []  # not run: this machine has CUDA
    out, md = c.path("cuda.xyz"), c.path("md_cuda")
    flagged = cli(*c.args(f"flag -m @model --data @f:test.xyz --out {out} -k 1 --device cuda"))
    ran = cli(*c.args(f"{MD} -s @f:test.xyz --out {md} --device cuda"))
    return [
        also(says(flagged, "CUDA", refused=True), not out.exists(), "no output"),
        also(says(ran, "CUDA", refused=True), not md.exists(), "no run folder"),
    ]


def emt_on_silicon(c: Ctx) -> list[Verdict]:
    config, out = c.path("al_si.yaml"), c.path("al_si")
    swap = {
        "oracle:": "oracle: emt",
        "structures:": "structures: {bulk: Si, crystalstructure: diamond, a: 5.43, cubic: true}",
    }
    lines = c.files["al.yaml"].read_text().splitlines()
    config.write_text("\n".join(swap.get(line.split(" ")[0], line) for line in lines) + "\n")
    t0 = time.monotonic()
    ran = cli(*c.args(f"active-learn -c {config} --out {out} --threads 1"))
    seconds = time.monotonic() - t0
    return [
        also(says(ran, ("emt", "Si"), refused=True), not out.exists(), f"no run ({seconds:.0f} s)")
    ]


def empty_file(c: Ctx) -> list[Verdict]:
    empty = c.inputs()["empty"]
    words = (str(empty), "no frames")
    out = []
    for line, left in (
        ("eval -m @model --data {e}", None),
        ("train -c @f:train.yaml --out {o} --set data.train={e}", c.path("train_empty")),
        ("flag -m @model --data {e} --out {o} -k 1", c.path("flag_empty.xyz")),
        (MD + " -s {e} --out {o}", c.path("md_empty")),
    ):
        verdict = says(cli(*c.args(line.format(e=empty, o=left))), words, refused=True)
        out.append(verdict if left is None else also(verdict, not left.exists(), "no output"))
    return out


def no_data_root(c: Ctx) -> list[Verdict]:
    folder = c.path("elsewhere")  # ../shared/data does not exist from here
    folder.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    os.chdir(folder)
    try:
        line = f"train -c {REPO / 'configs' / 'ethanol_gin.yaml'} --out {folder / 'run'}"
        ran = cli(*line.split(), env={"MLIP_UNC_DATA": None})
    finally:
        os.chdir(here)
    return [says(ran, "MLIP_UNC_DATA", refused=True)]


def unseen_in_predict(c: Ctx) -> list[Verdict]:
    out = c.path("unseen_pred.csv")
    ran = cli(*c.args(f"property predict --model @prop --data @x:unseen --out {out}"))
    rows = list(csv.DictReader(out.open())) if ran.code == 0 else []
    got = {r["smiles"]: r.get("unseen_elements") for r in rows}
    want = {"CCO": "", "CCBr": "Br", "CCCl": "Cl", "C[Si](C)C": "Si"}
    verdict = says(ran, "absent from the training set", refused=False)
    return [also(verdict, got == want, f"unseen_elements per molecule: {got}")]


# ============================================================ our own cases
def refuse(words: str, line: str, leaves: str | None = None) -> Callable[[Ctx], list[Verdict]]:
    """One command that must refuse, naming ``words``; ``leaves``: a work path it must not make."""

    def run(c: Ctx) -> list[Verdict]:
        verdict = says(cli(*c.args(line)), words, refused=True)
        if leaves is not None:
            verdict = also(verdict, not c.path(leaves).exists(), f"no {leaves}")
        return [verdict]

    return run


def energy_key_typo(c: Ctx) -> list[Verdict]:
    metrics = c.path("typo.json")
    ran = cli(*c.args(f"eval -m @model --data @f:test.xyz --energy-key energ --out {metrics}"))
    keys = json.loads(metrics.read_text()) if ran.code == 0 else {}
    verdict = says(ran, "2 have no energy", refused=False)
    return [also(verdict, "energy_mae_meV_atom" not in keys, "no energy metrics")]


def test_is_training(c: Ctx) -> list[Verdict]:
    line = "train -c @f:train.yaml --out @w:test_is_train --threads 1 --set data.test=@f:train.xyz"
    return [says(cli(*c.args(line)), ("test", "training"), refused=False)]


def out_of_domain(c: Ctx) -> list[Verdict]:
    import ase.io

    out = c.path("ood_flagged.xyz")
    ran = cli(*c.args(f"flag -m @model --data @x:out_of_domain --out {out}"))
    written = ran.code == 0 and out.is_file() and out.stat().st_size > 0
    picked = [a.info.get("source_index") for a in ase.io.read(out, ":")] if written else []
    verdict = says(ran, "domain", refused=False)
    seen = f"{verdict.seen}; frames selected: {picked} (frame 1 is out of domain)"
    return [Verdict(verdict.loud or 1 in picked, seen, ran.command)]


def overwrite_keeps_data(c: Ctx) -> list[Verdict]:
    run = c.path("data_inside")
    run.mkdir(parents=True, exist_ok=True)
    data = run / "data.xyz"
    data.write_bytes(c.files["train.xyz"].read_bytes())
    before = snapshot(data)
    line = f"train -c @f:train.yaml --out {run} --threads 1 --set data.train={data}"
    first, again = cli(*c.args(line)), cli(*c.args(line + " --overwrite"))
    kept = first.code == 0 and data.is_file() and snapshot(data) == before
    return [also(says(again, "model:", refused=False), kept, "the data file kept unchanged")]


@dataclass
class Case:
    name: str
    source: str  # "issue" or "own"
    expected: str  # the message (or outcome) shown on the page
    run: Callable[[Ctx], list[Verdict]]
    needs: str = ""  # what the machine needs to run it (no verdicts: not run)


def cases() -> list[Case]:
    """The issue's cases, then our own."""
    issue = [
        (
            "md.traj predictions as labels (flag, eval, train)",
            "flag: no label keys; eval, train: --accept-predicted-labels",
            predictions_as_labels,
        ),
        (
            "Ctrl-C (SIGINT) during train, epoch 2",
            "no model.pt was written (exit 130, last.pt kept)",
            ctrl_c,
        ),
        ("--out = --data (flag, property predict)", "is the input (file unchanged)", onto_inputs),
        ("md --out of an earlier run", "--overwrite (run unchanged)", md_again),
        (
            "property recalibration on 3 validation molecules",
            "fitted on 3 validation molecules; raw std",
            three_molecules,
        ),
        (
            "relative threshold, levels of 2 structures (flag, md)",
            "measured on 2 structure(s)",
            few_structures,
        ),
        ("attach calibrated on 3 structures", "fitted on 3 structures", attach_three),
        ("--device cuda without CUDA (flag, md)", "CUDA; no output", cuda_missing),
        ("active-learn, EMT oracle on Si", "emt ... Si; no run folder", emt_on_silicon),
        ("empty xyz (eval, train, flag, md)", "FILE ... no frames; no output", empty_file),
        ("shipped config, no data root", "MLIP_UNC_DATA", no_data_root),
        (
            "property predict, unseen elements",
            "absent from the training set; per molecule",
            unseen_in_predict,
        ),
    ]
    own = [
        (
            "eval: element the potential never saw",
            "Ni",
            refuse("Ni", "eval -m @model --data @x:nickel"),
        ),
        (
            "md: element the potential never saw",
            "Ni; no run folder",
            refuse("Ni", f"{MD} -s @x:nickel --out @w:md_ni", "md_ni"),
        ),
        (
            "eval: NaN coordinate",
            "NaN or inf in positions",
            refuse("NaN or inf in positions", "eval -m @model --data @x:nan_position"),
        ),
        (
            "eval: forces of shape (n, 2)",
            "got shape (4, 2)",
            refuse("got shape (4, 2)", "eval -m @model --data @x:forces_n2"),
        ),
        (
            "train: NaN energy label",
            "must be one finite number",
            refuse(
                "must be one finite number",
                "train -c @f:train.yaml --out @w:nan_e --set data.train=@x:nan_energy",
                "nan_e/model.pt",
            ),
        ),
        (
            "eval: xyz with its last frame cut",
            "truncated.xyz",
            refuse("truncated.xyz", "eval -m @model --data @x:truncated"),
        ),
        (
            "eval: periodic frame, zero cell",
            "lattice vector",
            refuse("lattice vector", "eval -m @model --data @x:zero_cell"),
        ),
        (
            "md with a property model",
            "holds a 'property' model",
            refuse(
                "holds a 'property' model",
                "md -m @prop.pt -s @f:test.xyz --out @w:md_prop",
                "md_prop",
            ),
        ),
        (
            "property predict with a potential",
            "holds a 'potential' model",
            refuse(
                "holds a 'potential' model",
                "property predict --model @model --data @f:mols.csv --out @w:pp.csv",
                "pp.csv",
            ),
        ),
        (
            "md with a negative threshold",
            "must be a positive number",
            refuse(
                "must be a positive number",
                f"{MD} -s @f:test.xyz --out @w:md_neg --max-force-std -1",
                "md_neg",
            ),
        ),
        ("eval --energy-key no frame has", "2 have no energy; no energy metrics", energy_key_typo),
        (
            "train with the training file as test set",
            "a warning: test ... training",
            test_is_training,
        ),
        ("flag: out-of-domain candidate, low std", "selected, or 'domain' said", out_of_domain),
        (
            "property predict: invalid SMILES row",
            "invalid SMILES; no output",
            refuse(
                "invalid SMILES",
                "property predict --model @prop --data @x:bad_smiles --out @w:bad.csv",
                "bad.csv",
            ),
        ),
        (
            "property train: non-numeric target",
            "is not a number; no model.pt",
            refuse(
                "is not a number",
                "property train --out @w:bad_y --data @x:bad_target --target-column y",
                "bad_y/model.pt",
            ),
        ),
        ("train --overwrite, data file in --out", "the data file kept", overwrite_keeps_data),
    ]
    needs = {attach_three: "a Python with mace-torch (.venv-mace)", cuda_missing: "no CUDA"}
    return [Case(n, "issue", e, r, needs.get(r, "")) for n, e, r in issue] + [
        Case(n, "own", e, r) for n, e, r in own
    ]
