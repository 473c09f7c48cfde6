"""The contract between the training core and a task: :class:`Task`, :class:`Step`, :class:`FitResult`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

__all__ = ["Step", "Task", "FitResult"]


@dataclass(frozen=True)
class Step:
    """What the core passes to :meth:`Task.loss` for one optimiser step."""

    epoch: float
    """Fractional epoch: completed epochs + batch / n_batches."""
    generator: torch.Generator
    """Posterior draws (local reparameterisation, weight samples)."""
    progress: float = 0.0
    """Fraction of training done (the cosine schedule's clock, ``train.schedule_clock``: epochs
    by default); a task may change its loss with it."""


class Task(Protocol):
    """One kind of training; the core owns everything else."""

    @property
    def model(self) -> nn.Module: ...

    metric_key: str
    """Key of :meth:`validate`'s result to minimise (early stopping, best model, plateau)."""

    def train_data(self) -> Sequence[Any]:  # graphs of the training set
        ...

    def loss(self, batch: Any, step: Step) -> tuple[Tensor, dict[str, float]]:
        """The scalar loss of one batch and the terms to log (floats)."""
        ...

    def validate(self) -> dict[str, float]:
        """Validation metrics with the current weights (the core swaps in the EMA). An optional
        ``"phase"`` (int) marks a change of the task's loss: the best model restarts with it."""
        ...

    def signature(self) -> dict[str, Any]:
        """What a resumed run must share with the checkpoint (architecture, training config)."""
        ...


@dataclass
class FitResult:
    """What :meth:`Trainer.fit` returns."""

    history: list[dict[str, Any]]
    best_epoch: int
    best_metric: float
    epochs_run: int
    """Epochs completed in total (including those before a resume)."""
    stop_reason: str
    """``epochs``, ``time``, ``early_stopping`` or ``interrupted`` (``stop_after``)."""
    minutes: float
    initial: dict[str, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.stop_reason != "interrupted"

    @property
    def stopped_early(self) -> bool:
        return self.stop_reason == "early_stopping"
