"""The model adapters through their official SDKs, against a loopback server speaking each provider's wire
format (strictly: a request the real API would refuse is refused), on the real desktop: a full recovery of a
built-in case for every dialect, malformed replies, transport failures, safety checks, the screenshot budget,
prompt caching, and a click that must land where the model pointed when its image is smaller than the
screen."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_retrace.agents import ModelConfig, create_agent
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import load_case, load_png
from pytest_retrace.replay.result import RecoveryResult, ReplayOptions
from pytest_retrace.replay.run import run_case
from pytest_retrace.testing import (
    LoopbackServer,
    Reply,
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
)
from tests.helpers import REPO

# every test here replays a built-in case on a real Xvfb desktop through a model adapter
pytestmark = pytest.mark.desktop

CASE = load_case(REPO / "tests" / "data" / "v1-cases" / "text-editor" / "append-line-t1-stray-keys.yaml")  # one ctrl+z recovers it
FAST = {"initial_backoff": 0.05, "max_backoff": 0.2}

# dialect -> (provider, options, reply that presses ctrl+z, reply that says it is done)
DIALECTS: dict[str, tuple[str, dict[str, Any], Any, Any]] = {
    "claude-20251124": ("anthropic", {"tool_version": "computer_20251124"},
                        lambda: anthropic_message([text_block("Undo the stray keys."), claude_computer("key", text="ctrl+z")]),
                        lambda: anthropic_message([text_block("The target state is restored.")])),
    "claude-20250124": ("anthropic", {"tool_version": "computer_20250124"},
                        lambda: anthropic_message([claude_computer("key", text="ctrl+z")]),
                        lambda: anthropic_message([text_block("Done.")])),
    "claude-toolset": ("anthropic", {"tool_version": "computer_toolset_20260801"},
                       lambda: anthropic_message([claude_toolset("key", text="ctrl+z")]),
                       lambda: anthropic_message([text_block("Done.")])),
    "openai-computer": ("openai", {"tool": "computer"},
                        lambda: openai_response([reasoning_item("Undo the stray keys."),
                                                 computer_call(actions=[{"type": "keypress", "keys": ["CTRL", "Z"]}])]),
                        lambda: openai_response([message_item("Restored.")])),
    "openai-preview": ("openai", {"tool": "computer_use_preview", "model": "computer-use-preview"},
                       lambda: openai_response([computer_call(action={"type": "keypress", "keys": ["ctrl", "z"]})]),
                       lambda: openai_response([message_item("Restored.")])),
    "ui-tars": ("openai-compat", {"parser": "uitars", "image": {"coordinates": "smart-resize"},
                                  "prompts": {"forward_system": "prompts/ui-tars-system.md"}},
                lambda: chat_completion("Thought: undo the stray keys\nAction: hotkey(key='ctrl z')"),
                lambda: chat_completion("Thought: it is restored\nAction: finished(content='restored')")),
    "qwen": ("openai-compat", {"parser": "qwen", "image": {"coordinates": "relative-1000"},
                               "prompts": {"forward_system": "prompts/qwen-system.md"}},
             lambda: chat_completion('Undo.\n<tool_call>\n{"name": "computer_use", "arguments": '
                                     '{"action": "key", "keys": ["ctrl", "z"]}}\n</tool_call>'),
             lambda: chat_completion('<tool_call>{"name": "computer_use", "arguments": '
                                     '{"action": "terminate", "status": "success"}}</tool_call>')),
    "qwen-native-calls": ("openai-compat", {"parser": "qwen", "prompts": {"forward_system": "prompts/qwen-system.md"}},
                          lambda: chat_completion("Undo.", tool_calls=[{"name": "computer_use", "arguments": {
                              "action": "key", "keys": ["ctrl", "z"]}}]),
                          lambda: chat_completion("It is restored.")),
    "evocua-pyautogui": ("openai-compat", {"parser": "pyautogui",
                                           "prompts": {"forward_system": "prompts/pyautogui-system.md"}},
                         lambda: chat_completion("Undo the stray keys.\n```python\npyautogui.hotkey('ctrl', 'z')\n```"),
                         lambda: chat_completion("DONE")),
}
PROVIDER_OF = {"anthropic": "anthropic", "openai": "openai-responses", "openai-compat": "openai-chat"}


def make_agent(server: LoopbackServer, provider: str, **options: Any) -> Any:
    base = server.openai_url if provider.startswith("openai") else server.url
    options = {"base_url": base, "api_key_env": "LOOPBACK_KEY", "transport": {**FAST, **options.pop("transport", {})},
               **options}
    if provider == "openai-compat":
        options.setdefault("model", "local-test")
    return create_agent(ModelConfig(f"test-{provider}", provider, options=options, path=REPO / "agents" / "x.yaml"))


def recover(env: XvfbEnvironment, agent: Any, budget: int = 3, strategy: str = "implicit") -> RecoveryResult:
    return run_case(env, CASE, agent, ReplayOptions(budget=budget, strategy=strategy))


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPBACK_KEY", "sk-loopback-test")


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_a_scripted_model_recovers_a_builtin_case_through_its_sdk(env: XvfbEnvironment, dialect: str) -> None:
    provider, options, undo, done = DIALECTS[dialect]
    with LoopbackServer(Script([Reply(undo()), Reply(done())])) as server:
        result = recover(env, make_agent(server, provider, **options))
    assert result.error is None, result.error
    assert result.verdict == "recovered" and (result.actions_used, result.invalid_steps) == (1, 0)
    assert [s.action for s in result.steps if s.stage == "recover"] == [
        {"action": "hotkey", "keys": ["ctrl", "z"]}, {"action": "done"}]
    assert result.usage.calls == 2 and result.usage.input_tokens == 200 and result.usage.output_tokens == 40
    assert [r.error for r in server.requests] == [None, None]  # the strict server accepted every request
    first = server.requests[0]
    assert first.provider == PROVIDER_OF[provider]
    assert CASE.task.instruction in str(first.body)  # implicit: the task itself, no recovery prompt
    assert "recovery agent" not in str(first.body)
    if provider == "anthropic" and options["tool_version"] != "computer_toolset_20260801":
        assert first.betas == [{"computer_20250124": "computer-use-2025-01-24",
                                "computer_20251124": "computer-use-2025-11-24"}[options["tool_version"]]]


@pytest.mark.parametrize(("dialect", "bad"), [
    ("claude-20251124", lambda: anthropic_message([claude_computer("teleport", coordinate=[1, 1])])),
    ("claude-toolset", lambda: anthropic_message([claude_toolset("left_click", coordinate=[5000, 10])])),
    ("openai-computer", lambda: openai_response([computer_call(actions=[{"type": "click", "button": "back",
                                                                         "x": 1, "y": 1}])])),
    ("ui-tars", lambda: chat_completion("Thought: hmm\nAction: teleport(to='moon')")),
    ("qwen", lambda: chat_completion('<tool_call>{"name": "computer_use", "arguments": {"action": "fly"}}</tool_call>')),
    ("evocua-pyautogui", lambda: chat_completion("Sure.\n```python\npyautogui.typewrite(open('/etc/passwd').read())\n```")),
])
def test_a_reply_that_does_not_parse_twice_is_an_invalid_step_that_uses_budget(
        env: XvfbEnvironment, dialect: str, bad: Any) -> None:
    provider, options, undo, done = DIALECTS[dialect]
    with LoopbackServer(Script([Reply(bad()), Reply(bad()), Reply(done())])) as server:
        result = recover(env, make_agent(server, provider, **options))
    assert result.error is None and result.verdict == "not_recovered"  # scored: the agent's own failure
    assert (result.invalid_steps, result.actions_used, result.usage.calls) == (1, 1, 3)
    assert [r.error for r in server.requests] == [None, None, None]
    assert "could not" in str(server.requests[1].body) or "invalid" in str(server.requests[1].body)  # the re-ask
    [invalid] = [s for s in result.steps if s.action == {"action": "invalid"}]
    assert invalid.error


@pytest.mark.parametrize("dialect", ["claude-20251124", "ui-tars"])
def test_one_re_ask_rescues_a_bad_reply(env: XvfbEnvironment, dialect: str) -> None:
    provider, options, undo, done = DIALECTS[dialect]
    bad = {"claude-20251124": lambda: anthropic_message([claude_computer("key")]),  # no text
           "ui-tars": lambda: chat_completion("I think I should undo.")}[dialect]  # no Action:
    with LoopbackServer(Script([Reply(bad()), Reply(undo()), Reply(done())])) as server:
        result = recover(env, make_agent(server, provider, **options))
    assert result.verdict == "recovered" and result.invalid_steps == 0 and result.usage.calls == 3


def test_the_sdks_own_base_url_variables_keep_working(env: XvfbEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config without base_url leaves the endpoint to the SDK: OPENAI_BASE_URL / ANTHROPIC_BASE_URL."""
    for dialect in ("openai-computer", "claude-20251124"):
        provider, options, undo, done = DIALECTS[dialect]
        with LoopbackServer(Script([Reply(undo()), Reply(done())])) as server:
            monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
            monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
            agent = create_agent(ModelConfig("m", provider, path=REPO / "agents" / "x.yaml",
                                             options={"api_key_env": "LOOPBACK_KEY", **options}))
            assert recover(env, agent).verdict == "recovered" and len(server.requests) == 2


