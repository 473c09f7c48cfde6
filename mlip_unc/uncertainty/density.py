"""Training-data density proxies and structural calibration.

As defined in docs/method.md section 7 of this project: per test point, a proxy of how densely
the training set covers it, and ``structural calibration = Spearman(predictive std, proxy)``.

* latent kNN distance (model-dependent): mean distance to the k nearest training latents;
* max Tanimoto similarity of Morgan fingerprints (molecules, model-independent);
* kNN distance in a fixed structure descriptor (periodic or molecular structures): a histogram
  of interatomic distances per structure (SOAP-free), hard-binned or Gaussian-smeared. It is
  the package's one structure descriptor (active learning's farthest-point features use it).

All functions return numpy float64 arrays; inputs may be numpy arrays or torch tensors.
RDKit and ASE are imported inside the functions that need them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mlip_unc.uncertainty.calibration import ArrayLike, NanPolicy, spearman_corr

__all__ = [
    "LatentReference",
    "AtomLatentReference",
    "latent_knn_distance",
    "atom_latent_knn_distance",
    "tanimoto_max_similarity",
    "structure_descriptor",
    "descriptor_knn_distance",
    "structural_calibration",
]


def _as_matrix(x: Tensor | np.ndarray, name: str) -> Tensor:
    t = x.detach() if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x, dtype=np.float64))
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (n, d), got shape {tuple(t.shape)}")
    return t


class LatentReference:
    """Training latents prepared once (standardised) for repeated kNN queries.

    ``distances(z_query)`` is :func:`latent_knn_distance` of the query against these latents:
    mean Euclidean distance to the ``k`` nearest, both sets shifted and scaled per coordinate by
    the training set's mean and std (``standardise``; coordinates with std < 1e-12 only
    shifted), in the dtype both inputs promote to.
    """

    def __init__(self, z_train: Tensor | np.ndarray, k: int = 10, standardise: bool = True) -> None:
        zt = _as_matrix(z_train, "z_train")
        if not 1 <= k <= zt.shape[0]:
            raise ValueError(f"k must be in [1, n_train={zt.shape[0]}], got {k}")
        self.k, self.standardise = k, standardise
        mean = zt.mean(dim=0) if standardise else torch.zeros_like(zt[0])
        std = zt.std(dim=0) if standardise and zt.shape[0] > 1 else torch.ones_like(mean)
        self.mean, self.std = mean, torch.where(std < 1e-12, torch.ones_like(std), std)  # (d,) each
        self.z = (zt - self.mean) / self.std  # (n_t, d)

    @torch.no_grad()
    def distances(self, z_query: Tensor | np.ndarray, *, chunk_size: int = 2048) -> np.ndarray:
        """``(n_q,)`` mean distance of each query latent ``(n_q, d)`` to its k nearest; larger = less supported."""
        zq = _as_matrix(z_query, "z_query")
        if zq.shape[1] != self.z.shape[1]:
            raise ValueError(f"latent sizes differ: {zq.shape[1]} vs {self.z.shape[1]}")
        dtype = torch.promote_types(zq.dtype, self.z.dtype)
        zt = self.z.to(dtype)
        zq = (zq.to(dtype=dtype, device=zt.device) - self.mean.to(dtype)) / self.std.to(dtype)
        out = []
        for start in range(0, zq.shape[0], chunk_size):
            d = torch.cdist(zq[start : start + chunk_size], zt)  # (chunk, n_t)
            out.append(torch.topk(d, self.k, dim=1, largest=False).values.mean(dim=1))
        if not out:
            return np.zeros(0)
        return torch.cat(out).cpu().double().numpy()


def latent_knn_distance(
    z_query: Tensor | np.ndarray,
    z_train: Tensor | np.ndarray,
    k: int = 10,
    standardise: bool = True,
    *,
    chunk_size: int = 2048,
) -> np.ndarray:
    """Mean Euclidean distance from each query latent to its ``k`` nearest training latents.

    As defined in docs/method.md section 7 of this project. With ``standardise`` both sets are
    shifted and scaled per coordinate by the training set's mean and std (coordinates with
    std < 1e-12 are only shifted). Distances are computed with ``torch.cdist`` in chunks of
    ``chunk_size`` queries, so memory is ``O(chunk_size * n_train)``. A query identical to a
    training point has that point at distance 0 (no self-exclusion). For many queries against
    one training set, prepare it once: :class:`LatentReference`.

    Shapes: z_query (n_q, d), z_train (n_t, d) -> (n_q,). Larger = less supported.
    """
    return LatentReference(z_train, k, standardise).distances(z_query, chunk_size=chunk_size)


class AtomLatentReference:
    """Training atoms' latents per element, each element a :class:`LatentReference` (k capped at
    that element's count); ``distances`` is :func:`atom_latent_knn_distance` against them."""

    def __init__(
        self, z_train: Tensor | np.ndarray, type_train: Tensor | np.ndarray, k: int = 10
    ) -> None:
        zt, tt = _as_matrix(z_train, "z_train"), _types(type_train)
        if tt.shape[0] != zt.shape[0]:
            raise ValueError(
                f"one type per latent: {tt.shape[0]} types for {zt.shape[0]} training latents"
            )
        self.elements = {
            int(e): LatentReference(
                zt[torch.as_tensor(np.flatnonzero(tt == e))], k=min(k, int(np.sum(tt == e)))
            )
            for e in np.unique(tt)
        }

    def distances(
        self, z_query: Tensor | np.ndarray, type_query: Tensor | np.ndarray
    ) -> np.ndarray:
        """``(n_q,)`` per-atom distance among atoms of the same element; ``inf`` for an element
        absent from training (no support at all)."""
        zq, tq = _as_matrix(z_query, "z_query"), _types(type_query)
        if tq.shape[0] != zq.shape[0]:
            raise ValueError(
                f"one type per latent: {tq.shape[0]} types for {zq.shape[0]} query latents"
            )
        out = np.full(zq.shape[0], np.inf)
        for element in np.unique(tq):
            if (ref := self.elements.get(int(element))) is not None:
                q = np.flatnonzero(tq == element)
                out[q] = ref.distances(zq[torch.as_tensor(q)])
        return out


