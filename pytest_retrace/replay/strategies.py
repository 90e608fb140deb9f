"""Recovery strategies (paper 5.3 and A.2): what an agent is told when recovery starts.

| strategy           | prompt            | history given              | target screenshot |
|--------------------|-------------------|----------------------------|-------------------|
| `implicit`         | forward (the task)| 0-E: up to the error       | no                |
| `explicit-0E`      | recovery          | 0-E: up to the error       | yes               |
| `explicit-0R`      | recovery          | 0-R: up to the target      | yes               |
| `explicit-none`    | recovery          | none                       | yes               |
| `explicit-context` | recovery          | an LLM's summary of 0-R    | yes               |

The harness knows where the target step lies (t_seed); this module is the only place that uses it, to cut
the history, and it never reaches the agent: an implicit agent cannot tell a target step from any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pytest_retrace.agents import AgentContext, ChatModel, HistoryStep, Usage
from pytest_retrace.agents.prompts import Image, Part, Prompts, Text

HistoryKind = Literal["0E", "0R", "none", "summary"]


@dataclass(frozen=True)
class Strategy:
    name: str
    explicit: bool  # recovery prompt + target screenshot
    history: HistoryKind


STRATEGIES: dict[str, Strategy] = {
    "implicit": Strategy("implicit", False, "0E"),
    "explicit-0E": Strategy("explicit-0E", True, "0E"),
    "explicit-0R": Strategy("explicit-0R", True, "0R"),
    "explicit-none": Strategy("explicit-none", True, "none"),
    "explicit-context": Strategy("explicit-context", True, "summary"),
}


class Contextualizer:
    """Recovery target contextualization: a model (its own config, e.g. Claude Sonnet 4.6 at temperature 0,
    1024 tokens, as in the paper) describes the target state and the transitions that led to it."""

    def __init__(self, chat: ChatModel, prompts: Prompts) -> None:
        self.chat, self.prompts = chat, prompts  # its config sets the model's own limits (max_tokens...)

    def summarize(self, instruction: str, history: list[HistoryStep], target: np.ndarray) -> tuple[str, Usage]:
        from pytest_retrace.actions.pyautogui_render import to_pyautogui

        values = {"instruction": instruction, "steps": len(history)}
        parts: list[Part] = [Text(self.prompts.text("contextualizer_instruction", **values))]
        for i, step in enumerate(history, 1):
            if step.screenshot is not None:
                parts.append(Image(step.screenshot, past=True))
            parts.append(Text(f"Step {i}: {to_pyautogui(step.action)}"))
        parts += [Text("The target state (the screen after the last step):"), Image(target)]
        return self.chat.complete(self.prompts.text("contextualizer_system", **values), parts)


def build_context(strategy: str, *, instruction: str, budget: int, screen: tuple[int, int],
                  history: list[HistoryStep], t_seed: int, target: np.ndarray,
                  contextualizer: Contextualizer | None = None) -> tuple[AgentContext, Usage]:
    """The context of one recovery. `history` is 0-E (the ground-truth prefix, then the perturbation);
    `t_seed` is how much of it is the prefix. Returns the context and what building it cost."""
    spec = STRATEGIES[strategy]
    usage = Usage()
    steps = {"0E": history, "0R": history[:t_seed], "none": [], "summary": []}[spec.history]
    summary = None
    if spec.history == "summary":
        if contextualizer is None:
            raise ValueError("explicit-context needs a contextualizer model")
        summary, usage = contextualizer.summarize(instruction, history[:t_seed], target)
    context = AgentContext(
        instruction=instruction, mode="recovery" if spec.explicit else "forward", strategy=strategy, budget=budget,
        screen=screen, history=list(steps), target_screenshot=target if spec.explicit else None, summary=summary,
    )
    return context, usage