def test_a_reply_that_tries_to_run_code_runs_nothing(env: XvfbEnvironment, tmp_path: Path) -> None:
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    evil = f"Let me fix it.\n```python\nimport os\nos.system('touch {marker}')\n```"
    with LoopbackServer(Script([Reply(chat_completion(evil))] * 2 + [Reply(chat_completion("DONE"))])) as server:
        result = recover(env, make_agent(server, "openai-compat", parser="pyautogui",
                                         prompts={"forward_system": "prompts/pyautogui-system.md"}))
    assert result.invalid_steps == 1 and "import os is not allowed" in next(s.error for s in result.steps if s.error)
    assert not marker.exists()
    env.run(f"test ! -e {marker}")


@pytest.mark.parametrize("dialect", ["claude-20251124", "openai-computer", "qwen"])
def test_429_with_retry_after_is_waited_out_and_counted(env: XvfbEnvironment, dialect: str) -> None:
    provider, options, undo, done = DIALECTS[dialect]
    script = Script([Reply.error(PROVIDER_OF[provider], 429, "slow down", headers={"retry-after": "1"}),
                     Reply(undo()), Reply(done())])
    with LoopbackServer(script) as server:
        result = recover(env, make_agent(server, provider, **options))
    assert result.verdict == "recovered" and result.usage.retries == 1 and result.usage.latency >= 1.0
    assert len(server.requests) == 3


