"""(De)serialisation of :class:`~mlip_unc.models.potential.BayesianPotential` as plain data.

A potential checkpoint payload (written by :func:`mlip_unc.models.checkpoint.save_checkpoint`)::

    {"kind": "potential", "config": potential_config(model), "model_state": state_dict, ...}

``config`` holds the registered backbone's name and constructor kwargs
(:data:`mlip_unc.models.backbones.BACKBONES`), the type map, cutoff, element offsets, head and
noise settings and the dtype, so a model is rebuilt without unpickling any code.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from mlip_unc.models.backbones import BACKBONES, build_backbone
from mlip_unc.models.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    checkpoint_format_version,
    load_checkpoint,
)
from mlip_unc.nn.radial import checkpoint_backbone_kwargs

if TYPE_CHECKING:  # annotations only: potential.py imports this module
    from mlip_unc.models.potential import BayesianPotential

# A BayesianPotential (or subclass); typed loosely so this module never imports potential.py.
PotentialT = TypeVar("PotentialT", bound=nn.Module)

__all__ = [
    "POTENTIAL_KIND",
    "incomplete_reason",
    "potential_config",
    "potential_payload",
    "potential_from_checkpoint",
]

POTENTIAL_KIND = "potential"


def incomplete_reason(payload: dict[str, Any], where: str = "the checkpoint") -> str | None:
    """Why ``payload`` is a training run's model that was never finalised, or None.

    Training writes ``metadata["training_config"]``; its finalisation (the full posterior and
    its calibration, the domain guard, the uncertainty levels) always adds
    ``metadata["domain"]``. Without it the model's uncertainties were never calibrated (e.g. a
    ``model.pt`` left by an interrupted run of a version that wrote it during training).
    Checkpoints that did not come from training (``attach``, ``BayesianPotential.save``) are
    never judged incomplete."""
    metadata = payload.get("metadata") or {}
    if "training_config" not in metadata or "domain" in metadata:
        return None
    out = (metadata["training_config"] or {}).get("out", "its run folder")
    return (
        f"{where} is an unfinished training checkpoint: its run stopped before the posterior "
        "was fitted and the uncertainty calibrated (no domain guard, no uncertainty levels), so "
        f"its uncertainties would be wrong. Finish it: `mlip-unc train --config "
        f"{out}/config.yaml --resume` continues the run in {out} (add --set train.epochs=N, N "
        "the epochs done, to finalise it without training further)"
    )


def potential_config(model: BayesianPotential) -> dict[str, Any]:
    """Everything needed to rebuild the ``BayesianPotential`` ``model``, as plain data."""
    backbone = model.backbone
    name = getattr(backbone, "backbone_name", None)
    backbone_config = getattr(backbone, "config", None)
    if name not in BACKBONES or backbone_config is None:
        raise ValueError(
            f"cannot checkpoint backbone {type(backbone).__name__}: only registered "
            f"backbones ({sorted(BACKBONES)}) with a config() can be rebuilt from plain data"
        )
    return {
        "backbone": {"name": name, "kwargs": backbone_config()},
        "type_map": list(model.type_map),
        "r_max": model.r_max,
        "atomic_energies": model.atomic_energies.tolist(),
        "head": {"prior_std": model.head.prior_std, "init_std": model.head.init_std},
        "noise": dict(model.noise_config),
        "isolated_reference": model.isolated_reference,
        "gradient_method": model.gradient_method,
        "dtype": str(model.dtype).removeprefix("torch."),
        "posterior": {
            "full": model.has_full_posterior,
            "rank": model.posterior_rank,
            "basis": model.posterior_basis,
        },
    }


def potential_payload(model: BayesianPotential) -> dict[str, Any]:
    """``{"kind": "potential", "format_version": ..., "config": ..., "model_state": ...}``
    (plain data, CPU tensors; the current :data:`~mlip_unc.models.checkpoint.FORMAT_VERSION`,
    so the payload rebuilds as written before it is ever saved)."""
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return {
        "kind": POTENTIAL_KIND,
        "format_version": FORMAT_VERSION,
        "config": potential_config(model),
        "model_state": state,
    }


def potential_from_checkpoint(
    cls: type[PotentialT],
    source: dict[str, Any] | str | os.PathLike,
    *,
    map_location: str | torch.device = "cpu",
    allow_incomplete: bool = False,
) -> PotentialT:
    """Rebuild a ``cls`` (``BayesianPotential`` or a subclass) from a :func:`potential_payload`
    or a checkpoint file (weights_only load).

    ``allow_incomplete``: accept a training run's model that was never finalised (for the
    finalisation itself and for fine-tuning; :func:`incomplete_reason`).

    Raises:
        CheckpointError: an unreadable file, a payload of another kind, or an unfinished
            training checkpoint (unless ``allow_incomplete``).
    """
    if isinstance(source, dict):
        payload = source
        if payload.get("kind") != POTENTIAL_KIND:
            raise CheckpointError(
                f"payload holds a {payload.get('kind')!r} model, expected 'potential'"
            )
    else:
        payload = load_checkpoint(source, map_location=map_location, kind=POTENTIAL_KIND)
    if not allow_incomplete:
        where = "the checkpoint" if isinstance(source, dict) else str(source)
        reason = incomplete_reason(payload, where)
        if reason is not None:
            raise CheckpointError(reason)
    cfg = payload["config"]
    name = cfg["backbone"]["name"]
    kwargs = checkpoint_backbone_kwargs(
        BACKBONES.get(name), cfg["backbone"]["kwargs"], checkpoint_format_version(payload)
    )
    backbone = build_backbone(name, **kwargs)
    model = cls(
        backbone,
        cfg["type_map"],
        cfg["r_max"],
        torch.tensor(cfg["atomic_energies"], dtype=torch.float64),
        prior_std=cfg["head"]["prior_std"],
        init_std=cfg["head"]["init_std"],
        isolated_reference=cfg["isolated_reference"],
        gradient_method=cfg.get("gradient_method", "auto"),
        full_posterior=cfg.get("posterior", {}).get("full", False),
        posterior_rank=cfg.get("posterior", {}).get("rank", 4),
        posterior_basis=cfg.get("posterior", {}).get("basis", "shared"),
        **cfg["noise"],
    )
    model.to(getattr(torch, cfg.get("dtype", "float32")))
    model.load_state_dict(payload["model_state"])
    return model.to(map_location)
