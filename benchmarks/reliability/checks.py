"""Checks of the reliability suite that run in its own process: the tiny inputs, corrupted
checkpoints, bad inputs through the CLI, fuzzed structures (see the docstring there)."""

from __future__ import annotations

import json
import math
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ase.calculators.emt import EMT

from benchmarks.reliability.harness import REPO, record


# ============================================================ tiny data and configs
def make_inputs(work: Path) -> dict[str, Path]:
    """EMT-labelled rattled Cu/Al cells, isolated atoms, a train and an active-learning config,
    property CSV files, frames without forces, a structure with coincident atoms."""
    import ase
    import ase.io
    from ase.build import bulk
    from ase.calculators.singlepoint import SinglePointCalculator

    def labelled(atoms: Any, stress: bool = True) -> Any:
        atoms.calc = EMT()
        results = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces()}
        if stress:
            results["stress"] = atoms.get_stress()
        atoms.calc = SinglePointCalculator(atoms, **results)
        return atoms

    frames = []
    for k in range(12):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        if k % 2:
            atoms[0].symbol = "Al"
        atoms.rattle(0.1, seed=k)
        frames.append(labelled(atoms))
    isolated = [labelled(ase.Atoms(s, positions=[[0, 0, 0]]), stress=False) for s in ("Cu", "Al")]
    work.mkdir(parents=True, exist_ok=True)
    files = {
        name: work / name for name in ("train.xyz", "test.xyz", "no_forces.xyz", "overlap.xyz")
    }
    ase.io.write(files["train.xyz"], frames[:10] + isolated)
    ase.io.write(files["test.xyz"], frames[10:])
    partial = [frames[10].copy(), frames[11].copy()]
    partial[0].calc = SinglePointCalculator(
        partial[0], energy=frames[10].get_potential_energy()
    )  # no forces
    partial[1].calc = SinglePointCalculator(
        partial[1], energy=frames[11].get_potential_energy(), forces=frames[11].get_forces()
    )
    ase.io.write(files["no_forces.xyz"], partial)
    overlap = bulk("Cu", "fcc", a=3.6, cubic=True)
    overlap.positions[1] = overlap.positions[0] + 1e-4
    ase.io.write(files["overlap.xyz"], overlap)
    files["train.yaml"] = work / "train.yaml"
    files["train.yaml"].write_text(
        f"seed: 0\nout: {work / 'unused'}\ndtype: float64\n"
        f"data: {{train: {files['train.xyz']}, valid_fraction: 0.25, r_max: 4.0}}\n"
        "model: {backbone: gin, backbone_kwargs: {hidden: 8, num_layers: 1}, latent_dim: 4}\n"
        "train: {epochs: 4, batch_size: 2, lr: 0.02}\n"
    )
    files["al.yaml"] = work / "al.yaml"
    files["al.yaml"].write_text(
        f"out: {work / 'unused_al'}\nseed: 0\noracle: benchmarks.reliability.harness:counting_emt\n"
        "structures: {bulk: Cu, crystalstructure: fcc, a: 3.61, cubic: true}\nrounds: 2\n"
        "bootstrap: {frames: 6, valid_frames: 2, interval: 3, equilibration: 0}\n"
        "test: {temperature: 1000, frames: 2, interval: 3, equilibration: 0}\n"
        "retrain_epochs: 2\nrefit_offsets: true\nmd: {temperature: 1500, steps: 6, interval: 2, timestep: 2.0}\n"
        "thresholds: {max_force_std: 1.0e-9}\nselection: {top_k: 2}\n"
        "training: {dtype: float64, data: {r_max: 4.0}, loss: {energy_weight: 1.0e-3},\n"
        "  model: {backbone: gin, backbone_kwargs: {hidden: 8, num_layers: 1, num_basis: 4}, latent_dim: 4,"
        " standardise: false},\n  train: {epochs: 2, batch_size: 4}}\n"
    )
    smiles = [
        "C",
        "CC",
        "CCC",
        "CCCC",
        "CO",
        "CCO",
        "CCCO",
        "CN",
        "CCN",
        "c1ccccc1",
        "Cc1ccccc1",
        "CC(=O)O",
        "CC(C)O",
        "OCCO",
        "C1CCCCC1",
        "CCOC",
        "CC#N",
        "C=C",
        "ClC",
        "CS",
    ]
    files["mols.csv"] = work / "mols.csv"
    files["mols.csv"].write_text(
        "smiles,y\n" + "".join(f"{s},{0.3 * len(s):.2f}\n" for s in smiles)
    )
    files["empty.csv"] = work / "empty.csv"
    files["empty.csv"].write_text("smiles,y\n")
    return files