@pytest.mark.parametrize(("replies", "transport", "kind", "message"), [
    ([Reply.error("anthropic", 500, "boom")] * 4, {"max_retries": 2}, "transport", "HTTP 500 after 3 attempt"),
    ([Reply.error("anthropic", 529, "overloaded")] * 2, {"max_retries": 1}, "transport", "HTTP 529"),
    ([Reply(anthropic_message([text_block("late")]), delay=3)] * 2, {"max_retries": 1, "timeout": 0.5},
     "transport", "APITimeoutError after 2 attempt"),
    ([Reply.error("anthropic", 401, "invalid x-api-key")], {}, "api", "HTTP 401"),
])
def test_transport_failures_after_retries_are_infrastructure_errors(
        env: XvfbEnvironment, replies: list[Reply], transport: dict[str, Any], kind: str, message: str) -> None:
    with LoopbackServer(Script(replies)) as server:
        result = recover(env, make_agent(server, "anthropic", transport=transport))
    assert result.verdict == "error" and result.error is not None
    assert (result.error.stage, result.error.kind) == ("agent", kind) and message in result.error.message


@pytest.mark.parametrize("policy", ["stop", "acknowledge"])
def test_pending_safety_checks_follow_the_configured_policy(env: XvfbEnvironment, policy: str) -> None:
    checked = openai_response([computer_call(actions=[{"type": "keypress", "keys": ["ctrl", "z"]}],
                                             pending_safety_checks=[{"code": "sensitive_domain"}])])
    with LoopbackServer(Script([Reply(checked), Reply(openai_response([message_item("Restored.")]))])) as server:
        result = recover(env, make_agent(server, "openai", safety_checks=policy))
    assert [r.error for r in server.requests if r.error] == []  # acknowledged exactly, or never answered
    if policy == "stop":
        assert result.verdict == "not_recovered" and result.actions_used == 0
        [stop] = [s for s in result.steps if s.stage == "recover"]
        assert stop.action == {"action": "fail"} and "pending safety check (policy stop)" in stop.rationale
    else:
        assert result.verdict == "recovered"
        acks = server.requests[1].body["input"][-1]["acknowledged_safety_checks"]
        assert [a["code"] for a in acks] == ["sensitive_domain"]


