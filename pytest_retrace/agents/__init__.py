"""Agents under test: one protocol, providers registered by name, configs in ``agents/NAME.yaml``.

Lifecycle per case: ``start(context)`` → ``act(observation)`` until the budget is spent or the agent is done
→ ``close()`` once per session. Providers: the scripted baselines (no key; they calibrate the benchmark),
``anthropic`` (Claude computer use), ``openai`` (Responses API computer use) and ``openai-compat`` (any
OpenAI-compatible chat endpoint: UI-TARS, Qwen, EvoCUA-style pyautogui code). A third party adds one with
:func:`register_agent` or an entry point in the ``pytest_retrace.agents`` group, and a chat model (contextualizer,
verifier) with :func:`register_chat` or the ``pytest_retrace.chat_models`` group (pytest_retrace.registry).

Who is to blame decides validity: an :class:`AgentInfraError` (the API unreachable after retries, a rejected
key) is an infrastructure error, excluded from every rate. Anything else the agent does — a reply that does
not parse, an action the desktop refuses, an exception from ``act`` — is the agent's own failure and is
scored, so an agent can never change its own n.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_retrace.actions import Action
from pytest_retrace.registry import Registry, RegistryError, UnknownName

ENTRY_POINT_GROUP = "pytest_retrace.agents"
CHAT_ENTRY_POINT_GROUP = "pytest_retrace.chat_models"
Mode = Literal["forward", "recovery", "perturbation"]


class AgentInfraError(RuntimeError):
    """The agent could not be asked at all: transport failure after retries (``transport``), a request the
    API rejects whatever the model does (``api``: bad key, unknown model), or a broken setup (``config``).
    An infrastructure error: the case leaves every rate. Its message never quotes a credential (a server
    may echo the key it was sent): it is redacted here, whoever raises it."""

    def __init__(self, message: str, kind: str = "transport") -> None:
        from pytest_retrace.agents.secrets import redact

        super().__init__(redact(message))
        self.kind = kind


class AgentConfigError(ValueError):
    """A model config that cannot be used; the message names the file and field."""


@dataclass(frozen=True)
class HistoryStep:
    """One past step: the screen before it and the action taken (with the model's rationale, if any)."""

    screenshot: np.ndarray | None
    action: Action
    rationale: str = ""


@dataclass(frozen=True)
class Observation:
    screenshot: np.ndarray  # RGB uint8, the screen as it is now (settled)
    turn: int  # 0-based model turn
    remaining: int  # actions left in the budget
    cursor: tuple[int, int] | None = None  # pointer position in screen pixels, when the environment knows it
    executed: int | None = None  # how many actions of the previous turn ran (None on the first turn)
    failure: str | None = None  # why the previous turn stopped before its last action


@dataclass
class AgentContext:
    """What an agent knows when it starts acting: the paper's recovery context C, built by
    :mod:`pytest_retrace.replay.strategies`. It never says where the target step lies in the history."""

    instruction: str  # the task's user query q
    mode: Mode  # forward: act on the task (implicit recovery, rollouts); recovery: restore the target; perturbation
    strategy: str  # the recovery strategy, for records and prompts (implicit, explicit-0E, ...)
    budget: int  # actions the agent may take (the paper's steps)
    screen: tuple[int, int]  # the desktop's size in pixels
    history: list[HistoryStep] = field(default_factory=list)  # past observation–action pairs, oldest first
    target_screenshot: np.ndarray | None = None  # o_target: explicit strategies only
    summary: str | None = None  # explicit-context: the contextualizer's description of the target state
    # Privileged hook for the oracle baseline only: reset the env and replay the ground-truth prefix.
    restore_target: Callable[[], None] | None = None
    # Privileged, forward runs only: the task's ground-truth actions, for the scripted forward baselines
    ground_truth: list[Action] | None = None
    # Which independent sample of the same start this episode is (an ideal-recovery continuation's index; 0
    # otherwise): a model samples anyway, a seeded scripted agent draws by it
    sample: int = 0
    # End-to-end recovery: told once, after the history, when the environment was restored to a past step
    note: str | None = None


@dataclass
class Usage:
    """What a turn (or a case) cost: summed over every model call."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    retries: int = 0
    latency: float = 0.0  # seconds spent waiting on the model, backoff included
    cost: float | None = None  # estimated USD from the config's prices; None when no price is configured

    def add(self, other: Usage) -> None:
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name == "cost":
                self.cost = None if mine is None and theirs is None else (mine or 0.0) + (theirs or 0.0)
            else:
                setattr(self, f.name, mine + theirs)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["latency"] = round(self.latency, 3)
        if self.cost is not None:
            out["cost"] = round(self.cost, 6)
        return out


@dataclass
class AgentTurn:
    """One model turn. ``actions`` run in order; a terminal action (done / fail) ends the agent's run.
    No actions and no ``invalid``: the model only looked (a screenshot or zoom request), which uses no budget.
    ``invalid``: the reply could not be used even after one re-ask; it counts as one step of the budget."""

    actions: list[Action]
    rationale: str = ""
    usage: Usage = field(default_factory=Usage)
    invalid: str | None = None


@runtime_checkable
class Agent(Protocol):
    name: str
    privileged: bool  # True if it uses AgentContext.restore_target (not a real recovery policy)
    calls_per_turn: int  # most model calls one act() makes (0 for scripted agents): --retrace-dry-run's count

    def start(self, context: AgentContext) -> None: ...
    def act(self, observation: Observation) -> AgentTurn: ...
    def close(self) -> None: ...


@runtime_checkable
class ChatModel(Protocol):
    """A model asked one question about screenshots: the recovery-target contextualizer, the state verifier."""

    name: str

    def complete(self, system: str, parts: list[Any]) -> tuple[str, Usage]: ...
    def close(self) -> None: ...


# -- configs -------------------------------------------------------------------------------------------
class PerturbationRule(BaseModel):
    """``perturbation:`` in a model config: how ``retrace build --perturb-agent`` drives this model (paper A.1).
    ``extra_steps``: steps added to the perturbation agent's step budget d under ``--protocol paper``, where a
    look-only turn spends a step; the mistake itself still takes at most d actions (docs/agents.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # at most 5: a long horizon's d; more looks than that before a mistake is a typo, not a model's habit
    extra_steps: int = Field(0, ge=0, le=5, strict=True)


@dataclass(frozen=True)
class ModelConfig:
    """A model as described by ``agents/NAME.yaml`` (an alias file names another config instead)."""

    name: str
    provider: str
    strategies: tuple[str, ...] = ("implicit",)
    options: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    perturbation: PerturbationRule = field(default_factory=PerturbationRule)

    @property
    def where(self) -> str:
        return str(self.path or self.name)


# name -> a factory taking the ModelConfig, or the "module:attribute" of one, imported lazily so `pytest --help`
# never pays for an SDK import (pytest_retrace.registry).
AGENTS: Registry[Callable[..., Agent]] = Registry("agent provider", ENTRY_POINT_GROUP, {
    "noop": "pytest_retrace.agents.baselines:NoopAgent",
    "undo": "pytest_retrace.agents.baselines:UndoAgent",
    "oracle": "pytest_retrace.agents.baselines:OracleAgent",
    "script": "pytest_retrace.agents.baselines:ScriptAgent",
    "stall": "pytest_retrace.agents.forward:StallAgent",
    "random-fail": "pytest_retrace.agents.forward:RandomFailAgent",
    "anthropic": "pytest_retrace.agents.anthropic:AnthropicAgent",
    "openai": "pytest_retrace.agents.openai:OpenAIAgent",
    "openai-compat": "pytest_retrace.agents.openai_compat:CompatAgent",
})
CHATS: Registry[Callable[..., ChatModel]] = Registry("chat provider", CHAT_ENTRY_POINT_GROUP, {
    "anthropic": "pytest_retrace.agents.anthropic:AnthropicChat",
    "openai": "pytest_retrace.agents.openai:OpenAIChat",
    "openai-compat": "pytest_retrace.agents.openai_compat:CompatChat",
})
# The same dicts as the registries' own: code that registers or pops through them keeps working.
PROVIDERS = AGENTS.targets
CHAT_PROVIDERS = CHATS.targets


def register_agent(name: str, target: str | Callable[..., Agent]) -> None:
    AGENTS.register(name, target)


def register_chat(name: str, target: str | Callable[..., ChatModel]) -> None:
    CHATS.register(name, target)


def _lookup(registry: Registry[Any], provider: str, what: str, where: str) -> Any:
    try:
        return registry.get(provider)
    except UnknownName as exc:
        known = ", ".join(exc.known)
        raise AgentConfigError(
            f"{where}: provider: {provider!r} has no {what} implementation (known: {known})") from None
    except RegistryError as exc:
        raise AgentConfigError(f"{where}: provider: {exc}") from exc.__cause__


STRATEGY_NAMES = ("implicit", "explicit-0E", "explicit-0R", "explicit-none", "explicit-context")
_CONFIG_FIELDS = {"name", "provider", "strategy", "options", "description", "alias", "perturbation"}


def load_model_config(name: str, search: list[Path], _seen: tuple[str, ...] = ()) -> ModelConfig:
    """Resolve ``--retrace-model=NAME`` to ``<dir>/NAME.yaml`` in the first search dir that has it;
    an alias file (``alias: OTHER``) resolves to OTHER's config, whose name the results then carry."""
    for directory in search:
        path = directory / f"{name}.yaml"
        if path.is_file():
            raw = _read_config(path)
            if "alias" in raw:
                target = raw["alias"]
                if set(raw) - {"alias", "description"} or not isinstance(target, str):
                    raise AgentConfigError(f"{path}: an alias file holds only `alias: NAME` (and a description)")
                if target in _seen + (name,):
                    raise AgentConfigError(f"{path}: alias loop: {' -> '.join(_seen + (name, target))}")
                return load_model_config(target, search, _seen + (name,))
            return _parse_config(name, path, raw)
    known = sorted({p.stem for d in search if d.is_dir() for p in d.glob("*.yaml")})
    where = ", ".join(str(d) for d in search) or "(no agents directory configured)"
    raise AgentConfigError(f"model {name!r}: no {name}.yaml in {where}; available: {', '.join(known) or 'none'}")


def _read_config(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise AgentConfigError(f"{path}: top level must be a mapping")
    unknown = set(raw) - _CONFIG_FIELDS
    if unknown:
        raise AgentConfigError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")
    return raw


def _parse_config(name: str, path: Path, raw: dict[str, Any]) -> ModelConfig:
    provider = raw.get("provider")
    if not isinstance(provider, str) or not provider:
        raise AgentConfigError(
            f"{path}: provider: a provider name is required (one of {', '.join(AGENTS.names())})")
    strategies = raw.get("strategy", "implicit")
    strategies = [strategies] if isinstance(strategies, str) else strategies
    if not isinstance(strategies, list) or not strategies:
        raise AgentConfigError(f"{path}: strategy: a strategy name or a list of them")
    for s in strategies:
        if s not in STRATEGY_NAMES:
            raise AgentConfigError(f"{path}: strategy: {s!r} is not one of {', '.join(STRATEGY_NAMES)}")
    options = raw.get("options", {}) or {}
    if not isinstance(options, dict):
        raise AgentConfigError(f"{path}: options: must be a mapping")
    return ModelConfig(name=str(raw.get("name", name)), provider=provider, strategies=tuple(strategies),
                       options=options, path=path, perturbation=_perturbation_rule(path, raw.get("perturbation")))


def _perturbation_rule(path: Path, raw: Any) -> PerturbationRule:
    if raw is None:
        return PerturbationRule()
    if not isinstance(raw, dict):
        raise AgentConfigError(f"{path}: perturbation: must be a mapping (e.g. {{extra_steps: 1}}), got {raw!r}")
    try:
        return PerturbationRule.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise AgentConfigError(f"{path}: perturbation.{where}: {err['msg']}, got {err['input']!r}") from None


def _construct(factory: Any, config: ModelConfig) -> Any:
    try:
        return factory(config)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, AgentConfigError):
            raise
        raise AgentConfigError(f"{config.where}: options: {exc}") from None


def parse_options(schema: type[Any], config: ModelConfig) -> Any:
    """Validate a config's ``options`` against a provider's pydantic model; errors name file and field."""
    try:
        return schema.model_validate(config.options)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise AgentConfigError(f"{config.where}: options.{where}: {err['msg']}") from None


def agent_factory(config: ModelConfig) -> Any:
    """The provider's factory (its class, usually), imported but not called: what a dry run may inspect."""
    return _lookup(AGENTS, config.provider, "agent", config.where)


def create_agent(config: ModelConfig) -> Agent:
    """Build the agent a config describes. Construction checks everything that can be checked offline
    (options, the API key's variable): a config error names the file and the field."""
    return _construct(agent_factory(config), config)


def create_chat(config: ModelConfig) -> ChatModel:
    return _construct(_lookup(CHATS, config.provider, "chat", config.where), config)


__all__ = [
    "STRATEGY_NAMES",
    "Agent",
    "AgentConfigError",
    "AgentContext",
    "AgentInfraError",
    "AgentTurn",
    "ChatModel",
    "HistoryStep",
    "ModelConfig",
    "Observation",
    "PerturbationRule",
    "Usage",
    "agent_factory",
    "create_agent",
    "create_chat",
    "load_model_config",
    "parse_options",
    "register_agent",
    "register_chat",
]
