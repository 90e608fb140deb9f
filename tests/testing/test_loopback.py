"""The loopback provider server (pytest_retrace.testing) through the official SDKs: its replies parse
into the SDKs' typed models, its strict checks refuse wrong requests the way the real APIs do, and it serves
many slow requests at once."""

from __future__ import annotations

import base64
import importlib
import inspect
import io
import json
import pkgutil
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import anthropic
import numpy as np
import openai
import pydantic
import pytest
from anthropic.types import ComputerToolUseBlock
from anthropic.types.beta import BetaComputerToolUseBlock
from PIL import Image

from pytest_retrace import testing
from pytest_retrace.testing import (
    LoopbackServer,
    Reply,
    Request,
    Script,
    anthropic_message,
    chat_completion,
    claude_computer,
    claude_toolset,
    computer_call,
    message_item,
    openai_response,
    reasoning_item,
    text_block,
    thinking_block,
)
from tests.helpers import REPO

# --- helpers ------------------------------------------------------------------------------------------------------


def png_b64(width: int, height: int, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (30, 120, 200)).save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def data_url(width: int, height: int, fmt: str = "PNG", mime: str = "image/png") -> str:
    return f"data:{mime};base64,{png_b64(width, height, fmt)}"


def claude(server: LoopbackServer, **kw: Any) -> anthropic.Anthropic:
    kw.setdefault("max_retries", 0)
    return anthropic.Anthropic(api_key="sk-test", base_url=server.url, _strict_response_validation=True, **kw)


def oai(server: LoopbackServer, **kw: Any) -> openai.OpenAI:
    kw.setdefault("max_retries", 0)
    return openai.OpenAI(
        api_key="sk-test", base_url=server.openai_url, _strict_response_validation=True, **kw
    )


def always_ok(request: Request) -> Reply:
    """A responder that accepts anything: a minimal valid reply for whichever API was called."""
    if request.provider == "anthropic":
        return Reply(anthropic_message([text_block("ok")]))
    if request.provider == "openai-responses":
        return Reply(openai_response([message_item("ok")]))
    return Reply(chat_completion("ok"))


def raw_post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def image_block(b64: str, media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64}}


def tool_result(tool_use_id: str, *, image: str | None = None, **extra: Any) -> dict:
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": [image_block(image or SHOT)],
        **extra,
    }


SHOT = png_b64(64, 48)
CLASSIC = {
    "type": "computer_20251124",
    "name": "computer",
    "display_width_px": 1280,
    "display_height_px": 800,
}
TOOLSET = {"type": "computer_toolset_20260801"}

# --- builders round-trip through the SDKs -----------------------------------------------------------------------


def test_claude_classic_tool_use_parses_in_the_beta_sdk() -> None:
    reply = anthropic_message(
        [
            thinking_block("look first"),
            text_block("clicking"),
            claude_computer("left_click", coordinate=[10, 20]),
        ],
        usage={"input_tokens": 7},
    )
    with LoopbackServer(Script([Reply(reply)])) as server:
        msg = claude(server).beta.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=1024,
            messages=[{"role": "user", "content": "click it"}],
            tools=[CLASSIC],
            betas=["computer-use-2025-11-24"],
        )
    assert type(msg).__name__ == "BetaMessage"
    assert [type(b).__name__ for b in msg.content] == [
        "BetaThinkingBlock",
        "BetaTextBlock",
        "BetaToolUseBlock",
    ]
    assert msg.content[0].signature.startswith("sig-")
    use = msg.content[2]
    assert use.type == "tool_use" and use.name == "computer" and use.id.startswith("toolu_")
    assert use.input == {"action": "left_click", "coordinate": [10, 20]}
    assert msg.stop_reason == "tool_use"
    assert msg.usage.input_tokens == 7 and msg.usage.output_tokens == 20
    assert msg.model == "claude-test"
    assert server.requests[0].betas == ["computer-use-2025-11-24"]


def test_claude_stop_reason_defaults_to_end_turn_without_tool_use() -> None:
    with LoopbackServer(Script([Reply(anthropic_message([text_block("done")]))])) as server:
        msg = claude(server).messages.create(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        )
    assert msg.stop_reason == "end_turn" and msg.content[0].text == "done"


@pytest.mark.parametrize(
    ("name", "args", "typed"),
    [
        ("left_click", {"coordinate": [3, 4]}, "ComputerLeftClickToolUseBlock"),
        ("key", {"text": "ctrl+s", "repeat": 2}, "ComputerKeyToolUseBlock"),
        ("type", {"text": "hello"}, "ComputerTypeToolUseBlock"),
        (
            "scroll",
            {"coordinate": [5, 6], "scroll_direction": "down", "scroll_amount": 3},
            "ComputerScrollToolUseBlock",
        ),
        (
            "left_click_drag",
            {"start_coordinate": [1, 1], "coordinate": [9, 9]},
            "ComputerLeftClickDragToolUseBlock",
        ),
        ("screenshot", {}, "ComputerScreenshotToolUseBlock"),
        ("zoom", {"region": [0, 0, 100, 100]}, "ComputerZoomToolUseBlock"),
    ],
)
def test_claude_toolset_member_parses_into_the_typed_member_block(name: str, args: dict, typed: str) -> None:
    reply = Reply(anthropic_message([claude_toolset(name, **args)]))
    with LoopbackServer(Script([reply, reply])) as server:
        client = claude(server)
        msg = client.messages.create(
            model="claude-sonnet-5-5",
            max_tokens=1024,
            messages=[{"role": "user", "content": "go"}],
            tools=[TOOLSET],
        )
        beta = client.beta.messages.create(  # the beta client parses it too (its `caller` is optional there)
            model="claude-sonnet-5-5",
            max_tokens=1024,
            messages=[{"role": "user", "content": "go"}],
            tools=[TOOLSET],
        )
    assert "anthropic-beta" not in server.requests[0].headers  # GA: no beta header needed
    block = msg.content[0]
    assert block.type == "tool_use" and block.name == name and block.toolset_name == "computer"
    assert block.input == args
    # the GA member union (discriminated on `name`) requires `caller` and `toolset_name`: the builder has both
    member = pydantic.TypeAdapter(ComputerToolUseBlock).validate_python(block.model_dump())
    assert type(member).__name__ == typed
    assert member.caller.type == "direct" and member.toolset_name == "computer"
    assert member.input.model_dump(exclude_none=True) == args
    beta_member = pydantic.TypeAdapter(BetaComputerToolUseBlock).validate_python(beta.content[0].model_dump())
    assert type(beta_member).__name__ == "Beta" + typed


