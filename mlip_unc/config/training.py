"""Options of the one training core (``mlip_unc.train.core``), shared by every task.

The property and potential ``train`` sections derive from :class:`TrainCoreConfig` and only
change defaults (and add their own fields), so the loop, optimiser, schedule, EMA, early
stopping, time budget and progress read the same names everywhere.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from mlip_unc.config.enums import LRSchedule, ScheduleClock
from mlip_unc.config.loader import Section

__all__ = ["TrainCoreConfig"]


class TrainCoreConfig(Section):
    """Optimisation and stopping.

    Attributes:
        epochs: maximum number of epochs.
        max_minutes: wall-time budget in minutes (null = none); checked after every batch.
            It stops the run; it changes the schedule only with ``schedule_clock: wall``.
        schedule_clock: what the cosine schedule and the loss's stage two follow: ``epochs``
            (default; reproducible) or ``wall`` (the larger of the epoch and ``max_minutes``
            fractions; the same as ``epochs`` without a budget; see :class:`ScheduleClock`).
        batch_size: examples (molecules or structures) per batch.
        lr: Adam learning rate; weight_decay: on deterministic parameters only (never on the
            Bayesian posterior, whose regulariser is the KL).
        lr_schedule: ``constant`` | ``plateau`` | ``cosine`` (see :class:`LRSchedule`).
        lr_factor, lr_patience: plateau schedule; min_lr: floor of plateau and cosine
            (null = lr / 100).
        grad_clip: max gradient norm (null = none).
        amsgrad: Adam's AMSGrad variant (mace-torch's default; off here).
        ema_decay: exponential moving average of the weights (null = off), used for
            validation and the saved model; ema_warmup: its decay starts low and rises to
            ``ema_decay`` as mace-torch's does (``mlip_unc.train.optim.ema_decay_at``).
        patience: early stopping after this many epochs without a better validation metric
            (null or 0 = never).
        eval_every: validate every k epochs (and after the last).
        progress: progress bar (null = only when stderr is a terminal).
        device: ``cpu`` (default), ``cuda``, ``cuda:N`` or ``auto`` (CUDA when available);
            under torchrun a bare ``cuda`` is ``cuda:LOCAL_RANK`` (see
            :mod:`mlip_unc.train.device`). Not part of a run's identity: a run may resume on
            another device.
    """

    epochs: int = Field(100, gt=0)
    max_minutes: float | None = Field(
        None, gt=0, description="Wall-time budget in minutes (null = none): stops the run."
    )
    schedule_clock: ScheduleClock = Field(
        ScheduleClock.EPOCHS,
        description=(
            "What the cosine schedule and loss stage two follow: 'epochs' (reproducible) or "
            "'wall' (larger of the epoch and max_minutes fractions, for equal-wall-time "
            "comparisons; depends on machine load)."
        ),
    )
    batch_size: int = Field(8, gt=0)
    lr: float = Field(5e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    lr_schedule: LRSchedule = LRSchedule.PLATEAU
    lr_factor: float = Field(0.5, gt=0, lt=1)
    lr_patience: int = Field(5, ge=0)
    min_lr: float | None = Field(None, ge=0)
    grad_clip: float | None = Field(10.0, gt=0)
    amsgrad: bool = False
    ema_decay: float | None = Field(None, gt=0, lt=1)
    ema_warmup: bool = True
    patience: int | None = Field(None, ge=0)
    eval_every: int = Field(1, gt=0)
    progress: bool | None = None
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:[0-9]+)?|auto)$")

    @field_validator("patience")
    @classmethod
    def _zero_is_never(cls, value: int | None) -> int | None:
        return None if value == 0 else value

    @property
    def lr_floor(self) -> float:
        """``min_lr``, or lr / 100 when it is null."""
        return self.lr / 100.0 if self.min_lr is None else self.min_lr
