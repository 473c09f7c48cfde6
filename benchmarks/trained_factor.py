"""Issue 11's last route: a low-rank posterior factor trained end to end (a shallow ensemble).

The shipped single model learns its features for the mean (Bayes-by-Backprop: one weight draw per
structure, the likelihood's variance the noise alone) and gets its force uncertainty after training
(the last-layer posterior, benchmarks/force_uncertainty.py). Kellner & Ceriotti (2024) train the
uncertainty with the model instead: a shallow ensemble of last layers on shared features, fitted by the
NLL of the ensemble's own mean and variance, so the features themselves learn to make the spread track
the errors. Here that ensemble is kept in mean/deviation form, which is exactly what the low-rank mode
evaluates::

    E = Phi . mu + offsets,   Var_epi E = sum_k (Phi_b . u_k)^2,   Var_epi F_i = sum_k (J_i^T u_k)^2

with ``mu`` the MAP head, ``U (K, D)`` a trained factor in the posterior's basis (``Phi_b``: per element
when the config says so) and ``J`` the position Jacobian of ``Phi_b``. The loss is the Gaussian NLL of
energies and forces under variance ``Var_epi + noise`` (the predictive NLL; the noises stay learnable),
so it needs K + 1 vector-Jacobian products per step with ``create_graph`` (the shipped training needs
one). After training ``U`` is attached as the model's full posterior (factor rows ``U``, zeros beyond,
every calibration scale 1, the learned noises), so the ``lowrank`` mode at rank K evaluates exactly the
trained ensemble, at the cost the shipped default has at that rank.

For each finished run of benchmarks/force_uncertainty.py (``--runs``, one dataset) the model is trained
with the run's config, data, validation split, seed and budget (``model.head=map``), evaluated on the
run's in-domain and OOD frames as the run's rows, and issue 11's ranking lines are applied against the
run's committee5 (committee A) and, where benchmarks/committee_floor.py trained it, committee B. Two rows:
``trained_factor`` (the factor above) and ``trained_factor_llpr`` (the shipped last-layer posterior
fitted post hoc on the same model, rank K), which separates "the features changed" from "the factor
changed". Cost: plain E+F against the lowrank mode on the run's timing frames, interleaved, in the same
process. Steps go to ``RUN/trained_factor.jsonl`` (resumable), results to ``OUT/trained_factor.{md,json}``.

    python benchmarks/trained_factor.py --runs benchmarks/results/force_uncertainty_seeds/seed1
    python benchmarks/trained_factor.py --quick --out /tmp/tf_quick
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.loader import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import committee_floor as cf
import force_uncertainty as fu

from mlip_unc import keys
from mlip_unc.atomic import atomic_write_text
from mlip_unc.models.checkpoint import load_checkpoint, save_checkpoint
from mlip_unc.models.derivatives import forces_and_stress
from mlip_unc.models.full_posterior import basis_mean, basis_state
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.train.core import Trainer
from mlip_unc.train.losses import likelihood_terms, potential_loss
from mlip_unc.train.posterior import fit_full_posterior
from mlip_unc.train.potential import PotentialTask, finalize_checkpoint
from mlip_unc.train.potential_data import prepare_data
from mlip_unc.uncertainty import moments

log = logging.getLogger("trained_factor")
ROWS = ("trained_factor", "trained_factor_llpr")
FACTOR_FILE = "factor.pt"
INIT_SCALE = (
    1e-2  # initial factor entries ~ N(0, INIT_SCALE^2 / D): the epistemic term starts near zero
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--runs", nargs="*", type=Path, default=[], help="force_uncertainty.py --out folders"
    )
    p.add_argument("--dataset", default="3bpa")
    p.add_argument(
        "--rank",
        type=int,
        default=4,
        help="K: rows of the trained factor (the shipped lowrank rank)",
    )
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--train-only", action="store_true", help="train (and record) the runs' models, then stop"
    )
    args = fu.parse_with_quick(
        p,
        argv,
        "a quick force_uncertainty run on tiny EMT Cu data made here, then this; needs --out",
    )
    if args.quick:
        args.dataset = "cu_emt"
    if not args.runs and not args.quick:
        p.error("give --runs (or --quick)")
    if args.rank < 1:
        p.error("--rank must be >= 1")
    return args


def factor_forward(
    model: BayesianPotential, batch: Any, factor: Tensor, blocks: int, *, create_graph: bool = False
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Energies and forces at the MAP head ``mu`` and the epistemic variances of the factor ``(K, D)``:
    ``{ENERGY: (n_graphs,) sum_k (Phi_b . u_k)^2, FORCES: (n_atoms, 3) sum_k (J^T u_k)^2}``, from K + 1
    vector-Jacobian products (``create_graph``: differentiable, for the loss)."""
    with torch.enable_grad():
        state = model._state(batch, forces=True, stress=False)
        if state.base_energy is not None:
            raise ValueError("the trained factor needs a backbone without its own energies")
        mu = model.head.weight_mu[0]  # (d,)
        out = model._energies(state, weights=mu)
        b = basis_state(state, blocks)
        rows = torch.cat([basis_mean(mu, blocks)[None], factor])  # (K + 1, D)
        (grads,) = moments.linear_gradients(
            b.phi,
            state.inputs,
            rows,
            method=model.gradient_method,
            create_graph=create_graph,
            retain_graph=create_graph,
        )  # (K + 1, n_atoms, 3)
        out.update(forces_and_stress(state, [grads[0]]))
    epistemic = {
        keys.ENERGY: (b.phi @ factor.T).square().sum(-1),
        keys.FORCES: grads[1:].square().sum(0),
    }
    return out, epistemic


