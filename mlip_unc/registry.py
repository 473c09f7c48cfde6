"""The extension points: registries of potential backbones and of oracles, found by name.

A backbone is named by ``model.backbone`` in a training config and by ``config.backbone.name``
in a potential checkpoint; an oracle by ``oracle`` in an active-learning config
(:func:`~mlip_unc.active.oracles.make_oracle`). Each name is an :class:`Entry` of a
:class:`Registry`: what builds it (a class or a factory), the pydantic model of its options
and a line that says what it is. Adding one is one file (``docs/guides/extending.md`` runs a
complete example)::

    from torch import nn

    from mlip_unc.config.backbones import BackboneOptions
    from mlip_unc.registry import register_backbone


    class ToyOptions(BackboneOptions):  # the model.backbone_kwargs of `backbone: toy`
        width: int = 16


    @register_backbone("toy", options=ToyOptions)
    class ToyBackbone(nn.Module):
        def __init__(self, num_types, *, r_max, latent_dim, avg_num_neighbors=1.0, width=16): ...

and :func:`mlip_unc.testing.check_backbone` (or :func:`~mlip_unc.testing.check_oracle`) says
whether it keeps the contract. The name then works wherever a built-in's does: in configs
(its options validated by its model, a misspelt key named), in
:func:`~mlip_unc.models.backbones.build_backbone`, in checkpoints.

Where names come from, in this order:

1. registered in this process (:func:`register_backbone`, :func:`register_oracle`);
2. the built-ins, declared where they live: the backbones next to their options in
   :mod:`mlip_unc.config.backbones` (with a lazy ``"module:attr"`` target, so reading a config
   imports no torch), the oracles in :mod:`mlip_unc.active.oracles`; imported when a registry
   is first read;
3. the modules named in the environment variable ``MLIP_UNC_PLUGINS`` (comma-separated, on
   the Python path), imported with the built-ins: ``MLIP_UNC_PLUGINS=toy_extension mlip-unc
   train ...`` runs a backbone of a file of one's own from the command line;
4. the entry points of the groups ``mlip_unc.backbones`` and ``mlip_unc.oracles`` of installed
   packages, imported the first time a name is not found, so that ``mlip-unc train`` finds a
   backbone of another package without an import. In that package's ``pyproject.toml``::

       [project.entry-points."mlip_unc.backbones"]
       toy = "my_package.toy"   # a module that registers its backbones when imported

Importing this module imports neither torch nor ASE, nor any other part of ``mlip_unc``.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, TypeVar, overload

from pydantic import BaseModel

log = logging.getLogger(__name__)

__all__ = [
    "BACKBONE_REGISTRY",
    "ORACLE_REGISTRY",
    "Entry",
    "Registry",
    "register_backbone",
    "register_oracle",
]

T = TypeVar("T")

_NAME = re.compile(r"^[a-z][a-z0-9_.-]*$")
TRAINER_KEYS = ("num_types", "r_max", "latent_dim", "avg_num_neighbors")
"""The keyword arguments of a backbone that the trainer sets, never its options
(``mlip_unc.config.backbones.RESERVED_BACKBONE_KEYS`` says from what)."""
PLUGINS_VARIABLE = "MLIP_UNC_PLUGINS"
"""The environment variable naming modules that register extensions (comma-separated)."""
GRADIENT_METHODS = ("auto", "loop", "batched")


@dataclass(frozen=True)
class Entry:
    """One registered name.

    Attributes:
        kind: ``"backbone"`` or ``"oracle"``.
        name: the name configs and checkpoints use (lower case).
        target: the class or factory, or ``"module:attr"`` imported by :meth:`load`.
        options: the pydantic model of its keyword arguments (a backbone's
            ``model.backbone_kwargs``, an oracle mapping's keys), or None: a backbone that no
            config trains (``mace_model``, built by ``mlip-unc attach``), an oracle whose
            keyword arguments are passed unchecked.
        description: one line, for error messages and listings.
        extra: kind-specific settings (a backbone's ``gradient_method``).
    """

    kind: str
    name: str
    target: Any
    options: type[BaseModel] | None = None
    description: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def load(self) -> Any:
        """The class or factory (imported first when the target is ``"module:attr"``)."""
        if not isinstance(self.target, str):
            return self.target
        module_name, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module_name), attr)

    @property
    def where(self) -> str:
        """``module:qualname`` of the target (without importing it)."""
        if isinstance(self.target, str):
            return self.target
        module = getattr(self.target, "__module__", "?")
        return f"{module}:{getattr(self.target, '__qualname__', repr(self.target))}"


class Registry:
    """Names of one kind of extension (``"backbone"`` or ``"oracle"``) -> :class:`Entry`.

    Reads like a read-only mapping of names to entries (``"gin" in BACKBONE_REGISTRY``,
    ``sorted(BACKBONE_REGISTRY)``, ``BACKBONE_REGISTRY["gin"]``); see the module docstring for
    where names come from.

    Args:
        kind: what it holds, for messages.
        group: the entry-point group of other packages' registrations.
        builtins: modules that register the built-ins, imported on first read.
    """

    def __init__(self, kind: str, group: str, builtins: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.group = group
        self._builtins = builtins
        self._entries: dict[str, Entry] = {}
        self._builtins_loaded = False
        self._entry_points_loaded = False

    # ------------------------------------------------------------ registering
    def add(
        self,
        name: str,
        target: Any,
        *,
        options: type[BaseModel] | None = None,
        description: str = "",
        replace: bool = False,
        **extra: Any,
    ) -> Entry:
        """Register ``target`` (an object, or ``"module:attr"``) under ``name``.

        Registering the same target again (a module imported twice) is allowed; another target
        under a taken name needs ``replace=True``.

        Raises:
            ValueError: a malformed or taken name, or ``options`` not a pydantic model.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"{self.kind} name {name!r}: lower-case letters, digits, '_', '.', '-', "
                "starting with a letter"
            )
        if options is not None and not (
            isinstance(options, type) and issubclass(options, BaseModel)
        ):
            raise ValueError(f"{self.kind} {name!r}: options must be a pydantic model class")
        if not description:
            doc = getattr(target, "__doc__", None) if not isinstance(target, str) else None
            description = (doc or "").strip().split("\n", 1)[0]
        entry = Entry(self.kind, name, target, options, description, dict(extra))
        old = self._entries.get(name)
        if old is not None and not replace and old.where != entry.where:
            raise ValueError(
                f"{self.kind} {name!r} is already registered ({old.where}); pass replace=True "
                "to replace it, or choose another name"
            )
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> Entry:
        """Unregister ``name`` (tests, notebooks); its entry."""
        self._load_builtins()
        return self._entries.pop(name)

    # ------------------------------------------------------------ looking up
    def get(self, name: str) -> Entry:
        """The entry of ``name``; entry points are searched when it is not registered.

        Raises:
            ValueError: ``unknown <kind> 'name'`` with the closest names and the known ones.
        """
        self._load_builtins()
        entry = self._entries.get(name)
        if entry is None and not self._entry_points_loaded:
            self._load_entry_points()
            entry = self._entries.get(name)
        if entry is None:
            known = sorted(self._entries)
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"unknown {self.kind} {name!r}{hint}; known: {', '.join(known)} (a module "
                f"that registers one is imported first, or named in {PLUGINS_VARIABLE})"
            )
        return entry

    def load(self, name: str) -> Any:
        """The class or factory of ``name`` (:meth:`Entry.load`)."""
        return self.get(name).load()

    def names(self) -> list[str]:
        """Registered names, sorted (entry points included once they are loaded)."""
        self._load_builtins()
        return sorted(self._entries)

    def targets(self) -> Mapping[str, Any]:
        """A live read-only mapping name -> class or factory, each imported when read."""
        return _Targets(self)

    def __getitem__(self, name: str) -> Entry:
        try:
            return self.get(name)
        except ValueError as err:
            raise KeyError(name) from err

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.get(name)
        except ValueError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"

    # ------------------------------------------------------------ discovery
    def _load_builtins(self) -> None:
        if self._builtins_loaded:
            return
        self._builtins_loaded = True  # first: the modules register through this registry
        for module in self._builtins:
            importlib.import_module(module)
        for module in os.environ.get(PLUGINS_VARIABLE, "").split(","):
            if module.strip():
                try:
                    importlib.import_module(module.strip())
                except ImportError as err:
                    raise ImportError(
                        f"{PLUGINS_VARIABLE}: cannot import {module.strip()!r} ({err}); is its "
                        "folder on the Python path (PYTHONPATH)?"
                    ) from err

    def _load_entry_points(self) -> None:
        self._entry_points_loaded = True
        for point in entry_points(group=self.group):
            try:
                point.load()  # a module registers on import; an object is registered below
            except Exception as err:  # a broken plugin must not hide the built-ins
                log.warning("entry point %s of %s failed to load: %s", point.value, self.group, err)


