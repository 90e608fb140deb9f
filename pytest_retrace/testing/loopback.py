"""A loopback stand-in for the model providers' HTTP APIs, for testing model adapters without API keys.

`LoopbackServer` runs uvicorn on 127.0.0.1 in a daemon thread and speaks just enough of three wire formats
for the official SDKs to talk to it: Anthropic Messages (`POST /v1/messages`), OpenAI Responses
(`POST /v1/responses`) and OpenAI Chat Completions (`POST /v1/chat/completions`). Every reply comes from a
*responder* — usually a `Script` of canned `Reply`s built with the body builders below (`anthropic_message`,
`claude_computer`, `openai_response`, `computer_call`, `chat_completion`, ...).

This is a test double, not an implementation of the APIs. Its *strict* mode (on by default) rejects, with an
HTTP 400 and a provider-shaped error body like the real API's, the request mistakes a computer-use adapter
tends to make: a `tool_use` left without its `tool_result`, a computer tool without its beta header, a
`computer_call_output` that forgets the safety checks it must acknowledge, an image that is not a PNG, ...
Each check is a small function below, per provider; anything they do not look at is accepted as sent.

    with LoopbackServer(Script([Reply(anthropic_message([claude_computer("screenshot")]))])) as server:
        client = anthropic.Anthropic(api_key="sk-test", base_url=server.url)
        ...
        assert server.requests[0].images == [(1280, 720)]
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import inspect
import io
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

__all__ = [
    "ANTHROPIC",
    "COMPUTER_TOOLSET_MEMBERS",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "PROVIDERS",
    "LoopbackServer",
    "Reply",
    "Request",
    "Responder",
    "Script",
    "WireError",
    "anthropic_message",
    "chat_completion",
    "check_anthropic",
    "check_openai_chat",
    "check_openai_responses",
    "claude_computer",
    "claude_toolset",
    "computer_call",
    "message_item",
    "openai_response",
    "reasoning_item",
    "text_block",
    "thinking_block",
]

ANTHROPIC = "anthropic"
OPENAI_RESPONSES = "openai-responses"
OPENAI_CHAT = "openai-chat"
PROVIDERS = (ANTHROPIC, OPENAI_RESPONSES, OPENAI_CHAT)

# Members of `computer_toolset_20260801` (the keys of the SDK's ComputerToolsetConfigsParam).
COMPUTER_TOOLSET_MEMBERS = frozenset(
    {
        "cursor_position", "double_click", "hold_key", "key", "left_click", "left_click_drag",
        "left_mouse_down", "left_mouse_up", "middle_click", "mouse_move", "right_click", "screenshot",
        "scroll", "triple_click", "type", "wait", "zoom",
    }
)  # fmt: skip


def _new_id(prefix: str, n: int = 24) -> str:
    return f"{prefix}{uuid.uuid4().hex[:n]}"


# ---------------------------------------------------------------------------------------------------------------
# Requests and replies
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Request:
    """One request the server received (rejected ones too: then `error` holds the message it answered)."""

    provider: str  # "anthropic" | "openai-responses" | "openai-chat"
    path: str
    headers: dict[str, str]  # lower-case names
    body: dict
    index: int  # 0-based count of requests to this provider so far (rejected ones count)
    images: list[tuple[int, int]] = field(default_factory=list)  # (width, height) of every image, in order
    query: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # the strict check's message when the server rejected the request

    @property
    def betas(self) -> list[str]:
        """The `anthropic-beta` header's values."""
        return [b.strip() for b in self.headers.get("anthropic-beta", "").split(",") if b.strip()]


def _error_body(provider: str, status: int, message: str, *, param: str | None = None) -> dict:
    """The error body the provider's API sends for `status` (the SDKs read their message from it)."""
    if provider == ANTHROPIC:
        kinds = {
            400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
            403: "permission_error", 404: "not_found_error", 429: "rate_limit_error",
            500: "api_error", 504: "timeout_error", 529: "overloaded_error",
        }  # fmt: skip
        kind = kinds.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}, "request_id": _new_id("req_")}
    if provider in (OPENAI_RESPONSES, OPENAI_CHAT, "openai"):
        code = None
        if status == 429:
            kind, code = "requests", "rate_limit_exceeded"
        elif status == 401:
            kind, code = "invalid_request_error", "invalid_api_key"
        elif status >= 500:
            kind = "server_error"
        else:
            kind = "invalid_request_error"
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}
    raise ValueError(f"unknown provider {provider!r}; expected one of {PROVIDERS}")


@dataclass
class Reply:
    """What the server answers: a JSON body (None: an empty body), a status, extra headers, a delay."""

    body: dict | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (await asyncio.sleep: other requests go on)

    @classmethod
    def error(
        cls, provider: str, status: int, message: str, headers: dict | None = None, delay: float = 0.0
    ) -> Reply:
        """A provider-shaped error reply, e.g. `Reply.error("anthropic", 429, "slow down", {"retry-after": "1"})`."""
        return cls(_error_body(provider, status, message), status, dict(headers or {}), delay)


Responder = Callable[[Request], Reply]


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