# ============================================================ group 3: corrupted checkpoints
def corruptions(model: Path, work: Path, quick: bool) -> list[dict]:
    """Each damaged copy of ``model`` loaded by the calculator and asked for energy and forces."""
    import zipfile

    import numpy as np
    import torch
    from ase.build import bulk

    from mlip_unc.calculator import NonFiniteResultError, UncertaintyCalculator
    from mlip_unc.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.rattle(0.05, seed=1)

    def answer(path: Path) -> tuple[np.ndarray, str]:
        """Energy, forces and their std (one array) and the checkpoint's non-tensor content."""
        calc = UncertaintyCalculator(path)
        calc.calculate(atoms.copy(), ["energy", "forces", "energy_std", "forces_std"])
        values = np.concatenate(
            [np.ravel(calc.results[k]) for k in ("energy", "forces", "energy_std", "forces_std")]
        )
        return values, json.dumps(_plain(load_checkpoint(path)), sort_keys=True, default=str)

    reference, plain = answer(model)
    raw = model.read_bytes()
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(
        model
    ) as archive:  # byte ranges of the tensor records (stored, not compressed)
        infos = [i for i in archive.infolist() if "/data/" in i.filename and i.file_size > 0]
    # the data start after the local header: 30 bytes, then the name and extra field, whose
    # lengths (bytes 26-29) differ from the central directory's (torch pads the local one)
    spans = [
        (
            i.header_offset
            + 30
            + int.from_bytes(raw[i.header_offset + 26 : i.header_offset + 28], "little")
            + int.from_bytes(raw[i.header_offset + 28 : i.header_offset + 30], "little"),
            i.file_size,
        )
        for i in infos
    ]
    cases: list[tuple[str, str, bytes | Callable[[Path], None]]] = []
    n = 5 if quick else 20
    for k in range(n):
        start, size = spans[rng.integers(len(spans))]
        cases.append(
            (
                "one bit flipped inside a tensor",
                f"#{k}",
                _flip(raw, start + int(rng.integers(size)), rng),
            )
        )
    for k in range(n):
        cases.append(
            (
                "one bit flipped anywhere in the file",
                f"#{k}",
                _flip(raw, int(rng.integers(len(raw))), rng),
            )
        )
    for frac in (0.0, 0.01, 0.1, 0.5, 0.9, 0.99):
        cases.append(("truncated file", f"{frac:.0%}", raw[: int(frac * len(raw))]))
    cases.append(("truncated file", "last byte cut", raw[:-1]))
    cases.append(("random bytes", "", rng.bytes(len(raw))))
    cases.append(
        ("pickled Python object", "", lambda p: torch.save({"model": torch.nn.Linear(2, 2)}, p))
    )
    cases.append(
        (
            "foreign torch file (not mlip-unc)",
            "",
            lambda p: torch.save({"weights": torch.ones(3)}, p),
        )
    )

    def nan_weights(path: Path) -> None:  # a checkpoint whose digest is valid but weights are NaN
        payload = load_checkpoint(model)
        state = payload["model_state"]
        key = next(
            k
            for k, v in state.items()
            if v.is_floating_point() and v.numel() > 1 and "backbone" in k
        )
        state[key] = torch.full_like(state[key], float("nan"))
        save_checkpoint(
            path, {k: v for k, v in payload.items() if k not in ("sha256", "format", "version")}
        )

    cases.append(("NaN weights saved with a valid digest", "", nan_weights))
    tally: dict[str, dict[str, Any]] = {}
    for fault, _tag, content in cases:
        path = work / "damaged.pt"
        path.unlink(missing_ok=True)
        content(path) if callable(content) else path.write_bytes(content)
        try:
            values, content = answer(path)
            outcome = (
                "same results"
                if np.array_equal(values, reference) and content == plain
                else (
                    "NaN RETURNED"
                    if not np.isfinite(values).all()
                    else "CHANGED RESULTS OR METADATA WITHOUT ERROR"
                )
            )
        except (CheckpointError, NonFiniteResultError) as err:
            outcome = f"{type(err).__name__}" + (
                " (names the file)" if str(path) in str(err) else ""
            )
        except Exception as err:  # noqa: BLE001 - any other exception is a failure of this benchmark
            outcome = f"UNEXPECTED {type(err).__name__}: {err}"
        entry = tally.setdefault(fault, {"tried": 0, "ok": 0, "outcomes": Counter()})
        entry["tried"] += 1
        entry["ok"] += int(
            outcome in ("same results", "CheckpointError (names the file)", "NonFiniteResultError")
        )
        entry["outcomes"][outcome] += 1
    return [
        record(
            "corrupted checkpoint -> calculator",
            fault,
            tried=e["tried"],
            ok=e["ok"],
            detail=", ".join(f"{c} x {o}" for o, c in e["outcomes"].most_common()),
        )
        for fault, e in tally.items()
    ]