class FactorTask(PotentialTask):
    """The potential task with a trained factor ``U (K, D)`` and the predictive NLL (module docstring)."""

    def __init__(self, config: Any, data: Any, out: Path, rank: int) -> None:
        super().__init__(config, data, out)
        model = self.model
        model.posterior_basis = config.model.posterior_basis.value
        self.blocks = model.posterior_blocks
        gen = torch.Generator().manual_seed(config.seed)
        width = model.posterior_width
        init = (
            INIT_SCALE * torch.randn(rank, width, generator=gen, dtype=torch.float64) / width**0.5
        )
        model.trained_factor = nn.Parameter(
            init.to(model.dtype)
        )  # (K, D); trained with the model, EMA'd

    def loss(self, batch: Any, step: Any) -> tuple[Tensor, dict[str, float]]:
        model, config = self.model, self.config
        self.stage, self.weights = config.loss.weights(step.progress)
        out, epistemic = factor_forward(
            model, batch, model.trained_factor, self.blocks, create_graph=True
        )
        noise = model.noise_variances(batch)
        total = {k: noise[k] + epistemic[k] for k in (keys.ENERGY, keys.FORCES)}
        nll = likelihood_terms(out, batch, total, energy_per_atom=self.energy_per_atom)
        parts = potential_loss(nll, self.weights)
        terms = {name: float(value.detach()) for name, value in parts.items() if name != "loss"}
        terms.update({f"{name}_nll": float(value.detach()) for name, value in nll.items()})
        terms["factor_norm"] = float(model.trained_factor.detach().norm())
        return parts["loss"], terms

    def validate(self) -> dict[str, float]:
        """The shipped validation metrics, with ``valid_loss`` (which picks the best epoch) the
        training objective on the validation frames: the NLL under the factor's variance plus the noise
        (under the noise alone, as the shipped task has it, the best epoch came early: the noise shrinks
        as the factor takes over the variance)."""
        metrics = super().validate()
        model, dataset = (
            self.model,
            self.data.valid if self.data.valid is not None else self.data.train,
        )
        total, count = 0.0, 0
        for batch in DataLoader(
            list(dataset.graphs), batch_size=self.config.train.valid_batch_size
        ):
            out, epistemic = factor_forward(
                model, batch, model.trained_factor.detach(), self.blocks
            )
            with torch.no_grad():
                noise = model.noise_variances(batch)
                var = {k: noise[k] + epistemic[k] for k in (keys.ENERGY, keys.FORCES)}
                nll = likelihood_terms(out, batch, var, energy_per_atom=self.energy_per_atom)
                total += batch.num_graphs * float(
                    sum(self.weights.get(k, 0.0) * v for k, v in nll.items())
                )
            count += batch.num_graphs
        return {
            **metrics,
            "valid_loss_noise_only": metrics["valid_loss"],
            "valid_loss": total / max(count, 1),
        }

    def on_best(self, state: dict[str, Tensor], epoch: int) -> None:
        state = dict(state)
        save_checkpoint(
            self.out / FACTOR_FILE,
            {
                "factor": state.pop("trained_factor").detach().cpu().clone(),
                "basis": self.model.posterior_basis,
                "epoch": epoch,
            },
        )
        trained = self.model._parameters.pop(
            "trained_factor"
        )  # the checkpoint holds the model alone
        try:
            super().on_best(state, epoch)
        finally:
            self.model._parameters["trained_factor"] = trained