def test_openai_responses_ga_computer_call_parses() -> None:
    actions = [{"type": "click", "button": "left", "x": 5, "y": 6}, {"type": "type", "text": "hi"}]
    reply = openai_response(
        [reasoning_item("I should click"), computer_call(actions=actions), message_item("working")],
        usage={"input_tokens": 11, "total_tokens": 31},
    )
    with LoopbackServer(Script([Reply(reply)])) as server:
        resp = oai(server).responses.create(
            model="gpt-5.4", input=[{"role": "user", "content": "click"}], tools=[{"type": "computer"}]
        )
    assert type(resp).__name__ == "Response"
    assert [type(o).__name__ for o in resp.output] == [
        "ResponseReasoningItem",
        "ResponseComputerToolCall",
        "ResponseOutputMessage",
    ]
    call = resp.output[1]
    assert call.type == "computer_call" and call.status == "completed" and call.action is None
    assert call.id.startswith("cu_") and call.call_id.startswith("call_")
    assert [a.type for a in call.actions] == ["click", "type"]
    assert (call.actions[0].button, call.actions[0].x, call.actions[0].y) == ("left", 5, 6)
    assert call.pending_safety_checks == []
    assert resp.output[0].summary[0].text == "I should click"
    assert resp.output_text == "working"
    assert resp.usage.input_tokens == 11 and resp.usage.input_tokens_details.cached_tokens == 0
    assert resp.model == "gpt-test"


def test_openai_responses_preview_computer_call_with_safety_checks_parses() -> None:
    reply = openai_response(
        [
            computer_call(
                action={"type": "scroll", "x": 1, "y": 2, "scroll_x": 0, "scroll_y": 300},
                pending_safety_checks=[{"id": "cu_sc_1", "code": "irrelevant_domain"}],
            )
        ]
    )
    with LoopbackServer(Script([Reply(reply)])) as server:
        resp = oai(server).responses.create(
            model="computer-use-preview",
            input=[{"role": "user", "content": "scroll"}],
            tools=[
                {
                    "type": "computer_use_preview",
                    "display_width": 1280,
                    "display_height": 800,
                    "environment": "linux",
                }
            ],
            truncation="auto",
        )
    call = resp.output[0]
    assert call.actions is None and call.action.type == "scroll" and call.action.scroll_y == 300
    check = call.pending_safety_checks[0]
    assert (check.id, check.code) == ("cu_sc_1", "irrelevant_domain") and check.message


def test_computer_call_builder_needs_exactly_one_of_action_and_actions() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        computer_call()
    with pytest.raises(ValueError, match="exactly one"):
        computer_call(actions=[], action={"type": "wait"})
    a, b = computer_call(actions=[]), computer_call(actions=[])
    assert a["id"] != b["id"] and a["call_id"] != b["call_id"]


def test_chat_completion_parses_content_and_tool_calls() -> None:
    script = Script(
        [
            Reply(chat_completion("Thought: click\nAction: click(start_box='(1,2)')")),
            Reply(
                chat_completion(
                    None,
                    tool_calls=[
                        {"name": "computer_use", "arguments": {"action": "key"}},
                        {"name": "noop", "arguments": "{}", "id": "call_x"},
                    ],
                )
            ),
        ]
    )
    with LoopbackServer(script) as server:
        client = oai(server)
        first = client.chat.completions.create(model="ui-tars", messages=[{"role": "user", "content": "go"}])
        second = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "go"}])
    assert type(first).__name__ == "ChatCompletion"
    assert first.choices[0].message.content.startswith("Thought: click")
    assert first.choices[0].finish_reason == "stop" and first.choices[0].message.tool_calls is None
    msg = second.choices[0].message
    assert second.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert [type(c).__name__ for c in msg.tool_calls] == ["ChatCompletionMessageFunctionToolCall"] * 2
    assert msg.tool_calls[0].function.name == "computer_use"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"action": "key"}
    assert msg.tool_calls[1].id == "call_x" and msg.tool_calls[1].function.arguments == "{}"
    assert second.usage.total_tokens == 120


