"""The backbone contract checks: :func:`check_backbone` (listed in :mod:`mlip_unc.testing`)."""

from __future__ import annotations

import copy
import inspect
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from ase import Atoms

from mlip_unc.testing.common import ContractError, close, max_abs, random_rotation, to_numpy

if TYPE_CHECKING:
    from torch import Tensor, nn
    from torch_geometric.data import Batch

    from mlip_unc.models.potential import BayesianPotential

__all__ = ["check_backbone"]


def _molecule(species: Sequence[int], n: int, seed: int, *, box: float, min_dist: float) -> Atoms:
    rng = np.random.default_rng(seed)
    positions: list[np.ndarray] = []
    while len(positions) < n:
        x = rng.uniform(0.0, box, size=3)
        if all(np.linalg.norm(x - q) > min_dist for q in positions):
            positions.append(x)
    numbers = [species[k % len(species)] for k in rng.permutation(n)]
    return Atoms(numbers=numbers, positions=np.array(positions))


def _plain(value: Any, where: str = "config()") -> None:
    """Refuse anything a weights-only checkpoint load cannot read back."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            _plain(item, f"{where}[{k}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ContractError(f"checkpoint: {where} has a non-string key {key!r}")
            _plain(item, f"{where}[{key!r}]")
        return
    raise ContractError(
        f"checkpoint: {where} is a {type(value).__name__}: config() must be plain data "
        "(str, int, float, bool, None, lists and dicts of them)"
    )


def check_backbone(
    backbone: str | nn.Module | Callable[[], nn.Module],
    *,
    options: Mapping[str, Any] | None = None,
    species: Sequence[int] = (1, 6, 8),
    r_max: float = 3.0,
    latent_dim: int = 8,
    smooth_cutoff: bool = True,
    checkpoint: bool = True,
    seed: int = 0,
) -> list[str]:
    """Check that a potential backbone keeps the contract of :mod:`mlip_unc.models.backbones`
    and gives a potential the physics it needs (the module docstring lists the checks).

    Args:
        backbone: a registered name (built as the trainer builds it: ``num_types``, ``r_max``,
            ``latent_dim``, ``avg_num_neighbors`` and ``options`` validated by its options
            model), a module, or a function returning one. A module must take
            ``len(species)`` atom types and a cutoff within ``r_max``.
        options: the ``model.backbone_kwargs`` of a registered name (default: its defaults).
        species: atomic numbers of the type map of the test structures.
        r_max: the graphs' cutoff radius.
        latent_dim: the latent width a registered name is built with.
        smooth_cutoff: check that energies are continuous and forces vanish at ``r_max``.
        checkpoint: check ``backbone_name``/``config()`` and a potential's save/load.
        seed: weights (the global torch RNG is left as it was) and structures.

    Returns:
        The names of the checks that passed, in order.

    Raises:
        ContractError: the first check that failed.
    """
    import torch

    done: list[str] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module, name = _build_backbone(backbone, options, species, r_max, latent_dim, done)
        module = module.double()
        _backbone_contract(module, species, r_max, seed, done)
        _latent_invariance(module, species, r_max, seed, done)
        potential = _potential(module, species, r_max)
        _potential_physics(potential, species, r_max, seed, smooth_cutoff, done)
        _reset_parameters(module, done)
        if checkpoint:
            _checkpoint(potential, name, species, r_max, seed, done)
    return done


def _build_backbone(
    backbone: Any,
    options: Mapping[str, Any] | None,
    species: Sequence[int],
    r_max: float,
    latent_dim: int,
    done: list[str],
) -> tuple[nn.Module, str | None]:
    from torch import nn

    from mlip_unc.config.loader import NestedConfigError, validate_nested
    from mlip_unc.models.backbones import build_backbone
    from mlip_unc.registry import BACKBONE_REGISTRY

    if isinstance(backbone, nn.Module):
        return backbone, None
    if not isinstance(backbone, str):
        module = backbone()
        if not isinstance(module, nn.Module):
            raise ContractError(f"contract: the factory returned a {type(module).__name__}")
        return module, None
    entry = BACKBONE_REGISTRY.get(backbone)
    if entry.options is None:  # built from what its options say (e.g. mace_model)
        return build_backbone(backbone, **dict(options or {})), backbone
    try:
        validated = validate_nested(entry.options, dict(options or {}))
    except NestedConfigError as err:
        raise ContractError(f"options: model.backbone_kwargs{err}") from None
    kwargs = validated.model_dump()
    defaults = validate_nested(entry.options, {}).model_dump()
    _options_match_constructor(entry.load(), entry.options.__name__, defaults)
    done.append("options")
    fixed = {
        "num_types": len(species),
        "r_max": r_max,
        "latent_dim": latent_dim,
        "avg_num_neighbors": 2.0,
    }
    try:
        module = build_backbone(backbone, **fixed, **kwargs)
    except TypeError as err:
        raise ContractError(
            f"contract: {entry.where} cannot be built as the trainer builds it "
            f"(num_types, r_max, latent_dim, avg_num_neighbors and the options): {err}"
        ) from err
    return module, backbone


def _options_match_constructor(target: Any, model: str, defaults: Mapping[str, Any]) -> None:
    """Each option is a keyword of the target, with the same default."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):  # no signature to compare
        return
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    for key, value in defaults.items():
        if key not in params:
            raise ContractError(f"options: {model}.{key} is not a keyword of {target.__name__}")
        default = params[key].default
        if default is inspect.Parameter.empty:
            continue
        default = list(default) if isinstance(default, tuple) else default
        if default != value:
            raise ContractError(
                f"options: {model}.{key} defaults to {value!r}, the constructor to {default!r} "
                "(a stored config would not rebuild the same model)"
            )


