"""Every action of every Claude computer-use version and of OpenAI's computer tool maps to the project's
Action, in screen coordinates (here the model sees the 1280x800 screen at 640x400, so every point doubles);
a malformed one is the model's mistake (ActionError), and a reply of random garbage never raises anything
else."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_retrace.actions import Action, ActionError
from pytest_retrace.agents import AgentContext, ModelConfig, create_agent
from tests.helpers import REPO


@pytest.fixture(scope="module")
def claude() -> Any:
    return started("anthropic")


@pytest.fixture(scope="module")
def gpt() -> Any:
    return started("openai")


def started(provider: str) -> Any:
    agent = create_agent(ModelConfig("m", provider, path=REPO / "agents" / "x.yaml", options={
        "api_key_env": "PATH", "base_url": "http://127.0.0.1:9", "image": {"max_long_edge": 640}}))
    agent.start(AgentContext("task", "forward", "implicit", 10, (1280, 800)))
    return agent


CLAUDE: list[tuple[str, dict[str, Any], Action | tuple]] = [
    ("left_click", {"coordinate": [10, 20]}, Action("click", 21, 41)),
    ("left_click", {}, Action("click")),
    ("left_click", {"coordinate": [10, 20], "text": "shift"}, Action("click", 21, 41, hold=("shift",))),
    ("right_click", {"coordinate": [10, 20]}, Action("click", 21, 41, button="right")),
    ("middle_click", {"coordinate": [10, 20]}, Action("click", 21, 41, button="middle")),
    ("double_click", {"coordinate": [10, 20], "text": "ctrl+shift"},
     Action("click", 21, 41, clicks=2, hold=("ctrl", "shift"))),
    ("triple_click", {"coordinate": [10, 20]}, Action("click", 21, 41, clicks=3)),
    ("mouse_move", {"coordinate": [639, 399]}, Action("move", 1279, 799)),
    ("left_click_drag", {"start_coordinate": [1, 2], "coordinate": [30, 40]}, Action("drag", 3, 5, 61, 81)),
    ("left_click_drag", {"coordinate": [30, 40]}, Action("drag", x2=61, y2=81)),
    ("left_mouse_down", {}, Action("mouse_down")),
    ("left_mouse_up", {"coordinate": [5, 5]}, Action("mouse_up", 11, 11)),
    ("scroll", {"coordinate": [10, 20], "scroll_direction": "down", "scroll_amount": 3}, Action("scroll", 21, 41, dy=-3)),
    ("scroll", {"scroll_direction": "left", "scroll_amount": 2, "text": "shift"}, Action("scroll", dx=-2, hold=("shift",))),
    ("type", {"text": "héllo\n"}, Action("type", text="héllo\n")),
    ("key", {"text": "ctrl+s"}, Action("hotkey", keys=("ctrl", "s"))),
    ("key", {"text": "Return"}, Action("key", keys=("enter",))),
    ("key", {"text": "ctrl+shift+Escape"}, Action("hotkey", keys=("ctrl", "shift", "esc"))),
    ("key", {"text": "Down Down Tab"}, Action("key", keys=("down", "down", "tab"))),
    ("key", {"text": "BackSpace", "repeat": 5}, Action("key", keys=("backspace",), presses=5)),
    ("key", {"text": "Page_Down"}, Action("key", keys=("pagedown",))),
    ("hold_key", {"text": "shift", "duration": 2}, Action("hotkey", keys=("shift",), seconds=2.0)),
    ("wait", {"duration": 1}, Action("wait", seconds=1.0)),
    ("screenshot", {}, ("screenshot", None)),
    ("cursor_position", {}, ("cursor", None)),
    ("zoom", {"region": [0, 0, 320, 200]}, ("zoom", ((1, 1), (641, 401)))),
]


@pytest.mark.parametrize(("name", "data", "expected"), CLAUDE, ids=[f"{c[0]}-{i}" for i, c in enumerate(CLAUDE)])
def test_every_claude_action_maps_to_an_action(claude: Any, name: str, data: dict, expected: Any) -> None:
    assert claude._map(name, dict(data)) == expected


@pytest.mark.parametrize(("name", "data", "fragment"), [
    ("left_click", {"coordinate": [640, 10]}, "outside the 640x400 screenshot"),
    ("left_click", {"coordinate": [1]}, "must be [x, y]"),
    ("mouse_move", {}, "needs a coordinate"),
    ("scroll", {"scroll_direction": "sideways", "scroll_amount": 1}, "scroll_direction"),
    ("scroll", {"scroll_direction": "up", "scroll_amount": 0}, "positive integer"),
    ("scroll", {"scroll_direction": "up", "scroll_amount": 100000}, "-100..100"),
    ("key", {"text": "ctrl+a Delete"}, "several chords"),
    ("key", {"text": "hyper+q"}, "unknown key"),
    ("type", {"text": 5}, "must be a string"),
    ("wait", {"duration": 600}, "0..60"),
    ("hold_key", {"text": "a", "duration": -1}, "non-negative"),
    ("zoom", {"region": [10, 10, 5, 5]}, "is empty"),
    ("teleport", {}, "unknown action"),
])
def test_a_malformed_claude_action_is_the_models_mistake(claude: Any, name: str, data: dict, fragment: str) -> None:
    with pytest.raises(ActionError, match=fragment.replace("[", r"\[").replace("(", r"\(")):
        claude._map(name, data)


OPENAI: list[tuple[dict[str, Any], Action | None]] = [
    ({"type": "click", "button": "left", "x": 10, "y": 20}, Action("click", 21, 41)),
    ({"type": "click", "button": "right", "x": 10, "y": 20, "keys": ["SHIFT"]},
     Action("click", 21, 41, button="right", hold=("shift",))),
    ({"type": "click", "button": "wheel", "x": 10, "y": 20}, Action("click", 21, 41, button="middle")),
    ({"type": "double_click", "x": 10, "y": 20}, Action("click", 21, 41, clicks=2)),
    ({"type": "move", "x": 10, "y": 20}, Action("move", 21, 41)),
    ({"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 5, "y": 5}, {"x": 30, "y": 40}]}, Action("drag", 3, 5, 61, 81)),
    ({"type": "scroll", "x": 10, "y": 20, "scroll_x": 0, "scroll_y": 300}, Action("scroll", 21, 41, dy=-3)),
    ({"type": "scroll", "x": 10, "y": 20, "scroll_x": -40, "scroll_y": 0}, Action("scroll", 21, 41, dx=-1)),
    ({"type": "type", "text": "abc"}, Action("type", text="abc")),
    ({"type": "keypress", "keys": ["CTRL", "SHIFT", "T"]}, Action("hotkey", keys=("ctrl", "shift", "t"))),
    ({"type": "keypress", "keys": ["ENTER"]}, Action("key", keys=("enter",))),
    ({"type": "keypress", "keys": ["ArrowUp"]}, Action("key", keys=("up",))),
    ({"type": "wait"}, Action("wait", seconds=1.0)),
    ({"type": "screenshot"}, None),
]


@pytest.mark.parametrize(("data", "expected"), OPENAI, ids=[f"{c[0]['type']}-{i}" for i, c in enumerate(OPENAI)])
def test_every_openai_action_maps_to_an_action(gpt: Any, data: dict, expected: Action | None) -> None:
    assert gpt._map(dict(data)) == expected


@pytest.mark.parametrize(("data", "fragment"), [
    ({"type": "click", "button": "back", "x": 1, "y": 1}, "not on this desktop's mouse"),
    ({"type": "click", "button": "left", "x": 700, "y": 1}, "outside"),
    ({"type": "drag", "path": [{"x": 1, "y": 1}]}, "at least 2 points"),
    ({"type": "scroll", "x": 1, "y": 1, "scroll_x": 0, "scroll_y": 0}, "0 pixels"),
    ({"type": "keypress", "keys": []}, "list of keys"),
    ({"type": "fly"}, "unknown action type"),
    ("click", "must be an object"),
])
def test_a_malformed_openai_action_is_the_models_mistake(gpt: Any, data: Any, fragment: str) -> None:
    with pytest.raises(ActionError, match=fragment):
        gpt._map(data)


junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                      max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from([c[0] for c in CLAUDE] + ["junk"]), data=st.dictionaries(
    st.sampled_from(["coordinate", "start_coordinate", "text", "scroll_direction", "scroll_amount", "duration",
                     "region", "repeat", "action"]), junk, max_size=5))
@example(name="scroll", data={"scroll_direction": [], "scroll_amount": 1})  # a list is no direction (found so)
def test_any_claude_reply_becomes_a_turn_or_an_invalid_reply(claude: Any, name: str, data: dict) -> None:
    use = SimpleNamespace(type="tool_use", id="toolu_1", name=name, input=data, toolset_name="computer")
    reply = SimpleNamespace(content=[use], stop_reason="tool_use")
    try:
        turn = claude._read(reply)  # not _read_reply, whose catch-all would hide a crash
    except ActionError:
        return
    assert all(isinstance(a, Action) for a in turn.actions)


@settings(max_examples=300, deadline=None)
@given(actions=st.lists(st.dictionaries(st.sampled_from(["type", "x", "y", "button", "keys", "path", "text",
                                                         "scroll_x", "scroll_y"]), junk, max_size=5), max_size=3))
@example(actions=[{"type": "click", "x": 1, "y": 1, "button": []}])
def test_any_openai_reply_becomes_a_turn_or_an_invalid_reply(gpt: Any, actions: list) -> None:
    call = SimpleNamespace(type="computer_call", model_dump=lambda **_: {"call_id": "c1", "actions": actions})
    reply = SimpleNamespace(output=[call])
    try:
        turn = gpt._read(reply)  # not _read_reply, whose catch-all would hide a crash
    except ActionError:
        return
    assert all(isinstance(a, Action) for a in turn.actions)
    assert np.all([a.x is None or 0 <= a.x < 1280 for a in turn.actions])
