"""Which environment a run uses, with its options: ``--retrace-env NAME|FILE`` and ``--retrace-env-option
KEY=VALUE`` (``retrace record`` and ``retrace build``: ``--env``, ``--env-option``).

NAME is a provider (``xvfb``, or one a package registers), or a config ``envs/NAME.yaml`` next to the project:

    provider: xvfb
    options:
      memory_limit: 2147483648

A command-line option overrides the file's. Values are YAML scalars (``4``, ``true``, ``a,b`` stays text).
Every option is checked against the provider's own parameters before anything starts, so a typo is a usage
error naming the option, not a crash in every test.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pytest_retrace.envs import Environment, environment_factory, provider_names

# What the harness passes to every provider itself: not user options.
HARNESS_KEYWORDS = frozenset({"size", "settle", "network", "hide"})


_SECRET = re.compile(r"token|key|secret|password", re.IGNORECASE)


class EnvConfigError(ValueError):
    """An environment name, config file or option that cannot be used; the message names it."""


@dataclass(frozen=True)
class EnvConfig:
    name: str  # what the user wrote: a provider, a config name or a file
    provider: str
    options: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # the config file, if any

    def create(self, **harness: Any) -> Environment:
        return environment_factory(self.provider)(**harness, **self.options)

    def describe(self) -> str:
        """For headers and reports: the provider and its options, secrets left out."""
        shown = ", ".join(f"{k}={'***' if _SECRET.search(k) else v}" for k, v in sorted(self.options.items()))
        return f"{self.provider} ({shown})" if shown else self.provider


def load_env_config(name: str, search: Sequence[Path] = (), overrides: Sequence[str] = ()) -> EnvConfig:
    path = Path(name)
    if name.endswith((".yaml", ".yml")):
        if not path.is_file():
            raise EnvConfigError(f"environment config {name}: no such file")
        config = _read(path, name)
    else:
        found = next((d / f"{name}.yaml" for d in search if (d / f"{name}.yaml").is_file()), None)
        config = _read(found, name) if found is not None else EnvConfig(name, name)
    options = dict(config.options)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise EnvConfigError(f"environment option {item!r}: write KEY=VALUE")
        try:
            options[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            options[key.strip()] = raw
    config = EnvConfig(config.name, config.provider, options, config.path)
    _check(config)
    return config


def _read(path: Path, name: str) -> EnvConfig:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise EnvConfigError(f"{path}: cannot read: {exc}") from None
    if not isinstance(raw, dict) or set(raw) - {"provider", "options", "description"}:
        raise EnvConfigError(f"{path}: a mapping with `provider`, `options` and an optional `description`")
    provider, options = raw.get("provider"), raw.get("options") or {}
    if not isinstance(provider, str) or not provider:
        raise EnvConfigError(f"{path}: provider: one of {', '.join(provider_names())}")
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise EnvConfigError(f"{path}: options: a mapping of option names to values")
    return EnvConfig(name, provider, dict(options), path)


def _check(config: EnvConfig) -> None:
    where = str(config.path) if config.path else f"environment {config.name!r}"
    try:
        factory = environment_factory(config.provider)
    except ValueError as exc:
        raise EnvConfigError(f"{where}: {exc}") from None
    params = inspect.signature(factory).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    allowed = sorted(n for n in params if n not in HARNESS_KEYWORDS and n != "self")
    for key in config.options:
        if key in HARNESS_KEYWORDS:
            raise EnvConfigError(f"{where}: option {key!r} is set by the harness (see --retrace-{key})")
        if key not in params and not accepts_any:
            raise EnvConfigError(f"{where}: provider {config.provider!r} has no option {key!r} "
                                 f"(its options: {', '.join(allowed) or 'none'})")
