"""Test doubles for model adapters, without API keys: a loopback stand-in for the model providers' HTTP APIs.

`LoopbackServer` (server.py) runs uvicorn on 127.0.0.1 in a daemon thread and speaks just enough of three
wire formats for the official SDKs to talk to it: Anthropic Messages (`POST /v1/messages`, anthropic.py),
OpenAI Responses (`POST /v1/responses`, openai.py) and OpenAI Chat Completions (`POST /v1/chat/completions`,
openai_compat.py). Every reply comes from a *responder* (responders.py) — usually a `Script` of canned
`Reply`s built with each provider's body builders (`anthropic_message`, `claude_computer`, `openai_response`,
`computer_call`, `chat_completion`, ...). wire.py holds what they share: `Request`, `Reply`, `WireError`, the
provider names and error bodies, PNG decoding.

This is a test double, not an implementation of the APIs. Its *strict* mode (on by default) rejects, with an
HTTP 400 and a provider-shaped error body like the real API's, the request mistakes a computer-use adapter
tends to make: a `tool_use` left without its `tool_result`, a computer tool without its beta header, a
`computer_call_output` that forgets the safety checks it must acknowledge, an image that is not a PNG, ...
Each check is a small function in its provider's module; anything they do not look at is accepted as sent.

    with LoopbackServer(Script([Reply(anthropic_message([claude_computer("screenshot")]))])) as server:
        client = anthropic.Anthropic(api_key="sk-test", base_url=server.url)
        ...
        assert server.requests[0].images == [(1280, 720)]
"""

from pytest_retrace.testing.anthropic import (
    COMPUTER_TOOLSET_MEMBERS,
    anthropic_images,
    anthropic_message,
    check_anthropic,
    claude_computer,
    claude_toolset,
    text_block,
    thinking_block,
)
from pytest_retrace.testing.openai import (
    check_openai_request,
    check_openai_responses,
    computer_call,
    message_item,
    openai_response,
    reasoning_item,
    responses_images,
)
from pytest_retrace.testing.openai_compat import chat_completion, chat_images, check_openai_chat
from pytest_retrace.testing.responders import EchoingCredentials, Script, UndoingClaude
from pytest_retrace.testing.server import LoopbackServer
from pytest_retrace.testing.wire import (
    ANTHROPIC,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    PROVIDERS,
    Reply,
    Request,
    Responder,
    WireError,
    error_body,
    new_id,
    png_size,
)

# The one list of what the package offers (tests/testing/test_loopback.py checks it against the modules).
__all__ = [
    "ANTHROPIC",
    "COMPUTER_TOOLSET_MEMBERS",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "PROVIDERS",
    "EchoingCredentials",
    "LoopbackServer",
    "Reply",
    "Request",
    "Responder",
    "Script",
    "UndoingClaude",
    "WireError",
    "anthropic_images",
    "anthropic_message",
    "chat_completion",
    "chat_images",
    "check_anthropic",
    "check_openai_chat",
    "check_openai_request",
    "check_openai_responses",
    "claude_computer",
    "claude_toolset",
    "computer_call",
    "error_body",
    "message_item",
    "new_id",
    "openai_response",
    "png_size",
    "reasoning_item",
    "responses_images",
    "text_block",
    "thinking_block",
]