def test_base_url_environment_variables_reach_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    with LoopbackServer(always_ok) as server:
        for name in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE", "ANTHROPIC_CONFIG_DIR"):
            monkeypatch.delenv(name, raising=False)
        for name, value in server.env(api_key="sk-env").items():
            monkeypatch.setenv(name, value)
        assert server.env()["ANTHROPIC_BASE_URL"] == server.url
        assert server.env()["OPENAI_BASE_URL"] == server.openai_url == server.url + "/v1"
        msg = anthropic.Anthropic(max_retries=0).messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        resp = openai.OpenAI(max_retries=0).responses.create(
            model="m", input=[{"role": "user", "content": "hi"}]
        )
        chat = openai.OpenAI(max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    assert msg.content[0].text == resp.output_text == chat.choices[0].message.content == "ok"
    assert [(r.provider, r.path) for r in server.requests] == [
        ("anthropic", "/v1/messages"),
        ("openai-responses", "/v1/responses"),
        ("openai-chat", "/v1/chat/completions"),
    ]
    assert all(r.headers["authorization"] == "Bearer sk-env" for r in server.requests)


# --- a full agent turn: the SDKs' own objects passed back are accepted --------------------------------------------


def test_claude_toolset_turn_with_sdk_objects_passed_back() -> None:
    first = anthropic_message(
        [
            thinking_block("plan"),
            claude_toolset("left_click", coordinate=[1, 2]),
            claude_toolset("screenshot"),
        ]
    )
    with LoopbackServer(Script([Reply(first), Reply(anthropic_message([text_block("done")]))])) as server:
        client = claude(server)
        messages: list[dict] = [
            {"role": "user", "content": [{"type": "text", "text": "go"}, image_block(SHOT)]}
        ]
        msg = client.messages.create(model="m", max_tokens=2048, messages=messages, tools=[TOOLSET])
        uses = [b for b in msg.content if b.type == "tool_use"]
        messages += [
            {"role": "assistant", "content": msg.content},
            {
                "role": "user",
                "content": [tool_result(u.id, toolset_name="computer", image=png_b64(32, 16)) for u in uses],
            },
        ]
        done = client.messages.create(model="m", max_tokens=2048, messages=messages, tools=[TOOLSET])
    assert done.content[0].text == "done"
    assert [r.error for r in server.requests] == [None, None]
    assert server.requests[1].images == [(64, 48), (32, 16), (32, 16)]


def test_openai_responses_turn_with_sdk_objects_passed_back() -> None:
    first = openai_response([reasoning_item("r"), computer_call(actions=[{"type": "screenshot"}],
                             pending_safety_checks=[{"id": "sc_1"}])])  # fmt: skip
    with LoopbackServer(Script([Reply(first), Reply(openai_response([message_item("done")]))])) as server:
        client = oai(server)
        items: list[Any] = [{"role": "user", "content": "go"}]
        resp = client.responses.create(model="gpt-5.4", input=items, tools=[{"type": "computer"}])
        call = resp.output[1]
        items += [
            *resp.output,
            {"type": "computer_call_output", "call_id": call.call_id,
             "output": {"type": "computer_screenshot", "image_url": data_url(40, 30)},
             "acknowledged_safety_checks": [{"id": "sc_1"}]},
        ]  # fmt: skip
        done = client.responses.create(model="gpt-5.4", input=items, tools=[{"type": "computer"}])
    assert done.output_text == "done"
    assert server.requests[1].error is None and server.requests[1].images == [(40, 30)]


def test_openai_previous_response_id_chain_is_checked() -> None:
    first = openai_response(
        [computer_call(actions=[{"type": "wait"}], pending_safety_checks=[{"id": "sc_9"}])]
    )
    script = Script([Reply(first), Reply(openai_response([message_item("done")]))])
    with LoopbackServer(script) as server:
        client = oai(server)
        resp = client.responses.create(
            model="g", input=[{"role": "user", "content": "go"}], tools=[{"type": "computer"}]
        )
        call_id = resp.output[0].call_id
        output = {"type": "computer_call_output", "call_id": call_id,
                  "output": {"type": "computer_screenshot", "image_url": data_url(8, 8)}}  # fmt: skip
        with pytest.raises(openai.BadRequestError, match="Previous response with id 'resp_nope' not found"):
            client.responses.create(model="g", previous_response_id="resp_nope", input=[output])
        with pytest.raises(openai.BadRequestError, match=f"No tool output found for computer call {call_id}"):
            client.responses.create(
                model="g", previous_response_id=resp.id, input=[{"role": "user", "content": "?"}]
            )
        with pytest.raises(openai.BadRequestError, match=r"exactly those ids, got \[\]"):
            client.responses.create(model="g", previous_response_id=resp.id, input=[output])
        done = client.responses.create(
            model="g",
            previous_response_id=resp.id,
            input=[{**output, "acknowledged_safety_checks": [{"id": "sc_9"}]}],
        )
    assert done.output_text == "done"
    assert script.remaining == 0


# --- strict checks: Anthropic -------------------------------------------------------------------------------------

USE_ID = "toolu_01"
TOOLSET_USE = {
    "type": "tool_use",
    "id": USE_ID,
    "name": "left_click",
    "input": {},
    "toolset_name": "computer",
}
CLASSIC_USE = {"type": "tool_use", "id": USE_ID, "name": "computer", "input": {"action": "screenshot"}}
SIGNED = {"type": "thinking", "thinking": "hm", "signature": "sig-1"}


def classic_turn(answer: list[dict] | None = None, assistant: list[dict] | None = None) -> list[dict]:
    return [
        {"role": "user", "content": "open the file"},
        {"role": "assistant", "content": assistant or [SIGNED, CLASSIC_USE]},
        {"role": "user", "content": answer if answer is not None else [tool_result(USE_ID)]},
    ]


def classic(**kw: Any) -> dict:
    return {"model": "claude-sonnet-4-6", "max_tokens": 1024, "messages": classic_turn(), "tools": [CLASSIC],
            "betas": ["computer-use-2025-11-24"], **kw}  # fmt: skip


ANTHROPIC_CASES = {
    "first message from the assistant": (
        classic(messages=[{"role": "assistant", "content": "hi"}, {"role": "user", "content": "hi"}]),
        'first message must use the "user" role',
    ),
    "two user messages in a row": (
        classic(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
        "roles must alternate",
    ),
    "tool_use without tool_result": (
        classic(messages=classic_turn(answer=[{"type": "text", "text": "here"}])),
        f"messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: {USE_ID}",
    ),
    "tool_use as the last message": (
        classic(messages=classic_turn()[:2]),
        "`tool_use` ids were found without `tool_result` blocks",
    ),
    "tool_result after text": (
        classic(messages=classic_turn(answer=[{"type": "text", "text": "here"}, tool_result(USE_ID)])),
        "messages.2.content.1: `tool_result` blocks must come first",
    ),
    "extra tool_result": (
        classic(messages=classic_turn(answer=[tool_result(USE_ID), tool_result("toolu_other")])),
        "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: toolu_other",
    ),
    "toolset tool_result without toolset_name": (
        classic(tools=[TOOLSET], betas=[], messages=classic_turn(assistant=[TOOLSET_USE])),
        "must echo toolset_name: 'computer' (got None)",
    ),
    "classic tool without its beta": (
        classic(betas=[]),
        "tools.0: tool type 'computer_20251124' needs the anthropic-beta header 'computer-use-2025-11-24'",
    ),
    "computer_20250124 with the wrong beta": (
        classic(tools=[{**CLASSIC, "type": "computer_20250124"}]),
        "needs the anthropic-beta header 'computer-use-2025-01-24' (got: computer-use-2025-11-24)",
    ),
    "enable_zoom on computer_20250124": (
        classic(
            tools=[{**CLASSIC, "type": "computer_20250124", "enable_zoom": True}],
            betas=["computer-use-2025-01-24"],
        ),
        "tools.0.computer_20250124.enable_zoom: Extra inputs are not permitted",
    ),
    "classic tool without display_height_px": (
        classic(tools=[{k: v for k, v in CLASSIC.items() if k != "display_height_px"}]),
        "tools.0.computer_20251124.display_height_px: Field required",
    ),
    "classic tool not named computer": (
        classic(tools=[{**CLASSIC, "name": "screen"}]),
        "tools.0.computer_20251124.name: Input should be 'computer'",
    ),
    "toolset entry with classic fields": (
        classic(
            tools=[{**TOOLSET, "name": "computer", "display_width_px": 1280}],
            betas=[],
            messages=classic_turn(
                assistant=[TOOLSET_USE], answer=[tool_result(USE_ID, toolset_name="computer")]
            ),
        ),
        "tools.0.computer_toolset_20260801.display_width_px: Extra inputs are not permitted",
    ),
    "toolset configs with an unknown member": (
        classic(
            tools=[{**TOOLSET, "configs": {"teleport": {"enabled": False}}}],
            betas=[],
            messages=[{"role": "user", "content": "hi"}],
        ),
        "configs.teleport: not a member of the computer toolset",
    ),
    "thinking block without its signature": (
        classic(messages=classic_turn(assistant=[{"type": "thinking", "thinking": "hm"}, CLASSIC_USE])),
        "messages.1.content.0.thinking.signature: Field required",
    ),
    "five cache_control markers": (
        classic(
            system=[
                {"type": "text", "text": f"s{i}", "cache_control": {"type": "ephemeral"}} for i in range(4)
            ],
            tools=[{**CLASSIC, "cache_control": {"type": "ephemeral"}}],
        ),
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),
    "a JPEG labelled image/png": (
        classic(messages=classic_turn(answer=[tool_result(USE_ID, image=png_b64(8, 8, "JPEG"))])),
        "messages.2.content.0.content.0.source.data: Image does not match the provided media type image/png",
    ),
    "a JPEG screenshot": (
        classic(messages=[{"role": "user", "content": [image_block(png_b64(8, 8, "JPEG"), "image/jpeg")]}]),
        "image media type must be image/png, got 'image/jpeg'",
    ),
    "a truncated PNG": (
        classic(messages=[{"role": "user", "content": [image_block(png_b64(8, 8)[:-24])]}]),
        "messages.0.content.0.source.data: the image could not be decoded",
    ),
    "an image wider than 8000 px": (
        classic(messages=[{"role": "user", "content": [image_block(png_b64(8001, 2))]}]),
        "messages.0.content.0.source: image dimensions exceed max allowed size: 8000 pixels (8001x2)",
    ),
    "21 images, one wider than 2000 px": (
        classic(
            messages=[{"role": "user", "content": [image_block(png_b64(2001, 2))] + [image_block(SHOT)] * 20}]
        ),
        "exceed max allowed size (a request with more than 20 images): 2000 pixels (2001x2)",
    ),
    "101 images": (
        classic(messages=[{"role": "user", "content": [image_block(png_b64(2, 2))] * 101}]),
        "Too many images in the request: 101, the maximum is 100",
    ),
    "invalid base64": (
        classic(messages=[{"role": "user", "content": [image_block("not base64!")]}]),
        "messages.0.content.0.source.data: the image's base64 data is invalid",
    ),
    "a URL image": (
        classic(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
                    ],
                }
            ]
        ),
        "messages.0.content.0.source: loopback accepts only base64 PNG images",
    ),
    "tool_use without tools": (
        classic(tools=[], betas=[]),
        "Requests which include `tool_use` or `tool_result` blocks must define tools.",
    ),
}


