"""The two detectors of the paper's experiments (§4, §6; its Figures 36-37 describe their prompts, these are this
project's own): the **error-step detector** reads a trajectory's observation-action history and names its first
wrong step E (1-based), or none; the **recovery-step detector** names the step R to return to (0 <= R < E: the
state after R steps, 0 the initial state).

Backed by a chat model through the existing adapters (a config ``agents/NAME.yaml`` whose provider is a chat
provider; prompts ``error_detector_system`` and ``recovery_detector_system`` in its prompts directory; the paper's
backbone, Qwen3.6-Plus at temperature 0.7, is ``agents/error-detector.yaml``), or scripted for tests
(``DETECTORS``: ``scripted-error`` fires at a fixed step, ``scripted-recovery`` goes a fixed number of steps back).
Every decision keeps its rationale, the reply, what it cost and the size of what it was shown.

A reply that names no valid step is a decision of its own (``step`` None, ``valid`` False): an annotation the
experiments count and exclude, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, field_validator

from pytest_retrace.agents import (
    AgentConfigError,
    ChatModel,
    HistoryStep,
    ModelConfig,
    Usage,
    create_chat,
    parse_options,
)
from pytest_retrace.agents.prompts import Image, Part, Prompts, Text, config_prompts
from pytest_retrace.registry import Registry

Role = Literal["error", "recovery"]


@dataclass(frozen=True)
class Decision:
    """One detector's answer: ``step`` (E or R) or None (no error found; or an invalid reply, ``valid`` False)."""

    step: int | None
    rationale: str
    valid: bool = True
    reply: str = ""
    usage: Usage = field(default_factory=Usage)
    inputs: dict[str, int] = field(default_factory=dict)  # steps, images, characters of text it was shown

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "valid": self.valid, "rationale": self.rationale, "reply": self.reply,
                "usage": self.usage.to_dict(), "inputs": dict(self.inputs)}


class ErrorDetector(Protocol):
    name: str

    def first_error(self, instruction: str, history: Sequence[HistoryStep], current: np.ndarray | None) -> Decision:
        """E: the first wrong step of ``history`` (the screen before each step, its action and rationale;
        ``current`` is the screen after the last), or None."""


class RecoveryStepDetector(Protocol):
    name: str

    def recovery_step(self, instruction: str, history: Sequence[HistoryStep], error_step: int) -> Decision:
        """R, with 0 <= R < ``error_step``: the state to return to (after R steps of ``history``)."""


# -- scripted, for tests --------------------------------------------------------------------------------
class _ScriptedErrorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at: int | None = None  # E; none: never fires
    tasks: dict[str, int | None] = {}  # per task instruction, overriding `at`

    @field_validator("at")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("must be >= 1 (steps are numbered from 1)")
        return value


class ScriptedErrorDetector:
    """Names step ``at`` once the history reaches it (per task instruction with ``tasks``), else none."""

    def __init__(self, config: ModelConfig) -> None:
        self.name, self.opts = config.name, parse_options(_ScriptedErrorOptions, config)

    def first_error(self, instruction: str, history: Sequence[HistoryStep], current: np.ndarray | None) -> Decision:
        at = self.opts.tasks.get(instruction, self.opts.at)
        if at is None or len(history) < at:
            return Decision(None, "scripted: no error yet", inputs={"steps": len(history)})
        return Decision(at, f"scripted: step {at} is wrong", inputs={"steps": len(history)})


class _ScriptedRecoveryOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    back: int = 1  # R = E - back, at least 0


class ScriptedRecoveryDetector:
    def __init__(self, config: ModelConfig) -> None:
        self.name, self.opts = config.name, parse_options(_ScriptedRecoveryOptions, config)

    def recovery_step(self, instruction: str, history: Sequence[HistoryStep], error_step: int) -> Decision:
        step = max(error_step - self.opts.back, 0)
        return Decision(step, f"scripted: {self.opts.back} step(s) before E={error_step}", inputs={"steps": len(history)})


# -- backed by a chat model ----------------------------------------------------------------------------------
_ERROR = re.compile(r"\berror\s+step\s*:\s*(none|\d+)\b", re.IGNORECASE)
_RECOVERY = re.compile(r"\brecovery\s+step\s*:\s*(\d+)\b", re.IGNORECASE)


