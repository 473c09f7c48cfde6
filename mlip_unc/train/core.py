"""The one training core: epochs, optimiser and schedule, EMA, early stopping, time budget,
resumable checkpoints, progress and logging. Every task (property model, potential) only
supplies its batch -> loss step and its validation (:class:`Task`).

Per step the task gets the fractional epoch ``epoch + batch / n_batches`` (KL ramp, regulariser
schedule), the progress fraction (loss stages) and the posterior draws' generator. The core:

* Adam on the trainable parameters (:mod:`mlip_unc.train.optim`): weight decay on the
  deterministic parameters only (the Bayesian layers are regularised by their KL);
* ``lr_schedule``: constant, plateau (after each validation) or cosine (every step, from the
  progress fraction; ends at ``min_lr``). Progress counts epochs (``schedule_clock: epochs``,
  the default), so the same config and seed train the same model on a busy machine and
  ``max_minutes`` only stops the run; ``schedule_clock: wall`` takes the larger of the epoch
  and wall-time fractions (a budget-limited run still completes its schedule);
* optional EMA of the weights (``swa_utils.AveragedModel``), for validation and the best model;
* early stopping on the validation metric; the best weights (of the last validation ``phase``)
  are loaded at the end; the task writes ``model.pt`` from them once its post-training fits
  are done, so a run folder holds a ``model.pt`` only when it is complete (a fresh run with
  ``overwrite`` removes the previous one first);
* ``out/last.pt`` after every epoch: model, optimiser, scheduler, EMA, generators, torch's
  RNG (dropout), history and stopping state, so ``resume`` continues exactly; it refuses a
  checkpoint written for another architecture or training config. Ctrl-C raises
  :class:`TrainingInterrupted` (a ``KeyboardInterrupt``) that names the folder and the epoch
  ``last.pt`` holds;
* torch's global RNG is forked (the caller's is untouched); on ``device``
  (:mod:`mlip_unc.train.device`) live the model, EMA, optimiser state, batches and posterior
  draws; the shuffling generator stays on the CPU;
* under torchrun, :mod:`mlip_unc.train.distributed` (sharding, gradient all-reduce, rank 0
  validates and writes; ranks > 0 draw from ``worker_seed``): the checkpoint is rank 0's
  state and does not depend on the number of processes.
"""

from __future__ import annotations

import copy
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel
from torch_geometric.loader import DataLoader
from tqdm.auto import tqdm

from mlip_unc.atomic_write import remove_stale_temps
from mlip_unc.config.enums import LRSchedule, ScheduleClock
from mlip_unc.config.training import TrainCoreConfig
from mlip_unc.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from mlip_unc.models.devices import to_device
from mlip_unc.train import distributed as dist
from mlip_unc.train.device import resolve_device
from mlip_unc.train.optim import make_ema_avg_fn, make_optimizer
from mlip_unc.train.task import FitResult, Step, Task
from mlip_unc.train.text_files import write_json

__all__ = [
    "Task",
    "Step",
    "FitResult",
    "Trainer",
    "TrainingInterrupted",
    "LAST_FILE",
    "HISTORY_FILE",
    "MODEL_FILE",
]

log = logging.getLogger(__name__)

