"""Smooth radial bases and cutoff envelopes for interatomic distances.

An edge feature built as ``basis(r) * envelope(r)`` goes to zero with a zero first (and, for
the polynomial envelope with ``p >= 2``, second) derivative at ``r_max``, so energies and
forces stay continuous when a neighbour crosses the cutoff sphere.

- :class:`BesselBasis`: ``sqrt(2 / r_max) * sin(n pi r / r_max) / r``, ``n = 1..num_basis``
  (DimeNet / NequIP / MACE).
- :class:`GaussianBasis`: ``exp(-(r - c_n)^2 / (2 w^2))`` on evenly spaced centres (SchNet).
- :class:`PolynomialCutoff`: the DimeNet/NequIP/MACE polynomial envelope of degree ``p``.
- :class:`CosineCutoff`: ``0.5 (cos(pi r / r_max) + 1)`` (zero value and slope at ``r_max``).
- :class:`RadialEmbedding`: basis times envelope, the edge input of both backbones.

All modules are parameter-free by default and follow the input dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn

__all__ = [
    "BesselBasis",
    "GaussianBasis",
    "PolynomialCutoff",
    "CosineCutoff",
    "RadialEmbedding",
    "PerAtomBackbone",
    "checkpoint_backbone_kwargs",
    "polynomial_cutoff",
]


def polynomial_cutoff(r: Tensor, r_max: float, p: int = 6) -> Tensor:
    """Polynomial envelope ``f(x)``, ``x = r / r_max``, zero for ``x >= 1``.

    ``f(x) = 1 - (p+1)(p+2)/2 x^p + p(p+2) x^(p+1) - p(p+1)/2 x^(p+2)``:
    ``f(0) = 1`` and ``f(1) = f'(1) = f''(1) = 0``.

    Shapes:
        - **r:** any shape; **output:** same shape.
    """
    x = r / r_max
    out = (
        1.0
        - 0.5 * (p + 1.0) * (p + 2.0) * x.pow(p)
        + p * (p + 2.0) * x.pow(p + 1)
        - 0.5 * p * (p + 1.0) * x.pow(p + 2)
    )
    return out * (x < 1.0).to(out.dtype)


class PolynomialCutoff(nn.Module):
    """Module form of :func:`polynomial_cutoff` (``p = 6`` as in NequIP/MACE)."""

    def __init__(self, r_max: float, p: int = 6) -> None:
        super().__init__()
        if r_max <= 0:
            raise ValueError(f"r_max must be positive, got {r_max}")
        if p < 2:
            raise ValueError(f"the polynomial cutoff needs p >= 2 for a smooth zero, got {p}")
        self.r_max = float(r_max)
        self.p = int(p)

    def forward(self, r: Tensor) -> Tensor:
        return polynomial_cutoff(r, self.r_max, self.p)

    def extra_repr(self) -> str:
        return f"r_max={self.r_max}, p={self.p}"


class CosineCutoff(nn.Module):
    """``0.5 (cos(pi r / r_max) + 1)`` inside ``r_max``, zero outside (zero value and slope)."""

    def __init__(self, r_max: float) -> None:
        super().__init__()
        if r_max <= 0:
            raise ValueError(f"r_max must be positive, got {r_max}")
        self.r_max = float(r_max)

    def forward(self, r: Tensor) -> Tensor:
        out = 0.5 * (torch.cos(math.pi * r / self.r_max) + 1.0)
        return out * (r < self.r_max).to(out.dtype)

    def extra_repr(self) -> str:
        return f"r_max={self.r_max}"


class BesselBasis(nn.Module):
    """``sqrt(2 / r_max) sin(n pi r / r_max) / r`` for ``n = 1..num_basis``.

    Args:
        r_max: cutoff radius (Angstrom).
        num_basis: number of basis functions.
        trainable: learn the frequencies ``n pi`` (NequIP's option); off by default.

    Shapes:
        - **r:** ``(n_edges,)`` distances (> 0); **output:** ``(n_edges, num_basis)``.
    """

    def __init__(self, r_max: float, num_basis: int = 8, *, trainable: bool = False) -> None:
        super().__init__()
        if r_max <= 0:
            raise ValueError(f"r_max must be positive, got {r_max}")
        self.r_max = float(r_max)
        self.num_basis = int(num_basis)
        freqs = math.pi * torch.arange(1, num_basis + 1, dtype=torch.get_default_dtype())
        if trainable:
            self.freqs = nn.Parameter(freqs)
        else:
            self.register_buffer("freqs", freqs)
        self.prefactor = math.sqrt(2.0 / self.r_max)

    def forward(self, r: Tensor) -> Tensor:
        r = r.unsqueeze(-1)  # (n_edges, 1)
        return self.prefactor * torch.sin(self.freqs.to(r.dtype) * r / self.r_max) / r

    def extra_repr(self) -> str:
        return f"r_max={self.r_max}, num_basis={self.num_basis}"


class GaussianBasis(nn.Module):
    """Gaussians ``exp(-(r - c_n)^2 / (2 w^2))`` with centres evenly spaced on ``[0, r_max]``.

    Shapes:
        - **r:** ``(n_edges,)``; **output:** ``(n_edges, num_basis)``.
    """

    centres: Tensor  # (num_basis,) buffer

    def __init__(self, r_max: float, num_basis: int = 8, *, width: float | None = None) -> None:
        super().__init__()
        if r_max <= 0:
            raise ValueError(f"r_max must be positive, got {r_max}")
        self.r_max = float(r_max)
        self.num_basis = int(num_basis)
        centres = torch.linspace(0.0, r_max, num_basis, dtype=torch.get_default_dtype())
        self.register_buffer("centres", centres)
        self.width = float(width) if width is not None else self.r_max / max(num_basis - 1, 1)

    def forward(self, r: Tensor) -> Tensor:
        diff = r.unsqueeze(-1) - self.centres.to(r.dtype)  # (n_edges, num_basis)
        return torch.exp(-0.5 * (diff / self.width) ** 2)

    def extra_repr(self) -> str:
        return f"r_max={self.r_max}, num_basis={self.num_basis}, width={self.width}"


class RadialEmbedding(nn.Module):
    """Smooth edge features ``basis(r) * envelope(r)`` and the envelope itself.

    Args:
        r_max: cutoff radius.
        num_basis: number of radial functions.
        basis: ``"bessel"`` or ``"gaussian"``.
        cutoff: ``"polynomial"`` or ``"cosine"``.
        cutoff_p: degree ``p`` of the polynomial envelope.

    Shapes:
        - **r:** ``(n_edges,)``
        - **output:** ``(features (n_edges, num_basis), envelope (n_edges,))``
    """

    def __init__(
        self,
        r_max: float,
        num_basis: int = 8,
        *,
        basis: str = "bessel",
        cutoff: str = "polynomial",
        cutoff_p: int = 6,
    ) -> None:
        super().__init__()
        if basis == "bessel":
            self.basis: nn.Module = BesselBasis(r_max, num_basis)
        elif basis == "gaussian":
            self.basis = GaussianBasis(r_max, num_basis)
        else:
            raise ValueError(f"unknown radial basis {basis!r} (use 'bessel' or 'gaussian')")
        if cutoff == "polynomial":
            self.envelope: nn.Module = PolynomialCutoff(r_max, cutoff_p)
        elif cutoff == "cosine":
            self.envelope = CosineCutoff(r_max)
        else:
            raise ValueError(f"unknown cutoff {cutoff!r} (use 'polynomial' or 'cosine')")
        self.r_max = float(r_max)
        self.num_basis = int(num_basis)

    def forward(self, r: Tensor) -> tuple[Tensor, Tensor]:
        env = self.envelope(r)  # (n_edges,)
        return self.basis(r) * env.unsqueeze(-1), env


class _Resettable(Protocol):
    def reset_parameters(self) -> None: ...


class PerAtomBackbone(nn.Module):
    """Base of the structure backbones: ``embedding -> layers -> readout`` per atom.

    Subclasses store their constructor kwargs in ``self._config`` (plain data), so a checkpoint
    rebuilds them with ``cls(**config())``, and build their readout with
    :meth:`_build_readout`: a linear map to ``latent_dim`` (``readout_hidden=()``) or a per-atom
    SiLU MLP followed by that linear map.
    """

    _config: dict[str, Any]
    embedding: nn.Embedding
    layers: nn.ModuleList  # of modules with reset_parameters()
    readout: nn.Module

    def config(self) -> dict[str, Any]:
        """Constructor kwargs as plain data (``cls(**config())`` rebuilds the backbone)."""
        return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in self._config.items()}

    def reset_parameters(self) -> None:
        self.embedding.reset_parameters()
        for layer in self.layers:
            cast(_Resettable, layer).reset_parameters()
        for module in self.readout.modules():
            if isinstance(module, nn.Linear):
                module.reset_parameters()

    @staticmethod
    def _build_readout(
        in_width: int,
        latent_dim: int,
        readout_hidden: Sequence[int],
        *,
        width_name: str,
        check_latent_span: bool = True,
    ) -> nn.Module:
        """``nn.Linear(in_width, latent_dim)``, or ``Linear + SiLU`` per entry of
        ``readout_hidden`` and then ``nn.Linear(readout_hidden[-1], latent_dim)``.

        The latents ``z = W x`` span at most ``width(x)`` directions, so a ``latent_dim`` above
        the width of the last layer's input (``in_width``, described by ``width_name``, or
        ``readout_hidden[-1]``) is rank-deficient by construction: ValueError, unless
        ``check_latent_span=False`` (checkpoints written before the check existed).
        """
        hidden = [int(w) for w in readout_hidden]
        if any(w <= 0 for w in hidden):
            raise ValueError(f"readout_hidden widths must be positive, got {list(readout_hidden)}")
        last = hidden[-1] if hidden else in_width
        if check_latent_span and latent_dim > last:
            where = (
                f"readout_hidden[-1] = {last}"
                if hidden
                else f"the readout input width {last} ({width_name})"
            )
            raise ValueError(
                f"latent_dim = {latent_dim} exceeds {where}: a linear map cannot span more "
                f"directions than its input has; use latent_dim <= {last}, concat_layers=True "
                f"or a wider readout_hidden"
            )
        if not hidden:
            return nn.Linear(in_width, latent_dim)
        modules: list[nn.Module] = []
        width = in_width
        for w in hidden:
            modules += [nn.Linear(width, w), nn.SiLU()]
            width = w
        modules.append(nn.Linear(width, latent_dim))
        return nn.Sequential(*modules)


def checkpoint_backbone_kwargs(
    cls: type | None, kwargs: dict[str, Any], format_version: int = 1
) -> dict[str, Any]:
    """A checkpoint's backbone kwargs, ready for ``cls(**...)``.

    ``format_version`` is the checkpoint's
    (:func:`mlip_unc.models.checkpoint.checkpoint_format_version`). From format 2 on, the
    kwargs are complete (every backbone's ``config()`` writes ``check_latent_span``) and are
    used as written. A format-1 checkpoint may predate ``concat_layers``/``readout_hidden``
    (no such key): its backbone is rebuilt as it was trained, with the latent-span check of
    :meth:`PerAtomBackbone._build_readout` off (equivariant checkpoints of that time have
    ``latent_dim`` 32 over 16 channels).
    """
    out = dict(kwargs)
    if format_version >= 2:
        return out
    legacy = "concat_layers" not in out and "readout_hidden" not in out
    if cls is not None and issubclass(cls, PerAtomBackbone) and legacy:
        out["check_latent_span"] = False
    return out
