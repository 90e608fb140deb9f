"""Tests for the parsers of open computer-use models' replies: UI-TARS, Qwen-VL computer_use, and
EvoCUA / OSWorld-style prose with fenced pyautogui code.  Model output is untrusted: every parser must
return Actions within the caps or raise ActionError, and must never execute anything."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_retrace.actions import Action, ActionError, ParsedReply
from pytest_retrace.actions.limits import (
    MAX_HOLD,
    MAX_KEYS,
    MAX_NUMBER,
    MAX_PRESSES,
    MAX_REPLY_CHARS,
    MAX_SCROLL,
    MAX_TEXT_CHARS,
    MAX_TURN_ACTIONS,
    MAX_WAIT,
)
from pytest_retrace.actions.pyautogui import MAX_CODE_CHARS, parse_pyautogui
from pytest_retrace.actions.pyautogui_reply import parse_pyautogui_reply
from pytest_retrace.actions.qwen import MAX_TOOL_CALL_CHARS, parse_qwen
from pytest_retrace.actions.uitars import parse_uitars

# --- UI-TARS: accepted forms -------------------------------------------------------------------------

UITARS_ACCEPTED: list[tuple[str, list[Action]]] = [
    # clicks and every box spelling
    ("Action: click(start_box='(100,200)')", [Action("click", 100, 200)]),
    ("Action: click(start_box=\"(100,200)\")", [Action("click", 100, 200)]),
    ("Action: click(start_box='<|box_start|>(100,200)<|box_end|>')", [Action("click", 100, 200)]),
    ("Action: click(start_box='( 100 , 200 )')", [Action("click", 100, 200)]),
    ("Action: click(start_box='(100.4,199.6)')", [Action("click", 100, 200)]),
    ("Action: click(start_box='(100,200,300,402)')", [Action("click", 200, 301)]),
    ("Action: click(start_box='<|box_start|>(10,20,30,40)<|box_end|>')", [Action("click", 20, 30)]),
    ("Action: click(start_box='<|box_start|> (7, 8) <|box_end|>')", [Action("click", 7, 8)]),
    ("Action: click(point='<point>100 200</point>')", [Action("click", 100, 200)]),
    ("Action: click(start_point='<point>100 200</point>')", [Action("click", 100, 200)]),
    ("Action: click(point='<point>12.5 7.4</point>')", [Action("click", 12, 7)]),
    ("Action: click(start_box='[100, 200]')", [Action("click", 100, 200)]),
    ("Action: click(start_box='[1,2,3,4]')", [Action("click", 2, 3)]),
    ("Action: click(start_box='100,200')", [Action("click", 100, 200)]),
    ("Action: click(start_box='(0,0)')", [Action("click", 0, 0)]),
    ("Action: click(start_box='(+5,6)')", [Action("click", 5, 6)]),
    ("Action: click( start_box = '(1,2)' )", [Action("click", 1, 2)]),
    ("Action: left_single(start_box='(1,2)')", [Action("click", 1, 2)]),
    ("Action: left_double(start_box='(1,2)')", [Action("click", 1, 2, clicks=2)]),
    ("Action: right_single(start_box='(1,2)')", [Action("click", 1, 2, button="right")]),
    ("Action: right_single(point='<point>3 4</point>')", [Action("click", 3, 4, button="right")]),
    # drag
    ("Action: drag(start_box='(1,2)', end_box='(3,4)')", [Action("drag", 1, 2, 3, 4)]),
    ("Action: drag(start_box='(0,0,2,2)', end_box='(10,10,12,12)')", [Action("drag", 1, 1, 11, 11)]),
    ("Action: drag(start_point='<point>1 2</point>', end_point='<point>3 4</point>')", [Action("drag", 1, 2, 3, 4)]),
    ("Action: drag(end_box='(3,4)', start_box='(1,2)')", [Action("drag", 1, 2, 3, 4)]),
    # keys
    ("Action: hotkey(key='ctrl c')", [Action("hotkey", keys=("ctrl", "c"))]),
    ("Action: hotkey(key='ctrl shift t')", [Action("hotkey", keys=("ctrl", "shift", "t"))]),
    ("Action: hotkey(key='Ctrl  Z')", [Action("hotkey", keys=("ctrl", "Z"))]),
    ("Action: hotkey(key='enter')", [Action("key", keys=("enter",))]),
    ("Action: hotkey(key='arrowdown')", [Action("key", keys=("down",))]),
    ("Action: hotkey(key='ctrl pagedown')", [Action("hotkey", keys=("ctrl", "pagedown"))]),
    ("Action: press(key='enter')", [Action("key", keys=("enter",))]),
    ("Action: press(key='esc')", [Action("key", keys=("esc",))]),
    ("Action: press(key='arrowup')", [Action("key", keys=("up",))]),
    ("Action: press(key='space')", [Action("key", keys=("space",))]),
    ("Action: press(key='Return')", [Action("key", keys=("enter",))]),
    ("Action: keydown(key='shift')", [Action("key_down", keys=("shift",))]),
    ("Action: keyup(key='shift')", [Action("key_up", keys=("shift",))]),
    # typing: Python string escapes, a trailing \n is kept (Return)
    ("Action: type(content='hello')", [Action("type", text="hello")]),
    ("Action: type(content='')", [Action("type", text="")]),
    ("Action: type(content='it\\'s')", [Action("type", text="it's")]),
    ("Action: type(content='say \\\"hi\\\"')", [Action("type", text='say "hi"')]),
    ("Action: type(content=\"it's\")", [Action("type", text="it's")]),
    ("Action: type(content='line1\\nline2\\n')", [Action("type", text="line1\nline2\n")]),
    ("Action: type(content='C:\\\\temp')", [Action("type", text="C:\\temp")]),
    ("Action: type(content='\\d+')", [Action("type", text="\\d+")]),
    ("Action: type(content='Grüße 中文 🙂')", [Action("type", text="Grüße 中文 🙂")]),
    ("Action: type(content='tab\\there')", [Action("type", text="tab\there")]),
    ("Action: type(content='a' 'b')", [Action("type", text="ab")]),
    # scrolling: down is negative dy, right positive dx, default 5 clicks
    ("Action: scroll(start_box='(1,2)', direction='down')", [Action("scroll", 1, 2, dy=-5)]),
    ("Action: scroll(start_box='(1,2)', direction='up')", [Action("scroll", 1, 2, dy=5)]),
    ("Action: scroll(start_box='(1,2)', direction='right')", [Action("scroll", 1, 2, dx=5)]),
    ("Action: scroll(start_box='(1,2)', direction='left')", [Action("scroll", 1, 2, dx=-5)]),
    ("Action: scroll(direction='down')", [Action("scroll", dy=-5)]),
    ("Action: scroll(direction='Up')", [Action("scroll", dy=5)]),
    ("Action: scroll(point='<point>5 6</point>', direction='down')", [Action("scroll", 5, 6, dy=-5)]),
    # ending and waiting
    ("Action: wait()", [Action("wait", seconds=5.0)]),
    ("Action: finished()", [Action("done")]),
    ("Action: finished(content='all saved')", [Action("done")]),
    ("Action: call_user()", [Action("fail")]),
    # sections and several calls
    ("Thought: undo it.\nAction: hotkey(key='ctrl z')", [Action("hotkey", keys=("ctrl", "z"))]),
    ("Action:click(start_box='(1,2)')", [Action("click", 1, 2)]),
    ("  Action : click(start_box='(1,2)')  ", [Action("click", 1, 2)]),
    (
        "Thought: fill the form\nAction: click(start_box='(1,2)')\n\ntype(content='x\\n')\n  press(key='tab')\n",
        [Action("click", 1, 2), Action("type", text="x\n"), Action("key", keys=("tab",))],
    ),
    ("Action:\nclick(start_box='(1,2)')\nwait()", [Action("click", 1, 2), Action("wait", seconds=5.0)]),
]


@pytest.mark.parametrize(("text", "expected"), UITARS_ACCEPTED, ids=[t[:70] for t, _ in UITARS_ACCEPTED])
def test_uitars_accepted(text: str, expected: list[Action]) -> None:
    reply = parse_uitars(text)
    assert isinstance(reply, ParsedReply)
    assert reply.actions == expected


def test_uitars_scroll_clicks_and_wait_seconds_are_options() -> None:
    text = "Action: scroll(direction='down')\nscroll(direction='left')\nwait()"
    assert parse_uitars(text, scroll_clicks=3, wait_seconds=1.5).actions == [
        Action("scroll", dy=-3), Action("scroll", dx=-3), Action("wait", seconds=1.5)
    ]


@pytest.mark.parametrize(
    ("text", "rationale"),
    [
        ("Thought: I should undo the last change.\nAction: hotkey(key='ctrl z')", "I should undo the last change."),
        ("Thought: first line\nsecond line\n\nthird\nAction: wait()", "first line\nsecond line\n\nthird"),
        ("Action: wait()", ""),
        (
            "Reflection: the click missed.\nAction_Summary: retry lower.\nThought: try again\nAction: wait()",
            "Reflection: the click missed.\nAction_Summary: retry lower.\nThought: try again",
        ),
        ("Thought: done.\nAction: finished(content='The file is saved.')", "done.\n\nThe file is saved."),
        ("Action: finished(content='only this')", "only this"),
        ("Thought: the word Action: appears mid-line\nAction: wait()", "the word Action: appears mid-line"),
    ],
)
def test_uitars_rationale(text: str, rationale: str) -> None:
    assert parse_uitars(text).rationale == rationale


# --- UI-TARS: rejected forms -------------------------------------------------------------------------

UITARS_REJECTED: list[tuple[Any, str]] = [
    ("", "no Action:"),
    ("Thought: just thinking", "no Action:"),
    ("click(start_box='(1,2)')", "no Action:"),
    ("action: click(start_box='(1,2)')", "no Action:"),
    ("Action:", "line 1: the Action: section holds no call"),
    ("Thought: x\nAction:   \n\n", "line 2: the Action: section holds no call"),
    ("Action: foo(start_box='(1,2)')", "unknown action function 'foo'"),
    ("Action: hover(start_box='(1,2)')", "unknown action function 'hover'"),
    ("Action: os.system('ls')", "call of os.system is not allowed"),
    ("Action: __import__('os').system('ls')", "call of __import__('os').system is not allowed"),
    ("Action: click('(1,2)')", "positional arguments are not allowed"),
    ("Action: click(*a)", "positional arguments are not allowed"),
    ("Action: click(**{'start_box': '(1,2)'})", "**kwargs are not allowed"),
    ("Action: click(start_box=(1,2))", "argument 'start_box' must be a string literal"),
    ("Action: click(start_box=x)", "the name 'x'"),
    ("Action: type(content=f'{x}')", "f-string"),
    ("Action: type(content=b'x')", "a constant of type bytes"),
    ("Action: type(content=1)", "a constant of type int"),
    ("Action: type(content='\\ud800')", "lone surrogate"),
    ("Action: type(content='a' + 'b')", "an arithmetic expression"),
    ("Action: click(start_box='(1,2)'); wait()", "syntax error"),
    ("Action: click(start_box='(1,2)'", "syntax error"),
    ("Action: type(content='it's')", "syntax error"),
    ("Action: click", "expected a call"),
    ("Action: 42", "expected a call"),
    ("Action: click(start_box='(1,2)')(1)", "is not allowed"),
    ("Action: click(start_box='(1,2)', foo='x')", "unknown argument(s) 'foo'"),
    ("Action: wait(seconds='3')", "unknown argument(s) 'seconds' (allowed: none)"),
    ("Action: click()", "missing argument 'start_box' / 'point' / 'start_point'"),
    ("Action: drag(start_box='(1,2)')", "missing argument 'end_box' / 'end_point'"),
    ("Action: click(start_box='(1,2)', point='(1,2)')", "give only one of start_box, point"),
    ("Action: click(start_box='(-1,2)')", "non-negative"),
    ("Action: click(start_box='(1,-0.2)')", "non-negative"),
    ("Action: click(start_box='(1,2,3)')", "2 numbers (a point) or 4 (a box)"),
    ("Action: click(start_box='(1)')", "2 numbers (a point) or 4 (a box)"),
    ("Action: click(start_box='()')", "2 numbers (a point) or 4 (a box)"),
    ("Action: click(start_box='(a,b)')", "'a' is not a number"),
    ("Action: click(start_box='(nan,1)')", "'nan' is not a number"),
    ("Action: click(start_box='(inf,1)')", "'inf' is not a number"),
    ("Action: click(start_box='(1e5,1)')", "'1e5' is not a number"),
    ("Action: click(start_box='(0x10,1)')", "not a number"),
    ("Action: click(start_box='(" + "9" * 150 + ",1)')", "not a finite number up to"),
    ("Action: click(start_box='(1,2)" + " " * 300 + "')", "too long"),
    ("Action: click(start_box='somewhere')", "must be a point like '(x,y)'"),
    ("Action: click(start_box='')", "must be a point like '(x,y)'"),
    ("Action: click(start_box='((1,2))')", "not a number"),
    ("Action: hotkey(key='ctrl nosuchkey')", "unknown key 'nosuchkey'"),
    ("Action: hotkey(key='ctrl+c')", "unknown key 'ctrl+c'"),
    ("Action: hotkey(key='  ')", "names no key"),
    ("Action: hotkey(key=" + repr(" ".join(["a"] * 17)) + ")", "at most 16 keys"),
    ("Action: press(key='ctrl c')", "must name one key"),
    ("Action: keydown(key='')", "names no key"),
    ("Action: scroll(start_box='(1,2)', direction='sideways')", "direction must be one of down, up, right, left"),
    ("Action: scroll(start_box='(1,2)')", "missing argument 'direction'"),
    ("Action: type(content='" + "a" * (MAX_TEXT_CHARS + 1) + "')", "at most 2000 characters"),
    ("Action: type(content='\\x1b')", "control character '\\x1b'"),
    ("Action: type(content='" + "a" * 6000 + "')", "the call is too long"),
    ("Action: click(start_box='(1,2)')\x00", "null bytes"),
    ("Action: " + "(" * 300 + ")" * 300, "syntax error"),
    ("Action: " + "a." * 3000 + "b()", "the call is too long"),
    ("Action: " + "a." * 500 + "b()", "a long attribute expression"),
    ("Action: 0x" + "f" * 4000 + "()", "a constant expression holding a huge number"),
    ("Action: (0x" + "f" * 4000 + ").x()", "expression holding a huge number"),
    ("Action: " + "\n".join(["wait()"] * (MAX_TURN_ACTIONS + 1)), "too many actions"),
    ("x" * (MAX_REPLY_CHARS + 1), "the reply is too long"),
    (b"Action: wait()", "must be a string"),
    (None, "must be a string"),
]


@pytest.mark.parametrize(("text", "fragment"), UITARS_REJECTED, ids=[str(t)[:70] for t, _ in UITARS_REJECTED])
def test_uitars_rejected(text: Any, fragment: str) -> None:
    with pytest.raises(ActionError) as info:
        parse_uitars(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("Action: foo()", 1),
        ("Thought: a\nb\nAction: click(start_box='(1,2)')\n\nfoo()", 5),
        ("Thought: a\nAction: wait()\nThought: more", 3),
        ("Thought: a\n\nAction:\n\nwait()\nclick(start_box='(-1,2)')", 6),
    ],
)
def test_uitars_error_names_the_line_of_the_reply(text: str, line: int) -> None:
    with pytest.raises(ActionError, match=rf"^line {line}: "):
        parse_uitars(text)


def test_uitars_bad_options_are_action_errors() -> None:
    with pytest.raises(ActionError, match="scroll: dy must be an integer"):
        parse_uitars("Action: scroll(direction='down')", scroll_clicks=1000)
    with pytest.raises(ActionError, match="wait: seconds must be in 0..60"):
        parse_uitars("Action: wait()", wait_seconds=100)


# --- Qwen computer_use: accepted forms ---------------------------------------------------------------


def _qwen_block(arguments: dict[str, Any], name: str = "computer_use") -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


QWEN_ACCEPTED: list[tuple[dict[str, Any], Action]] = [
    ({"action": "key", "keys": ["Return"]}, Action("key", keys=("enter",))),
    ({"action": "key", "keys": ["esc"]}, Action("key", keys=("esc",))),
    ({"action": "key", "keys": ["ctrl", "c"]}, Action("hotkey", keys=("ctrl", "c"))),
    ({"action": "key", "keys": ["ctrl", "shift", "t"]}, Action("hotkey", keys=("ctrl", "shift", "t"))),
    ({"action": "type", "text": "hello"}, Action("type", text="hello")),
    ({"action": "type", "text": "two\nlines\n"}, Action("type", text="two\nlines\n")),
    ({"action": "type", "text": "Grüße 中文 \"q\" \\"}, Action("type", text="Grüße 中文 \"q\" \\")),
    ({"action": "type", "text": ""}, Action("type", text="")),
    ({"action": "mouse_move", "coordinate": [10, 20]}, Action("move", 10, 20)),
    ({"action": "left_click", "coordinate": [10, 20]}, Action("click", 10, 20)),
    ({"action": "left_click", "coordinate": [10.4, 19.6]}, Action("click", 10, 20)),
    ({"action": "left_click", "coordinate": [0, 0]}, Action("click", 0, 0)),
    ({"action": "left_click"}, Action("click")),
    ({"action": "right_click", "coordinate": [1, 2]}, Action("click", 1, 2, button="right")),
    ({"action": "right_click"}, Action("click", button="right")),
    ({"action": "middle_click", "coordinate": [1, 2]}, Action("click", 1, 2, button="middle")),
    ({"action": "double_click", "coordinate": [1, 2]}, Action("click", 1, 2, clicks=2)),
    ({"action": "double_click"}, Action("click", clicks=2)),
    ({"action": "triple_click", "coordinate": [1, 2]}, Action("click", 1, 2, clicks=3)),
    ({"action": "left_click_drag", "coordinate": [5, 6]}, Action("drag", x2=5, y2=6)),
    ({"action": "scroll", "pixels": 5}, Action("scroll", dy=5)),
    ({"action": "scroll", "pixels": -3, "coordinate": [100, 200]}, Action("scroll", 100, 200, dy=-3)),
    ({"action": "scroll", "pixels": 2.6}, Action("scroll", dy=3)),
    ({"action": "hscroll", "pixels": 4}, Action("scroll", dx=4)),
    ({"action": "hscroll", "pixels": -4, "coordinate": [1, 2]}, Action("scroll", 1, 2, dx=-4)),
    ({"action": "wait", "time": 2}, Action("wait", seconds=2.0)),
    ({"action": "wait", "time": 0.5}, Action("wait", seconds=0.5)),
    ({"action": "terminate", "status": "success"}, Action("done")),
    ({"action": "terminate", "status": "failure"}, Action("fail")),
    ({"action": "answer", "text": "42"}, Action("done")),
]


@pytest.mark.parametrize(("arguments", "expected"), QWEN_ACCEPTED, ids=[json.dumps(a) for a, _ in QWEN_ACCEPTED])
def test_qwen_accepted_in_text(arguments: dict[str, Any], expected: Action) -> None:
    reply = parse_qwen("Doing it.\n" + _qwen_block(arguments))
    assert reply == ParsedReply("Doing it." + ("\n\n42" if arguments["action"] == "answer" else ""), [expected])


@pytest.mark.parametrize(("arguments", "expected"), QWEN_ACCEPTED, ids=[json.dumps(a) for a, _ in QWEN_ACCEPTED])
def test_qwen_accepted_as_native_tool_calls(arguments: dict[str, Any], expected: Action) -> None:
    as_string = [{"name": "computer_use", "arguments": json.dumps(arguments)}]
    as_dict = [{"name": "computer_use", "arguments": arguments}]
    openai = [{"id": "call_1", "type": "function", "function": {"name": "computer_use", "arguments": json.dumps(arguments)}}]
    for calls in (as_string, as_dict, openai):
        assert parse_qwen("", calls).actions == [expected]


def test_qwen_several_blocks_in_order_and_rationale() -> None:
    text = (
        "<think>\nThe menu is at the top.\n</think>\n\nOpen the menu, then save.\n"
        + _qwen_block({"action": "left_click", "coordinate": [34, 12]})
        + "\n"
        + _qwen_block({"action": "key", "keys": ["ctrl", "s"]})
    )
    reply = parse_qwen(text)
    assert reply.actions == [Action("click", 34, 12), Action("hotkey", keys=("ctrl", "s"))]
    assert reply.rationale == "The menu is at the top.\n\nOpen the menu, then save."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click"}}</tool_call>', [Action("click")]),
        ('<tool_call>  \n {"name":"computer_use","arguments":{"action":"wait","time":1}} \n</tool_call>',
         [Action("wait", seconds=1.0)]),
        # arguments as a JSON string inside the block
        ('<tool_call>{"name": "computer_use", "arguments": "{\\"action\\": \\"left_click\\"}"}</tool_call>',
         [Action("click")]),
        # an unclosed last block (the server cut the reply at the closing tag)
        ('go\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "double_click"}}', [Action("click", clicks=2)]),
        # a raw newline inside a JSON string is kept
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "type", "text": "a\nb"}}</tool_call>',
         [Action("type", text="a\nb")]),
    ],
)
def test_qwen_block_spellings(text: str, expected: list[Action]) -> None:
    assert parse_qwen(text).actions == expected


def test_qwen_no_tool_call_is_no_action() -> None:
    assert parse_qwen("  The task is complete.  ") == ParsedReply("The task is complete.", [])
    assert parse_qwen("") == ParsedReply("", [])
    assert parse_qwen("thinking", []) == ParsedReply("thinking", [])


def test_qwen_native_tool_calls_win_over_blocks() -> None:
    text = "Click it.\n" + _qwen_block({"action": "right_click"})
    calls = [{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1, 2]}}]
    assert parse_qwen(text, calls) == ParsedReply("Click it.", [Action("click", 1, 2)])
    assert parse_qwen(text, []).actions == [Action("click", button="right")]  # empty list: read the text


def test_qwen_pixels_per_click() -> None:
    calls = [
        {"name": "computer_use", "arguments": {"action": "scroll", "pixels": -300}},
        {"name": "computer_use", "arguments": {"action": "hscroll", "pixels": 180}},
    ]
    assert parse_qwen("", calls, pixels_per_click=100).actions == [Action("scroll", dy=-3), Action("scroll", dx=2)]


# --- Qwen computer_use: rejected forms ---------------------------------------------------------------


def _call(arguments: Any, name: Any = "computer_use") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


QWEN_REJECTED: list[tuple[str, str]] = [
    (_call({"action": "left_click"}, name="os_system"), "unknown tool 'os_system'"),
    ('<tool_call>{"arguments": {"action": "left_click"}}</tool_call>', "unknown tool None"),
    ("<tool_call>not json</tool_call>", "not valid JSON"),
    ("<tool_call></tool_call>", "not valid JSON"),
    ("<tool_call>{'name': 'computer_use'}</tool_call>", "not valid JSON"),
    ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click"}} extra</tool_call>', "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "a tool call must be a JSON object"),
    ('<tool_call>"computer_use"</tool_call>', "a tool call must be a JSON object"),
    ('<tool_call>{"name": "computer_use", "arguments": {}, "id": 3}</tool_call>', "unknown tool call field(s) 'id'"),
    (_call([1, 2]), "arguments must be a JSON object"),
    (_call("not json"), "the arguments is not valid JSON"),
    (_call({}), "unknown action None"),
    (_call({"action": "fly"}), "unknown action 'fly'"),
    (_call({"action": 5}), "unknown action 5"),
    (_call({"action": "left_click", "reason": "why"}), "left_click: unknown argument(s) 'reason'"),
    (_call({"action": "key", "keys": ["a"], "text": "x"}), "unknown argument(s) 'text' (allowed: keys)"),
    (_call({"action": "left_click", "coordinate": "[1, 2]"}), "coordinate must be a list [x, y]"),
    (_call({"action": "left_click", "coordinate": [1]}), "coordinate must be a list [x, y]"),
    (_call({"action": "left_click", "coordinate": [1, 2, 3]}), "coordinate must be a list [x, y]"),
    (_call({"action": "left_click", "coordinate": {"x": 1, "y": 2}}), "coordinate must be a list [x, y]"),
    (_call({"action": "left_click", "coordinate": [True, 2]}), "coordinate must be a number, got True"),
    (_call({"action": "left_click", "coordinate": ["1", 2]}), "coordinate must be a number, got '1'"),
    (_call({"action": "left_click", "coordinate": [None, 2]}), "coordinate must be a number"),
    (_call({"action": "left_click", "coordinate": [-1, 2]}), "coordinate must be non-negative"),
    (_call({"action": "left_click", "coordinate": [1, -0.6]}), "coordinate must be non-negative"),
    (_call({"action": "left_click", "coordinate": [10**30, 2]}), "coordinate is too large"),
    (_call({"action": "left_click", "coordinate": [1e300, 2]}), "finite number up to"),
    ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1e400, 2]}}</tool_call>',
     "finite number up to"),
    ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [NaN, 2]}}</tool_call>',
     "NaN is not a number JSON allows"),
    ('<tool_call>{"name": "computer_use", "arguments": {"action": "scroll", "pixels": -Infinity}}</tool_call>',
     "-Infinity is not a number JSON allows"),
    ('<tool_call>{"name": "computer_use", "arguments": {"action": "scroll", "pixels": 1' + "0" * 5000 + "}}</tool_call>",
     "cannot be decoded (ValueError"),
    ("<tool_call>" + "[" * 10_000 + "]" * 9_000 + "</tool_call>", "cannot be decoded (RecursionError"),
    ('<tool_call>{"name": "computer_use", "name": "computer_use", "arguments": {}}</tool_call>',
     "the field 'name' is given twice"),
    ('<tool_call>{"name": "computer_use", "arguments": {"action": "type", "text": "\\ud800"}}</tool_call>',
     "lone surrogate"),
    (_call({"action": "type", "text": "a" * MAX_TOOL_CALL_CHARS}), "the tool call is too long"),
    (_call({"action": "key"}), "key: missing argument(s) 'keys'"),
    (_call({"action": "key", "keys": []}), "keys must be a non-empty list"),
    (_call({"action": "key", "keys": "ctrl+c"}), "keys must be a non-empty list"),
    (_call({"action": "key", "keys": ["nosuchkey"]}), "unknown key 'nosuchkey'"),
    (_call({"action": "key", "keys": [1]}), "each of keys must be a string, got 1"),
    (_call({"action": "key", "keys": ["a"] * 17}), "at most 16 keys"),
    (_call({"action": "type"}), "missing argument(s) 'text'"),
    (_call({"action": "type", "text": 5}), "text must be a string, got 5"),
    (_call({"action": "type", "text": "a" * (MAX_TEXT_CHARS + 1)}), "at most 2000 characters"),
    (_call({"action": "type", "text": "\x1b"}), "control character"),
    (_call({"action": "mouse_move"}), "mouse_move: missing argument(s) 'coordinate'"),
    (_call({"action": "left_click_drag"}), "left_click_drag: missing argument(s) 'coordinate'"),
    (_call({"action": "scroll"}), "missing argument(s) 'pixels'"),
    (_call({"action": "scroll", "pixels": 0}), "scroll of 0 clicks"),
    (_call({"action": "scroll", "pixels": 0.4}), "scroll of 0 clicks"),
    (_call({"action": "scroll", "pixels": "5"}), "pixels must be a number"),
    (_call({"action": "scroll", "pixels": False}), "pixels must be a number"),
    (_call({"action": "scroll", "pixels": 1000}), "scroll: dy must be an integer in -100..100"),
    (_call({"action": "hscroll", "pixels": -1000}), "hscroll: dx must be an integer in -100..100"),
    (_call({"action": "wait"}), "missing argument(s) 'time'"),
    (_call({"action": "wait", "time": 100}), "wait: seconds must be in 0..60"),
    (_call({"action": "wait", "time": -1}), "wait: seconds must be in 0..60"),
    (_call({"action": "terminate", "status": "maybe"}), "status must be 'success' or 'failure'"),
    (_call({"action": "terminate"}), "missing argument(s) 'status'"),
    (_call({"action": "answer"}), "missing argument(s) 'text'"),
    (_call({"action": "answer", "text": ["x"]}), "text must be a string"),
    (_call({"action": "left_click"}) + _call({"action": "fly"}), "tool call 2: unknown action 'fly'"),
    ("\n".join([_call({"action": "left_click"})] * (MAX_TURN_ACTIONS + 1)), "too many tool calls"),
    ("x" * (MAX_REPLY_CHARS + 1), "the reply is too long"),
]


@pytest.mark.parametrize(("text", "fragment"), QWEN_REJECTED, ids=[t[:90] for t, _ in QWEN_REJECTED])
def test_qwen_rejected(text: str, fragment: str) -> None:
    with pytest.raises(ActionError) as info:
        parse_qwen(text)
    assert fragment in str(info.value)
    assert str(info.value).startswith("tool call ") or "reply" in fragment or "too many" in fragment


@pytest.mark.parametrize(
    ("tool_calls", "fragment"),
    [
        ("not a list", "tool_calls must be a list"),
        ({"name": "computer_use"}, "tool_calls must be a list"),
        ([None], "tool call 1: a tool call must be a JSON object"),
        ([{"name": "computer_use", "arguments": "{"}], "tool call 1: the arguments is not valid JSON"),
        ([{"name": "computer_use", "arguments": 5}], "arguments must be a JSON object, got 5"),
        ([{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": (1, 2)}}],
         "coordinate must be a list"),
        ([{"name": "computer_use", "arguments": {"action": "scroll", "pixels": 10**5000}}], "pixels is too large"),
        ([{"name": "computer_use", "arguments": {"action": "scroll", "pixels": float("nan")}}], "finite number"),
        ([{"name": "computer_use", "arguments": " " * (MAX_TOOL_CALL_CHARS + 1)}], "too long"),
        ([{"name": "computer_use", "arguments": {"action": "wait", "time": 1}}, {"name": "bash", "arguments": {}}],
         "tool call 2: unknown tool 'bash'"),
        ([{"type": "function", "function": {"name": "computer_use", "arguments": {"action": "x"}}}],
         "unknown action 'x'"),
        ([{"function": {"name": "computer_use"}, "extra": 1}], "unknown tool call field(s) 'extra', 'function'"),
        ([{1: 2}], "unknown tool call field(s) 1"),
        ([{10**5000: 2}], "unknown tool call field(s) a very large integer"),
        ([{"name": "computer_use", "arguments": {"action": "left_click", 10**5000: 1}}],
         "unknown argument(s) a very large integer"),
        ([{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": (10**5000, 1)}}],
         "coordinate must be a list [x, y] of two numbers, got a tuple"),
    ],
)
def test_qwen_rejected_native_tool_calls(tool_calls: Any, fragment: str) -> None:
    with pytest.raises(ActionError) as info:
        parse_qwen("", tool_calls)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "per_click", [0, -1, float("nan"), float("inf"), "1", True, 10**5000],
    ids=["zero", "negative", "nan", "inf", "string", "bool", "huge"],
)
def test_qwen_bad_pixels_per_click(per_click: Any) -> None:
    with pytest.raises(ActionError, match="pixels_per_click"):
        parse_qwen("", pixels_per_click=per_click)


def test_qwen_tiny_pixels_per_click_cannot_overflow() -> None:
    calls = [{"name": "computer_use", "arguments": {"action": "scroll", "pixels": 10**9}}]
    with pytest.raises(ActionError, match="too many wheel clicks"):
        parse_qwen("", calls, pixels_per_click=1e-300)


@pytest.mark.parametrize("text", [b"x", None, 5])
def test_qwen_non_string_text(text: Any) -> None:
    with pytest.raises(ActionError, match="must be a string"):
        parse_qwen(text)


# --- pyautogui replies (EvoCUA / OSWorld): accepted forms --------------------------------------------

REPLY_ACCEPTED: list[tuple[str, ParsedReply]] = [
    ("I'll click OK.\n```python\npyautogui.click(10, 20)\n```",
     ParsedReply("I'll click OK.", [Action("click", 10, 20)])),
    ("```\npyautogui.click(10, 20)\n```", ParsedReply("", [Action("click", 10, 20)])),
    ("```py\nimport pyautogui\npyautogui.press('enter')\n```", ParsedReply("", [Action("key", keys=("enter",))])),
    ("```Python \npyautogui.press('enter')\n```", ParsedReply("", [Action("key", keys=("enter",))])),
    ("a\n```python\npyautogui.click(1, 2)\n```\nb\n```python\npyautogui.write('x')\n```\nc",
     ParsedReply("a\n\nb\n\nc", [Action("click", 1, 2), Action("type", text="x")])),
    ("```python\npyautogui.click(1, 2)\nDONE\n```", ParsedReply("", [Action("click", 1, 2), Action("done")])),
    ("```python\npyautogui.click(1, 2)\n```\nThen I'm done.\n```\nDONE\n```",
     ParsedReply("Then I'm done.", [Action("click", 1, 2), Action("done")])),
    ("```python\n  WAIT  \npyautogui.click(1, 2)\nFAIL\n```",
     ParsedReply("", [Action("wait", seconds=1.0), Action("click", 1, 2), Action("fail")])),
    ("```WAIT```", ParsedReply("", [Action("wait", seconds=1.0)])),
    ("```DONE\n```", ParsedReply("", [Action("done")])),
    ("Run: ```pyautogui.click(1, 2)``` now", ParsedReply("Run:  now", [Action("click", 1, 2)])),
    ("Nothing to do.\n```python\nimport pyautogui\n```", ParsedReply("Nothing to do.", [])),
    ("```python\n```", ParsedReply("", [])),
    ("```python\npyautogui.write('''two\nlines''')\n```", ParsedReply("", [Action("type", text="two\nlines")])),
    ("```python\npyautogui.click(1, 2)", ParsedReply("", [Action("click", 1, 2)])),  # unclosed at the end
    ("WAIT", ParsedReply("", [Action("wait", seconds=1.0)])),
    ("DONE", ParsedReply("", [Action("done")])),
    ("FAIL", ParsedReply("", [Action("fail")])),
    ("  DONE \n\n", ParsedReply("", [Action("done")])),
    ("The task is impossible.\nFAIL", ParsedReply("The task is impossible.", [Action("fail")])),
    ("Waiting for the page.\n\n  WAIT\n", ParsedReply("Waiting for the page.", [Action("wait", seconds=1.0)])),
]


@pytest.mark.parametrize(("text", "expected"), REPLY_ACCEPTED, ids=[t[:70] for t, _ in REPLY_ACCEPTED])
def test_pyautogui_reply_accepted(text: str, expected: ParsedReply) -> None:
    assert parse_pyautogui_reply(text) == expected


REPLY_REJECTED: list[tuple[Any, str]] = [
    ("I will click the button.", "no pyautogui code block"),
    ("", "no pyautogui code block"),
    ("done", "no pyautogui code block"),
    ("DONE.", "no pyautogui code block"),
    ("DONE\nand more", "no pyautogui code block"),
    ("pyautogui.click(1, 2)", "no pyautogui code block"),
    ("```python\nos.system('x')\n```", "line 2: call of os.system is not allowed"),
    ("```python\npyautogui.click(1, 2\n```", "line 2: syntax error"),
    ("```python\npyautogui.click(1, 2)\n\nx = 1\n```", "line 4: Assign statements are not allowed"),
    ("Thought.\n\n```python\npyautogui.click(1, 2)\nos.system('x')\n```", "line 5: call of os.system"),
    ("```python\npyautogui.click(1, 2)\nDONE\nos.system('x')\n```", "line 4: call of os.system"),
    ("```python\npyautogui.click(1, 2)\n```\ntext\n```python\nimport os\n```", "line 6: import os"),
    ("```python\npyautogui.click(1, 2)\x00\n```", "line 2: syntax error: source code string cannot contain null bytes"),
    ("```pyautogui.click(-1, 2)```", "line 1: pyautogui.click: x must be a non-negative number"),
    ("```python\n" + "pyautogui.write('" + "a" * MAX_CODE_CHARS + "')\n```", "pyautogui code is too long"),
    ("\n".join(["```python", *["pyautogui.press('a')"] * 150, "```"] * 2), "too many actions"),
    ("```python\n" + "DONE\n" * (MAX_TURN_ACTIONS + 1) + "```", "too many actions"),
    ("x" * (MAX_REPLY_CHARS + 1), "the reply is too long"),
    (None, "must be a string"),
    (b"DONE", "must be a string"),
]


@pytest.mark.parametrize(("text", "fragment"), REPLY_REJECTED, ids=[str(t)[:70] for t, _ in REPLY_REJECTED])
def test_pyautogui_reply_rejected(text: Any, fragment: str) -> None:
    with pytest.raises(ActionError) as info:
        parse_pyautogui_reply(text)
    assert fragment in str(info.value)


# --- parse_pyautogui: numbers too large to convert or print are refused by name ----------------------


@pytest.mark.parametrize(
    ("code", "fragment"),
    [
        ("pyautogui.click(0x" + "f" * 5000 + ", 1)", "argument 'x' is too large"),
        ("pyautogui.click(0x" + "f" * 300 + ", 1)", "argument 'x' is too large"),
        ("pyautogui.click(" + "9" * 4000 + ", 1)", "argument 'x' is too large"),
        ("pyautogui.click([1, 0x" + "f" * 5000 + "])", "argument 'x' is too large"),
        ("pyautogui.click(1, 2, clicks=0x" + "f" * 5000 + ")", "argument 'clicks' is too large"),
        ("pyautogui.press('a', presses=0x" + "f" * 5000 + ")", "argument 'presses' is too large"),
        ("pyautogui.write(0x" + "f" * 5000 + ")", "argument 'message' is too large"),
        ("pyautogui.press(0x" + "f" * 5000 + ")", "argument 'keys' is too large"),
        ("pyautogui.scroll(-0x" + "f" * 5000 + ")", "argument 'clicks' is too large"),
        ("time.sleep(0x" + "f" * 5000 + ")", "argument 'seconds' is too large"),
        ("pyautogui.click(1e308, 1)", "x is too large"),
        ("pyautogui.moveTo(1, 1e10)", "y is too large"),
        ("pyautogui.click(1, 2, interval=0x" + "f" * 5000 + ")", "argument 'interval' is too large"),
        ("a." * 1000 + "b()", "call of a long attribute expression is not allowed"),
        ("f" + "()" * 1500, "call of a long call expression is not allowed"),
        ("f" + "[0]" * 1500 + "()", "call of a long subscript expression is not allowed"),
        ("0x" + "f" * 4000 + "()", "call of a constant expression holding a huge number is not allowed"),
        ("pyautogui.click[0x" + "f" * 4000 + "](1)", "call of a subscript expression holding a huge number"),
        ("(0x" + "f" * 4000 + ").real()", "call of an attribute expression holding a huge number"),
    ],
)
def test_pyautogui_huge_numbers_and_deep_callees(code: str, fragment: str) -> None:
    with pytest.raises(ActionError) as info:
        parse_pyautogui(code)
    assert fragment in str(info.value)


def test_pyautogui_largest_number_is_accepted() -> None:
    assert parse_pyautogui(f"pyautogui.click({MAX_NUMBER}, {MAX_NUMBER})") == [Action("click", MAX_NUMBER, MAX_NUMBER)]


# --- nothing is ever executed ------------------------------------------------------------------------


def _uitars_payloads(t: str) -> list[str]:
    return [
        f"Action: __import__('os').system('touch {t}')",
        f"Action: open({t!r}, 'w')",
        f"Action: exec(\"open({t!r}, 'w')\")",
        f"Action: eval(\"open({t!r}, 'w')\")",
        f"Action: type(content=open({t!r}, 'w'))",
        f"Action: type(content=__import__('os').system('touch {t}'))",
        f"Action: type(content=f\"{{open({t!r}, 'w')}}\")",
        f"Action: click(start_box=exec(\"open({t!r}, 'w')\"))",
        f"Action: click(**{{'start_box': open({t!r}, 'w')}})",
        f"Action: click(start_box='(1,2)')\nopen({t!r}, 'w')",
        f"Action: type(content='x'); open({t!r}, 'w')",
        f"Action: [open({t!r}, 'w') for _ in range(1)]",
        f"Action: (lambda: open({t!r}, 'w'))()",
        f"Action: getattr(__import__('os'), 'system')('touch {t}')",
        f"Action: type(content='x').__class__.__init__.__globals__['os'].system('touch {t}')",
        f"Action: type(content=(x := open({t!r}, 'w')))",
        f"Action: click(start_box='(1,2)' if open({t!r}, 'w') else '(3,4)')",
        f"Action: import os; os.system('touch {t}')",
        f"Action: type(content='{t}')(open({t!r}, 'w'))",
    ]


def _qwen_payloads(t: str) -> list[tuple[str, list[dict[str, Any]] | None]]:
    code = f"__import__('os').system('touch {t}')"
    return [
        (f"<tool_call>{code}</tool_call>", None),
        (f"<tool_call>{{\"name\": \"computer_use\", \"arguments\": {code}}}</tool_call>", None),
        (f"<tool_call>{{\"name\": {code!r}, \"arguments\": {{}}}}</tool_call>", None),
        (_call({"action": code}), None),
        (_call({"action": "type", "text": 1, "__class__": code}), None),
        (_call(code), None),
        (_call({"action": "left_click", "coordinate": [code, code]}), None),
        (_call({"action": "key", "keys": [code]}), None),
        ("", [{"name": "computer_use", "arguments": code}]),
        ("", [{"name": code, "arguments": {}}]),
        ("", [{"name": "computer_use", "arguments": {"action": "wait", "time": code}}]),
        ("", [{"name": "computer_use", "arguments": f"{{\"action\": {code}}}"}]),
    ]


def _pyautogui_reply_payloads(t: str) -> list[str]:
    return [
        f"Let me look.\n```python\nimport os\nos.system('touch {t}')\n```",
        f"```python\n__import__('os').system('touch {t}')\n```",
        f"```python\npyautogui.click(1, 2)\nDONE\nopen({t!r}, 'w')\n```",
        f"```python\npyautogui.write(open({t!r}, 'w'))\n```",
        f"```\nexec(\"open({t!r}, 'w')\")\n```",
        f"```open({t!r}, 'w')```",
        f"```python\npyautogui.click(1, 2)\n```\n```bash\ntouch {t}\n```",
        f"```python\nimport subprocess\nsubprocess.run(['touch', {t!r}])\n```",
        f"```python\npyautogui.hotkey(*[open({t!r}, 'w')])\n```",
    ]


def _run_payload(parse: Any, *args: Any) -> None:
    with pytest.raises(ActionError):
        parse(*args)


@pytest.mark.parametrize("index", range(len(_uitars_payloads("/tmp/x"))))
def test_uitars_payload_is_never_executed(index: int) -> None:
    target = Path(f"/tmp/retrace-pwned-{uuid.uuid4().hex}")
    try:
        _run_payload(parse_uitars, _uitars_payloads(str(target))[index])
        assert not target.exists(), "parsing executed model output"
    finally:
        target.unlink(missing_ok=True)


@pytest.mark.parametrize("index", range(len(_qwen_payloads("/tmp/x"))))
def test_qwen_payload_is_never_executed(index: int) -> None:
    target = Path(f"/tmp/retrace-pwned-{uuid.uuid4().hex}")
    try:
        text, calls = _qwen_payloads(str(target))[index]
        _run_payload(parse_qwen, text, calls)
        assert not target.exists(), "parsing executed model output"
    finally:
        target.unlink(missing_ok=True)


@pytest.mark.parametrize("index", range(len(_pyautogui_reply_payloads("/tmp/x"))))
def test_pyautogui_reply_payload_is_never_executed(index: int) -> None:
    target = Path(f"/tmp/retrace-pwned-{uuid.uuid4().hex}")
    try:
        _run_payload(parse_pyautogui_reply, _pyautogui_reply_payloads(str(target))[index])
        assert not target.exists(), "parsing executed model output"
    finally:
        target.unlink(missing_ok=True)


def test_accepted_replies_only_produce_data() -> None:
    target = Path(f"/tmp/retrace-pwned-{uuid.uuid4().hex}")
    command = f"touch {target}\n"
    assert parse_uitars(f"Action: type(content={command!r})").actions == [Action("type", text=command)]
    assert parse_qwen(_call({"action": "type", "text": command})).actions == [Action("type", text=command)]
    assert parse_pyautogui_reply(f"```python\npyautogui.write({command!r})\n```").actions == [
        Action("type", text=command)
    ]
    assert not target.exists()


# --- fuzzing: any input gives Actions within the caps, or ActionError --------------------------------

FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
# Arbitrary text: any Unicode (NUL, lone surrogates ...), or drawn from the characters the dialects use.
_ANY_TEXT = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=st.sampled_from(list("pyautogui.clickAction:()[]{}<>|'\"`0123456789 ,=\n\\xe-+_#")), max_size=300),
)


def _check_action(action: Action) -> None:
    assert isinstance(action, Action)
    for value in (action.x, action.y, action.x2, action.y2):
        assert value is None or (type(value) is int and 0 <= value <= MAX_NUMBER)
    assert len(action.text) <= MAX_TEXT_CHARS
    assert abs(action.dx) <= MAX_SCROLL and abs(action.dy) <= MAX_SCROLL
    assert len(action.keys) + len(action.hold) <= MAX_KEYS
    assert action.presses * max(1, len(action.keys)) <= MAX_PRESSES
    assert 0 <= action.seconds <= {"wait": MAX_WAIT, "hotkey": MAX_HOLD}.get(action.kind, 0.0)


def _check(parse: Any, *args: Any, **kwargs: Any) -> None:
    try:
        result = parse(*args, **kwargs)
    except ActionError as exc:
        assert str(exc)  # every refusal says why
        return
    actions = result.actions if isinstance(result, ParsedReply) else result
    if isinstance(result, ParsedReply):
        assert isinstance(result.rationale, str)
    assert isinstance(actions, list) and len(actions) <= MAX_TURN_ACTIONS
    for action in actions:
        _check_action(action)


# Grammars of near-valid replies: each call mostly has the right shape and plausible values, with an
# adversarial value (huge, non-finite, hex, deeply nested, any Unicode, NUL ...) or stray argument mixed in
# often enough that both the accepting and the refusing paths are exercised.

_RARELY = st.sampled_from([False] * 9 + [True])  # (st.integers(0, n) == 0 would be far likelier than 1/n)
_BAD_NUMBER = st.one_of(
    st.integers(min_value=0, max_value=2**3000).map(hex),
    st.integers(min_value=-(10**300), max_value=10**300).map(str),
    st.floats().map(repr),
    st.sampled_from(
        ["1e308", "1e309", "-1e308", "nan", "inf", "-inf", "NaN", "Infinity", "-0", "-1", "1_000", "٣",
         "9" * 4000, "9" * 5000, "0x" + "f" * 5000, "-0x" + "f" * 300, "1j", "True", "None", "''", "[]",
         "()", "1e-400", "0.5"]
    ),
)
_GOOD_NUMBER = st.one_of(st.integers(0, 3000).map(str), st.floats(0, 3000).map(lambda f: f"{f:.1f}"))
_NUMBER_TEXT = st.one_of(_GOOD_NUMBER, _GOOD_NUMBER, _BAD_NUMBER)
_SIGNED_TEXT = st.one_of(st.integers(-150, 150).map(str), st.integers(-150, 150).map(str), _BAD_NUMBER)
_NESTED = st.integers(min_value=1, max_value=400).flatmap(
    lambda n: st.sampled_from(["(" * n + "1" + ")" * n, "[" * n + "]" * n, "(" * n, "{" * n + "}" * n, "-" * n + "1"])
)
_GARBAGE = st.text(max_size=30)  # any Unicode, NUL and lone surrogates included
_TEXT = st.one_of(st.text(max_size=40), st.text(max_size=3).map(lambda s: s * 700))  # near the typing cap
_KEY = st.sampled_from(["ctrl", "shift", "alt", "enter", "esc", "tab", "a", "Z", "f5", "pagedown", "space",
                        "arrowup", "Return", "nosuchkey", "", " ", "ctrl+c"])


def _list_of(element: st.SearchStrategy[str], max_size: int = 5) -> st.SearchStrategy[str]:
    return st.lists(element, max_size=max_size).map(lambda xs: "[" + ", ".join(xs) + "]")


_PY_VALUE = st.one_of(
    _NUMBER_TEXT, _TEXT.map(repr), _NESTED, _GARBAGE, _list_of(_NUMBER_TEXT), _list_of(_KEY.map(repr)),
    st.sampled_from(["'left'", "'right'", "x", "f'{x}'", "b'x'", "open('f')", "*a", "**k"]),
)
_PY_POINT = st.tuples(_NUMBER_TEXT, _NUMBER_TEXT).map(list)
_PY_KEYS = st.one_of(_KEY.map(repr), _list_of(_KEY.map(repr), 18))
_PYAUTOGUI_ARGS: dict[str, st.SearchStrategy[list[str]]] = {
    **dict.fromkeys(
        ["click", "leftClick", "doubleClick", "tripleClick", "rightClick", "middleClick", "moveTo", "dragTo",
         "mouseDown", "mouseUp"],
        st.one_of(_PY_POINT, _PY_POINT, st.just([]), _list_of(_NUMBER_TEXT, 3).map(lambda s: [s])),
    ),
    **dict.fromkeys(["scroll", "vscroll", "hscroll"], st.one_of(
        st.tuples(_SIGNED_TEXT).map(list), st.tuples(_SIGNED_TEXT, _NUMBER_TEXT, _NUMBER_TEXT).map(list))),
    **dict.fromkeys(["write", "typewrite"], st.one_of(st.tuples(_TEXT.map(repr)).map(list),
                                                      st.tuples(_list_of(_KEY.map(repr))).map(list))),
    **dict.fromkeys(["press", "keyDown", "keyUp"], st.tuples(_PY_KEYS).map(list)),
    "hotkey": st.lists(_KEY.map(repr), max_size=18),
    "sleep": st.tuples(st.one_of(st.floats(0, 70).map(repr), _SIGNED_TEXT)).map(list),
    "moveRel": _PY_POINT,
    "screenshot": st.just([]),
}
_PYAUTOGUI_KWARGS = st.sampled_from(
    ["x", "y", "clicks", "button", "message", "keys", "presses", "interval", "duration", "seconds", "key", "foo"]
)


@st.composite
def _pyautogui_call(draw: st.DrawFn) -> str:
    fn = draw(st.sampled_from(list(_PYAUTOGUI_ARGS)))
    module = "pyautogui"
    if draw(_RARELY):
        module = draw(st.sampled_from(["time", "os", "pyautogui.os", f"({draw(_NUMBER_TEXT)})", f"x[{draw(_PY_VALUE)}]"]))
    parts = draw(_PYAUTOGUI_ARGS[fn])
    if draw(_RARELY):
        parts.append(f"{draw(_PYAUTOGUI_KWARGS)}={draw(st.one_of(_PY_VALUE, _SIGNED_TEXT))}")
    return f"{module}.{fn}({', '.join(parts)})"


_PYAUTOGUI_CODE = st.lists(
    st.one_of(_pyautogui_call(), _pyautogui_call(), _pyautogui_call(),
              st.sampled_from(["WAIT", "DONE", "FAIL", "import pyautogui", "", "x = 1"])),
    min_size=1, max_size=3,
).map("\n".join)


@FUZZ
@given(_ANY_TEXT)
def test_fuzz_parse_pyautogui_any_text(text: str) -> None:
    _check(parse_pyautogui, text)


@FUZZ
@given(_PYAUTOGUI_CODE)
def test_fuzz_parse_pyautogui_near_valid(code: str) -> None:
    _check(parse_pyautogui, code)


@FUZZ
@given(_ANY_TEXT)
def test_fuzz_parse_pyautogui_reply_any_text(text: str) -> None:
    _check(parse_pyautogui_reply, text)


@FUZZ
@given(st.lists(st.tuples(st.text(max_size=40), st.sampled_from(["```python\n", "```\n", "```", "```py\n"]),
                          _PYAUTOGUI_CODE, st.sampled_from(["\n```", "```", ""])), max_size=3),
       st.sampled_from(["", "\nDONE", "\nWAIT\n", "FAIL"]))
def test_fuzz_parse_pyautogui_reply_near_valid(blocks: list[tuple[str, str, str, str]], tail: str) -> None:
    _check(parse_pyautogui_reply, "".join("".join(block) for block in blocks) + tail)


# UI-TARS: point strings in every spelling, with adversarial numbers inside.
_UITARS_POINT = st.one_of(
    st.tuples(_NUMBER_TEXT, _NUMBER_TEXT).map(lambda p: f"({p[0]},{p[1]})"),
    st.tuples(_NUMBER_TEXT, _NUMBER_TEXT, _NUMBER_TEXT, _NUMBER_TEXT).map(
        lambda p: f"<|box_start|>({p[0]},{p[1]},{p[2]},{p[3]})<|box_end|>"
    ),
    st.tuples(_NUMBER_TEXT, _NUMBER_TEXT).map(lambda p: f"<point>{p[0]} {p[1]}</point>"),
    st.tuples(_NUMBER_TEXT, _NUMBER_TEXT).map(lambda p: f"[{p[0]}, {p[1]}]"),
    st.lists(_NUMBER_TEXT, max_size=6).map(lambda xs: "(" + ",".join(xs) + ")"),
    _GARBAGE,
)
_UITARS_CHORD = st.lists(_KEY, max_size=18).map(" ".join)
_UITARS_ARGS: dict[str, dict[str, st.SearchStrategy[str]]] = {
    **{fn: {"start_box": _UITARS_POINT} for fn in ["click", "left_single", "left_double", "right_single"]},
    "drag": {"start_box": _UITARS_POINT, "end_box": _UITARS_POINT},
    "hotkey": {"key": _UITARS_CHORD},
    **{fn: {"key": st.one_of(_KEY, _UITARS_CHORD)} for fn in ["press", "keydown", "keyup"]},
    "type": {"content": _TEXT},
    "scroll": {"direction": st.sampled_from(["down", "up", "left", "right", "Down", "sideways"]),
               "start_box": _UITARS_POINT},
    "finished": {"content": _TEXT},
    "wait": {},
    "call_user": {},
    "hover": {"start_box": _UITARS_POINT},
}
_UITARS_KWARGS = st.sampled_from(
    ["start_box", "end_box", "point", "start_point", "end_point", "key", "content", "direction", "x"]
)
_UITARS_VALUE = st.one_of(_UITARS_POINT.map(repr), _TEXT.map(repr), _PY_VALUE)


@st.composite
def _uitars_call(draw: st.DrawFn) -> str:
    fn = draw(st.sampled_from(list(_UITARS_ARGS)))
    parts = [f"{name}={draw(values)!r}" for name, values in _UITARS_ARGS[fn].items() if not draw(_RARELY)]
    if draw(_RARELY):
        parts.append(f"{draw(_UITARS_KWARGS)}={draw(_UITARS_VALUE)}")
    parts = draw(st.permutations(parts))
    if draw(_RARELY):
        parts.insert(0, draw(_PY_VALUE))  # a positional argument
    if draw(_RARELY):
        fn = draw(st.sampled_from(["os.system", "x." + fn, "__import__('os').system", f"({draw(_NUMBER_TEXT)})",
                                   f"x[{draw(_PY_VALUE)}]"]))
    return f"{fn}({', '.join(parts)})"


@st.composite
def _uitars_reply(draw: st.DrawFn) -> str:
    lines = draw(st.lists(_uitars_call(), max_size=4))
    thought = draw(st.text(max_size=60))
    return f"Thought: {thought}\nAction: " + "\n".join(lines)


@FUZZ
@given(_ANY_TEXT)
def test_fuzz_parse_uitars_any_text(text: str) -> None:
    _check(parse_uitars, text)
    _check(parse_uitars, "Action: " + text)


@FUZZ
@given(_uitars_reply())
def test_fuzz_parse_uitars_near_valid(text: str) -> None:
    _check(parse_uitars, text)


# Qwen: JSON values of every type, including huge ints, non-finite floats and deep nesting.
_JSON_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**1000), max_value=10**1000), st.integers(-2000, 2000),
    st.floats(), st.text(max_size=20),
)
_JSON = st.recursive(_JSON_SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=8), inner, max_size=3), max_leaves=8)
_GOOD_COORD = st.one_of(st.integers(0, 3000), st.floats(0, 3000))
_QWEN_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "coordinate": st.one_of(st.lists(_GOOD_COORD, min_size=2, max_size=2),
                            st.lists(_GOOD_COORD, min_size=2, max_size=2),
                            st.lists(st.one_of(_GOOD_COORD, _JSON_SCALAR), max_size=3), _JSON),
    "keys": st.one_of(st.lists(_KEY, max_size=18), st.lists(_KEY, min_size=1, max_size=3), _JSON),
    "text": st.one_of(_TEXT, _TEXT, _JSON),
    "pixels": st.one_of(st.integers(-500, 500), st.integers(-500, 500), st.floats(), _JSON),
    "time": st.one_of(st.floats(0, 70), st.floats(), st.integers(-10, 100), _JSON),
    "status": st.one_of(st.sampled_from(["success", "failure", "success", "maybe"]), _JSON),
    "reason": _JSON,
}
_QWEN_FIELDS: dict[str, tuple[str, ...]] = {
    "key": ("keys",), "type": ("text",), "mouse_move": ("coordinate",), "left_click": ("coordinate",),
    "right_click": ("coordinate",), "middle_click": ("coordinate",), "double_click": ("coordinate",),
    "triple_click": ("coordinate",), "left_click_drag": ("coordinate",), "scroll": ("pixels", "coordinate"),
    "hscroll": ("pixels", "coordinate"), "wait": ("time",), "terminate": ("status",), "answer": ("text",),
    "fly": (),
}


@st.composite
def _qwen_call(draw: st.DrawFn) -> Any:
    action = draw(st.sampled_from(list(_QWEN_FIELDS)))
    arguments: dict[str, Any] = {"action": draw(_JSON_SCALAR) if draw(_RARELY) else action}
    for field in _QWEN_FIELDS[action]:
        if not draw(_RARELY):
            arguments[field] = draw(_QWEN_VALUES[field])
    if draw(_RARELY):
        field = draw(st.sampled_from(list(_QWEN_VALUES)))
        arguments[field] = draw(_QWEN_VALUES[field])
    name = draw(st.sampled_from(["bash", ""])) if draw(_RARELY) else "computer_use"
    call: Any = {"name": name, "arguments": json.dumps(arguments) if draw(st.booleans()) else arguments}
    if draw(_RARELY):
        return draw(st.sampled_from([{"type": "function", "function": call}, draw(_JSON)]))
    return call


def _block(call: Any) -> str:
    try:
        body = json.dumps(call)  # NaN / Infinity come out as JSON's non-standard tokens
    except ValueError:
        body = "{"
    return f"<tool_call>\n{body}\n</tool_call>"


@FUZZ
@given(_ANY_TEXT)
def test_fuzz_parse_qwen_any_text(text: str) -> None:
    _check(parse_qwen, text)
    _check(parse_qwen, "<tool_call>" + text)


@FUZZ
@given(st.lists(_qwen_call(), max_size=4), st.text(max_size=40), st.booleans(),
       st.sampled_from([1.0, 0.5, 120.0, 1e-300]))
def test_fuzz_parse_qwen_near_valid(calls: list[Any], prose: str, native: bool, per_click: float) -> None:
    if native:
        _check(parse_qwen, prose, calls, pixels_per_click=per_click)
    else:
        _check(parse_qwen, prose + "".join(_block(c) for c in calls), pixels_per_click=per_click)


@FUZZ
@given(st.one_of(_JSON, st.lists(_JSON, max_size=3), st.lists(st.dictionaries(st.sampled_from(
    ["name", "arguments", "function", "type"]), _JSON), max_size=3)))
def test_fuzz_parse_qwen_arbitrary_tool_calls(tool_calls: Any) -> None:
    _check(parse_qwen, "", tool_calls)
