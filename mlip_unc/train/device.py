"""Where training runs: ``train.device`` resolved to a ``torch.device``.

``train.device`` is ``cpu`` (the default, as in MACE), ``cuda``, ``cuda:N`` or ``auto`` (CUDA
when available, else CPU). Under torchrun a bare ``cuda`` (or ``auto`` with CUDA) means
``cuda:LOCAL_RANK``: one GPU per process, the one :func:`mlip_unc.train.distributed.init_from_env`
made current. The training core moves the model there before it builds the optimiser, every
batch before the step (:func:`mlip_unc.models.devices.to_device`), and draws the posterior
samples from a generator on that device; evaluation and the post-hoc fits (full posterior,
uncertainty levels) move their batches to the model's device with the same function.
Checkpoints are written from CPU copies (and read with ``map_location="cpu"``), so a run
trained on a GPU resumes or predicts on a CPU.
"""

from __future__ import annotations

import os

import torch

__all__ = ["resolve_device"]


def resolve_device(
    spec: str, *, cuda_available: bool | None = None, local_rank: int | None = None
) -> torch.device:
    """``train.device`` as a ``torch.device``; ValueError naming the setting when it cannot run here.

    Args:
        spec: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        cuda_available: default ``torch.cuda.is_available()`` (a parameter for tests).
        local_rank: default ``$LOCAL_RANK`` (torchrun), else 0; the GPU of a bare ``cuda``.
    """
    cuda_available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    text = spec.strip().lower()
    if text == "auto":
        text = "cuda" if cuda_available else "cpu"
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(
            f"train.device: {spec!r} is not a device (cpu, cuda, cuda:N or auto)"
        ) from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ValueError(f"train.device: {spec!r}: only cpu and cuda are supported")
    if not cuda_available:
        raise ValueError(
            f"train.device: {spec!r} but CUDA is not available here (torch {torch.__version__}, "
            "a CPU build or no GPU visible); use train.device=cpu or auto"
        )
    return torch.device("cuda", local_rank if device.index is None else device.index)
