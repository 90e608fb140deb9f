"""OpenAI Responses (`POST /v1/responses`) for the loopback server: reply builders the official SDK parses into
its typed models (`openai_response`, `computer_call`, `message_item`, `reasoning_item`),
`check_openai_responses`, the strict checks of a request, `responses_images`, where a request's images are,
and `check_openai_request`, the checks every OpenAI endpoint shares (Chat Completions uses it too)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from pytest_retrace.testing.wire import WireError, new_id, png_size

# ---------------------------------------------------------------------------------------------------------------
# Body builders: valid replies the official SDK parses into its typed models
# ---------------------------------------------------------------------------------------------------------------


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
        {"id": new_id("cu_sc_"), "code": "malicious_instructions", "message": "Check the screen.", **c}
        for c in (pending_safety_checks or [])
    ]
    item: dict[str, Any] = {
        "type": "computer_call",
        "id": new_id("cu_"),
        "call_id": new_id("call_"),
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
        "id": new_id("msg_"),
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def reasoning_item(summary: str) -> dict:
    """A Responses `reasoning` output item with one summary part."""
    return {"type": "reasoning", "id": new_id("rs_"), "summary": [{"type": "summary_text", "text": summary}]}


def openai_response(output: list[dict], *, usage: dict | None = None, model: str = "gpt-test") -> dict:
    """A Responses API response body (`Response`): every field the SDK's model requires, plus the usual rest."""
    return {
        "id": new_id("resp_"),
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


# ---------------------------------------------------------------------------------------------------------------
# Strict checks
# ---------------------------------------------------------------------------------------------------------------


def check_openai_request(headers: dict[str, str], body: dict) -> None:
    """What every OpenAI endpoint checks first: a bearer key (else 401) and a model."""
    auth = headers.get("authorization", "")
    if not auth.startswith("Bearer ") or not auth[len("Bearer ") :].strip():
        raise WireError(
            "You didn't provide an API key. You need to provide your API key in an Authorization header using "
            "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            status=401,
        )
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise WireError("Missing required parameter: 'model'.", param="model")


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


def _items(value: object) -> list:
    return value if isinstance(value, list) else []


def responses_images(body: dict) -> Iterator[tuple[str, object]]:
    """Every image in a Responses request, in order, as (where, data URL): computer_call_output screenshots
    and input_image parts (of a message, or of a function_call_output's list output). Tolerant of malformed
    bodies."""
    for i, item in enumerate(_items(body.get("input"))):
        if not isinstance(item, dict):
            continue
        output = item.get("output")
        if item.get("type") == "computer_call_output" and isinstance(output, dict):
            yield f"input[{i}].output.image_url", output.get("image_url")
        for key in ("content", "output"):
            for j, part in enumerate(_items(item.get(key))):
                if isinstance(part, dict) and part.get("type") == "input_image":
                    yield f"input[{i}].{key}[{j}].image_url", part.get("image_url")


def check_openai_responses(
    headers: dict[str, str], body: dict, previous_outputs: Callable[[str], list[dict] | None] = lambda _: None
) -> None:
    """Strict checks of a Responses request (`POST /v1/responses`); WireError on the first violation.
    `previous_outputs(id)` gives the output items of a response this server sent (for previous_response_id)."""
    check_openai_request(headers, body)
    if not isinstance(body.get("input"), list):
        raise WireError(
            "Invalid type for 'input': loopback strict mode expects a list of input items, got "
            f"{type(body.get('input')).__name__}.",
            param="input",
        )
    _check_responses_tools(body)
    _check_responses_outputs(body, previous_outputs)
    for where, url in responses_images(body):
        png_size(url, where)