def test_past_screenshots_beyond_the_budget_become_placeholders_and_caching_marks_two_blocks(
        env: XvfbEnvironment) -> None:
    moves = [Reply(anthropic_message([claude_computer("mouse_move", coordinate=[600 + i, 500])])) for i in range(4)]
    with LoopbackServer(Script(moves + [Reply(anthropic_message([text_block("Done.")]))])) as server:
        result = recover(env, make_agent(server, "anthropic", max_screenshots=1), budget=5, strategy="explicit-0E")
    assert result.error is None and result.actions_used == 4
    history_images = sum(1 for step in CASE.prefix + CASE.perturbation)  # the 0-E history: one per step
    for request in server.requests:
        # kept: the target, the current screen and one past screenshot; the rest are placeholders
        assert len(request.images) == 3, request.images
        assert str(request.body).count("cache_control") == 2  # the system prompt and the newest block
    assert str(server.requests[-1].body).count("omitted to keep the conversation short") == history_images + 4 - 1


def test_a_click_lands_where_the_model_pointed_on_a_smaller_image(env: XvfbEnvironment) -> None:
    """The model sees 640x400 (half the 1280x800 screen) and clicks Mousepad's File menu there, at (9, 15):
    the pointer must land on the screen pixel under that point's centre, (19, 31), and open the menu."""
    click = anthropic_message([claude_computer("left_click", coordinate=[9, 15])])
    with LoopbackServer(Script([Reply(click), Reply(anthropic_message([text_block("Done.")]))])) as server:
        agent = make_agent(server, "anthropic", image={"max_long_edge": 640})
        result = run_case(env, CASE, agent, ReplayOptions(budget=2))
        assert server.requests[0].images[-1] == (640, 400)
        assert server.requests[0].body["tools"][0]["display_width_px"] == 640
    assert [s.action for s in result.steps if s.stage == "recover"][0] == {"action": "click", "x": 19, "y": 31}
    error = load_png(CASE.error_png)
    menu = np.any(result.recovered_screenshot[40:200, 0:150] != error[40:200, 0:150], axis=2).sum()
    assert menu > 2000, "the File menu did not open"


@pytest.mark.parametrize("verdict", ["same", "different"])
def test_the_state_verifier_accepts_a_state_that_is_not_pixel_identical_only_when_it_says_same(
        env: XvfbEnvironment, tmp_path: Path, verdict: str) -> None:
    """--retrace-verifier: for environments that cannot reproduce a screen exactly. Here the recorded target
    is made to differ by a few pixels (a clock, say): the verifier decides, and the record says so."""
    import shutil

    from PIL import Image

    from pytest_retrace.agents import create_chat
    from pytest_retrace.agents.baselines import NoopAgent
    from pytest_retrace.agents.prompts import Prompts
    from pytest_retrace.replay.verifier import StateVerifier

    src = REPO / "tests" / "data" / "v1-cases" / "text-editor"
    shutil.copy(src / f"{CASE.id}.yaml", tmp_path)
    shutil.copytree(src / CASE.id, tmp_path / CASE.id)
    target = np.array(Image.open(tmp_path / CASE.id / "target.png").convert("RGB"))
    target[790:800, 1200:1280] = 255 - target[790:800, 1200:1280]  # a "clock" that changed
    Image.fromarray(target).save(tmp_path / CASE.id / "target.png")
    case = load_case(tmp_path / f"{CASE.id}.yaml")
    answer = openai_response([message_item(f"Only the corner differs.\nVerdict: {verdict}")])
    with LoopbackServer(lambda request: Reply(answer)) as server:
        chat = create_chat(ModelConfig("verifier", "openai", path=REPO / "agents" / "x.yaml", options={
            "model": "gpt-5-mini", "base_url": server.openai_url, "api_key_env": "LOOPBACK_KEY"}))
        opts = ReplayOptions(budget=1, attempts=2, verifier=StateVerifier(chat, Prompts(REPO / "agents")))
        result = run_case(env, case, NoopAgent(), opts)
        assert all(r.images == [(1280, 800), (1280, 800)] for r in server.requests)
    if verdict == "same":
        assert result.error is None and result.reconstruction["target"].startswith("verifier (800 px differ)")
        assert result.reconstruction["error"] == "pixels" and result.context_usage.calls == 1
    else:
        assert result.error is not None and result.error.kind == "desync"
        assert "the verifier says different" in result.error.message and len(server.requests) == 2