def _batch(atoms_list: Sequence[Atoms], species: Sequence[int], r_max: float, dtype: Any) -> Batch:
    from torch_geometric.data import Batch

    from mlip_unc.data import TypeMap, atoms_to_graph

    types = TypeMap.from_list(list(species))
    return Batch.from_data_list([atoms_to_graph(a, r_max, types, dtype=dtype) for a in atoms_list])


def _cell(species: Sequence[int], seed: int) -> Atoms:
    """Four atoms in a 4 A cubic cell: every atom has neighbours across its faces."""
    rng = np.random.default_rng(seed + 101)
    base = np.array([[0.3, 0.4, 0.2], [2.2, 0.6, 0.5], [0.8, 2.1, 1.9], [2.6, 2.7, 3.1]])
    numbers = [species[k % len(species)] for k in range(4)]
    positions = base + rng.uniform(-0.15, 0.15, size=base.shape)
    return Atoms(numbers=numbers, positions=positions, cell=np.eye(3) * 4.0, pbc=True)


def _latents(module: nn.Module, batch: Batch) -> Tensor:
    import torch

    with torch.no_grad():
        return module(batch)


def _backbone_contract(
    module: nn.Module, species: Sequence[int], r_max: float, seed: int, done: list[str]
) -> None:
    import torch

    from mlip_unc.models.backbones import Backbone

    d = getattr(module, "latent_dim", None)
    if not isinstance(d, int) or d <= 0:
        raise ContractError(f"contract: latent_dim must be a positive int, got {d!r}")
    if not isinstance(module, Backbone):
        raise ContractError("contract: not callable as backbone(batch) -> latents")
    own = getattr(module, "r_max", None)
    if own is not None and float(own) > r_max + 1e-12:
        raise ContractError(f"contract: the backbone's r_max {own} exceeds the graphs' {r_max}")
    atoms = [_molecule(species, 5, seed, box=2.6, min_dist=0.9), _cell(species, seed)]
    for dtype in (torch.float64, torch.float32):
        copy_ = module if dtype is torch.float64 else copy.deepcopy(module).to(dtype)
        z = _latents(copy_, _batch(atoms, species, r_max, dtype))
        n = sum(len(a) for a in atoms)
        if not isinstance(z, torch.Tensor) or tuple(z.shape) != (n, d):
            shape = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
            raise ContractError(f"contract: latents of {n} atoms: {shape}, expected ({n}, {d})")
        if z.dtype != dtype:
            raise ContractError(f"contract: a {dtype} module gave {z.dtype} latents")
        if not torch.isfinite(z).all():
            raise ContractError(f"contract: non-finite latents ({dtype})")
    done.append("contract")


def _latent_invariance(
    module: nn.Module, species: Sequence[int], r_max: float, seed: int, done: list[str]
) -> None:
    import torch

    rng = np.random.default_rng(seed + 1)
    atoms = _molecule(species, 5, seed, box=2.6, min_dist=0.9)
    z = _latents(module, _batch([atoms], species, r_max, torch.float64))
    moved = atoms.copy()
    moved.positions = atoms.positions @ random_rotation(rng).T + rng.normal(size=3)
    perm = rng.permutation(len(atoms))
    z_moved = _latents(module, _batch([moved[perm]], species, r_max, torch.float64))
    tol = 1e-9 * max(1.0, max_abs(to_numpy(z)))
    close(
        "latent_invariance",
        "latents of the rotated, translated, permuted molecule",
        z_moved,
        z[torch.as_tensor(perm)],
        atol=tol,
        rtol=1e-9,
    )
    done.append("latent_invariance")

    cell = _cell(species, seed)
    z = _latents(module, _batch([cell], species, r_max, torch.float64))
    shifted = cell.copy()
    shifted.positions = cell.positions + np.array([1.7, -2.3, 3.1])
    shifted.wrap()
    z_shifted = _latents(module, _batch([shifted], species, r_max, torch.float64))
    close(
        "periodic_images",
        "latents of the shifted and wrapped cell",
        z_shifted,
        z,
        atol=tol,
        rtol=1e-9,
    )
    done.append("periodic_images")