# ---------------------------------------------------------------------------------------------------------------
# Body builders: valid replies the official SDKs parse into their typed models
# ---------------------------------------------------------------------------------------------------------------


def text_block(text: str) -> dict:
    return {"type": "text", "text": text, "citations": None}


def thinking_block(thinking: str, signature: str | None = None) -> dict:
    return {"type": "thinking", "thinking": thinking, "signature": signature or _new_id("sig-")}


def claude_computer(action: str, **input: Any) -> dict:
    """A `tool_use` of the classic `computer` tool (computer_20250124 / computer_20251124)."""
    return {
        "type": "tool_use",
        "id": _new_id("toolu_"),
        "name": "computer",
        "input": {"action": action, **input},
    }


def claude_toolset(name: str, **input: Any) -> dict:
    """A `tool_use` of a `computer_toolset_20260801` member: `name` is the action (`left_click`, `key`, ...).
    The GA SDK's typed member blocks (ComputerLeftClickToolUseBlock, ...) require `caller` and `toolset_name`."""
    return {
        "type": "tool_use",
        "id": _new_id("toolu_"),
        "name": name,
        "input": dict(input),
        "toolset_name": "computer",
        "caller": {"type": "direct"},
    }


def anthropic_message(
    content: list[dict],
    *,
    stop_reason: str | None = None,
    usage: dict | None = None,
    model: str = "claude-test",
) -> dict:
    """A Messages API response body; `stop_reason` defaults to "tool_use" when a block is a tool_use."""
    if stop_reason is None:
        stop_reason = "tool_use" if any(b.get("type") == "tool_use" for b in content) else "end_turn"
    return {
        "id": _new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": list(content),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 100,
            "output_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            **(usage or {}),
        },
    }


def computer_call(
    *,
    actions: list[dict] | None = None,
    action: dict | None = None,
    pending_safety_checks: list[dict] | None = None,
) -> dict:
    """A Responses `computer_call` item: GA (`actions=[...]`) or preview (`action={...}`), exactly one of them.
    A safety check without an `id` gets one (`code`/`message` default to a generic check)."""
    if (actions is None) == (action is None):
        raise ValueError("computer_call: give exactly one of actions= (GA tool) or action= (preview tool)")
    checks = [
        {"id": _new_id("cu_sc_"), "code": "malicious_instructions", "message": "Check the screen.", **c}
        for c in (pending_safety_checks or [])
    ]
    item: dict[str, Any] = {
        "type": "computer_call",
        "id": _new_id("cu_"),
        "call_id": _new_id("call_"),
        "status": "completed",
        "pending_safety_checks": checks,
    }
    if actions is not None:
        item["actions"] = list(actions)
    else:
        item["action"] = dict(action or {})
    return item


def message_item(text: str) -> dict:
    """A Responses assistant `message` output item with one `output_text` part."""
    return {
        "type": "message",
        "id": _new_id("msg_"),
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def reasoning_item(summary: str) -> dict:
    """A Responses `reasoning` output item with one summary part."""
    return {"type": "reasoning", "id": _new_id("rs_"), "summary": [{"type": "summary_text", "text": summary}]}


def openai_response(output: list[dict], *, usage: dict | None = None, model: str = "gpt-test") -> dict:
    """A Responses API response body (`Response`): every field the SDK's model requires, plus the usual rest."""
    return {
        "id": _new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "completed_at": int(time.time()),
        "model": model,
        "output": list(output),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "temperature": 1.0,
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 120,
            **(usage or {}),
        },
    }


def chat_completion(
    content: str | None,
    *,
    tool_calls: list[dict] | None = None,
    usage: dict | None = None,
    model: str = "local-test",
) -> dict:
    """A Chat Completions response body; `tool_calls` are `{"name", "arguments"}` (a JSON string, or a dict that
    is dumped), optionally with an `id`, wrapped in the OpenAI `{"id", "type": "function", "function"}` shape."""
    calls = [
        {
            "id": c.get("id") or _new_id("call_"),
            "type": "function",
            "function": {
                "name": c["name"],
                "arguments": c["arguments"]
                if isinstance(c["arguments"], str)
                else json.dumps(c["arguments"]),
            },
        }
        for c in (tool_calls or [])
    ]
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120, **(usage or {})},
        "system_fingerprint": None,
    }


# ---------------------------------------------------------------------------------------------------------------
# Strict checks
# ---------------------------------------------------------------------------------------------------------------


