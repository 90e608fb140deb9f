"""Parse a whole model reply in the EvoCUA / OSWorld style, prose plus pyautogui code in fenced blocks, into
its rationale and :class:`Action` values; the code itself is read by :func:`.pyautogui.parse_pyautogui`."""

from __future__ import annotations

import re

from pytest_retrace.actions.action import Action, ActionError, ParsedReply
from pytest_retrace.actions.limits import MAX_REPLY_CHARS, MAX_TURN_ACTIONS
from pytest_retrace.actions.pyautogui import MAX_CODE_CHARS, SPECIAL, parse_pyautogui

_FENCE = "```"
_INFO_STRING = re.compile(r"[A-Za-z0-9_+.#-]*")  # the language tag after an opening fence: python, py ...
_LINE_PREFIX = re.compile(r"^line (\d+): ")


def _fenced_blocks(text: str) -> tuple[list[tuple[int, str]], str]:
    """The code of each fenced block with the reply line its code starts on, and the text outside blocks.

    Scans with str.find (linear even for a reply full of unmatched fences). A block's first line is a
    language tag only if it is a bare word; ```` ```pyautogui.click(1, 2)``` ```` is code. An unclosed
    last fence runs to the end of the reply (replies are often cut at a stop sequence).
    """
    blocks: list[tuple[int, str]] = []
    outside: list[str] = []
    pos, line = 0, 1
    while (start := text.find(_FENCE, pos)) != -1:
        outside.append(text[pos:start])
        body_start = start + len(_FENCE)
        line += text.count("\n", pos, body_start)
        end = text.find(_FENCE, body_start)
        body = text[body_start:] if end == -1 else text[body_start:end]
        first, newline, rest = body.partition("\n")
        code, code_line = body, line
        if newline and _INFO_STRING.fullmatch(first.strip()) and first.strip() not in SPECIAL:
            code, code_line = rest, line + 1
        blocks.append((code_line, code))
        pos = len(text) if end == -1 else end + len(_FENCE)
        line += text.count("\n", body_start, pos)
    outside.append(text[pos:])
    return blocks, "".join(outside)


def _parse_at(code: str, first_line: int) -> list[Action]:
    """parse_pyautogui, with its error's line number counted in the reply rather than in `code`."""
    try:
        return parse_pyautogui(code)
    except ActionError as exc:
        message = str(exc)
        match = _LINE_PREFIX.match(message)
        if match is None:
            raise ActionError(f"line {first_line}: {message}") from None
        line = first_line + int(match.group(1)) - 1
        raise ActionError(f"line {line}: {message[match.end():]}") from None


def parse_pyautogui_reply(text: str) -> ParsedReply:
    """Parse a whole reply: prose plus pyautogui code in fenced blocks, or a WAIT / DONE / FAIL line.

    The code of all blocks is parsed, in order, by :func:`parse_pyautogui`; a line that is exactly
    WAIT / DONE / FAIL inside a block is that action (so ```` ```DONE``` ```` after a block of clicks works).
    Without any block, the reply (stripped) or its last non-empty line must be WAIT / DONE / FAIL.
    The rationale is the text outside the blocks.  Errors name the line of the reply.
    """
    if not isinstance(text, str):
        raise ActionError(f"a model reply must be a string, got {type(text).__name__}")
    if len(text) > MAX_REPLY_CHARS:
        raise ActionError(f"the reply is too long ({len(text)} characters, limit {MAX_REPLY_CHARS})")
    blocks, outside = _fenced_blocks(text)
    if not blocks:
        lines = text.strip().split("\n")
        special = SPECIAL.get(lines[-1].strip())
        if special is None:
            raise ActionError(
                "no pyautogui code block (```python ... ```) in the reply, and its last line is not "
                "WAIT, DONE or FAIL"
            )
        return ParsedReply("\n".join(lines[:-1]).strip(), [special])
    total = sum(len(code) for _, code in blocks)
    if total > MAX_CODE_CHARS:
        raise ActionError(f"pyautogui code is too long ({total} characters, limit {MAX_CODE_CHARS})")
    actions: list[Action] = []
    for first_line, code in blocks:
        segment: list[str] = []
        segment_line = first_line
        for offset, line in enumerate(code.split("\n")):
            special = SPECIAL.get(line.strip())
            if special is None:
                segment.append(line)
                continue
            actions += _parse_at("\n".join(segment), segment_line)
            actions.append(special)
            segment, segment_line = [], first_line + offset + 1
            if len(actions) > MAX_TURN_ACTIONS:
                raise ActionError(f"line {first_line + offset}: too many actions (limit {MAX_TURN_ACTIONS})")
        actions += _parse_at("\n".join(segment), segment_line)
        if len(actions) > MAX_TURN_ACTIONS:
            raise ActionError(f"line {first_line}: too many actions (limit {MAX_TURN_ACTIONS})")
    return ParsedReply(outside.strip(), actions)


__all__ = ["parse_pyautogui_reply"]
