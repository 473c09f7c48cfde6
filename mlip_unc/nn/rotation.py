"""The latent rotation intervention ``z -> Q z`` (docs/method.md section 5 of this project).

A Haar-random orthogonal Q mixes the latent coordinates without changing their norms, so it
breaks any alignment between the latent axes and the posterior's principal axes while
leaving the information in z intact.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["RandomRotation"]


def _haar_orthogonal(dim: int, generator: torch.Generator) -> Tensor:
    """A Haar-random orthogonal (dim, dim) matrix (QR of a Gaussian with the sign fix), float64 CPU."""
    a = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


class RandomRotation(nn.Module):
    """Rotation intervention ``z -> Q z`` with a random orthogonal Q, docs/method.md section 5 of this project.

    Q is drawn from an explicit ``torch.Generator`` (``generator``, or a new one seeded with
    ``seed``) and kept as the buffer ``Q`` (saved in the state dict). With ``redraw=True`` a
    new Q is drawn from the same generator on every forward call in training mode; in eval
    mode the last Q is used.

    Shapes:
        input z (batch, dim) -> output (batch, dim), ``z @ Q^T``.
    """

    Q: Tensor

    def __init__(
        self,
        dim: int,
        *,
        generator: torch.Generator | None = None,
        seed: int = 0,
        redraw: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.dim = int(dim)
        self.redraw = bool(redraw)
        self.generator = generator if generator is not None else torch.Generator().manual_seed(seed)
        q = _haar_orthogonal(self.dim, self.generator).to(
            dtype=dtype or torch.get_default_dtype(), device=device
        )
        self.register_buffer("Q", q)  # (dim, dim)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Draw a new Q from the generator (in place, keeping dtype and device)."""
        self.Q.copy_(_haar_orthogonal(self.dim, self.generator))

    def forward(self, z: Tensor) -> Tensor:  # (batch, dim) -> (batch, dim)
        if self.redraw and self.training:
            self.reset_parameters()
        return z @ self.Q.T.to(z.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, redraw={self.redraw}"