class WireError(Exception):
    """A request the real API would refuse; the server answers `status` with a provider-shaped body."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


def _at(provider: str, *parts: str | int) -> str:
    """A location in the body, the way the provider's errors name it: `messages.1.content.0` (Anthropic),
    `input[3].output` (OpenAI)."""
    if provider == ANTHROPIC:
        return ".".join(str(p) for p in parts)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


_DATA_URL = re.compile(r"data:(?P<mime>[^;,]*);base64,(?P<data>.*)", re.DOTALL)


def _png_size(data_url: object, where: str) -> tuple[int, int]:
    """The size of a `data:image/png;base64,...` image; WireError when it is anything else."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data_url, str):
        raise WireError(
            f"{where}: expected an image data URL string, got {type(data_url).__name__}", param=where
        )
    match = _DATA_URL.fullmatch(data_url)
    if not match:
        raise WireError(
            f"{where}: loopback accepts only base64 data URLs (data:image/png;base64,...), got {data_url[:40]!r}",
            param=where,
        )
    if match["mime"] != "image/png":
        raise WireError(f"{where}: image media type must be image/png, got {match['mime']!r}", param=where)
    try:
        raw = base64.b64decode(match["data"], validate=True)
    except (binascii.Error, ValueError):
        raise WireError(f"{where}: the image's base64 data is invalid", param=where) from None
    try:
        with Image.open(io.BytesIO(raw)) as image:
            fmt, size = image.format, image.size
            image.verify()  # chunk CRCs and structure: catches truncated or corrupt data ~25x faster than load()
    except UnidentifiedImageError:
        raise WireError(f"{where}: the data is not an image", param=where) from None
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
        raise WireError(f"{where}: the image could not be decoded ({exc})", param=where) from None
    if fmt != "PNG":
        raise WireError(
            f"{where}: Image does not match the provided media type image/png (it is {fmt})", param=where
        )
    return size


def _images(provider: str, body: dict) -> Iterator[tuple[str, object]]:
    """Every image in the request body, in order: (where, data URL). Tolerant of malformed bodies."""

    def items(value: object) -> list:
        return value if isinstance(value, list) else []

    if provider == ANTHROPIC:

        def anthropic_image(block: dict, where: str) -> tuple[str, object]:
            source = block.get("source")
            if isinstance(source, dict) and source.get("type") == "base64":
                return f"{where}.source", f"data:{source.get('media_type')};base64,{source.get('data')}"
            kind = source.get("type") if isinstance(source, dict) else source
            return f"{where}.source", f"<image source {kind!r}>"

        for i, msg in enumerate(items(body.get("messages"))):
            for j, block in enumerate(items(msg.get("content") if isinstance(msg, dict) else None)):
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "image":
                    yield anthropic_image(block, _at(provider, "messages", i, "content", j))
                elif block.get("type") == "tool_result":
                    for k, sub in enumerate(items(block.get("content"))):
                        if isinstance(sub, dict) and sub.get("type") == "image":
                            yield anthropic_image(
                                sub, _at(provider, "messages", i, "content", j, "content", k)
                            )
    elif provider == OPENAI_RESPONSES:
        for i, item in enumerate(items(body.get("input"))):
            if not isinstance(item, dict):
                continue
            output = item.get("output")
            if item.get("type") == "computer_call_output" and isinstance(output, dict):
                yield _at(provider, "input", i, "output", "image_url"), output.get("image_url")
            for key in ("content", "output"):  # a message's parts; a function_call_output's list output
                for j, part in enumerate(items(item.get(key))):
                    if isinstance(part, dict) and part.get("type") == "input_image":
                        yield _at(provider, "input", i, key, j, "image_url"), part.get("image_url")
    elif provider == OPENAI_CHAT:
        for i, msg in enumerate(items(body.get("messages"))):
            for j, part in enumerate(items(msg.get("content") if isinstance(msg, dict) else None)):
                if isinstance(part, dict) and part.get("type") == "image_url":
                    url = part.get("image_url")
                    yield (
                        _at(provider, "messages", i, "content", j, "image_url", "url"),
                        (url.get("url") if isinstance(url, dict) else url),
                    )


# --- Anthropic ---------------------------------------------------------------------------------------------------

_CLASSIC_COMPUTER_BETAS = {
    "computer_20241022": "computer-use-2024-10-22",
    "computer_20250124": "computer-use-2025-01-24",
    "computer_20251124": "computer-use-2025-11-24",
}
_CLASSIC_COMPUTER_KEYS = {
    "type", "name", "display_width_px", "display_height_px", "display_number", "cache_control",
    "allowed_callers", "defer_loading", "input_examples", "strict",
}  # fmt: skip
_TOOLSET_KEYS = {"type", "configs", "cache_control"}
_MAX_CACHE_CONTROL = 4
_MAX_IMAGES = 100
_MAX_IMAGE_BYTES = 5 * 1024 * 1024
_MAX_IMAGE_SIDE = 8000
_MANY_IMAGES = 20
_MAX_IMAGE_SIDE_MANY = 2000


def _check_anthropic_headers(headers: dict[str, str]) -> None:
    if not headers.get("x-api-key") and not headers.get("authorization", "").startswith("Bearer "):
        raise WireError("x-api-key header is required (or authorization: Bearer <key>)", status=401)
    if not headers.get("anthropic-version"):
        raise WireError("anthropic-version: header is required")


def _check_anthropic_top_level(body: dict) -> None:
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise WireError("model: Field required")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise WireError("max_tokens: Field required")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise WireError(f"max_tokens: Input should be an integer >= 1, got {max_tokens!r}")
    if "messages" not in body:
        raise WireError("messages: Field required")
    if not isinstance(body["messages"], list) or not body["messages"]:
        raise WireError("messages: at least one message is required")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            raise WireError(f"thinking.enabled.budget_tokens: Input should be >= 1024, got {budget!r}")
        if max_tokens <= budget:
            raise WireError(
                f"`max_tokens` must be greater than `thinking.budget_tokens` ({max_tokens} <= {budget})"
            )