def _types(types: Tensor | np.ndarray) -> np.ndarray:
    return np.asarray(types.detach().cpu() if isinstance(types, Tensor) else types).reshape(-1)


def atom_latent_knn_distance(
    z_query: Tensor | np.ndarray,
    type_query: Tensor | np.ndarray,
    z_train: Tensor | np.ndarray,
    type_train: Tensor | np.ndarray,
    k: int = 10,
) -> np.ndarray:
    """Per-atom latent kNN distance among atoms of the same element.

    Each query atom's :func:`latent_knn_distance` (standardised by that element's training
    atoms) to the training atoms of its own type; ``k`` is capped at that element's count. An
    element absent from training gives ``inf`` (no support at all). For many queries against
    one training set, prepare it once: :class:`AtomLatentReference`.

    Shapes: z_query (n_q, d), type_query (n_q,), z_train (n_t, d), type_train (n_t,) -> (n_q,).
    """
    return AtomLatentReference(z_train, type_train, k).distances(z_query, type_query)


def tanimoto_max_similarity(
    smiles_query: Sequence[str], smiles_train: Sequence[str], radius: int = 2, n_bits: int = 2048
) -> np.ndarray:
    """Max Tanimoto similarity of each query molecule to the training set (n_q,), in [0, 1].

    Morgan fingerprints (radius 2, 2048 bits by default) from
    ``rdkit.Chem.rdFingerprintGenerator`` and ``DataStructs.BulkTanimotoSimilarity``, as
    defined in docs/method.md section 7 of this project. Larger = better supported (the
    opposite sign of a distance). Unparsable query SMILES give NaN; an unparsable training
    SMILES raises ``ValueError``.
    """
    from rdkit import Chem, DataStructs
    from rdkit.Chem import rdFingerprintGenerator

    gen = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)

    def fingerprint(smi: str) -> Any:
        mol = Chem.MolFromSmiles(smi)
        return None if mol is None else gen.GetFingerprint(mol)

    train_fps = []
    for i, smi in enumerate(smiles_train):
        fp = fingerprint(smi)
        if fp is None:
            raise ValueError(f"training SMILES {i} ({smi!r}) cannot be parsed by RDKit")
        train_fps.append(fp)
    if not train_fps:
        raise ValueError("empty training set")
    out = np.full(len(smiles_query), np.nan)
    for i, smi in enumerate(smiles_query):
        fp = fingerprint(smi)
        if fp is not None:
            out[i] = max(DataStructs.BulkTanimotoSimilarity(fp, train_fps))
    return out


