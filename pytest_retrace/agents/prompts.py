"""The prompts a model agent is given, read from files next to the model configs (``agents/prompts/``,
documented in its README), and the one opening message every provider renders in its own wire format.

Composition follows the paper (A.2): implicit recovery and forward rollouts get the model's forward system
prompt and the task, nothing about recovery; explicit strategies prepend the recovery prefix to the system
prompt and replace the task with the strategy's recovery instruction, the target screenshot and the
strategy's context; the perturbation agent gets the perturbation prefix. Templates use ``$name``
placeholders (``string.Template``), so prompts may hold JSON braces verbatim.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pytest_retrace.actions import Action
from pytest_retrace.agents import AgentConfigError, AgentContext, ModelConfig

# key -> default file, relative to the prompts directory
FILES: dict[str, str] = {
    "forward_system": "forward-system.md",
    "recovery_prefix": "recovery-prefix.md",
    "recovery_explicit-0E": "recovery-explicit-0E.md",
    "recovery_explicit-0R": "recovery-explicit-0R.md",
    "recovery_explicit-none": "recovery-explicit-none.md",
    "recovery_explicit-context": "recovery-explicit-context.md",
    "perturbation_prefix": "perturbation-prefix.md",
    "perturbation_instruction": "perturbation-instruction.md",
    "contextualizer_system": "contextualizer-system.md",
    "contextualizer_instruction": "contextualizer-instruction.md",
    "verifier_system": "verifier-system.md",
    "error_detector_system": "error-detector-system.md",
    "recovery_detector_system": "recovery-detector-system.md",
    "judge_system": "judge-system.md",
}
DETECTOR_KEYS = frozenset({"error_detector_system", "recovery_detector_system"})
JUDGE_KEY = "judge_system"  # the LLM judge of finished records (validation/judge.py)


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Image:
    """A screenshot in a prompt. `past` ones (history, earlier turns) may be replaced by a placeholder once
    more than the config's ``max_screenshots`` are in the conversation; the target and the current screen
    are always kept."""

    pixels: np.ndarray
    past: bool = False


Part = Text | Image
PLACEHOLDER = "[an earlier screenshot, omitted to keep the conversation short]"


class Prompts:
    """Prompt files for one model config: ``prompts_dir`` (relative to the config file) holds the defaults,
    ``overrides`` maps a key of :data:`FILES` to another file."""

    def __init__(self, base: Path, prompts_dir: str = "prompts", overrides: dict[str, str] | None = None) -> None:
        self.base, self.dir = base, base / prompts_dir
        unknown = set(overrides or {}) - set(FILES)
        if unknown:
            raise AgentConfigError(f"prompts: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(FILES)}")
        self.paths = {k: self.dir / f for k, f in FILES.items()} | {k: base / v for k, v in (overrides or {}).items()}
        self._cache: dict[str, str] = {}

    def text(self, key: str, **values: object) -> str:
        if key not in self._cache:
            path = self.paths[key]
            try:
                self._cache[key] = path.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise AgentConfigError(f"prompt {key!r}: cannot read {path}: {exc.strerror or exc}") from None
        try:
            return string.Template(self._cache[key]).substitute({k: str(v) for k, v in values.items()})
        except (KeyError, ValueError) as exc:
            raise AgentConfigError(f"prompt {key!r} ({self.paths[key]}): unknown or malformed placeholder {exc}") from None

    def check(self) -> None:
        """Read every file now: a missing prompt is a config error at start-up, not mid-run."""
        for key in FILES:
            if key not in DETECTOR_KEYS | {JUDGE_KEY}:  # an agent never reads them (their users check their own)
                self.text(key, **_ALL_PLACEHOLDERS)

    # -- composition ---------------------------------------------------------------------------------
    def system(self, ctx: AgentContext, **values: object) -> str:
        forward = self.text("forward_system", **self._values(ctx, values))
        if ctx.mode == "recovery":
            return self.text("recovery_prefix", **self._values(ctx, values)) + "\n\n" + forward
        if ctx.mode == "perturbation":
            return self.text("perturbation_prefix", **self._values(ctx, values)) + "\n\n" + forward
        return forward

    def opening(self, ctx: AgentContext, screenshot: np.ndarray, describe: Callable[[Action], str],
                **values: object) -> list[Part]:
        """The first user message: what to do, the context the strategy allows, then the current screen."""
        vals = self._values(ctx, values)
        if ctx.mode == "recovery":
            head = self.text(f"recovery_{ctx.strategy}", **vals)
        elif ctx.mode == "perturbation":
            head = self.text("perturbation_instruction", **vals)
        else:
            head = ctx.instruction
        parts: list[Part] = [Text(head)]
        if ctx.history:
            parts.append(Text(f"The steps taken so far ({len(ctx.history)}, oldest first), each the screen "
                              "before it and the action taken there:"))
            for i, step in enumerate(ctx.history, 1):
                if step.screenshot is not None:
                    parts.append(Image(step.screenshot, past=True))
                note = f"\nRationale: {step.rationale}" if step.rationale else ""
                parts.append(Text(f"Step {i}:\n{describe(step.action)}{note}"))
        if ctx.note:
            parts.append(Text(ctx.note))
        if ctx.summary:
            parts.append(Text("What led to the target state:\n" + ctx.summary))
        if ctx.target_screenshot is not None:
            parts += [Text("The target state to restore:"), Image(ctx.target_screenshot)]
        parts += [Text("The current screen:"), Image(screenshot)]
        return parts

    @staticmethod
    def _values(ctx: AgentContext, extra: dict[str, object]) -> dict[str, object]:
        return {"instruction": ctx.instruction, "budget": ctx.budget, "screen_width": ctx.screen[0],
                "screen_height": ctx.screen[1], **extra}


# Every placeholder a prompt file may use: `check()` substitutes them all to catch typos at start-up.
_ALL_PLACEHOLDERS: dict[str, object] = {
    "instruction": "", "budget": 0, "screen_width": 0, "screen_height": 0, "image_width": 0, "image_height": 0,
    "steps": 0, "state": "",
}


def config_prompts(config: ModelConfig) -> Prompts:
    """The prompt files a chat model config reads: its ``prompts_dir`` (relative to the config file; the current
    directory for a config made in code) and its ``prompts`` overrides."""
    base = config.path.parent if config.path else Path.cwd()
    return Prompts(base, config.options.get("prompts_dir", "prompts"), config.options.get("prompts"))