def train_model(
    run: Path,
    settings: argparse.Namespace,
    steps: fu.Steps,
    args: argparse.Namespace,
    split: dict[str, Any],
) -> Path:
    """The run's single-model config with a MAP head and the trained factor, once."""
    out = run / "checkpoints" / "force_uncertainty" / f"{args.dataset}_trained_factor{args.rank}"
    if steps.get(f"train:{args.dataset}:{args.rank}"):
        return out
    map_head = argparse.Namespace(
        **{**vars(settings), "overrides": [*settings.overrides, "model.head=map"]}
    )
    config = fu.train_config(split, map_head, out, 1)
    data = prepare_data(config)
    log.info("[%s] trained factor K=%d, %.3g min", run, args.rank, settings.budget_minutes)
    task = FactorTask(config, data, out, args.rank)
    trainer = Trainer(
        task, config.train, seed=config.seed, out=out, history_extra=task.history_extra
    )
    result = trainer.fit(resume=False, overwrite=True)
    finalize_checkpoint(
        out / "model.pt", config, data
    )  # offsets refitted, domain guard (no posterior: MAP head)
    for last in out.rglob("last.pt"):
        last.unlink()
    hist = result.history
    steps.add(
        f"train:{args.dataset}:{args.rank}",
        {
            "train_minutes": result.minutes,
            "best_epoch": result.best_epoch,
            "epochs": len(hist),
            "last": {
                k: v for k, v in (hist[-1] if hist else {}).items() if isinstance(v, (int, float))
            },
        },
    )
    return out


def trained_model(folder: Path, rank: int) -> BayesianPotential:
    """The trained model with its factor attached as the full posterior (rank K, scales 1, learned noises)."""
    model = BayesianPotential.from_checkpoint(folder / "model.pt")
    saved = load_checkpoint(folder / FACTOR_FILE)
    model.posterior_basis, model.posterior_rank = saved["basis"], rank
    width = model.posterior_width
    factor = torch.zeros(width, width, dtype=torch.float64)
    factor[:rank] = saved["factor"].to(torch.float64)
    noise = [float(model.energy_noise.detach()) ** 2, float(model.force_noise.detach()) ** 2]
    model.set_full_posterior(factor, torch.tensor([1.0, 1.0, *noise, 1.0], dtype=torch.float64))
    return model.eval()


def llpr_model(
    folder: Path, rank: int, config: Any, data: Any
) -> tuple[BayesianPotential, dict[str, Any]]:
    """The same model with the shipped last-layer posterior fitted post hoc (rank K, the config's basis)."""
    model = BayesianPotential.from_checkpoint(folder / "model.pt")
    model.posterior_basis, model.posterior_rank = config.model.posterior_basis.value, rank
    summary = fit_full_posterior(
        model, data.train.graphs, data.valid, batch_size=config.train.valid_batch_size
    )
    return model.eval(), {k: v for k, v in summary.items() if isinstance(v, (int, float, str))}


def evaluate(
    run: Path,
    settings: argparse.Namespace,
    steps: fu.Steps,
    args: argparse.Namespace,
    split: dict[str, Any],
    folder: Path,
) -> None:
    """Both rows on the run's in-domain and OOD frames, and the cost of the lowrank mode."""
    name, ev = args.dataset, argparse.Namespace(n_samples=4, seed=settings.seed)
    model = trained_model(folder, args.rank)
    sets = {
        p: fu.load_frames(split[k], model, split, None) for p, k in (("in", "test"), ("ood", "ood"))
    }
    sets = {p: d for p, d in sets.items() if d is not None}
    if not steps.get(f"eval:{name}:trained_factor"):
        steps.add(
            f"eval:{name}:trained_factor",
            {p: fu.frame_values(model, d, "lowrank", ev) for p, d in sets.items()},
        )
    if not steps.get(f"eval:{name}:trained_factor_llpr"):
        config = fu.train_config(split, settings, folder, 1)
        llpr, summary = llpr_model(folder, args.rank, config, prepare_data(config))
        record = {p: fu.frame_values(llpr, d, "lowrank", ev) for p, d in sets.items()}
        steps.add(f"eval:{name}:trained_factor_llpr", {**record, "posterior": summary})
    if not steps.get(f"cost:{name}"):
        calls = {
            m: (lambda g, m=m: model(g, compute_forces=True, uncertainty=m))
            for m in ("none", "lowrank")
        }
        graphs = sets["in"].graphs[:20]
        ms = fu.time_calls(calls, graphs)
        steps.add(
            f"cost:{name}",
            {"ms": ms, "n_frames": len(graphs), "cost_ratio": ms["lowrank"] / ms["none"]},
        )