LAST_FILE = "last.pt"
HISTORY_FILE = "history.json"
MODEL_FILE = "model.pt"
EpochCallback = Callable[[int, dict[str, Any]], None]


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during a training run: no ``model.pt`` was written for it.

    ``out``: the run folder (None: nothing is written); ``epoch``: the epochs its ``last.pt``
    holds (None: none finished, nothing to resume)."""

    def __init__(self, out: Path | None, epoch: int | None) -> None:
        self.out, self.epoch = out, epoch
        where = "nothing was written" if out is None else f"no {MODEL_FILE} was written in {out}"
        state = (
            f"{LAST_FILE} holds {epoch} epoch(s) to resume from"
            if out is not None and epoch
            else "no epoch finished, so there is nothing to resume"
        )
        super().__init__(f"training interrupted: {where}; {state}")


def _diff(saved: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} (checkpoint) vs {b!r} (now)")
    return out


class Trainer:
    """The loop of :func:`fit` over a :class:`Task` (module docstring).

    Args:
        task: the model, its loss and its validation.
        options: the training core's section of the task's config.
        seed: shuffling (``seed``), posterior draws (``seed + 1``) and torch's forked RNG.
        out: folder of ``last.pt`` and ``history.json`` (None: nothing is written).
        history_extra: called when ``history.json`` is written; its dict is merged in.
    """

    def __init__(
        self,
        task: Task,
        options: TrainCoreConfig,
        *,
        seed: int,
        out: str | Path | None = None,
        history_extra: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.task, self.opts, self.seed = task, options, seed
        self.device = resolve_device(options.device)
        self.model = task.model.to(self.device)  # in place: the task's model is this one
        self.out = None if out is None else Path(out)
        self.history_extra = history_extra or dict
        self.optimizer = make_optimizer(
            self.model, lr=options.lr, weight_decay=options.weight_decay, amsgrad=options.amsgrad
        )
        self.scheduler = None
        if options.lr_schedule is LRSchedule.PLATEAU:
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer,
                factor=options.lr_factor,
                patience=options.lr_patience,
                min_lr=options.lr_floor,
            )
        self.ema = None
        if options.ema_decay:
            self.ema = AveragedModel(
                self.model,
                device=self.device,
                multi_avg_fn=make_ema_avg_fn(  # type: ignore[arg-type]  # lists as torch passes
                    options.ema_decay, warmup=options.ema_warmup
                ),
            )
        self.loader_rng = torch.Generator().manual_seed(seed)  # on the CPU, where the sampler draws
        self.sample_rng = torch.Generator(self.device).manual_seed(seed + 1)
        self.torch_rng: Tensor | None = None
        self.epoch = 0
        self.history: list[dict[str, Any]] = []
        self.initial: dict[str, float] | None = None
        self.best: dict[str, Any] = {"metric": math.inf, "epoch": 0, "bad": 0, "state": None}
        self.elapsed_before, self.start = 0.0, time.monotonic()
        self.rank, self.world = dist.rank(), dist.world_size()
        self.saved_epoch: int | None = None  # the epoch that out/last.pt holds

    def elapsed(self) -> float:
        """Seconds of training, including those before a resume."""
        return self.elapsed_before + time.monotonic() - self.start

    def _clock(self) -> float:
        """:meth:`elapsed` of rank 0 (every rank must call it at the same point)."""
        return dist.broadcast_float(self.elapsed()) if self.world > 1 else self.elapsed()

    def over_budget(self) -> bool:
        minutes = self.opts.max_minutes
        return minutes is not None and self._clock() >= 60.0 * minutes

    def progress(self, epoch: float) -> float:
        """Fraction of training done at the fractional ``epoch``: epoch / ``epochs``, or with
        ``schedule_clock: wall`` and a budget, the larger of that and the wall-time fraction."""
        done = epoch / self.opts.epochs
        if self.opts.schedule_clock is ScheduleClock.WALL and self.opts.max_minutes is not None:
            done = max(done, self._clock() / (60.0 * self.opts.max_minutes))
        return min(done, 1.0)

    def _cosine_lr(self, progress: float) -> None:
        lo, hi = self.opts.lr_floor, self.opts.lr
        lr = lo + 0.5 * (hi - lo) * (1.0 + math.cos(math.pi * progress))
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def stop_reason(self) -> str | None:
        if self.epoch >= self.opts.epochs:
            return "epochs"
        if self.over_budget() and self.epoch > 0:  # a fresh run trains at least one batch
            return "time"
        if self.opts.patience is not None and self.best["bad"] >= self.opts.patience:
            return "early_stopping"
        return None

    # -------------------------------------------------------------- EMA
    def _swap_ema(self) -> None:
        """Exchange the model's parameters with the EMA's (call twice to undo)."""
        if self.ema is None:
            return
        with torch.no_grad():
            for p, q in zip(self.model.parameters(), self.ema.module.parameters(), strict=False):
                tmp = p.detach().clone()
                p.copy_(q)
                q.copy_(tmp)

    def validate(self) -> dict[str, float]:
        """The task's validation with the averaged weights when EMA is on (rank 0's, broadcast)."""
        if self.rank != 0:
            return dist.broadcast_object(None)
        self._swap_ema()
        try:
            metrics = self.task.validate()
        finally:
            self._swap_ema()
        return dist.broadcast_object(metrics) if self.world > 1 else metrics

    def _best_state(self) -> dict[str, Tensor]:
        self._swap_ema()
        try:
            return copy.deepcopy(self.model.state_dict())
        finally:
            self._swap_ema()

    # -------------------------------------------------------------- one epoch
    def _loader(self) -> tuple[DataLoader, int]:
        """This rank's batches and the examples of all ranks; the order of ``shuffle=True``."""
        found = self.task.train_data()  # a sequence is indexed lazily (on-disk sets stay on disk)
        indexable = hasattr(found, "__getitem__") and hasattr(found, "__len__")
        data = found if indexable else list(found)
        mine = dist.ShardSampler(
            len(data), self.rank, self.world, self.loader_rng
        )  # (ceil(n / world),)
        loader = DataLoader(
            data, batch_size=self.opts.batch_size, sampler=mine, generator=self.loader_rng
        )
        return loader, len(mine) * self.world

    def _generator(self) -> torch.Generator:
        """Posterior draws: the run's on rank 0; others (and their dropout) from ``worker_seed``."""
        if self.rank == 0:
            return self.sample_rng
        seed = dist.worker_seed(self.seed + 1, self.epoch, self.rank)
        torch.manual_seed(seed + 1)
        return torch.Generator(self.device).manual_seed(seed)

    def train_epoch(self) -> dict[str, Any]:
        loader, total = self._loader()
        n_batches = len(loader)  # the same on every rank
        generator = self._generator()
        self.model.train()
        sums: dict[str, float] = {}
        done = 0.0  # examples (a float: summed over ranks with the loss sums)
        for i, batch in enumerate(loader):
            batch = to_device(batch, self.device)
            epoch = self.epoch + i / n_batches
            progress = self.progress(epoch)
            if self.opts.lr_schedule is LRSchedule.COSINE:
                self._cosine_lr(progress)
            loss, terms = self.task.loss(
                batch, Step(epoch=epoch, generator=generator, progress=progress)
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            dist.average_gradients(self.model.parameters())  # no-op in one process
            if self.opts.grad_clip is not None:
                nn.utils.clip_grad_norm_(self.model.parameters(), self.opts.grad_clip)
            self.optimizer.step()
            if self.ema is not None:
                self.ema.update_parameters(self.model)
            n = int(getattr(batch, "num_graphs", 1))
            for name, value in {"loss": float(loss.detach()), **terms}.items():
                sums[name] = sums.get(name, 0.0) + value * n
            done += n
            if self.over_budget():
                break
        if self.world > 1:  # example-weighted means over all ranks
            names = sorted(sums)
            *values, done = dist.all_reduce_sum([sums[k] for k in names] + [done])
            sums = dict(zip(names, values, strict=False))
        record: dict[str, Any] = {f"train_{k}": v / max(done, 1) for k, v in sums.items()}
        record["partial"] = done < total
        return record

    def _after_validation(self, record: dict[str, Any]) -> None:
        metric, phase = float(record[self.task.metric_key]), int(record.get("phase", 0))
        if phase != self.best.get("phase", 0):  # the loss changed: keep this phase's best model
            self.best.update(metric=math.inf, bad=0, phase=phase)
        if metric < self.best["metric"] or self.best["state"] is None:
            self.best.update(metric=metric, epoch=self.epoch, bad=0, state=self._best_state())
            on_best = getattr(self.task, "on_best", None)
            if on_best is not None and self.rank == 0:
                on_best(self.best["state"], self.epoch)
        else:
            self.best["bad"] += self.opts.eval_every
        if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.scheduler.step(metric)

    def run_epoch(self) -> dict[str, Any]:
        t0 = time.monotonic()
        record = self.train_epoch()
        record["lr"] = self.optimizer.param_groups[0]["lr"]
        self.epoch += 1
        if (
            self.epoch % self.opts.eval_every == 0
            or self.epoch >= self.opts.epochs
            or record["partial"]
        ):
            record.update(self.validate())
            self._after_validation(record)
        record.update(epoch=self.epoch, seconds=time.monotonic() - t0, elapsed_s=self.elapsed())
        self.history.append(record)
        log.info("epoch %d: %s", self.epoch, _describe(record))
        return record

    # -------------------------------------------------------------- checkpoints
    def state_dict(self, stop_reason: str | None) -> dict[str, Any]:
        return {
            "kind": "training",
            "signature": self.task.signature(),
            "model_state": self.model.state_dict(),
            "optimizer_state": self.optimizer.state_dict(),
            "scheduler_state": None if self.scheduler is None else self.scheduler.state_dict(),
            "ema_state": None if self.ema is None else self.ema.state_dict(),
            "epoch": self.epoch,
            "history": self.history,
            "initial": self.initial,
            "best": {k: v for k, v in self.best.items() if k != "state"},
            "best_state": self.best["state"],
            "rng": {
                "loader": self.loader_rng.get_state(),
                "sample": self.sample_rng.get_state(),
                "torch": torch.get_rng_state(),
            },
            "elapsed_s": self.elapsed(),
            "stop_reason": stop_reason,
            "task_state": getattr(self.task, "extra_state", dict)(),
        }

    def restore(self, path: Path) -> None:
        """Continue from ``path``; :class:`CheckpointError` when it belongs to another run."""
        state = load_checkpoint(path, kind="training")
        diffs = _diff(state.get("signature") or {}, self.task.signature())
        if diffs:
            raise CheckpointError(
                f"{path} was written with a different config: {'; '.join(diffs[:5])}"
            )
        self.model.load_state_dict(state["model_state"])
        self.optimizer.load_state_dict(state["optimizer_state"])
        if self.scheduler is not None and state["scheduler_state"] is not None:
            self.scheduler.load_state_dict(state["scheduler_state"])
        if self.ema is not None and state["ema_state"] is not None:
            self.ema.load_state_dict(state["ema_state"])
        self.epoch, self.history, self.initial = (
            int(state["epoch"]),
            list(state["history"]),
            state["initial"],
        )
        self.best = {**state["best"], "state": state["best_state"]}
        self.loader_rng.set_state(state["rng"]["loader"])
        try:
            self.sample_rng.set_state(state["rng"]["sample"])
        except RuntimeError:  # written on another kind of device (CPU and CUDA states differ)
            self.sample_rng.manual_seed(self.seed + 1 + self.epoch)
            log.warning(
                "%s was written on another device: the posterior draws continue from a new seed",
                path,
            )
        self.torch_rng = state["rng"]["torch"]
        self.elapsed_before, self.start = float(state["elapsed_s"]), time.monotonic()
        self.saved_epoch = self.epoch
        load_extra = getattr(self.task, "load_extra_state", None)
        if load_extra is not None and load_extra(state.get("task_state") or {}) is False:
            self.best.update(metric=math.inf, epoch=0, bad=0, state=None)
            log.warning(
                "the data differ from the run in %s: best-on-validation tracking restarts", path
            )
        log.info("resumed from %s at epoch %d", path, self.epoch)

    def _write(self, stop_reason: str | None) -> None:
        if self.out is None or self.rank != 0:
            return
        save_checkpoint(self.out / LAST_FILE, self.state_dict(stop_reason))
        self.saved_epoch = self.epoch
        write_json(
            self.out / HISTORY_FILE,
            {
                **self.history_extra(),
                "initial": self.initial,
                "epochs": self.history,
                "best_epoch": self.best["epoch"],
                "best_metric": _finite(self.best["metric"]),
                "metric": self.task.metric_key,
                "stop_reason": stop_reason,
                "train_minutes": self.elapsed() / 60.0,
            },
        )

    # -------------------------------------------------------------- the loop
    def fit(
        self,
        *,
        resume: bool = False,
        overwrite: bool = False,
        stop_after: int | None = None,
        callbacks: Sequence[EpochCallback] = (),
    ) -> FitResult:
        """Train until ``epochs``, the time budget, early stopping or ``stop_after`` epochs of
        this call; then load the best weights. ``callbacks`` run after each epoch's checkpoint
        (an exception there aborts the run like a kill). A folder that holds a run (``last.pt``)
        is continued with ``resume``, replaced with ``overwrite`` (its ``model.pt`` is removed
        at the start), and otherwise refused. Ctrl-C raises :class:`TrainingInterrupted`."""
        with torch.random.fork_rng(
            devices=[self.device.index] if self.device.type == "cuda" else []
        ):
            torch.manual_seed(self.seed)
            last = None if self.out is None else self.out / LAST_FILE
            if last is not None and last.is_file() and not (resume or overwrite):
                raise FileExistsError(
                    f"{self.out} already holds a training run; continue it with --resume "
                    "or replace it with --overwrite"
                )
            if self.rank == 0:
                remove_stale_temps(self.out)  # temporary files of writes killed mid-way (kill -9)
            if resume and last is not None and last.is_file():
                self.restore(last)
                if self.torch_rng is not None:
                    torch.set_rng_state(self.torch_rng)
            elif overwrite and self.out is not None and self.rank == 0:
                # the replaced run's model must not outlive it (an interrupted new run has none)
                (self.out / MODEL_FILE).unlink(missing_ok=True)
            if not dist.all_equal(self.epoch):
                raise CheckpointError(
                    f"the ranks found different runs in {self.out}: it must be one shared folder"
                )
            dist.broadcast_module(self.model)  # identical start on every rank (seeded anyway)
            on_start = getattr(self.task, "on_start", None)
            if on_start is not None and self.rank == 0:  # after the resume check: write config.yaml
                on_start()
            try:
                return self._loop(stop_after, callbacks)
            except TrainingInterrupted:
                raise
            except KeyboardInterrupt as err:
                raise TrainingInterrupted(self.out, self.saved_epoch) from err

    def _loop(self, stop_after: int | None, callbacks: Sequence[EpochCallback]) -> FitResult:
        if self.initial is None and not self.history:
            self.initial = self.validate()
            log.info("initial: %s", _describe(self.initial))
        first = self.epoch
        show = (
            self.opts.progress if self.opts.progress is not None else sys.stderr.isatty()
        ) and self.rank == 0
        bar = tqdm(
            total=self.opts.epochs,
            initial=self.epoch,
            disable=not show,
            desc="train",
            unit="epoch",
            leave=False,
        )
        try:
            reason = self.stop_reason()
            while reason is None:
                if stop_after is not None and self.epoch - first >= stop_after:
                    reason = "interrupted"
                    break
                record = self.run_epoch()
                reason = self.stop_reason()
                self._write(reason)
                bar.update(1)
                bar.set_postfix_str(_describe(record), refresh=False)
                for callback in callbacks:
                    callback(self.epoch - 1, record)
        finally:
            bar.close()
        if reason != "interrupted":
            if self.best["state"] is not None:
                self.model.load_state_dict(self.best["state"])
            on_end = getattr(self.task, "on_end", None)
            if on_end is not None and self.rank == 0:  # e.g. the last-layer Laplace fit
                on_end()
        log.info(
            "stopped (%s) after %d epochs, %.2f min; best epoch %d",
            reason,
            self.epoch,
            self.elapsed() / 60,
            self.best["epoch"],
        )
        return FitResult(
            history=self.history,
            best_epoch=int(self.best["epoch"]),
            best_metric=float(self.best["metric"]),
            epochs_run=self.epoch,
            stop_reason=reason,
            minutes=self.elapsed() / 60.0,
            initial=self.initial,
        )


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


_SHOWN = (
    ("train_loss", "loss", "{:.4g}"),
    ("train_nll", "nll", "{:.4g}"),
    ("valid_loss", "valid", "{:.4g}"),
    ("val_rmse", "val_rmse", "{:.4g}"),
    ("val_nll", "val_nll", "{:.4g}"),
    ("valid_energy_mae_meV_atom", "E_mae", "{:.2f}"),
    ("valid_forces_mae_meV_A", "F_mae", "{:.1f}"),
    ("lr", "lr", "{:.2g}"),
)


def _describe(record: dict[str, Any]) -> str:
    return " ".join(f"{label}={fmt.format(record[k])}" for k, label, fmt in _SHOWN if k in record)