def _shown(instruction: str, history: Sequence[HistoryStep], current: np.ndarray | None) -> list[Part]:
    from pytest_retrace.actions.pyautogui_render import to_pyautogui

    parts: list[Part] = [Text(f"The task: {instruction}")]
    for i, step in enumerate(history, 1):
        if step.screenshot is not None:
            parts += [Text(f"The screen before step {i}:"), Image(step.screenshot, past=True)]
        said = f" The agent's reasoning: {' '.join(step.rationale.split())}" if step.rationale else ""
        parts.append(Text(f"Step {i}: {to_pyautogui(step.action)}{said}"))
    if current is not None:
        parts += [Text("The screen now, after the last step:"), Image(current)]
    return parts


def _size(parts: list[Part], steps: int) -> dict[str, int]:
    return {"steps": steps, "images": sum(isinstance(p, Image) for p in parts),
            "characters": sum(len(p.text) for p in parts if isinstance(p, Text))}


class LLMErrorDetector:
    def __init__(self, name: str, chat: ChatModel, prompts: Prompts) -> None:
        self.name, self.chat, self.prompts = name, chat, prompts

    def first_error(self, instruction: str, history: Sequence[HistoryStep], current: np.ndarray | None) -> Decision:
        parts = _shown(instruction, history, current)
        parts.append(Text(f"Which of steps 1-{len(history)} is the first wrong one? End with one line "
                          "`Error step: N`, or `Error step: none` if every step so far is right."))
        reply, usage = self.chat.complete(self.prompts.text("error_detector_system", steps=len(history)), parts)
        found = _ERROR.findall(reply)
        size, why = _size(parts, len(history)), " ".join(reply.split())[:600]
        if not found:
            return Decision(None, why, False, reply, usage, size)
        answer = found[-1].lower()
        if answer == "none":
            return Decision(None, why, True, reply, usage, size)
        step = int(answer)
        valid = 1 <= step <= len(history)
        return Decision(step if valid else None, why, valid, reply, usage, size)


class LLMRecoveryStepDetector:
    def __init__(self, name: str, chat: ChatModel, prompts: Prompts) -> None:
        self.name, self.chat, self.prompts = name, chat, prompts

    def recovery_step(self, instruction: str, history: Sequence[HistoryStep], error_step: int) -> Decision:
        shown = list(history[:error_step])
        parts = _shown(instruction, shown, None)
        parts.append(Text(f"Step {error_step} was wrong. To which state should the agent return: the state after "
                          f"step R, for R from 0 (the initial state) to {error_step - 1}? End with one line "
                          "`Recovery step: R`."))
        reply, usage = self.chat.complete(self.prompts.text("recovery_detector_system", error_step=error_step), parts)
        found = _RECOVERY.findall(reply)
        size, why = _size(parts, len(shown)), " ".join(reply.split())[:600]
        step = int(found[-1]) if found else None
        valid = step is not None and 0 <= step < error_step
        return Decision(step if valid else None, why, valid, reply, usage, size)


# role -> provider -> a factory taking the config: the scripted detectors; any other provider is a chat model
DETECTORS: Registry[Callable[..., Any]] = Registry("detector provider", "pytest_retrace.detectors", {
    "scripted-error": "pytest_retrace.experiments.detectors:ScriptedErrorDetector",
    "scripted-recovery": "pytest_retrace.experiments.detectors:ScriptedRecoveryDetector",
})
_ROLE_OF = {"scripted-error": "error", "scripted-recovery": "recovery"}


def create_detector(role: Role, config: ModelConfig) -> Any:
    """The ``role`` detector a config describes: a scripted one, or a chat model with this role's prompt."""
    if config.provider in DETECTORS.names():
        if _ROLE_OF.get(config.provider, role) != role:
            what = "an error-step" if role == "error" else "a recovery-step"
            raise AgentConfigError(f"{config.where}: provider {config.provider} is not {what} detector")
        return DETECTORS.get(config.provider)(config)
    chat = create_chat(config)
    prompts = config_prompts(config)
    key = "error_detector_system" if role == "error" else "recovery_detector_system"
    prompts.text(key, steps=0, error_step=1)  # a missing or broken prompt file is a config error now
    cls = LLMErrorDetector if role == "error" else LLMRecoveryStepDetector
    return cls(config.name, chat, prompts)
