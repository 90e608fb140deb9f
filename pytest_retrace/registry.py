"""One registry for every pluggable kind: agents, chat models, environments (and the judges and detectors
to come), each by name, each imported lazily, each open to other packages through an entry point group.

A kind is one line::

    ENVIRONMENTS = Registry("environment provider", "pytest_retrace.environments", {"xvfb": "mod:Class"})

A target is a callable or a ``"module:attr"`` string, imported on first :meth:`Registry.get` so that
``pytest --help`` never pays for an SDK. Names registered in-process win over entry points of the same name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import Generic, TypeVar, cast

T = TypeVar("T")
EntryPointSource = Callable[..., Iterable[metadata.EntryPoint]]


class RegistryError(ValueError):
    """A name a registry cannot resolve. A ValueError, as every provider lookup raised before the registry,
    so callers that turn bad names into config errors keep doing so."""

    def __init__(self, message: str, kind: str, name: str, known: list[str]) -> None:
        super().__init__(message)
        self.kind, self.name, self.known = kind, name, known


class UnknownName(RegistryError):
    """No built-in, registered or installed implementation has this name."""


class BrokenEntryPoint(RegistryError):
    """An installed package announces the name, but its entry point does not import (or is ambiguous)."""


class Registry(Generic[T]):
    """Implementations of one kind by name: built-ins, :meth:`register` calls, and entry points.

    ``targets`` is the plain mapping of in-process names (a target is a callable or ``"module:attr"``);
    ``entry_points`` is where installed entry points come from (importlib.metadata's, unless a caller
    substitutes its own)."""

    def __init__(self, kind: str, entry_point_group: str, builtins: Mapping[str, str | T] | None = None, *,
                 entry_points: EntryPointSource = metadata.entry_points) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.targets: dict[str, str | T] = {}
        self._entry_points = entry_points
        for name, target in (builtins or {}).items():
            self.register(name, target)

    def register(self, name: str, target: str | T) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: a name must be a non-empty string, not {name!r}")
        if isinstance(target, str):
            module, sep, attr = target.partition(":")
            if not (module and sep and attr):
                raise ValueError(f"{self.kind} {name!r}: target {target!r} is not 'module:attribute'")
        elif not callable(target):
            raise TypeError(f"{self.kind} {name!r}: target must be callable or 'module:attribute', "
                            f"not {type(target).__name__}")
        self.targets[name] = target

    def names(self) -> list[str]:
        """Every name :meth:`get` can resolve: registered and installed, sorted."""
        return sorted({*self.targets, *(ep.name for ep in self._installed())})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def get(self, name: str) -> T:
        """The implementation called ``name``, imported now if it was not yet."""
        target = self.targets.get(name)
        if target is None:
            return self._load_entry_point(name)
        if isinstance(target, str):
            # A built-in's own import error (a missing optional SDK) propagates as it is: it names the module.
            return cast(T, metadata.EntryPoint(name=name, value=target, group=self.entry_point_group).load())
        return target

    def _installed(self) -> list[metadata.EntryPoint]:
        # Not cached: a scan takes milliseconds and happens once per lookup of an unregistered name, and a
        # package installed mid-session (or a test's stand-in) is then seen.
        return list(self._entry_points(group=self.entry_point_group))

    def _load_entry_point(self, name: str) -> T:
        found = [ep for ep in self._installed() if ep.name == name]
        if not found:
            known = sorted({*self.targets, *(ep.name for ep in self._installed())})
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(known) or 'none'}",
                              self.kind, name, known)
        if len({ep.value for ep in found}) > 1:
            offers = "; ".join(f"{_origin(ep)}: {ep.value}" for ep in found)
            raise BrokenEntryPoint(f"{self.kind} {name!r}: entry point group {self.entry_point_group} "
                                   f"has several different {name!r} ({offers})", self.kind, name, self.names())
        ep = found[0]
        try:
            loaded = ep.load()
        except Exception as exc:  # whatever a third-party import raises, the message must say whose it was
            raise BrokenEntryPoint(
                f"{self.kind} {name!r}: entry point {ep.name} = {ep.value} of {_origin(ep)} "
                f"(group {self.entry_point_group}) failed to import: {type(exc).__name__}: {exc}",
                self.kind, name, self.names()) from exc
        if not callable(loaded):
            raise BrokenEntryPoint(f"{self.kind} {name!r}: entry point {ep.name} = {ep.value} of {_origin(ep)} "
                                   f"is a {type(loaded).__name__}, not a callable", self.kind, name, self.names())
        return cast(T, loaded)


def _origin(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "an unknown distribution"
    return f"distribution {dist.name} {dist.version}"


__all__ = ["BrokenEntryPoint", "Registry", "RegistryError", "UnknownName"]