def _potential(module: nn.Module, species: Sequence[int], r_max: float) -> BayesianPotential:
    import torch

    from mlip_unc.models.potential import BayesianPotential

    offsets = torch.linspace(-3.0, -1.0, len(species), dtype=torch.float64)
    model = BayesianPotential(module, list(species), r_max, offsets, init_std=0.3)
    with torch.no_grad():  # a head mean far from zero: forces well above rounding
        model.head.weight_mu.normal_(0.0, 1.0)
    return model.to(torch.float64).eval()


def _energy(model: BayesianPotential, atoms: Atoms, species: Sequence[int], r_max: float) -> float:
    import torch

    from mlip_unc import keys

    out = model(_batch([atoms], species, r_max, torch.float64), compute_forces=False)
    return float(out[keys.ENERGY].item())


def _potential_physics(
    model: BayesianPotential,
    species: Sequence[int],
    r_max: float,
    seed: int,
    smooth_cutoff: bool,
    done: list[str],
) -> None:
    import torch

    from mlip_unc import keys

    f64 = torch.float64
    molecule = _molecule(species, 5, seed + 2, box=2.6, min_dist=0.9)
    cell = _cell(species, seed)
    h = 1e-5
    for atoms in (molecule, cell):
        out = model(_batch([atoms], species, r_max, f64))
        forces = to_numpy(out[keys.FORCES])
        if max_abs(forces) < 1e-8:
            raise ContractError(
                "finite_difference_forces: forces are all zero: are the latents computed from "
                "batch.pos through mlip_unc.geometry.batch_edge_vectors (not precomputed)?"
            )
        numeric = np.zeros_like(forces)
        for a in range(len(atoms)):
            for c in range(3):
                e = []
                for s in (1.0, -1.0):
                    moved = atoms.copy()
                    moved.positions[a, c] += s * h
                    e.append(_energy(model, moved, species, r_max))
                numeric[a, c] = -(e[0] - e[1]) / (2 * h)
        kind = "periodic cell" if atoms.pbc.any() else "molecule"
        close(
            "finite_difference_forces",
            f"forces and -dE/dx ({kind})",
            forces,
            numeric,
            atol=1e-6 * max(1.0, max_abs(forces)),
            rtol=1e-5,
        )
    done.append("finite_difference_forces")

    stress = to_numpy(
        model(_batch([cell], species, r_max, f64), compute_stress=True)[keys.STRESS][0]
    )
    numeric_stress = np.zeros((3, 3))
    volume = cell.get_volume()
    for i in range(3):
        for j in range(3):
            e = []
            for s in (1.0, -1.0):
                strain = np.eye(3)
                strain[i, j] += s * h
                strained = cell.copy()
                strained.set_cell(cell.cell.array @ strain, scale_atoms=True)
                e.append(_energy(model, strained, species, r_max))
            numeric_stress[i, j] = (e[0] - e[1]) / (2 * h * volume)
    numeric_stress = 0.5 * (numeric_stress + numeric_stress.T)
    close(
        "finite_difference_stress",
        "stress and dE/dstrain / V",
        stress,
        numeric_stress,
        atol=1e-6 * max(1.0, max_abs(stress)),
        rtol=1e-5,
    )
    done.append("finite_difference_stress")

    rng = np.random.default_rng(seed + 3)
    ref = model(_batch([molecule], species, r_max, f64))
    rot = random_rotation(rng)
    perm = rng.permutation(len(molecule))
    moved = molecule.copy()
    moved.positions = molecule.positions @ rot.T + rng.normal(size=3)
    out = model(_batch([moved[perm]], species, r_max, f64))
    e_ref = to_numpy(ref[keys.ENERGY])
    tol = 1e-10 * max(1.0, max_abs(e_ref))
    close(
        "energy_invariance",
        "energies of the rotated, translated, permuted molecule",
        out[keys.ENERGY],
        e_ref,
        atol=tol,
        rtol=1e-10,
    )
    f_ref = to_numpy(ref[keys.FORCES])[perm] @ rot.T
    close(
        "energy_invariance",
        "forces of the rotated, translated, permuted molecule",
        out[keys.FORCES],
        f_ref,
        atol=1e-9 * max(1.0, max_abs(f_ref)),
        rtol=1e-8,
    )
    done.append("energy_invariance")

    both = model(_batch([molecule, cell], species, r_max, f64))
    single = model(_batch([cell], species, r_max, f64))
    close(
        "batch_equals_singles",
        "energies of a batch of two and of each alone",
        both[keys.ENERGY],
        np.concatenate([e_ref, to_numpy(single[keys.ENERGY])]),
        atol=tol,
        rtol=1e-10,
    )
    close(
        "batch_equals_singles",
        "forces of a batch of two and of each alone",
        both[keys.FORCES],
        np.concatenate([to_numpy(ref[keys.FORCES]), to_numpy(single[keys.FORCES])]),
        atol=1e-9 * max(1.0, max_abs(f_ref)),
        rtol=1e-8,
    )
    done.append("batch_equals_singles")

    if smooth_cutoff:
        a, b = species[0], species[-1]
        dimers = [
            Atoms(numbers=[a, b], positions=[[0, 0, 0], [0, 0, r_max + d]]) for d in (-1e-6, 1e-6)
        ]
        inside, outside = (model(_batch([x], species, r_max, f64)) for x in dimers)
        close(
            "smooth_cutoff",
            "energies of a dimer just inside and just outside r_max",
            inside[keys.ENERGY],
            outside[keys.ENERGY],
            atol=1e-8,
            rtol=0,
        )
        close(
            "smooth_cutoff",
            "forces of a dimer at r_max",
            inside[keys.FORCES],
            np.zeros((2, 3)),
            atol=1e-6,
            rtol=0,
        )
        done.append("smooth_cutoff")

    far = Atoms(
        numbers=[species[k % len(species)] for k in range(3)],
        positions=[[0, 0, 0], [4 * r_max, 0, 0], [0, 4 * r_max, 0]],
    )
    out = model(_batch([far], species, r_max, f64))
    offsets = to_numpy(model.atomic_energies)
    expected = sum(offsets[list(species).index(z)] for z in far.numbers)
    close(
        "isolated_atoms",
        "the energy of free atoms and their offsets",
        out[keys.ENERGY],
        np.array([expected]),
        atol=1e-10,
        rtol=0,
    )
    close(
        "isolated_atoms",
        "forces on free atoms",
        out[keys.FORCES],
        np.zeros((3, 3)),
        atol=1e-12,
        rtol=0,
    )
    done.append("isolated_atoms")


