"""Responders for the loopback server, the callables that answer its requests: `Script`, canned replies in
order, and two ready-made models, `UndoingClaude` (presses ctrl+z, then says it is done) and
`EchoingCredentials` (quotes back the key it was sent)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from pytest_retrace.testing.anthropic import anthropic_message, claude_computer, claude_toolset, text_block
from pytest_retrace.testing.openai import message_item, openai_response
from pytest_retrace.testing.openai_compat import chat_completion
from pytest_retrace.testing.wire import ANTHROPIC, OPENAI_RESPONSES, PROVIDERS, Reply, Request


class Script:
    """A responder that answers with the given replies in order — per provider when given a dict of lists,
    in one sequence whatever the provider when given a list. An item may be a `Reply`, a bare body dict
    (a 200 reply), or a responder called with the request. Past the end it answers 500 saying so."""

    def __init__(self, replies: list[Reply] | dict[str, list[Reply]]) -> None:
        if isinstance(replies, Mapping):
            unknown = set(replies) - set(PROVIDERS)
            if unknown:
                raise ValueError(f"unknown provider(s) {sorted(unknown)}; expected keys among {PROVIDERS}")
            self._queues = {p: list(r) for p, r in replies.items()}
        else:
            self._queues = {"*": list(replies)}
        self._next = dict.fromkeys(self._queues, 0)
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        """How many scripted replies have not been used yet."""
        with self._lock:
            return sum(len(q) - self._next[k] for k, q in self._queues.items())

    def __call__(self, request: Request) -> Reply:
        key = "*" if "*" in self._queues else request.provider
        with self._lock:
            queue = self._queues.get(key)
            if queue is None:
                message = f"loopback Script: no replies scripted for provider {key!r} (only for {sorted(self._queues)})"
                return Reply.error(request.provider, 500, message)
            n = self._next[key]
            if n >= len(queue):
                scripted = f"{len(queue)} reply was" if len(queue) == 1 else f"{len(queue)} replies were"
                for_key = "" if key == "*" else f" for {key!r}"
                message = (
                    f"loopback Script exhausted: {request.provider} request #{n + 1} to the script "
                    f"({request.path}) has no reply; {scripted} scripted{for_key}"
                )
                return Reply.error(request.provider, 500, message)
            self._next[key] = n + 1
            item = queue[n]
        if isinstance(item, Reply):
            return item
        if isinstance(item, Mapping):
            return Reply(body=dict(item))
        if callable(item):
            return item(request)
        raise TypeError(
            f"Script item #{n + 1} is a {type(item).__name__}; expected a Reply, a dict or a callable"
        )


class UndoingClaude:
    """A responder playing Claude (classic computer tool or toolset): it presses ctrl+z once, then says it is
    done; asked without tools (the contextualizer), it answers a one-line summary. Every answer comes after
    `latency` seconds; `peak` is the most requests it ever had in flight (a concurrency limit's witness)."""

    SUMMARY = "The editor shows the document as it was before the stray keys."

    def __init__(self, latency: float = 0.0, usage: dict | None = None) -> None:
        self.latency, self.usage = latency, usage
        self.peak = self._now = 0
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> Reply:
        with self._lock:
            self._now += 1
            self.peak = max(self.peak, self._now)
        try:
            time.sleep(self.latency)
            body = request.body
            if "tools" not in body:
                return Reply(anthropic_message([text_block(self.SUMMARY)], usage=self.usage))
            if any(b.get("type") == "tool_result" for b in body["messages"][-1]["content"]):
                return Reply(
                    anthropic_message([text_block("The target state is restored.")], usage=self.usage)
                )
            toolset = any(t.get("type", "").startswith("computer_toolset") for t in body["tools"])
            key = claude_toolset("key", text="ctrl+z") if toolset else claude_computer("key", text="ctrl+z")
            return Reply(anthropic_message([text_block("Undo the stray keys."), key], usage=self.usage))
        finally:
            with self._lock:
                self._now -= 1


class EchoingCredentials:
    """A responder playing an API that quotes back the credentials it was sent, as some servers do in their
    401 (`invalid key Bearer sk-...`): every answer's text holds the request's `authorization` and
    `x-api-key` header values. `status` 401 (or any error status) answers with a provider-shaped error body;
    200 answers with the provider's final reply whose text is the echo (Claude's text, a Responses message,
    a chat completion), so the echo reaches what an adapter keeps of a reply: its rationale, or the message of
    a reply that does not parse. For testing that no key leaves an adapter, whatever the path."""

    def __init__(self, status: int = 401) -> None:
        self.status = status

    @staticmethod
    def echo(request: Request) -> str:
        """The header values as sent, and the bare key too (a server may quote either)."""
        sent = [request.headers[h] for h in ("authorization", "x-api-key") if request.headers.get(h)]
        bare = sorted({v.removeprefix("Bearer ").strip() for v in sent})
        return f"invalid key {' / '.join(sent) or '(none sent)'} (key: {', '.join(bare)})"

    def __call__(self, request: Request) -> Reply:
        text = self.echo(request)
        if self.status != 200:
            return Reply.error(request.provider, self.status, text)
        if request.provider == ANTHROPIC:
            return Reply(anthropic_message([text_block(text)]))
        if request.provider == OPENAI_RESPONSES:
            return Reply(openai_response([message_item(text)]))
        return Reply(chat_completion(text))