def _check_anthropic_tools(body: dict, betas: list[str]) -> None:
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise WireError("tools: Input should be a valid list")
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise WireError(f"{where}: Input should be an object")
        kind = tool.get("type")
        if kind in _CLASSIC_COMPUTER_BETAS:
            beta = _CLASSIC_COMPUTER_BETAS[kind]
            if beta not in betas:
                got = ",".join(betas) or "none"
                raise WireError(
                    f"{where}: tool type '{kind}' needs the anthropic-beta header '{beta}' (got: {got})"
                )
            allowed = _CLASSIC_COMPUTER_KEYS | ({"enable_zoom"} if kind == "computer_20251124" else set())
            extra = sorted(set(tool) - allowed)
            if extra:
                raise WireError(f"{where}.{kind}.{extra[0]}: Extra inputs are not permitted")
            if tool.get("name") != "computer":
                raise WireError(f"{where}.{kind}.name: Input should be 'computer', got {tool.get('name')!r}")
            for key in ("display_width_px", "display_height_px"):
                value = tool.get(key)
                if value is None:
                    raise WireError(f"{where}.{kind}.{key}: Field required")
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise WireError(
                        f"{where}.{kind}.{key}: Input should be a positive integer, got {value!r}"
                    )
        elif kind == "computer_toolset_20260801":
            extra = sorted(set(tool) - _TOOLSET_KEYS)
            if extra:
                raise WireError(
                    f"{where}.{kind}.{extra[0]}: Extra inputs are not permitted "
                    "(a toolset entry carries only type, configs and cache_control)"
                )
            configs = tool.get("configs")
            if configs is not None:
                if not isinstance(configs, dict):
                    raise WireError(f"{where}.{kind}.configs: Input should be an object")
                unknown = sorted(set(configs) - COMPUTER_TOOLSET_MEMBERS)
                if unknown:
                    raise WireError(
                        f"{where}.{kind}.configs.{unknown[0]}: not a member of the computer toolset"
                    )


def _blocks(msg: dict) -> list:
    content = msg.get("content")
    return content if isinstance(content, list) else []


def _check_anthropic_messages(body: dict) -> None:
    messages = body["messages"]
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            role = msg.get("role") if isinstance(msg, dict) else msg
            raise WireError(f"messages.{i}.role: Input should be 'user' or 'assistant', got {role!r}")
        if "content" not in msg:
            raise WireError(f"messages.{i}.content: Field required")
        content = msg["content"]
        if not isinstance(content, (str, list)):
            raise WireError(f"messages.{i}.content: Input should be a string or a list of content blocks")
        if not content and not (i == len(messages) - 1 and msg["role"] == "assistant"):
            raise WireError(
                f"messages.{i}: all messages must have non-empty content except for the optional final "
                "assistant message"
            )
        for j, block in enumerate(_blocks(msg)):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise WireError(f"messages.{i}.content.{j}.type: Field required")
    if messages[0]["role"] != "user":
        raise WireError('messages: first message must use the "user" role')
    for i in range(1, len(messages)):
        if messages[i]["role"] == messages[i - 1]["role"]:
            raise WireError(
                f'messages.{i}: roles must alternate between "user" and "assistant", '
                f'but found multiple "{messages[i]["role"]}" roles in a row'
            )


def _check_anthropic_block_placement(messages: list[dict]) -> None:
    """tool_use only in assistant messages, tool_result only in user ones; thinking passed back intact."""
    for i, msg in enumerate(messages):
        wrong = "tool_result" if msg["role"] == "assistant" else "tool_use"
        for j, block in enumerate(_blocks(msg)):
            if block["type"] == wrong:
                raise WireError(
                    f"messages.{i}.content.{j}: `{wrong}` blocks are not allowed in {msg['role']} messages"
                )
            if block["type"] == "thinking" and not (
                isinstance(block.get("signature"), str) and block["signature"]
            ):
                raise WireError(
                    f"messages.{i}.content.{j}.thinking.signature: Field required "
                    "(pass thinking blocks back unchanged, signature included)"
                )
            if block["type"] == "redacted_thinking" and not block.get("data"):
                raise WireError(f"messages.{i}.content.{j}.redacted_thinking.data: Field required")