@pytest.mark.parametrize("case", ANTHROPIC_CASES)
def test_anthropic_strict_check_rejects(case: str) -> None:
    request, message = ANTHROPIC_CASES[case]
    with LoopbackServer(always_ok) as server, pytest.raises(anthropic.BadRequestError) as err:
        claude(server).beta.messages.create(**request)
    assert err.value.status_code == 400
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert message in err.value.body["error"]["message"], err.value.body["error"]["message"]
    assert server.requests[0].error == err.value.body["error"]["message"]


ANTHROPIC_ACCEPTED = {
    "classic turn": classic(),
    "classic turn, computer_20250124": classic(tools=[{**CLASSIC, "type": "computer_20250124"}],
                                                betas=["computer-use-2025-01-24"]),
    "toolset turn": classic(tools=[{**TOOLSET, "configs": {"zoom": {"enabled": False}},
                                    "cache_control": {"type": "ephemeral"}}], betas=[],
                            messages=classic_turn(assistant=[SIGNED, TOOLSET_USE],
                                                  answer=[tool_result(USE_ID, toolset_name="computer"),
                                                          {"type": "text", "text": "and then?"}])),
    "four cache_control markers": classic(
        system=[{"type": "text", "text": f"s{i}", "cache_control": {"type": "ephemeral"}} for i in range(4)]
    ),
    "prefilled assistant turn": classic(
        tools=[], betas=[], messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", ANTHROPIC_ACCEPTED)
def test_anthropic_strict_check_accepts(case: str) -> None:
    with LoopbackServer(always_ok) as server:
        msg = claude(server).beta.messages.create(**ANTHROPIC_ACCEPTED[case])
    assert msg.content[0].text == "ok"
    assert server.requests[0].error is None


def test_anthropic_rejects_an_image_over_5_mb() -> None:
    noise = np.random.default_rng(0).integers(0, 256, (1400, 1400, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="PNG", compress_level=0)
    big = base64.b64encode(buf.getvalue()).decode()
    with (
        LoopbackServer(always_ok) as server,
        pytest.raises(
            anthropic.BadRequestError, match=r"source.data: image exceeds 5 MB maximum: \d+ bytes > 5242880"
        ),
    ):
        claude(server).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": [image_block(big)]}]
        )
    assert server.requests[0].images == [(1400, 1400)]


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m", "messages": HI}, "max_tokens: Field required"),
        ({"max_tokens": 5, "messages": HI}, "model: Field required"),
        ({"model": "m", "max_tokens": 5}, "messages: Field required"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages: at least one message is required"),
        (
            {
                "model": "m",
                "max_tokens": 5000,
                "messages": HI,
                "thinking": {"type": "enabled", "budget_tokens": 500},
            },
            "thinking.enabled.budget_tokens: Input should be >= 1024, got 500",
        ),
        (
            {
                "model": "m",
                "max_tokens": 2000,
                "messages": HI,
                "thinking": {"type": "enabled", "budget_tokens": 2000},
            },
            "`max_tokens` must be greater than `thinking.budget_tokens`",
        ),
    ],
)
def test_anthropic_top_level_fields_are_checked(body: dict, message: str) -> None:
    # the typed method cannot leave these out; the SDK's raw post can
    with LoopbackServer(always_ok) as server, pytest.raises(anthropic.BadRequestError) as err:
        claude(server).post("/v1/messages", body=body, cast_to=object)
    assert message in err.value.body["error"]["message"]


def test_missing_auth_version_and_bad_json_are_refused_like_the_real_apis() -> None:
    body = json.dumps(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    with LoopbackServer(always_ok) as server:
        msgs = server.url + "/v1/messages"
        status, err = raw_post(msgs, body, {"anthropic-version": "2023-06-01"})
        assert status == 401 and err["error"]["type"] == "authentication_error"
        assert "x-api-key header is required" in err["error"]["message"]
        status, err = raw_post(msgs, body, {"x-api-key": "sk-test"})
        assert status == 400 and err["error"]["message"] == "anthropic-version: header is required"
        status, ok = raw_post(msgs, body, {"x-api-key": "sk-test", "anthropic-version": "2023-06-01"})
        assert status == 200 and ok["type"] == "message"
        status, err = raw_post(msgs, b"{nope", {"x-api-key": "k", "anthropic-version": "2023-06-01"})
        assert status == 400 and "not valid JSON" in err["error"]["message"]
        chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        status, err = raw_post(server.openai_url + "/chat/completions", chat, {})
        assert status == 401 and "You didn't provide an API key" in err["error"]["message"]
        assert err["error"]["code"] == "invalid_api_key"
        status, err = raw_post(server.openai_url + "/responses", b"{}", {"authorization": "Bearer k"})
        assert status == 400 and err["error"] == {
            "message": "Missing required parameter: 'model'.", "type": "invalid_request_error",
            "param": "model", "code": None,
        }  # fmt: skip
        with urllib.request.urlopen(server.url + "/health", timeout=5) as resp:
            assert json.loads(resp.read()) == {"status": "ok"}


# --- strict checks: OpenAI Responses --------------------------------------------------------------------------------

GA = [{"type": "computer"}]
PREVIEW = [
    {"type": "computer_use_preview", "display_width": 1024, "display_height": 768, "environment": "linux"}
]
CALL = {"type": "computer_call", "id": "cu_1", "call_id": "call_1", "status": "completed",
        "actions": [{"type": "screenshot"}], "pending_safety_checks": []}  # fmt: skip


def call_output(call_id: str = "call_1", image_url: str | None = None, **extra: Any) -> dict:
    return {"type": "computer_call_output", "call_id": call_id,
            "output": {"type": "computer_screenshot", "image_url": image_url or data_url(20, 10)}, **extra}  # fmt: skip


USER = {"role": "user", "content": "go"}
RESPONSES_CASES = {
    "string input": ({"input": "go", "tools": GA}, "expects a list of input items"),
    "computer_call without its output": (
        {"input": [USER, CALL], "tools": GA},
        "No tool output found for computer call call_1",
    ),
    "output before its call": (
        {"input": [USER, call_output(), CALL], "tools": GA},
        "No tool call found for computer call output with call_id call_1",
    ),
    "output of the wrong shape": (
        {
            "input": [
                USER,
                CALL,
                {**call_output(), "output": {"type": "input_image", "image_url": data_url(2, 2)}},
            ],
            "tools": GA,
        },
        'Invalid \'input[2].output\': expected {"type": "computer_screenshot"',
    ),
    "an https screenshot": (
        {"input": [USER, CALL, call_output(image_url="https://example.com/s.png")], "tools": GA},
        "input[2].output.image_url: loopback accepts only base64 data URLs",
    ),
    "a JPEG screenshot": (
        {"input": [USER, CALL, call_output(image_url=data_url(4, 4, "JPEG", "image/jpeg"))], "tools": GA},
        "image media type must be image/png, got 'image/jpeg'",
    ),
    "unacknowledged safety checks": (
        {
            "input": [
                USER,
                {**CALL, "pending_safety_checks": [{"id": "sc_1", "code": "x", "message": "y"}]},
                call_output(),
            ],
            "tools": GA,
        },
        "its acknowledged_safety_checks must carry exactly those ids, got []",
    ),
    "wrongly acknowledged safety checks": (
        {
            "input": [
                USER,
                {**CALL, "pending_safety_checks": [{"id": "sc_1"}]},
                call_output(acknowledged_safety_checks=[{"id": "sc_2"}]),
            ],
            "tools": GA,
        },
        "pending_safety_checks are ['sc_1']",
    ),
    "GA tool with display fields": (
        {"input": [USER], "tools": [{"type": "computer", "display_width": 1024}]},
        "Unknown parameter: 'tools[0].display_width'.",
    ),
    "preview tool without environment": (
        {"input": [USER], "tools": [{k: v for k, v in PREVIEW[0].items() if k != "environment"}]},
        "Missing required parameter: 'tools[0].environment'.",
    ),
    "preview tool with a bad environment": (
        {"input": [USER], "tools": [{**PREVIEW[0], "environment": "amiga"}]},
        "Invalid value: 'amiga'.",
    ),
    "preview tool with an extra field": (
        {"input": [USER], "tools": [{**PREVIEW[0], "display_number": 1}]},
        "Unknown parameter: 'tools[0].display_number'.",
    ),
    "a JPEG input_image": (
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "detail": "auto", "image_url": data_url(4, 4, "JPEG")}
                    ],
                }
            ]
        },
        "input[0].content[0].image_url: Image does not match the provided media type image/png",
    ),
}