def _plain(node: Any) -> Any:
    """``node`` with every tensor replaced by its shape (what the SHA-256 digest does not cover)."""
    if hasattr(node, "shape") and hasattr(node, "dtype"):
        return f"tensor{tuple(node.shape)}"
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items() if k != "sha256"}
    if isinstance(node, (list, tuple)):
        return [_plain(v) for v in node]
    return node


def _flip(raw: bytes, offset: int, rng: Any) -> bytes:
    data = bytearray(raw)
    data[offset] ^= 1 << int(rng.integers(8))
    return bytes(data)


# ============================================================ group 4: bad inputs through the CLI
def bad_inputs(files: dict[str, Path], work: Path, train_run: Path, al_run: Path) -> list[dict]:
    """Each bad input of the reliability list, run through the CLI in this process, outcome checked."""
    import torch
    from typer.testing import CliRunner

    from mlip_unc.cli import app

    runner = CliRunner()
    group = "bad input -> clear outcome"
    out: list[dict] = []

    def cli(*args: Any) -> Any:
        return runner.invoke(app, ["-q", *(str(a) for a in args)])

    def clear(result: Any, *words: str) -> tuple[bool, str]:
        lines = [line for line in result.output.splitlines() if line.startswith("error:")]
        ok = (
            result.exit_code == 1
            and isinstance(result.exception, SystemExit)
            and len(lines) == 1
            and all(w in lines[0] for w in words)
        )
        return ok, (lines[0] if lines else f"exit {result.exit_code}, {result.exception!r}")[:300]

    def check(fault: str, ok_detail: tuple[bool, str], *extra: tuple[bool, str]) -> None:
        ok = ok_detail[0] and all(e[0] for e in extra)
        out.append(
            record(group, fault, ok=ok, detail="; ".join([ok_detail[1], *(e[1] for e in extra)]))
        )

    def same_files(folder: Path, before: dict[str, bytes]) -> tuple[bool, str]:
        now = {
            str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        return now == before, "run folder unchanged" if now == before else "RUN FOLDER CHANGED"

    def snapshot(folder: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }

    train_yaml, model = files["train.yaml"], train_run / "model.pt"
    r = cli(
        "train",
        "-c",
        train_yaml,
        "--out",
        work / "vf0",
        "--set",
        "data.valid_fraction=0",
        "--threads",
        "1",
    )
    hist = (
        json.loads((work / "vf0" / "history.json").read_text())
        if r.exit_code == 0
        else {"epochs": [{}]}
    )
    finite = all(math.isfinite(e.get("valid_loss", math.nan)) for e in hist["epochs"])
    check(
        "train with data.valid_fraction=0",
        (
            r.exit_code == 0 and finite and (work / "vf0" / "model.pt").is_file(),
            f"exit {r.exit_code}; {len(hist['epochs'])} epochs validated on the training set, finite losses: {finite}",
        ),
    )
    r = cli(
        "property",
        "train",
        "--out",
        work / "p_empty",
        "--data",
        files["empty.csv"],
        "--target-column",
        "y",
        "--epochs",
        "1",
    )
    check("property train on a CSV with a header and no rows", clear(r, "empty.csv"))
    r = cli(
        "property",
        "train",
        "--out",
        work / "p",
        "--data",
        files["mols.csv"],
        "--target-column",
        "y",
        "--epochs",
        "1",
    )
    trained = (
        r.exit_code == 0,
        f"a model trained on {files['mols.csv'].name} (exit {r.exit_code})",
    )
    r = cli(
        "property",
        "predict",
        "--model",
        work / "p",
        "--data",
        files["empty.csv"],
        "--out",
        work / "pred.csv",
    )
    check("property predict on a CSV with a header and no rows", clear(r, "empty.csv"), trained)
    before = snapshot(work / "p")
    r = cli(
        "property",
        "train",
        "--out",
        work / "p",
        "--data",
        files["mols.csv"],
        "--target-column",
        "y",
        "--epochs",
        "1",
    )
    check(
        "property train into an existing run folder (no --resume/--overwrite)",
        clear(r, "--overwrite"),
        same_files(work / "p", before),
    )
    for name, extra, words, fault in (
        (
            "arch",
            ["--resume", "--set", "model.latent_dim=6"],
            ("different config",),
            "train --resume with a changed architecture (config.yaml unchanged)",
        ),
        (
            "again",
            [],
            ("--resume", "--overwrite"),
            "train into an existing run folder (no --resume/--overwrite)",
        ),
    ):
        copy = work / f"train_{name}"
        shutil.copytree(train_run, copy)
        before = snapshot(copy)
        r = cli("train", "-c", train_yaml, "--out", copy, "--threads", "1", *extra)
        check(fault, clear(r, *words), same_files(copy, before))
    al_yaml = files["al.yaml"]
    for name, extra, words, fault in (
        (
            "again",
            [],
            ("--resume", "--overwrite"),
            "active-learn into an existing run folder (no --resume/--overwrite)",
        ),
        (
            "changed",
            ["--resume", "--set", "rounds=3"],
            ("config differs", "rounds"),
            "active-learn --resume with a changed config",
        ),
    ):
        copy = work / f"al_{name}"
        shutil.copytree(al_run, copy)
        before = snapshot(copy)
        r = cli("active-learn", "-c", al_yaml, "--out", copy, *extra)
        check(fault, clear(r, *words), same_files(copy, before))
    r = cli("eval", "--model", model, "--data", files["no_forces.xyz"], "--out", work / "m.json")
    warned = [line for line in r.output.splitlines() if line.startswith("warning:")]
    metrics = json.loads((work / "m.json").read_text()) if r.exit_code == 0 else {}
    check(
        "eval on frames lacking forces",
        (
            r.exit_code == 0
            and len(warned) == 1
            and "1 no forces" in warned[0]
            and metrics.get("n_frames_without_forces") == 1,
            (warned or [f"exit {r.exit_code}, no warning"])[0],
        ),
    )
    torch.save({"model": torch.nn.Linear(2, 2)}, work / "pickled.pt")
    check(
        "eval with a pickled-object checkpoint (refused)",
        clear(
            cli("eval", "--model", work / "pickled.pt", "--data", files["test.xyz"]),
            "pickled Python objects",
        ),
    )
    raw = model.read_bytes()
    (work / "truncated.pt").write_bytes(raw[: len(raw) // 2])
    check(
        "eval with a truncated checkpoint",
        clear(
            cli("eval", "--model", work / "truncated.pt", "--data", files["test.xyz"]),
            "truncated or corrupted",
        ),
    )
    r = cli(
        "md",
        "--model",
        model,
        "--structure",
        files["overlap.xyz"],
        "--steps",
        "4",
        "--interval",
        "2",
        "--out",
        work / "md_overlap",
    )
    failed = (
        work / "md_overlap" / "failed.xyz"
    ).is_file()  # the run ends, the failed frame is kept
    said = [line for line in r.output.splitlines() if "coincident" in line]
    check(
        "md from a structure with coincident atoms",
        (
            r.exit_code == 0 and failed and bool(said),
            f"exit {r.exit_code}; failed.xyz written: {failed}; {(said or ['no message'])[0][:200]}",
        ),
    )
    from ase.io import read

    from mlip_unc.calculator import UncertaintyCalculator
    from mlip_unc.data.domain import CoincidentAtomsError

    try:
        UncertaintyCalculator(model).get_forces(read(files["overlap.xyz"]))
        check("calculator on coincident atoms", (False, "NO ERROR"))
    except CoincidentAtomsError as err:
        check("calculator on coincident atoms", (True, f"CoincidentAtomsError: {err}"[:250]))
    check(
        "train with a missing data file",
        clear(
            cli(
                "train",
                "-c",
                train_yaml,
                "--out",
                work / "missing",
                "--set",
                f"data.train={work / 'nope.xyz'}",
            ),
            "nope.xyz",
        ),
    )
    check(
        "train with a misspelt config key",
        clear(
            cli("train", "-c", train_yaml, "--out", work / "typo", "--set", "train.epochz=3"),
            "epochz",
        ),
    )
    return out


# ============================================================ group 5: fuzzing
def fuzz(model: Path, n: int) -> list[dict]:
    """``n`` structures of the fuzz strategy through the calculator and ``atoms_to_graph``."""
    import importlib.util

    import numpy as np
    from hypothesis import HealthCheck, Phase, given, settings

    from mlip_unc.calculator import NonFiniteResultError, UncertaintyCalculator
    from mlip_unc.data.graphs import atoms_to_graph
    from mlip_unc.data.typemap import TypeMap

    spec = importlib.util.spec_from_file_location(
        "fuzz_strategies", REPO / "tests" / "test_fuzz_calculator.py"
    )
    strategies = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(strategies)
    calc = UncertaintyCalculator(model)
    type_map = TypeMap.from_list(calc.model.type_map)
    tally = {"calculator": Counter(), "graph builder": Counter()}
    slowest = [0.0]

    def hang(*_: Any) -> None:
        raise TimeoutError("over 60 s")

    def outcome(work: Callable[[], dict[str, Any]]) -> str:
        signal.signal(signal.SIGALRM, hang)
        signal.alarm(60)
        try:
            values = work()
        except (ValueError, NonFiniteResultError) as err:
            return f"clear error ({type(err).__name__})"
        except Exception as err:  # noqa: BLE001 - counted as a failure
            return f"FAILURE ({type(err).__name__}: {str(err)[:80]})"
        finally:
            signal.alarm(0)
        return (
            "finite results"
            if all(np.isfinite(np.asarray(v, dtype=float)).all() for v in values.values())
            else "FAILURE (non-finite results)"
        )

    def through_calculator(atoms: Any) -> dict[str, Any]:
        calc.calculate(atoms, ["energy", "forces", "forces_std", "energy_std"])
        return {k: calc.results[k] for k in ("energy", "forces", "forces_std", "energy_std")}

    def through_graph(atoms: Any) -> dict[str, Any]:
        graph = atoms_to_graph(atoms, calc.model.r_max, type_map)
        return {
            k: v.numpy()
            for k, v in graph.to_dict().items()
            if hasattr(v, "is_floating_point") and v.is_floating_point()
        }

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(atoms=strategies.structures())
    def one(atoms: Any) -> None:
        t0 = time.monotonic()
        tally["calculator"][outcome(lambda: through_calculator(atoms.copy()))] += 1
        tally["graph builder"][outcome(lambda: through_graph(atoms.copy()))] += 1
        slowest[0] = max(slowest[0], time.monotonic() - t0)

    one()
    return [
        record(
            "fuzzed structures (hypothesis, derandomised)",
            f"random structures -> {name}",
            tried=sum(c.values()),
            ok=sum(v for k, v in c.items() if not k.startswith("FAILURE")),
            detail=", ".join(f"{v} {k}" for k, v in c.most_common())
            + f"; slowest structure {slowest[0]:.2f} s",
        )
        for name, c in tally.items()
    ]
