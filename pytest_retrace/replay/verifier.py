"""The optional LLM state verifier (``--retrace-verifier MODEL``; the paper uses GPT-5-mini, A.2).

On the xvfb desktop a reconstructed state is checked pixel for pixel, which is stricter than any model.
Environments that cannot reproduce a screen exactly (a remote VM with a clock, a browser that renders a
frame late) may ask a model instead whether the screen shows the recorded state; the record says which
states were accepted that way. It only ever accepts a *reconstruction*; it never judges a recovery.
"""

from __future__ import annotations

import re

import numpy as np

from pytest_retrace.agents import ChatModel, Usage
from pytest_retrace.agents.prompts import Image, Prompts, Text

_VERDICT = re.compile(r"\bverdict\s*:\s*(same|different)\b", re.IGNORECASE)


class StateVerifier:
    def __init__(self, chat: ChatModel, prompts: Prompts) -> None:
        self.chat, self.prompts = chat, prompts  # its config sets the model's own limits (max_tokens...)

    def same_state(self, expected: np.ndarray, actual: np.ndarray, state: str) -> tuple[bool, str, Usage]:
        """(same?, the model's reason, usage). A reply without a clear verdict counts as different: an
        unsure judge must never let a wrong state through."""
        parts = [Text(f"Recorded {state} state:"), Image(expected), Text(f"Reconstructed {state} state:"),
                 Image(actual), Text("Answer with your reasoning, then a last line `Verdict: same` or `Verdict: different`.")]
        text, usage = self.chat.complete(self.prompts.text("verifier_system", state=state), parts)
        found = _VERDICT.findall(text)
        reason = " ".join(text.split())[:300]
        return bool(found) and found[-1].lower() == "same", reason, usage