@pytest.mark.parametrize("case", RESPONSES_CASES)
def test_openai_responses_strict_check_rejects(case: str) -> None:
    request, message = RESPONSES_CASES[case]
    with LoopbackServer(always_ok) as server, pytest.raises(openai.BadRequestError) as err:
        oai(server).responses.create(model="gpt-5.4", **request)
    assert err.value.status_code == 400 and err.value.type == "invalid_request_error"
    assert message in err.value.message, err.value.message


RESPONSES_ACCEPTED = {
    "GA turn": {"input": [USER, CALL, call_output()], "tools": GA},
    "preview turn with acknowledged checks": {
        "input": [USER, {**CALL, "actions": None, "action": {"type": "wait"}, "pending_safety_checks": [{"id": "a"},
               {"id": "b"}]}, call_output(acknowledged_safety_checks=[{"id": "b"}, {"id": "a", "code": "c"}])],
        "tools": PREVIEW, "truncation": "auto"},
    "function tools and input_image": {
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "see"},
               {"type": "input_image", "detail": "auto", "image_url": data_url(6, 5)}]}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]},
}  # fmt: skip


@pytest.mark.parametrize("case", RESPONSES_ACCEPTED)
def test_openai_responses_strict_check_accepts(case: str) -> None:
    with LoopbackServer(always_ok) as server:
        assert oai(server).responses.create(model="gpt-5.4", **RESPONSES_ACCEPTED[case]).output_text == "ok"
    assert server.requests[0].error is None