class _Targets(Mapping[str, Any]):
    """Name -> loaded target, a view of a :class:`Registry` (``BACKBONES``)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __getitem__(self, name: str) -> Any:
        return self._registry[name].load()

    def __contains__(self, name: object) -> bool:
        return name in self._registry

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry)

    def __len__(self) -> int:
        return len(self._registry)

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{n!r}: {self._registry[n].where}' for n in self._registry)}}}"


BACKBONE_REGISTRY = Registry("backbone", "mlip_unc.backbones", ("mlip_unc.config.backbones",))
"""The potential backbones (:mod:`mlip_unc.models.backbones` states their contract)."""

ORACLE_REGISTRY = Registry("oracle", "mlip_unc.oracles", ("mlip_unc.active.oracles",))
"""The oracles: factories of ASE calculators (:func:`~mlip_unc.active.oracles.make_oracle`)."""


@overload
def register_backbone(
    name: str,
    target: None = None,
    *,
    options: type[BaseModel] | None,
    gradient_method: str = "auto",
    description: str = "",
    replace: bool = False,
) -> Callable[[T], T]: ...


@overload
def register_backbone(
    name: str,
    target: T,
    *,
    options: type[BaseModel] | None,
    gradient_method: str = "auto",
    description: str = "",
    replace: bool = False,
) -> T: ...


def register_backbone(
    name: str,
    target: Any = None,
    *,
    options: type[BaseModel] | None,
    gradient_method: str = "auto",
    description: str = "",
    replace: bool = False,
) -> Any:
    """Register a potential backbone under ``name``: a class decorator, or called with the
    ``target`` (a class, a factory or ``"module:attr"``, imported when first built).

    The target is called as the trainer calls it,
    ``target(num_types=..., r_max=..., latent_dim=..., avg_num_neighbors=..., **options)``
    (``options`` the validated ``model.backbone_kwargs``), and returns a module that keeps the
    contract of :mod:`mlip_unc.models.backbones`. A class without a ``backbone_name`` gets
    ``name`` as one, which checkpoints store.

    Args:
        name: the ``model.backbone`` value.
        target: what to register; None: return a decorator.
        options: its ``model.backbone_kwargs`` model, a subclass of
            :class:`~mlip_unc.config.backbones.BackboneOptions` (fields: the constructor's
            keyword arguments but the four above); None: not trainable from a config.
        gradient_method: the potential's way to the per-structure force uncertainty
            (:class:`~mlip_unc.models.potential.BayesianPotential`): ``auto``, ``batched`` or
            ``loop`` (one backward pass per structure, for backbones whose batched passes are
            slow).
        description: one line; default: the first line of the target's docstring.
        replace: replace a backbone registered under ``name``.
    """
    _check_backbone_options(name, options)
    if gradient_method not in GRADIENT_METHODS:
        raise ValueError(f"gradient_method must be one of {GRADIENT_METHODS}")

    def decorate(target: T) -> T:
        BACKBONE_REGISTRY.add(
            name,
            target,
            options=options,
            description=description,
            replace=replace,
            gradient_method=gradient_method,
        )
        if isinstance(target, type) and getattr(target, "backbone_name", None) is None:
            target.backbone_name = name  # type: ignore[attr-defined]
        return target

    return decorate if target is None else decorate(target)


@overload
def register_oracle(
    name: str,
    target: None = None,
    *,
    options: type[BaseModel] | None = None,
    description: str = "",
    replace: bool = False,
) -> Callable[[T], T]: ...


@overload
def register_oracle(
    name: str,
    target: T,
    *,
    options: type[BaseModel] | None = None,
    description: str = "",
    replace: bool = False,
) -> T: ...


def register_oracle(
    name: str,
    target: Any = None,
    *,
    options: type[BaseModel] | None = None,
    description: str = "",
    replace: bool = False,
) -> Any:
    """Register an oracle (a class or factory returning an ASE calculator) under ``name``: a
    decorator, or called with the ``target``.

    ``make_oracle("name")`` or ``make_oracle({"name": "name", **kwargs})`` then calls
    ``target(**kwargs)``, the keyword arguments validated by ``options`` first (an unknown or
    misspelt key is named) and passed with its defaults filled in.

    Args:
        name: the ``oracle`` value of an active-learning config (lower case).
        target: what to register; None: return a decorator.
        options: a pydantic model of the keyword arguments (e.g. a subclass of
            :class:`~mlip_unc.config.loader.Section`: frozen, unknown keys refused); None:
            passed as given.
        description: one line; default: the first line of the target's docstring.
        replace: replace an oracle registered under ``name``.
    """

    def decorate(target: T) -> T:
        ORACLE_REGISTRY.add(name, target, options=options, description=description, replace=replace)
        return target

    return decorate if target is None else decorate(target)


def _check_backbone_options(name: str, options: type[BaseModel] | None) -> None:
    """A backbone's options: a pydantic model with ``kwargs()`` (``BackboneOptions``), no field
    the trainer sets."""
    if options is None:
        return
    if not (isinstance(options, type) and issubclass(options, BaseModel)) or not callable(
        getattr(options, "kwargs", None)
    ):
        raise ValueError(
            f"backbone {name!r}: options must subclass mlip_unc.config.backbones.BackboneOptions"
        )
    reserved = sorted(set(TRAINER_KEYS) & set(options.model_fields))
    if reserved:
        raise ValueError(f"backbone {name!r}: {reserved} are set by the trainer, not options")
