"""Agents under test: one protocol, providers registered by name, configs in ``agents/NAME.yaml``.

Lifecycle per case: ``start(context)`` → ``act(observation)`` up to r times → ``close()`` once per session.
Model adapters (Claude / OpenAI computer use, vLLM-served models) plug in as providers; the scripted
baselines here need no key and calibrate the benchmark (noop must score 0 %, oracle 100 %).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import yaml

from ..actions import Action

Strategy = Literal["implicit", "explicit"]
STRATEGIES: tuple[str, ...] = ("implicit", "explicit")


class AgentError(RuntimeError):
    """The agent could not produce an action (API error, unparsable reply): an infrastructure error."""


class AgentConfigError(ValueError):
    """A model config that cannot be used; the message names the file and field."""


@dataclass(frozen=True)
class HistoryStep:
    """One past step: the observation before it and the action taken (with the model's rationale)."""

    screenshot: np.ndarray | None
    action: Action
    rationale: str = ""


@dataclass(frozen=True)
class Observation:
    screenshot: np.ndarray  # RGB uint8, the screen as it is now
    step: int  # 0-based recovery step


@dataclass
class RecoveryContext:
    """What an agent knows when recovery starts (the paper's recovery context C)."""

    instruction: str  # the task's user query q
    strategy: Strategy
    budget: int  # r: at most this many agent turns
    history: list[HistoryStep]  # 0-E: trajectory so far, target prefix then the perturbation
    t_seed: int  # index in `history` where the target state was reached
    target_screenshot: np.ndarray | None  # o_target: given to explicit recovery only
    ssim_threshold: float = 0.99
    # Privileged hook for the oracle baseline only: reset the env and replay gt[0:t_seed].
    restore_target: Callable[[], None] | None = None


@dataclass
class AgentTurn:
    actions: list[Action]
    rationale: str = ""
    usage: dict[str, int] = field(default_factory=dict)  # tokens etc., for cost accounting


@runtime_checkable
class Agent(Protocol):
    name: str
    privileged: bool  # True if it uses RecoveryContext.restore_target (not a real recovery policy)

    def start(self, context: RecoveryContext) -> None: ...
    def act(self, observation: Observation) -> AgentTurn: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class ModelConfig:
    """A model under test as described by ``agents/NAME.yaml``."""

    name: str
    provider: str
    strategy: Strategy = "implicit"
    options: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


PROVIDERS: dict[str, str] = {
    "noop": "pytest_retrace.agents.baselines:NoopAgent",
    "undo": "pytest_retrace.agents.baselines:UndoAgent",
    "oracle": "pytest_retrace.agents.baselines:OracleAgent",
    "script": "pytest_retrace.agents.baselines:ScriptAgent",
}


def register_agent(name: str, target: str | Callable[..., Agent]) -> None:
    PROVIDERS[name] = target  # type: ignore[assignment]


def load_model_config(name: str, search: list[Path]) -> ModelConfig:
    """Resolve ``--retrace-model=NAME`` to ``<dir>/NAME.yaml`` in the first search dir that has it."""
    for directory in search:
        path = directory / f"{name}.yaml"
        if path.is_file():
            return _parse_config(name, path)
    known = sorted({p.stem for d in search if d.is_dir() for p in d.glob("*.yaml")})
    where = ", ".join(str(d) for d in search) or "(no agents directory configured)"
    raise AgentConfigError(f"model {name!r}: no {name}.yaml in {where}; available: {', '.join(known) or 'none'}")


def _parse_config(name: str, path: Path) -> ModelConfig:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise AgentConfigError(f"{path}: top level must be a mapping")
    unknown = set(raw) - {"name", "provider", "strategy", "options", "description"}
    if unknown:
        raise AgentConfigError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")
    provider = raw.get("provider")
    if provider not in PROVIDERS:
        raise AgentConfigError(f"{path}: provider: {provider!r} is not one of {', '.join(sorted(PROVIDERS))}")
    strategy = raw.get("strategy", "implicit")
    if strategy not in STRATEGIES:
        raise AgentConfigError(f"{path}: strategy: {strategy!r} is not one of {', '.join(STRATEGIES)}")
    options = raw.get("options", {}) or {}
    if not isinstance(options, dict):
        raise AgentConfigError(f"{path}: options: must be a mapping")
    return ModelConfig(name=str(raw.get("name", name)), provider=provider, strategy=strategy, options=options,
                       path=path)


def create_agent(config: ModelConfig) -> Agent:
    target: Any = PROVIDERS[config.provider]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
    try:
        return target(**config.options)
    except TypeError as exc:
        raise AgentConfigError(f"{config.path or config.name}: options: {exc}") from None
