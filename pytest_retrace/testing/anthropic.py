"""Anthropic Messages (`POST /v1/messages`) for the loopback server: reply builders the official SDK parses
into its typed models (`anthropic_message`, `claude_computer`, `claude_toolset`, `text_block`,
`thinking_block`), `check_anthropic`, the strict checks of a request, and `anthropic_images`, where a
request's images are."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pytest_retrace.testing.wire import WireError, new_id, png_size

# Members of `computer_toolset_20260801` (the keys of the SDK's ComputerToolsetConfigsParam).
COMPUTER_TOOLSET_MEMBERS = frozenset(
    {
        "cursor_position", "double_click", "hold_key", "key", "left_click", "left_click_drag",
        "left_mouse_down", "left_mouse_up", "middle_click", "mouse_move", "right_click", "screenshot",
        "scroll", "triple_click", "type", "wait", "zoom",
    }
)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Body builders: valid replies the official SDKs parse into their typed models
# ---------------------------------------------------------------------------------------------------------------


def text_block(text: str) -> dict:
    return {"type": "text", "text": text, "citations": None}


def thinking_block(thinking: str, signature: str | None = None) -> dict:
    return {"type": "thinking", "thinking": thinking, "signature": signature or new_id("sig-")}


def claude_computer(action: str, **input: Any) -> dict:
    """A `tool_use` of the classic `computer` tool (computer_20250124 / computer_20251124)."""
    return {
        "type": "tool_use",
        "id": new_id("toolu_"),
        "name": "computer",
        "input": {"action": action, **input},
    }


def claude_toolset(name: str, **input: Any) -> dict:
    """A `tool_use` of a `computer_toolset_20260801` member: `name` is the action (`left_click`, `key`, ...).
    The GA SDK's typed member blocks (ComputerLeftClickToolUseBlock, ...) require `caller` and `toolset_name`."""
    return {
        "type": "tool_use",
        "id": new_id("toolu_"),
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
        "id": new_id("msg_"),
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


# ---------------------------------------------------------------------------------------------------------------
# Strict checks
# ---------------------------------------------------------------------------------------------------------------

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


def _blocks(msg: object) -> list:
    """A message's content blocks; [] for a string content or a malformed message."""
    content = msg.get("content") if isinstance(msg, dict) else None
    return content if isinstance(content, list) else []


def anthropic_images(body: dict) -> Iterator[tuple[str, object]]:
    """Every image in a Messages request, in order, as (where, data URL), tool results' images included; an
    image whose source is not base64 comes as `<image source 'url'>`. Tolerant of malformed bodies."""

    def image(block: dict, where: str) -> tuple[str, object]:
        source = block.get("source")
        if isinstance(source, dict) and source.get("type") == "base64":
            return f"{where}.source", f"data:{source.get('media_type')};base64,{source.get('data')}"
        kind = source.get("type") if isinstance(source, dict) else source
        return f"{where}.source", f"<image source {kind!r}>"

    messages = body.get("messages")
    for i, msg in enumerate(messages if isinstance(messages, list) else []):
        for j, block in enumerate(_blocks(msg)):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "image":
                yield image(block, f"messages.{i}.content.{j}")
            elif block.get("type") == "tool_result":
                for k, sub in enumerate(_blocks(block)):
                    if isinstance(sub, dict) and sub.get("type") == "image":
                        yield image(sub, f"messages.{i}.content.{j}.content.{k}")


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
    images = list(anthropic_images(body))
    if len(images) > _MAX_IMAGES:
        raise WireError(f"Too many images in the request: {len(images)}, the maximum is {_MAX_IMAGES}")
    max_side = _MAX_IMAGE_SIDE if len(images) <= _MANY_IMAGES else _MAX_IMAGE_SIDE_MANY
    for where, url in images:
        if isinstance(url, str) and url.startswith("<image source"):
            raise WireError(f"{where}: loopback accepts only base64 PNG images, got {url[1:-1]}")
        width, height = png_size(url, f"{where}.data")
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