def run_summary(run: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """One run's rows (its default, committee A, B where trained, the two trained-factor rows) and the lines."""
    name, path = args.dataset, run / "trained_factor.jsonl"
    if not path.is_file():
        return None
    steps = fu.Steps(path, step_settings(cf.run_settings(run, args), args))
    if not all(steps.get(f"eval:{name}:{row}") for row in ROWS) or not steps.get(f"cost:{name}"):
        return None
    entry = json.loads((run / "force_uncertainty.json").read_text())[name]
    cost = steps.get(f"cost:{name}")["cost_ratio"]
    rows = {
        "default": entry[entry["default"]],
        "committee5": entry["committee5"],
        **cf.baseline_rows(entry),
    }
    rows.update(
        {
            row: fu.row_metrics(
                steps.get(f"eval:{name}:{row}")["in"],
                steps.get(f"eval:{name}:{row}").get("ood"),
                cost if row == "trained_factor" else None,
            )
            for row in ROWS
        }
    )
    if (b := cf.committee_b_row(run, args)) is not None:
        rows["committee5_b"] = b
    lines = {
        f"{row}_vs_{ref}": cf.lines_met(rows[row], rows[ref])
        for row in ("default", *ROWS)
        for ref in ("committee5", "committee5_b")
        if ref in rows
    }
    trained = steps.get(f"train:{name}:{args.rank}")
    return {
        "run": str(run),
        "seed": cf.run_settings(run, args).seed,
        "rank": args.rank,
        "rows": rows,
        "lines": lines,
        "train": trained,
        "cost_ms": steps.get(f"cost:{name}")["ms"],
        "llpr_posterior": steps.get(f"eval:{name}:trained_factor_llpr").get("posterior"),
        "auroc_ood_of_error": {
            row: cf.error_auroc(steps.get(f"eval:{name}:{row}")) for row in ROWS
        },
    }


def step_settings(settings: argparse.Namespace, args: argparse.Namespace) -> dict[str, Any]:
    return {**cf.floor_settings(settings), "rank": args.rank}


def write_markdown(summary: dict[str, Any], path: Path) -> None:
    runs, f3 = summary["runs"], fu._f3
    cols = ("default", "committee5", "committee5_b", *cf.BASELINES, *ROWS)
    lines = [
        f"# A low-rank factor trained end to end (shallow ensemble), {summary['dataset']}",
        "",
        f"Commands: {'; '.join(f'`{c}`' for c in summary['commands'])} (updated {summary['updated']}; "
        f"status {summary['status']}).",
        "",
        (
            "Per run of benchmarks/force_uncertainty.py: its default row and committee5 (A), committee B of "
            "benchmarks/committee_floor.py where trained, and a model of the same config, data, seed and budget "
            f"with a MAP head and a rank-{summary['rank']} factor trained with the predictive NLL "
            "(trained_factor; benchmarks/trained_factor.py docstring), with the shipped last-layer posterior "
            "fitted post hoc on that same model beside it (trained_factor_llpr); force_magnitude (|F_pred|) and "
            "latent_distance are the run's own baseline rows on the same frames. Lines (issue 11): in-domain "
            "Spearman >= committee - 0.05; partial Spearman given |F_pred| >= committee - 0.05 and >= 0.3; OOD "
            "AUROC >= committee - 0.03."
        ),
        "",
        "| run | seed | row | in-domain | partial | AUROC OOD | std/RMSE | cost ratio | F MAE (meV/A) "
        "| lines vs A | lines vs B |",
        "|---" * 11 + "|",
    ]
    for r in runs:
        for row in cols:
            if row not in r["rows"]:
                continue
            v = r["rows"][row]
            checks = []
            for ref in ("committee5", "committee5_b"):
                checks.append(cf.verdict(r["lines"].get(f"{row}_vs_{ref}")))
            cells = [
                f3(v.get(k))
                for k in (
                    "spearman_frame_in_domain",
                    "partial_spearman_given_force",
                    "auroc_ood",
                    "std_over_rmse",
                    "cost_ratio",
                )
            ] + [f"{v['force_mae_meV_A']:.1f}"]
            lines.append(
                f"| {r['run']} | {r['seed']} | {row} | " + " | ".join(cells + checks) + " |"
            )
    lines += [
        "",
        "Runs in which all three ranking lines hold, against committee A (the issue's test):",
    ]
    for row in ("default", *ROWS):
        lines.append(
            f"- {row}: {sum(r['lines'][f'{row}_vs_committee5']['all'] for r in runs)} of {len(runs)}"
        )
    lines += [
        "",
        "Training of the trained-factor model per run: "
        + "; ".join(
            f"seed {r['seed']}: {r['train']['train_minutes']:.2f} min, {r['train']['epochs']} epochs, best {r['train']['best_epoch']}"
            for r in runs
        ),
    ]
    atomic_write_text(path, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    runs = cf.run_folders(args)
    for run, settings, steps, split in cf.each_run(
        args, argv, "trained_factor", runs, {"rank": args.rank}
    ):
        folder = train_model(run, settings, steps, args, split)
        if not args.train_only:
            evaluate(run, settings, steps, args, split, folder)
    return cf.summarise_runs(
        args, runs, "trained_factor", run_summary, write_markdown, rank=args.rank
    )


if __name__ == "__main__":
    main()