# --- strict checks: OpenAI chat ------------------------------------------------------------------------------------


def image_part(url: Any) -> dict:
    return {"type": "image_url", "image_url": url}


ASSISTANT_CALL = {"role": "assistant", "content": None,
                  "tool_calls": [{"id": "call_7", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}  # fmt: skip
CHAT_CASES = {
    "no messages": ([], "expected a non-empty array of messages"),
    "image_url as a bare string": (
        [{"role": "user", "content": [image_part(data_url(4, 4))]}],
        "Invalid type for 'messages[0].content[0].image_url': expected an object",
    ),
    "a JPEG image": (
        [{"role": "user", "content": [image_part({"url": data_url(4, 4, "JPEG")})]}],
        "messages[0].content[0].image_url.url: Image does not match the provided media type image/png",
    ),
    "a message without content": ([{"role": "user"}], "Missing required parameter: 'messages[0].content'."),
    "an unknown role": ([{"role": "robot", "content": "hi"}], "Invalid value: 'robot'."),
    "a tool message answering nothing": (
        [USER, ASSISTANT_CALL, {"role": "tool", "tool_call_id": "call_8", "content": "done"}],
        "'messages[2]' has role 'tool' with tool_call_id 'call_8', which answers no earlier assistant tool call",
    ),
    "a tool message before its call": (
        [USER, {"role": "tool", "tool_call_id": "call_7", "content": "done"}, ASSISTANT_CALL],
        "tool_call_id 'call_7', which answers no earlier assistant tool call",
    ),
}


@pytest.mark.parametrize("case", CHAT_CASES)
def test_openai_chat_strict_check_rejects(case: str) -> None:
    messages, message = CHAT_CASES[case]
    with LoopbackServer(always_ok) as server, pytest.raises(openai.BadRequestError) as err:
        oai(server).chat.completions.create(model="ui-tars", messages=messages)
    assert err.value.status_code == 400 and message in err.value.message, err.value.message


def test_openai_chat_strict_check_accepts_a_tool_turn_with_images() -> None:
    messages = [
        {"role": "system", "content": "You are a GUI agent."},
        {"role": "user", "content": [{"type": "text", "text": "go"}, image_part({"url": data_url(28, 14)})]},
        ASSISTANT_CALL,
        {"role": "tool", "tool_call_id": "call_7", "content": "done"},
        {"role": "user", "content": [image_part({"url": data_url(56, 28), "detail": "high"})]},
    ]
    with LoopbackServer(always_ok) as server:
        assert (
            oai(server).chat.completions.create(model="q", messages=messages).choices[0].message.content
            == "ok"
        )
    assert server.requests[0].images == [(28, 14), (56, 28)]


def test_lenient_mode_passes_wrong_requests_and_still_records_images() -> None:
    body = classic(
        messages=classic_turn(answer=[{"type": "text", "text": "no result"}, image_block(SHOT)]), betas=[]
    )
    with LoopbackServer(always_ok, strict=False) as server:
        assert claude(server).beta.messages.create(**body).content[0].text == "ok"
    assert server.requests[0].error is None and server.requests[0].images == [(64, 48)]


# --- errors, retries, scripts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["anthropic", "openai-responses"])
def test_429_with_retry_after_is_retried_by_the_sdk(provider: str) -> None:
    ok = always_ok(Request(provider, "", {}, {}, 0))
    script = Script([Reply.error(provider, 429, "slow down", headers={"retry-after": "1"}), ok])
    with LoopbackServer(script) as server:
        start = time.monotonic()
        if provider == "anthropic":
            claude(server, max_retries=1).messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
        else:
            oai(server, max_retries=1).responses.create(model="m", input=[USER])
        elapsed = time.monotonic() - start
    assert 0.9 <= elapsed < 2.5, elapsed
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1"]
    assert [r.index for r in server.requests] == [0, 1]


def test_429_without_retries_raises_rate_limit_error() -> None:
    script = Script([Reply.error("anthropic", 429, "slow down", {"retry-after": "1"})])
    with LoopbackServer(script) as server, pytest.raises(anthropic.RateLimitError) as err:
        claude(server).messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["error"] == {"type": "rate_limit_error", "message": "slow down"}
    assert err.value.response.headers["retry-after"] == "1"


def test_500_raises_internal_server_error() -> None:
    script = Script({"anthropic": [Reply.error("anthropic", 500, "boom")],
                     "openai-chat": [Reply.error("openai-chat", 503, "down")]})  # fmt: skip
    with LoopbackServer(script) as server:
        with pytest.raises(anthropic.InternalServerError, match="boom"):
            claude(server).messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(openai.InternalServerError, match="down") as err:
            oai(server).chat.completions.create(model="m", messages=[USER])
    assert err.value.status_code == 503 and err.value.type == "server_error"


def test_reply_error_bodies_are_provider_shaped() -> None:
    a = Reply.error("anthropic", 529, "overloaded", delay=0.5)
    assert a.body["type"] == "error" and a.body["error"] == {
        "type": "overloaded_error",
        "message": "overloaded",
    }
    assert (a.status, a.delay) == (529, 0.5)
    o = Reply.error("openai-responses", 400, "bad")
    assert o.body == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}
    }
    with pytest.raises(ValueError, match="unknown provider"):
        Reply.error("gemini", 400, "bad")


