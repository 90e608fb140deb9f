"""OpenAI Chat Completions (`POST /v1/chat/completions`), the dialect OpenAI-compatible servers (vLLM, ...)
speak, for the loopback server: `chat_completion`, a reply the official SDK parses, `check_openai_chat`, the
strict checks of a request, and `chat_images`, where a request's images are."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from pytest_retrace.testing.openai import check_openai_request
from pytest_retrace.testing.wire import WireError, new_id, png_size


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
            "id": c.get("id") or new_id("call_"),
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
        "id": new_id("chatcmpl-"),
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


def chat_images(body: dict) -> Iterator[tuple[str, object]]:
    """Every image_url part in a Chat Completions request, in order, as (where, data URL). Tolerant of
    malformed bodies."""
    messages = body.get("messages")
    for i, msg in enumerate(messages if isinstance(messages, list) else []):
        content = msg.get("content") if isinstance(msg, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = part.get("image_url")
                yield (
                    f"messages[{i}].content[{j}].image_url.url",
                    (url.get("url") if isinstance(url, dict) else url),
                )


def check_openai_chat(headers: dict[str, str], body: dict) -> None:
    """Strict checks of a Chat Completions request (`POST /v1/chat/completions`); WireError on the first violation."""
    check_openai_request(headers, body)
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
    for where, url in chat_images(body):
        png_size(url, where)