def _check_anthropic_tool_uses_answered(messages: list[dict]) -> None:
    """Every tool_use is answered by a tool_result in the next message; a toolset one's echoes toolset_name."""
    seen: set[str] = set()
    for i, msg in enumerate(messages):
        uses = {b.get("id"): b for b in _blocks(msg) if b["type"] == "tool_use"}
        for tool_id in uses:
            if not isinstance(tool_id, str) or not tool_id:
                raise WireError(f"messages.{i}: every `tool_use` block needs an `id`")
            if tool_id in seen:
                raise WireError(f"messages.{i}: `tool_use` ids must be unique; {tool_id} appears twice")
            seen.add(tool_id)
        answer = _blocks(messages[i + 1]) if i + 1 < len(messages) else []
        results = {b.get("tool_use_id"): (j, b) for j, b in enumerate(answer) if b["type"] == "tool_result"}
        missing = [tool_id for tool_id in uses if tool_id not in results]
        if missing:
            raise WireError(
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                "in the next message."
            )
        for tool_id, use in uses.items():
            j, result = results[tool_id]
            expected, echoed = use.get("toolset_name"), result.get("toolset_name")
            if expected is not None and echoed != expected:
                raise WireError(
                    f"messages.{i + 1}.content.{j}.toolset_name: a `tool_result` for a `{expected}` toolset "
                    f"`tool_use` ({tool_id}) must echo toolset_name: '{expected}' (got {echoed!r})"
                )
            if expected is None and echoed is not None:
                raise WireError(
                    f"messages.{i + 1}.content.{j}.toolset_name: {tool_id} is not a toolset `tool_use`, "
                    f"but its `tool_result` says toolset_name: {echoed!r}"
                )


def _check_anthropic_tool_results_expected(messages: list[dict]) -> None:
    """Every tool_result answers, once, a tool_use of the message right before it, and comes first."""
    for i, msg in enumerate(messages):
        blocks = _blocks(msg)
        use_ids = {b.get("id") for b in (_blocks(messages[i - 1]) if i else []) if b["type"] == "tool_use"}
        answered: set[object] = set()
        for j, block in enumerate(blocks):
            if block["type"] != "tool_result":
                continue
            tool_id = block.get("tool_use_id")
            if tool_id not in use_ids or tool_id in answered:
                raise WireError(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {tool_id}. "
                    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                )
            answered.add(tool_id)
            if any(b["type"] != "tool_result" for b in blocks[:j]):
                raise WireError(
                    f"messages.{i}.content.{j}: `tool_result` blocks must come first in the user message, "
                    "before any other content"
                )


def _check_anthropic_tool_blocks(body: dict) -> None:
    messages = body["messages"]
    _check_anthropic_block_placement(messages)
    _check_anthropic_tool_uses_answered(messages)
    _check_anthropic_tool_results_expected(messages)
    kinds = {b["type"] for msg in messages for b in _blocks(msg)}
    if kinds & {"tool_use", "tool_result"} and not body.get("tools"):
        raise WireError("Requests which include `tool_use` or `tool_result` blocks must define tools.")


def _count_cache_control(value: object, top: bool = True) -> int:
    if isinstance(value, list):
        return sum(_count_cache_control(v, False) for v in value)
    if isinstance(value, dict):
        here = 0 if top or value.get("cache_control") is None else 1
        return here + sum(_count_cache_control(v, False) for k, v in value.items() if k != "cache_control")
    return 0


def check_anthropic(headers: dict[str, str], body: dict) -> None:
    """Strict checks of a Messages request (`POST /v1/messages`); WireError on the first violation."""
    _check_anthropic_headers(headers)
    _check_anthropic_top_level(body)
    betas = [b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()]
    _check_anthropic_tools(body, betas)
    _check_anthropic_messages(body)
    _check_anthropic_tool_blocks(body)
    count = _count_cache_control({k: body.get(k) for k in ("system", "tools", "messages")})
    if count > _MAX_CACHE_CONTROL:
        raise WireError(
            f"A maximum of {_MAX_CACHE_CONTROL} blocks with cache_control may be provided. Found {count}."
        )
    _check_anthropic_images(body)


def _check_anthropic_images(body: dict) -> None:
    """Base64 PNGs within the documented limits: 100 images a request, 5 MB (base64) and 8000 px a side each,
    2000 px a side once a request holds more than 20 images."""
    images = list(_images(ANTHROPIC, body))
    if len(images) > _MAX_IMAGES:
        raise WireError(f"Too many images in the request: {len(images)}, the maximum is {_MAX_IMAGES}")
    max_side = _MAX_IMAGE_SIDE if len(images) <= _MANY_IMAGES else _MAX_IMAGE_SIDE_MANY
    for where, url in images:
        if isinstance(url, str) and url.startswith("<image source"):
            raise WireError(f"{where}: loopback accepts only base64 PNG images, got {url[1:-1]}")
        width, height = _png_size(url, f"{where}.data")
        data_bytes = len(str(url).partition(",")[2])
        if data_bytes > _MAX_IMAGE_BYTES:
            raise WireError(
                f"{where}.data: image exceeds 5 MB maximum: {data_bytes} bytes > {_MAX_IMAGE_BYTES} bytes"
            )
        if max(width, height) > max_side:
            many = f" (a request with more than {_MANY_IMAGES} images)" if max_side != _MAX_IMAGE_SIDE else ""
            raise WireError(
                f"{where}: image dimensions exceed max allowed size{many}: {max_side} pixels ({width}x{height})"
            )


# --- OpenAI (both endpoints) ------------------------------------------------------------------------------------


def _check_openai_common(headers: dict[str, str], body: dict) -> None:
    auth = headers.get("authorization", "")
    if not auth.startswith("Bearer ") or not auth[len("Bearer ") :].strip():
        raise WireError(
            "You didn't provide an API key. You need to provide your API key in an Authorization header using "
            "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            status=401,
        )
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise WireError("Missing required parameter: 'model'.", param="model")