def test_exhausted_script_answers_500_with_a_clear_message() -> None:
    with LoopbackServer(Script([Reply(chat_completion("one"))])) as server:
        client = oai(server)
        assert client.chat.completions.create(model="m", messages=[USER]).choices[0].message.content == "one"
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.create(model="m", messages=[USER])
    assert "loopback Script exhausted: openai-chat request #2 to the script" in err.value.message
    assert "1 reply was scripted" in err.value.message


def test_per_provider_script_keeps_separate_queues() -> None:
    script = Script({"anthropic": [Reply(anthropic_message([text_block("a1")])),
                                   Reply(anthropic_message([text_block("a2")]))],
                     "openai-chat": [Reply(chat_completion("c1"))]})  # fmt: skip
    with LoopbackServer(script) as server:
        c, o = claude(server), oai(server)
        hi = [{"role": "user", "content": "hi"}]
        assert c.messages.create(model="m", max_tokens=5, messages=hi).content[0].text == "a1"
        assert o.chat.completions.create(model="m", messages=[USER]).choices[0].message.content == "c1"
        assert c.messages.create(model="m", max_tokens=5, messages=hi).content[0].text == "a2"
        with pytest.raises(
            openai.InternalServerError, match="no replies scripted for provider 'openai-responses'"
        ):
            o.responses.create(model="m", input=[USER])
    assert [(r.provider, r.index) for r in server.requests] == [
        ("anthropic", 0), ("openai-chat", 0), ("anthropic", 1), ("openai-responses", 0)
    ]  # fmt: skip
    assert script.remaining == 0