def _reset_parameters(module: nn.Module, done: list[str]) -> None:
    import torch

    if getattr(module, "reset_parameters", None) is None:
        return
    other = copy.deepcopy(module)  # the checked module keeps its weights
    before = [p.detach().clone() for p in other.parameters()]
    other.reset_parameters()  # type: ignore[operator]
    if not any(not torch.equal(p, b) for p, b in zip(other.parameters(), before, strict=True)):
        raise ContractError("reset_parameters: leaves every parameter as it was")
    done.append("reset_parameters")


def _checkpoint(
    model: BayesianPotential,
    name: str | None,
    species: Sequence[int],
    r_max: float,
    seed: int,
    done: list[str],
) -> None:
    import torch

    from mlip_unc import keys
    from mlip_unc.models.backbones import build_backbone
    from mlip_unc.models.potential import BayesianPotential

    module = model.backbone
    stored = getattr(module, "backbone_name", None)
    config = getattr(module, "config", None)
    if stored is None or not callable(config):
        raise ContractError(
            "checkpoint: a checkpointed backbone needs backbone_name (its registered name) and "
            "config() (its constructor's keyword arguments); pass checkpoint=False to skip"
        )
    if name is not None and stored != name:
        raise ContractError(f"checkpoint: backbone_name is {stored!r}, registered as {name!r}")
    kwargs = config()
    if not isinstance(kwargs, dict):
        raise ContractError(f"checkpoint: config() returned a {type(kwargs).__name__}")
    _plain(kwargs)
    rebuilt = build_backbone(stored, **kwargs).double()
    rebuilt.load_state_dict(module.state_dict())
    batch = _batch(
        [_molecule(species, 4, seed + 4, box=2.4, min_dist=0.9)], species, r_max, torch.float64
    )
    close(
        "checkpoint",
        "latents of build_backbone(backbone_name, **config())",
        _latents(rebuilt, batch),
        _latents(module, batch),
        atol=0,
        rtol=0,
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.pt"
        model.save(path)
        again = BayesianPotential.from_checkpoint(path).eval()
    close(
        "checkpoint",
        "energies of the saved and loaded potential",
        again(batch)[keys.ENERGY],
        model(batch)[keys.ENERGY],
        atol=0,
        rtol=0,
    )
    done.append("checkpoint")