def _pair_distances(structure: Any, r_max: float) -> tuple[np.ndarray, int]:
    """Distances of ordered pairs i != j within r_max (both directions) and the atom count."""
    if hasattr(structure, "get_positions"):  # ase.Atoms
        n = len(structure)
        if n > 0 and bool(np.any(structure.get_pbc())):
            from ase.neighborlist import neighbor_list

            return np.asarray(neighbor_list("d", structure, r_max), dtype=np.float64), n
        pos = np.asarray(structure.get_positions(), dtype=np.float64)
    else:
        pos = (
            structure.detach().cpu().numpy()
            if isinstance(structure, Tensor)
            else np.asarray(structure)
        )
        pos = pos.astype(np.float64)
        n = pos.shape[0]
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ValueError(f"positions must be (n_atoms, 3), got {pos.shape}")
    if n < 2:
        return np.zeros(0), n
    from scipy.spatial import cKDTree

    pairs = cKDTree(pos).query_pairs(r_max, output_type="ndarray")  # (n_pairs, 2), i < j
    dist = np.linalg.norm(pos[pairs[:, 0]] - pos[pairs[:, 1]], axis=1)
    dist = dist[dist < r_max]
    return np.concatenate([dist, dist]), n  # both directions, like neighbor_list


def structure_descriptor(
    structures: Sequence[Any],
    n_bins: int = 64,
    r_max: float = 6.0,
    *,
    smearing: float | None = None,
) -> np.ndarray:
    """Interatomic-distance histogram per structure, a fixed SOAP-free descriptor.

    As defined in docs/method.md section 7 of this project. Each structure is an
    ``ase.Atoms`` (periodic images counted through ``ase.neighborlist.neighbor_list`` when any
    ``pbc`` is set) or a positions array (n_atoms, 3) (non-periodic). All ordered pairs
    ``i != j`` with distance < ``r_max`` (Angstrom) are counted and divided by the atom count:
    the mean number of neighbours per atom in each shell, comparable across structure sizes.

    * ``smearing=None``: hard counts in ``n_bins`` equal bins on ``[0, r_max)``.
    * ``smearing=w`` (Angstrom): each pair adds ``exp(-(d - c_b)^2 / (2 w^2))`` to the bins
      centred at ``c_b = linspace(0, r_max, n_bins)``; smooth in the positions, so nearby
      frames get nearby descriptors (what farthest-point sampling needs).

    An empty structure gives zeros. Returns: (n_structures, n_bins).
    """
    if smearing is not None and smearing <= 0:
        raise ValueError(f"smearing must be positive or None, got {smearing}")
    edges = np.linspace(0.0, r_max, n_bins + 1)
    centres = np.linspace(0.0, r_max, n_bins)
    out = np.zeros((len(structures), n_bins))
    for i, s in enumerate(structures):
        dist, n = _pair_distances(s, r_max)  # (n_pairs,)
        if smearing is None:
            counts = np.histogram(dist, bins=edges)[0]
        else:
            counts = np.exp(-0.5 * ((dist[:, None] - centres[None, :]) / smearing) ** 2).sum(axis=0)
        out[i] = counts / max(n, 1)
    return out


def descriptor_knn_distance(
    desc_query: Tensor | np.ndarray,
    desc_train: Tensor | np.ndarray,
    k: int = 10,
    standardise: bool = True,
) -> np.ndarray:
    """Mean distance to the ``k`` nearest training descriptors (n_q,); see :func:`latent_knn_distance`."""
    return latent_knn_distance(desc_query, desc_train, k=k, standardise=standardise)


def structural_calibration(
    std: ArrayLike, density_proxy: ArrayLike, *, nan_policy: NanPolicy = "omit"
) -> float:
    """Structural calibration ``Spearman(predictive std, density proxy)``.

    As defined in docs/method.md section 7 of this project. Good structural calibration is a
    *positive* value for a distance proxy (kNN distance) and a *negative* value for a
    similarity proxy (Tanimoto). Points with a NaN proxy (e.g. unparsable SMILES) are dropped
    by default.
    """
    return spearman_corr(std, density_proxy, nan_policy=nan_policy)