def test_raising_responder_gives_500_with_the_exception_text() -> None:
    def responder(request: Request) -> Reply:
        raise RuntimeError(f"no reply for request {request.index}")

    with (
        LoopbackServer(responder) as server,
        pytest.raises(anthropic.InternalServerError, match="RuntimeError: no reply for request 0"),
    ):
        claude(server).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert isinstance(server.errors[0], RuntimeError)


def test_async_responder_and_dict_replies() -> None:
    async def responder(request: Request) -> dict:
        return chat_completion(f"async {request.index}")

    with LoopbackServer(responder) as server:
        client = oai(server)
        assert (
            client.chat.completions.create(model="m", messages=[USER]).choices[0].message.content == "async 0"
        )
    with LoopbackServer(Script([chat_completion("plain dict")])) as server:
        assert oai(server).chat.completions.create(model="m", messages=[USER]).choices[0].message.content == (
            "plain dict"
        )


def test_requests_record_headers_and_image_sizes() -> None:
    messages = [{"role": "user", "content": [image_block(png_b64(100, 50)), {"type": "text", "text": "a"},
                                             image_block(png_b64(30, 20))]}]  # fmt: skip
    with LoopbackServer(always_ok) as server:
        claude(server).beta.messages.create(
            model="m", max_tokens=5, messages=messages, betas=["computer-use-2025-11-24", "other-beta"]
        )
    req = server.requests[0]
    assert (req.provider, req.path, req.index) == ("anthropic", "/v1/messages", 0)
    assert req.images == [(100, 50), (30, 20)]
    # anthropic 2.x sends the API key as `authorization: Bearer`, not `x-api-key`; the server accepts either
    assert req.headers.get("x-api-key") == "sk-test" or req.headers.get("authorization") == "Bearer sk-test"
    assert req.headers["anthropic-version"]
    assert req.betas == ["computer-use-2025-11-24", "other-beta"]
    assert all(name == name.lower() for name in req.headers)
    assert req.body["messages"] == messages


# --- concurrency and lifecycle -----------------------------------------------------------------------------------------


def run_concurrently(n: int, call: Any) -> tuple[float, list[Any]]:
    results: list[Any] = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = call(i)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return time.monotonic() - start, results


def test_sixteen_delayed_replies_are_served_at_once() -> None:
    with LoopbackServer(lambda request: Reply(chat_completion(f"r{request.index}"), delay=1.0)) as server:
        clients = [oai(server) for _ in range(16)]
        elapsed, results = run_concurrently(
            16,
            lambda i: (
                clients[i].chat.completions.create(model="m", messages=[USER]).choices[0].message.content
            ),
        )
    assert sorted(results) == sorted(f"r{i}" for i in range(16)), results
    # one at a time would take 16 s; the bound leaves room for a loaded machine (CI ran 2.6 s next to 16 desktops)
    assert elapsed < 8.0, elapsed


def test_slow_sync_responders_do_not_block_each_other() -> None:
    def slow(request: Request) -> Reply:
        time.sleep(1.0)
        return Reply(anthropic_message([text_block("slow")]))

    with LoopbackServer(slow) as server:
        client = claude(server)
        elapsed, results = run_concurrently(
            16,
            lambda i: client.messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            ),
        )
        with urllib.request.urlopen(server.url + "/health", timeout=5) as resp:
            assert resp.status == 200
    assert all(getattr(r, "content", None) for r in results), results
    assert elapsed < 8.0, elapsed  # one at a time: 16 s


def test_server_stops_cleanly() -> None:
    server = LoopbackServer(always_ok)
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.url
    with server:
        port = server.port
        thread = server._thread
        assert server.url == f"http://127.0.0.1:{port}"
        claude(server).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert thread is not None and not thread.is_alive()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


# --- the package's one list of names --------------------------------------------------------------------------


def test_testing_all_is_what_the_package_offers() -> None:
    """`pytest_retrace.testing.__all__` names only what exists, every public class and function the package's
    modules define, and every `pytest_retrace.testing.<name>` the docs mention."""
    names = testing.__all__
    assert len(names) == len(set(names)), "a name is listed twice"
    assert [n for n in names if not hasattr(testing, n)] == []
    defined = set()
    for module_info in pkgutil.iter_modules(testing.__path__, testing.__name__ + "."):
        module = importlib.import_module(module_info.name)
        defined |= {
            name
            for name, obj in vars(module).items()
            if not name.startswith("_")
            and (inspect.isclass(obj) or inspect.isfunction(obj))
            and obj.__module__ == module.__name__
        }
    assert defined - set(names) == set(), "public but not in testing.__all__"
    root = REPO
    docs = [root / "README.md", *(root / "docs").glob("*.md")]
    mentioned = {m for doc in docs for m in re.findall(r"pytest_retrace\.testing\.(\w+)", doc.read_text())}
    assert mentioned - set(names) == set(), "the docs name what testing does not export"