# --- OpenAI Responses ---------------------------------------------------------------------------------------------

_PREVIEW_TOOL_KEYS = {"type", "display_width", "display_height", "environment"}
_PREVIEW_ENVIRONMENTS = {"windows", "mac", "linux", "ubuntu", "browser"}


def _check_responses_tools(body: dict) -> None:
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise WireError("Invalid type for 'tools': expected an array.", param="tools")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise WireError(f"Invalid type for '{where}': expected an object.", param=where)
        if tool.get("type") == "computer":
            extra = sorted(set(tool) - {"type"})
            if extra:
                raise WireError(
                    f"Unknown parameter: '{where}.{extra[0]}'. The GA computer tool is just "
                    '{"type": "computer"}.',
                    param=f"{where}.{extra[0]}",
                )
        elif tool.get("type") == "computer_use_preview":
            extra = sorted(set(tool) - _PREVIEW_TOOL_KEYS)
            if extra:
                raise WireError(f"Unknown parameter: '{where}.{extra[0]}'.", param=f"{where}.{extra[0]}")
            for key in ("display_width", "display_height", "environment"):
                if key not in tool:
                    raise WireError(f"Missing required parameter: '{where}.{key}'.", param=f"{where}.{key}")
            for key in ("display_width", "display_height"):
                value = tool[key]
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise WireError(
                        f"Invalid '{where}.{key}': expected a positive integer, got {value!r}.",
                        param=f"{where}.{key}",
                    )
            if tool["environment"] not in _PREVIEW_ENVIRONMENTS:
                raise WireError(
                    f"Invalid value: {tool['environment']!r}. Supported values are: "
                    f"{', '.join(sorted(_PREVIEW_ENVIRONMENTS))}.",
                    param=f"{where}.environment",
                )


def _check_responses_outputs(body: dict, previous_outputs: Callable[[str], list[dict] | None]) -> None:
    """Every computer_call / function_call (in `input`, or in the previous response) is answered later in
    `input`; computer_call_output items have the screenshot shape and acknowledge the pending safety checks."""
    items = body["input"]
    calls: dict[str, tuple[str, dict]] = {}  # call_id -> (where it is, the call item)
    previous_id = body.get("previous_response_id")
    if previous_id is not None:
        previous = previous_outputs(previous_id)
        if previous is None:
            raise WireError(
                f"Previous response with id '{previous_id}' not found.", param="previous_response_id"
            )
        for item in previous:
            if item.get("type") in ("computer_call", "function_call"):
                calls[item.get("call_id")] = (f"previous response {previous_id}", item)
    answered: set[str] = set()
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise WireError(f"Invalid type for '{where}': expected an object.", param=where)
        kind = item.get("type")
        if kind in ("computer_call", "function_call"):
            calls[item.get("call_id")] = (where, item)
        elif kind in ("computer_call_output", "function_call_output"):
            call_id = item.get("call_id")
            call_kind = kind.removesuffix("_output")
            if call_id not in calls or calls[call_id][1].get("type") != call_kind:
                raise WireError(
                    f"No tool call found for {call_kind.replace('_', ' ')} output with call_id {call_id}.",
                    param=where,
                )
            answered.add(call_id)
            if kind == "computer_call_output":
                _check_computer_call_output(item, where, calls[call_id][1])
    unanswered = [(cid, w, c) for cid, (w, c) in calls.items() if cid not in answered]
    if unanswered:
        call_id, where, call = unanswered[0]
        raise WireError(
            f"No tool output found for {call.get('type', '').replace('_', ' ')} {call_id} (from {where}); "
            f"it needs a {call.get('type')}_output with call_id {call_id} later in `input`.",
            param="input",
        )


def _check_computer_call_output(item: dict, where: str, call: dict) -> None:
    output = item.get("output")
    if not isinstance(output, dict) or output.get("type") != "computer_screenshot":
        raise WireError(
            f'Invalid \'{where}.output\': expected {{"type": "computer_screenshot", "image_url": '
            f'"data:image/png;base64,..."}}, got {json.dumps(output)[:80]}.',
            param=f"{where}.output",
        )
    if not isinstance(output.get("image_url"), str):
        raise WireError(
            f"Missing required parameter: '{where}.output.image_url'.", param=f"{where}.output.image_url"
        )
    pending = sorted(c.get("id") for c in call.get("pending_safety_checks") or [])
    acked_list = item.get("acknowledged_safety_checks") or []
    if not isinstance(acked_list, list) or not all(isinstance(c, dict) for c in acked_list):
        raise WireError(
            f"Invalid '{where}.acknowledged_safety_checks': expected a list of objects.", param=where
        )
    acked = sorted(c.get("id") for c in acked_list)
    if acked != pending:
        raise WireError(
            f"'{where}' answers computer call {call.get('call_id')} whose pending_safety_checks are {pending}; "
            f"its acknowledged_safety_checks must carry exactly those ids, got {acked}.",
            param=f"{where}.acknowledged_safety_checks",
        )


