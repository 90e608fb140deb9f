"""What a guest said when it failed, as a message a person can read: the server's own error text out of JSON,
an HTML error page or a traceback, never the page itself or a tail cut mid-line; and the one failure of an
OSWorld VM's display that has a known cause and remedy (:class:`DisplayExhausted`)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from pytest_retrace.envs import EnvError
from pytest_retrace.text import clip

LIMIT = 300  # characters of a guest's error text in a message
# libX11's text when the X server refuses a connection because its client slots are all taken
EXHAUSTED = "maximum number of clients reached"
_JSON_KEYS = ("error", "message", "output")  # OSWorld's and retrace guest's error fields, most specific first
_TRACEBACK = "Traceback (most recent call last):"
_DEBUGGER_TITLE = re.compile(r"\s*//\s*Werkzeug Debugger\s*$")  # Flask's debug mode (OSWorld runs debug=True)


class DisplayExhausted(EnvError):
    """The guest's X server refuses new clients ("Maximum number of clients reached"). Not the agent's doing:
    OSWorld's screenshot endpoint opens an X connection per call and never closes it. The guest is not used
    again until a reset (which must revert or restart the VM to give the slots back)."""


def exhausted_message(url: str, where: str, said: str) -> str:
    return (f"{url}{where}: the VM's X server has no client slots left ({clip(said, 160)}). Cause: the guest's "
            "screenshot endpoint leaks an X connection per call, as OSWorld's server does (its cursor grab opens "
            "the display and never closes it), so every screenshot uses up a slot until the server restarts. "
            "Remedy: revert or restart the VM in `reset` (the pool's option reset=host:CMD reverting its snapshot, "
            "or a guest:CMD that restarts the guest's server), or lower max_screenshots; this guest is not used "
            "again until then")


def is_exhausted(text: str) -> bool:
    return EXHAUSTED in text.lower()


class _PageText(HTMLParser):
    """The <title> and the first <p> of an HTML page: what Flask's and Werkzeug's error pages say."""

    def __init__(self) -> None:
        super().__init__()
        self.title = ""
        self.para = ""
        self._in: str | None = None
        self._paras = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("title", "p") and self._in is None:
            self._in = tag
            self._paras += tag == "p"

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "title":
            self.title += data
        elif self._in == "p" and self._paras == 1:
            self.para += data


def _squash(text: str) -> str:
    return " ".join(text.split())


def html_text(page: str) -> str:
    """An HTML error page as one line: its title and first paragraph, tags and whitespace runs gone."""
    parser = _PageText()
    parser.feed(page)
    parser.close()
    title = _squash(_DEBUGGER_TITLE.sub("", parser.title))
    para = _squash(parser.para)
    parts = [p for p in (title, para) if p]
    if len(parts) == 2 and (para in title or title in para):
        parts = [max(parts, key=len)]
    return ": ".join(parts)


def tail(text: str, limit: int = LIMIT) -> str:
    """What a failed program's output says: a traceback's last line (the exception), else the last whole lines
    that fit in `limit` (a single longer line is clipped at its end, never started mid-line)."""
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    opening = next((line for line in lines if _TRACEBACK in line), None)
    if opening is not None:  # what came before the traceback on its line ("Failed to serve file: "), then the exception
        before = opening[:opening.index(_TRACEBACK)].strip()
        return clip(f"{before} {lines[-1].strip()}".strip(), limit)
    kept: list[str] = []
    for line in reversed(lines):
        if kept and sum(len(k) + 3 for k in kept) + len(line) > limit:
            break
        kept.insert(0, line.strip())
    return clip(" | ".join(kept), limit)


def server_text(body: bytes, content_type: str = "", limit: int = LIMIT) -> str:
    """The guest's own error text in a reply body: JSON's error, message or output (a traceback there becomes
    its last line), an HTML page's title and first paragraph, or plain text as :func:`tail` reads it."""
    text = body.decode(errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for key in _JSON_KEYS:
            value = data.get(key)
            if isinstance(value, str) and value.strip():
                return tail(value, limit)
        return clip(_squash(text), limit)
    if "html" in content_type.lower() or text.lstrip()[:1] == "<":
        return clip(html_text(text), limit)
    return tail(text, limit)


__all__ = ["EXHAUSTED", "LIMIT", "DisplayExhausted", "exhausted_message", "html_text", "is_exhausted",
           "server_text", "tail"]
