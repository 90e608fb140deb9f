"""Keeping API keys out of everything that leaves an adapter: records, pytest's output, Allure, logs.

A key reaches text in ways no adapter controls: a server answering 401 with ``invalid key Bearer sk-...``
puts it into the SDK's exception message, a model (or a proxy) may repeat it in a reply, which becomes a
rationale or the message of an invalid step. So every such text goes through :func:`redact`, the one place
that knows the secrets of this process:

- every key an :class:`~pytest_retrace.agents.llm.Endpoint` read (the variables the model configs name) and
  whatever the provider SDKs read by default (``ANTHROPIC_API_KEY``, ``OPENAI_API_KEY``), registered with
  :func:`register_secret`; they are the values the SDKs send as ``x-api-key`` / ``Authorization: Bearer``;
- anything that looks like a credential although nobody registered it: ``Bearer <token>``, ``sk-...``
  tokens, ``x-api-key: <value>`` / ``api_key=<value>`` pairs (a key of another process, a proxy's own).

Applied to every :class:`~pytest_retrace.agents.AgentInfraError` message (its constructor), to every
rationale and invalid-reply text a model adapter returns, to the text a chat model returns (contextualizer,
verifier), to exceptions escaping an adapter (:func:`scrub_exception`) and to the records of the SDKs' and
their HTTP clients' loggers (:func:`install_log_filter`).
"""

from __future__ import annotations

import logging
import os
import re
import threading

PLACEHOLDER = "[redacted]"
# the variables the official SDKs read a key from when a client is given none
SDK_KEY_VARIABLES = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
# A shorter value is a word, not a key: a local server's dummy key ("EMPTY") must not blank that word out of
# every message. Real keys are far longer (sk-ant-api03-... is over 100 characters).
MIN_SECRET_LENGTH = 8
# loggers whose records may quote a request or a response (the SDKs, their HTTP clients)
SDK_LOGGERS = ("anthropic", "openai", "httpx", "httpx2", "httpcore")

_TOKEN = r"[A-Za-z0-9._~+/=-]"
_PATTERNS = (
    # Authorization: Bearer <token>, however it is quoted
    (re.compile(rf"(?i)\b(bearer\s+){_TOKEN}{{8,}}"), rf"\g<1>{PLACEHOLDER}"),
    # x-api-key: <value>, api_key=<value>, "api-key": "<value>"
    (re.compile(r"(?i)\b((?:x-)?api[-_]?key[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]{8,}"), rf"\g<1>{PLACEHOLDER}"),
    # OpenAI's and Anthropic's key shapes (sk-..., sk-proj-..., sk-ant-api03-...) wherever they stand
    (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), PLACEHOLDER),
)

_lock = threading.Lock()
_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a credential of this process (a key read for an endpoint) so that no text quotes it."""
    if value and len(value) >= MIN_SECRET_LENGTH:
        with _lock:
            _secrets.add(value)


def _known() -> list[str]:
    """The registered secrets and the SDKs' default keys, longest first (a key containing another is
    replaced whole)."""
    with _lock:
        values = set(_secrets)
    values.update(v for v in (os.environ.get(n) for n in SDK_KEY_VARIABLES) if v and len(v) >= MIN_SECRET_LENGTH)
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    """`text` with every known secret and everything that looks like a credential replaced by
    ``[redacted]``."""
    if not text:
        return text
    for secret in _known():
        text = text.replace(secret, PLACEHOLDER)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def leaks(text: str) -> bool:
    return redact(text) != text


class RedactedError(RuntimeError):
    """An exception from adapter code whose text quoted a credential, and whose text could not be redacted in
    place (its ``__str__`` is its own): its type name and the redacted text, with the original traceback."""


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return seen


def _scrub_args(exc: BaseException) -> None:
    exc.args = tuple(redact(a) if isinstance(a, str) else a for a in exc.args)
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        notes[:] = [redact(n) if isinstance(n, str) else n for n in notes]


def scrub_exception(exc: BaseException) -> BaseException:
    """`exc` with no credential in its text or in that of the exceptions chained to it (which pytest prints
    too: "The above exception was the direct cause..."). The exception is kept, type and traceback, with
    its arguments redacted in place when that is enough; otherwise a :class:`RedactedError` stands for it
    (and for its chain), carrying its traceback."""
    chain = _chain(exc)
    if not any(leaks(_text(e)) for e in chain):
        return exc
    for e in chain:
        _scrub_args(e)
    if not any(leaks(_text(e)) for e in chain):
        return exc
    text = " <- ".join(f"{type(e).__name__}: {_text(e)}" for e in chain)
    replacement = RedactedError(redact(text)).with_traceback(exc.__traceback__)
    replacement.__suppress_context__ = True
    return replacement


def _text(exc: BaseException) -> str:
    try:
        return str(exc) + "".join(str(n) for n in getattr(exc, "__notes__", None) or [])
    except Exception:  # noqa: BLE001 - a broken __str__ shows nothing, so it cannot leak either
        return ""


class RedactingFilter(logging.Filter):
    """Redacts a log record's message (formatted with its arguments) and its exception text in place."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is logging's to report
            return True
        if leaks(message):
            record.msg, record.args = redact(message), None
        if record.exc_info and record.exc_info[1] is not None:
            scrubbed = scrub_exception(record.exc_info[1])
            record.exc_info = (type(scrubbed), scrubbed, scrubbed.__traceback__)
            record.exc_text = None
        return True


_FILTER = RedactingFilter()


def install_log_filter() -> None:
    """Put the redacting filter on the SDKs' loggers and on every logger below them that exists by now
    (a logger's filters do not apply to its children's records, and the SDKs log from modules such as
    ``anthropic._base_client``). Called once an SDK is imported, when an endpoint is built; idempotent."""
    manager = logging.Logger.manager
    names = [n for n in list(manager.loggerDict) if n.split(".")[0] in SDK_LOGGERS] + list(SDK_LOGGERS)
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