def check_openai_responses(
    headers: dict[str, str], body: dict, previous_outputs: Callable[[str], list[dict] | None] = lambda _: None
) -> None:
    """Strict checks of a Responses request (`POST /v1/responses`); WireError on the first violation.
    `previous_outputs(id)` gives the output items of a response this server sent (for previous_response_id)."""
    _check_openai_common(headers, body)
    if not isinstance(body.get("input"), list):
        raise WireError(
            "Invalid type for 'input': loopback strict mode expects a list of input items, got "
            f"{type(body.get('input')).__name__}.",
            param="input",
        )
    _check_responses_tools(body)
    _check_responses_outputs(body, previous_outputs)
    for where, url in _images(OPENAI_RESPONSES, body):
        _png_size(url, where)


# --- OpenAI Chat Completions ----------------------------------------------------------------------------------------

_CHAT_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def _check_chat_content(msg: dict, where: str) -> None:
    if "content" not in msg and not (msg["role"] == "assistant" and msg.get("tool_calls")):
        raise WireError(f"Missing required parameter: '{where}.content'.", param=f"{where}.content")
    content = msg.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise WireError(f"Invalid type for '{where}.content': expected a string or an array.", param=where)
    for j, part in enumerate(content if isinstance(content, list) else []):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise WireError(f"Missing required parameter: '{at}.type'.", param=at)
        image_url = part.get("image_url")
        if part["type"] == "image_url" and not (
            isinstance(image_url, dict) and isinstance(image_url.get("url"), str)
        ):
            raise WireError(
                f'Invalid type for \'{at}.image_url\': expected an object {{"url": "data:image/png;base64,..."}}.',
                param=f"{at}.image_url",
            )


def check_openai_chat(headers: dict[str, str], body: dict) -> None:
    """Strict checks of a Chat Completions request (`POST /v1/chat/completions`); WireError on the first violation."""
    _check_openai_common(headers, body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise WireError("Invalid 'messages': expected a non-empty array of messages.", param="messages")
    tool_call_ids: set[str] = set()
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise WireError(f"Invalid type for '{where}': expected an object.", param=where)
        if msg.get("role") not in _CHAT_ROLES:
            raise WireError(
                f"Invalid value: {msg.get('role')!r}. Supported values are: {', '.join(sorted(_CHAT_ROLES))}.",
                param=f"{where}.role",
            )
        _check_chat_content(msg, where)
        if msg["role"] == "assistant":
            calls = msg.get("tool_calls") or []
            tool_call_ids.update(
                c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)
            )
        elif msg["role"] == "tool" and msg.get("tool_call_id") not in tool_call_ids:
            raise WireError(
                f"Invalid parameter: '{where}' has role 'tool' with tool_call_id {msg.get('tool_call_id')!r}, which "
                "answers no earlier assistant tool call; messages with role 'tool' must be a response to a "
                "preceding message with 'tool_calls'.",
                param=f"{where}.tool_call_id",
            )
    for where, url in _images(OPENAI_CHAT, body):
        _png_size(url, where)


# ---------------------------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------------------------

_ROUTES = {
    "/v1/messages": ANTHROPIC,
    "/v1/responses": OPENAI_RESPONSES,
    "/v1/chat/completions": OPENAI_CHAT,
}


def _is_response(body: object) -> bool:
    return isinstance(body, dict) and body.get("object") == "response" and isinstance(body.get("id"), str)


