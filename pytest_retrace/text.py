"""Text cut short for messages. What a message quotes may come from a case file, a request or a model's reply,
of any size: ``clip`` bounds a text, ``show`` a value's repr (the one helper every room uses for this)."""

from __future__ import annotations

from typing import Any


def clip(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its start and an ellipsis, ``limit`` in all."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show(value: Any, limit: int = 200) -> str:
    """repr() for messages, cut to ``limit`` characters."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's int-to-str limit, from an untrusted file or reply
        return f"<a {type(value).__name__} too large to print>"
    return clip(text, limit)