class LoopbackServer:
    """The provider APIs on 127.0.0.1:<free port>, answered by `responder`; a context manager.

    `url` is the ANTHROPIC_BASE_URL form, `openai_url` (url + "/v1") the OPENAI_BASE_URL form; `requests`
    records every request received, in arrival order. A sync responder runs in a worker thread (a slow one
    holds up nobody else); an `async def` responder is awaited. A responder that raises gets its request a 500
    carrying the exception text (the exception is also kept in `errors`)."""

    def __init__(
        self,
        responder: Responder | Callable[[Request], Awaitable[Reply]],
        *,
        host: str = "127.0.0.1",
        strict: bool = True,
    ) -> None:
        self.responder = responder
        self.host = host
        self.strict = strict
        self.requests: list[Request] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(PROVIDERS, 0)
        self._outputs: dict[str, list[dict]] = {}  # Responses id -> output items, for previous_response_id
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.port: int | None = None

    # --- addresses ---

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("LoopbackServer is not running; use it as a context manager")
        return f"http://{self.host}:{self.port}"

    @property
    def openai_url(self) -> str:
        return self.url + "/v1"

    def env(self, api_key: str = "sk-loopback") -> dict[str, str]:
        """Environment variables that point the official SDKs here (for monkeypatch.setenv / subprocesses)."""
        return {
            "ANTHROPIC_BASE_URL": self.url,
            "ANTHROPIC_API_KEY": api_key,
            "OPENAI_BASE_URL": self.openai_url,
            "OPENAI_API_KEY": api_key,
        }

    def requests_for(self, provider: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.provider == provider]

    # --- lifecycle ---

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 10.0) -> None:
        import uvicorn

        if self._thread is not None:
            raise RuntimeError("LoopbackServer already started")
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind((self.host, 0))
        self.port = self._socket.getsockname()[1]
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=64, thread_name_prefix="loopback-responder"
        )
        config = uvicorn.Config(
            self._app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http="h11",
            ws="none",
            timeout_graceful_shutdown=3,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name=f"loopback-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                self.stop()
                raise RuntimeError("LoopbackServer failed to start (uvicorn exited)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"LoopbackServer did not start within {timeout} s")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout=5)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._pool = self._socket = None

    # --- HTTP ---

    def _app(self) -> Any:
        """A Starlette app (the base of FastAPI; no request models here: the checks read the raw JSON)."""
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def health(_request: Any) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        routes = [Route("/health", health, methods=["GET"])]
        routes += [Route(path, self._handle, methods=["POST"]) for path in _ROUTES]
        return Starlette(routes=routes)

    async def _handle(self, request: Any) -> Any:
        """One provider request: record it, check it (strict), ask the responder, wait out the delay, answer."""
        from starlette.responses import JSONResponse, Response

        provider = _ROUTES[request.url.path]
        raw = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        with self._lock:
            index = self._counts[provider]
            self._counts[provider] += 1
        loop = asyncio.get_running_loop()
        query = dict(request.query_params)
        req, rejection = await loop.run_in_executor(
            self._pool, self._receive, provider, request.url.path, query, headers, raw, index
        )
        with self._lock:
            self.requests.append(req)
        if rejection is not None:
            body = _error_body(provider, rejection.status, rejection.message, param=rejection.param)
            return JSONResponse(body, status_code=rejection.status, headers=self._id_headers(provider))
        reply = await self._respond(req, loop)
        if reply.delay > 0:
            await asyncio.sleep(reply.delay)
        if provider == OPENAI_RESPONSES and reply.status == 200 and _is_response(reply.body):
            with self._lock:
                self._outputs[reply.body["id"]] = [
                    o for o in reply.body.get("output") or [] if isinstance(o, dict)
                ]
        headers_out = {**self._id_headers(provider), **reply.headers}
        if reply.body is None:
            return Response(status_code=reply.status, headers=headers_out)
        content = json.dumps(reply.body)
        return Response(content, status_code=reply.status, headers=headers_out, media_type="application/json")

    @staticmethod
    def _id_headers(provider: str) -> dict[str, str]:
        return {"request-id": _new_id("req_")} if provider == ANTHROPIC else {"x-request-id": _new_id("req_")}

    def _receive(
        self, provider: str, path: str, query: dict, headers: dict[str, str], raw: bytes, index: int
    ) -> tuple[Request, WireError | None]:
        """Parse and (in strict mode) check one request; runs in a worker thread (PNG decoding takes time)."""
        req = Request(provider, path, headers, {}, index, query=query)
        rejection = None
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise WireError(f"The request body must be a JSON object, got {type(body).__name__}")
            req.body = body
            if self.strict and provider == ANTHROPIC:
                check_anthropic(headers, body)
            elif self.strict and provider == OPENAI_RESPONSES:
                check_openai_responses(headers, body, self._previous_outputs)
            elif self.strict:
                check_openai_chat(headers, body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            rejection = WireError(f"The request body is not valid JSON: {exc}")
        except WireError as exc:
            rejection = exc
        except Exception as exc:  # noqa: BLE001 - a body odd enough to trip a check: say so instead of a bare 500
            self.errors.append(exc)
            rejection = WireError(
                f"loopback could not check this request ({type(exc).__name__}: {exc}); "
                "this is a bug in pytest_retrace.testing.loopback",
                status=500,
            )
        req.error = rejection.message if rejection else None
        for where, url in _images(provider, req.body):
            try:
                req.images.append(_png_size(url, where))
            except WireError:
                pass  # strict mode has already answered for it; lenient mode records what decodes
        return req, rejection

    def _previous_outputs(self, response_id: str) -> list[dict] | None:
        with self._lock:
            return self._outputs.get(response_id)

    async def _respond(self, req: Request, loop: asyncio.AbstractEventLoop) -> Reply:
        try:
            if inspect.iscoroutinefunction(self.responder):
                reply: Any = await self.responder(req)
            else:  # a sync responder runs in a worker thread; an object with `async def __call__` lands here too
                reply = await loop.run_in_executor(self._pool, self.responder, req)
                if inspect.isawaitable(reply):
                    reply = await reply
        except Exception as exc:  # noqa: BLE001 - whatever the responder raises becomes the 500's message
            self.errors.append(exc)
            return Reply.error(req.provider, 500, f"loopback responder raised {type(exc).__name__}: {exc}")
        if isinstance(reply, Mapping):
            return Reply(body=dict(reply))
        if not isinstance(reply, Reply):
            return Reply.error(
                req.provider, 500, f"loopback responder returned {type(reply).__name__}; expected a Reply"
            )
        return reply


# ---------------------------------------------------------------------------------------------------------------
# A ready-made model
# ---------------------------------------------------------------------------------------------------------------


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
                return Reply(anthropic_message([text_block("The target state is restored.")], usage=self.usage))
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
