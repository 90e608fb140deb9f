"""Tests for the Action type and the pyautogui parser (which must never execute model output)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from pytest_retrace.actions import Action, ActionError, normalize_key, parse_action
from pytest_retrace.actions.limits import MAX_TEXT_CHARS, MAX_TURN_ACTIONS
from pytest_retrace.actions.pyautogui import MAX_CODE_CHARS, parse_pyautogui

# --- accepted forms ----------------------------------------------------------------------------------

ACCEPTED: list[tuple[str, Action]] = [
    # click and friends
    ("pyautogui.click()", Action("click")),
    ("pyautogui.click(100, 200)", Action("click", 100, 200)),
    ("pyautogui.click(x=100, y=200)", Action("click", 100, 200)),
    ("pyautogui.click(100.4, 199.6)", Action("click", 100, 200)),
    ("pyautogui.click((100, 200))", Action("click", 100, 200)),
    ("pyautogui.click([100, 200])", Action("click", 100, 200)),
    ("pyautogui.click(0, 0)", Action("click", 0, 0)),
    ("pyautogui.click(+5, 6)", Action("click", 5, 6)),
    ("pyautogui.click(10, 20, button='right')", Action("click", 10, 20, button="right")),
    ("pyautogui.click(10, 20, button='middle')", Action("click", 10, 20, button="middle")),
    ("pyautogui.click(10, 20, button='primary')", Action("click", 10, 20, button="left")),
    ("pyautogui.click(10, 20, button='secondary')", Action("click", 10, 20, button="right")),
    ("pyautogui.click(10, 20, clicks=2)", Action("click", 10, 20, clicks=2)),
    ("pyautogui.click(10, 20, 3, 0.1, 'right', 0.2)", Action("click", 10, 20, clicks=3, button="right")),
    ("pyautogui.click(10, 20, interval=0.1, duration=0.5)", Action("click", 10, 20)),
    ("pyautogui.click(x=None, y=None)", Action("click")),
    ("pyautogui.leftClick(1, 2)", Action("click", 1, 2)),
    ("pyautogui.doubleClick(10, 20)", Action("click", 10, 20, clicks=2)),
    ("pyautogui.doubleClick()", Action("click", clicks=2)),
    ("pyautogui.doubleClick(10, 20, button='right')", Action("click", 10, 20, clicks=2, button="right")),
    ("pyautogui.tripleClick(10, 20)", Action("click", 10, 20, clicks=3)),
    ("pyautogui.rightClick(10, 20)", Action("click", 10, 20, button="right")),
    ("pyautogui.rightClick()", Action("click", button="right")),
    ("pyautogui.middleClick(10, 20)", Action("click", 10, 20, button="middle")),
    # pointer movement
    ("pyautogui.moveTo(300, 400)", Action("move", 300, 400)),
    ("pyautogui.moveTo(300, 400, duration=0.5)", Action("move", 300, 400)),
    ("pyautogui.moveTo(300, 400, 0.5)", Action("move", 300, 400)),
    ("pyautogui.moveTo((300, 400))", Action("move", 300, 400)),
    ("pyautogui.dragTo(500, 600)", Action("drag", x2=500, y2=600)),
    ("pyautogui.dragTo(500, 600, 1.0, button='left')", Action("drag", x2=500, y2=600)),
    (
        "pyautogui.dragTo(500, 600, duration=1, button='right')",
        Action("drag", x2=500, y2=600, button="right"),
    ),
    ("pyautogui.dragTo(x=500.2, y=599.7)", Action("drag", x2=500, y2=600)),
    ("pyautogui.mouseDown()", Action("mouse_down")),
    ("pyautogui.mouseDown(10, 20, button='right')", Action("mouse_down", 10, 20, button="right")),
    ("pyautogui.mouseDown(x=10, y=20)", Action("mouse_down", 10, 20)),
    ("pyautogui.mouseUp()", Action("mouse_up")),
    ("pyautogui.mouseUp(30, 40, 'middle')", Action("mouse_up", 30, 40, button="middle")),
    # scrolling: positive = up / right
    ("pyautogui.scroll(5)", Action("scroll", dy=5)),
    ("pyautogui.scroll(-3)", Action("scroll", dy=-3)),
    ("pyautogui.scroll(-3, 100, 200)", Action("scroll", 100, 200, dy=-3)),
    ("pyautogui.scroll(clicks=2, x=1, y=2)", Action("scroll", 1, 2, dy=2)),
    ("pyautogui.scroll(2.6)", Action("scroll", dy=3)),
    ("pyautogui.vscroll(-1)", Action("scroll", dy=-1)),
    ("pyautogui.hscroll(4, 10, 10)", Action("scroll", 10, 10, dx=4)),
    ("pyautogui.hscroll(-4)", Action("scroll", dx=-4)),
    # keyboard
    ("pyautogui.typewrite('hello')", Action("type", text="hello")),
    ("pyautogui.typewrite('hello', interval=0.05)", Action("type", text="hello")),
    ("pyautogui.write('hello world', 0.1)", Action("type", text="hello world")),
    ("pyautogui.write(message='x')", Action("type", text="x")),
    ("pyautogui.write('')", Action("type", text="")),
    ("pyautogui.write('line1\\nline2')", Action("type", text="line1\nline2")),
    ("pyautogui.write('C:\\\\temp\\\\a.txt')", Action("type", text="C:\\temp\\a.txt")),
    ("pyautogui.typewrite(['a', 'b', 'enter'])", Action("key", keys=("a", "b", "enter"))),
    ("pyautogui.write(('left', 'Return'))", Action("key", keys=("left", "enter"))),
    ("pyautogui.press('enter')", Action("key", keys=("enter",))),
    ("pyautogui.press('Return')", Action("key", keys=("enter",))),
    ("pyautogui.press('tab', presses=3)", Action("key", keys=("tab",), presses=3)),
    ("pyautogui.press('down', 2, 0.1)", Action("key", keys=("down",), presses=2)),
    ("pyautogui.press(['up', 'up', 'enter'])", Action("key", keys=("up", "up", "enter"))),
    ("pyautogui.press(keys='esc', interval=0.2)", Action("key", keys=("esc",))),
    ("pyautogui.hotkey('ctrl', 'c')", Action("hotkey", keys=("ctrl", "c"))),
    ("pyautogui.hotkey('ctrl', 'shift', 't', interval=0.1)", Action("hotkey", keys=("ctrl", "shift", "t"))),
    ("pyautogui.hotkey(['ctrl', 'v'])", Action("hotkey", keys=("ctrl", "v"))),
    ("pyautogui.hotkey(('command', 'q'))", Action("hotkey", keys=("win", "q"))),
    ("pyautogui.hotkey('Control', 'S')", Action("hotkey", keys=("ctrl", "S"))),
    ("pyautogui.keyDown('shift')", Action("key_down", keys=("shift",))),
    ("pyautogui.keyUp('shift')", Action("key_up", keys=("shift",))),
    ("pyautogui.keyDown(key='ctrl')", Action("key_down", keys=("ctrl",))),
    # waiting
    ("time.sleep(1)", Action("wait", seconds=1.0)),
    ("time.sleep(0.5)", Action("wait", seconds=0.5)),
    ("pyautogui.sleep(2)", Action("wait", seconds=2.0)),
    ("pyautogui.sleep(seconds=0)", Action("wait", seconds=0.0)),
]


@pytest.mark.parametrize(("code", "expected"), ACCEPTED, ids=[c for c, _ in ACCEPTED])
def test_accepted_form(code: str, expected: Action) -> None:
    assert parse_pyautogui(code) == [expected]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("WAIT", [Action("wait", seconds=1.0)]),
        ("DONE", [Action("done")]),
        ("FAIL", [Action("fail")]),
        ("  DONE\n", [Action("done")]),
    ],
)
def test_osworld_special_strings(code: str, expected: list[Action]) -> None:
    assert parse_pyautogui(code) == expected


@pytest.mark.parametrize("code", ["done", "Wait", "DONE()", "FAIL FAIL"])
def test_special_strings_are_exact(code: str) -> None:
    with pytest.raises(ActionError):
        parse_pyautogui(code)


@pytest.mark.parametrize(
    "code",
    ["", "   \n\n", "import pyautogui", "import time", "import pyautogui, time\nimport time", "# a comment"],
)
def test_nothing_to_do(code: str) -> None:
    assert parse_pyautogui(code) == []


def test_several_statements_in_order() -> None:
    code = """
import pyautogui
import time
pyautogui.click(10, 20)
time.sleep(0.5)
pyautogui.write('hi'); pyautogui.press('enter')
pyautogui.hotkey('ctrl', 's')
"""
    assert parse_pyautogui(code) == [
        Action("click", 10, 20),
        Action("wait", seconds=0.5),
        Action("type", text="hi"),
        Action("key", keys=("enter",)),
        Action("hotkey", keys=("ctrl", "s")),
    ]


@pytest.mark.parametrize(
    "text", ["é", "€100", "中文输入", "naïve café", "emoji 🙂", "tab\there", "a\nb\r\nc", "quote ' \" \\"]
)
def test_unicode_text_preserved(text: str) -> None:
    assert parse_pyautogui(f"pyautogui.write({text!r})") == [Action("type", text=text)]
    assert parse_pyautogui(f"pyautogui.typewrite(message={text!r})")[0].text == text


def test_unicode_in_triple_quoted_string() -> None:
    code = 'pyautogui.write("""Grüße\nan € und 中""")'
    assert parse_pyautogui(code) == [Action("type", text="Grüße\nan € und 中")]


@pytest.mark.parametrize("char", ["\x1b", "\x07", "\x00", "\x7f", "\x85"])
def test_text_with_a_control_character_no_key_types_is_refused_by_name(char: str) -> None:
    with pytest.raises(ActionError, match=re.escape(repr(char))):
        parse_pyautogui(f"pyautogui.write({'ok' + char!r})")


def test_invalid_escape_is_kept_literally() -> None:
    # '\d' is an invalid escape: Python keeps the backslash (with a warning we suppress).
    assert parse_pyautogui("pyautogui.write('\\d+')") == [Action("type", text="\\d+")]


# --- rejected forms ----------------------------------------------------------------------------------

ATTACKS: list[str] = [
    "import os",
    "import subprocess",
    "import pyautogui as p",
    "import pyautogui, os",
    "import time as t",
    "from os import system",
    "from pyautogui import click",
    "from . import x",
    "os.system('x')",
    "__import__('os').system('x')",
    "exec('1')",
    "eval('1')",
    "compile('1', 'f', 'exec')",
    "pyautogui.click(x)",
    "pyautogui.click(x, 1)",
    "pyautogui.click(*a)",
    "pyautogui.click(**k)",
    "pyautogui.hotkey(*keys)",
    "for i in range(3): pyautogui.click(1, 1)",
    "while True: pass",
    "if True: pyautogui.click(1, 1)",
    "x = 1",
    "x: int = 1",
    "x += 1",
    "del x",
    "global x",
    "pass",
    "assert False",
    "raise SystemExit",
    "pyautogui.os.system('x')",
    "pyautogui.pyscreeze.screenshot()",
    "getattr(pyautogui, 'click')(1, 1)",
    "open('/etc/passwd')",
    "(lambda: 1)()",
    "lambda: 1",
    "def f(): pass",
    "class A: pass",
    "with open('x') as f: pass",
    "try:\n    pass\nexcept Exception:\n    pass",
    "[pyautogui.click(1, 1) for _ in range(3)]",
    "pyautogui.click(*[1, 2])",
    "pyautogui.write(f'{x}')",
    "pyautogui.write(f'plain')",
    "pyautogui.write('a' + 'b')",
    "pyautogui.write('a' * 1000000)",
    "pyautogui.click(1+1, 2)",
    "pyautogui.click(2**10, 2)",
    "pyautogui.click(-(1), 2)",
    "pyautogui.click(~1, 2)",
    "pyautogui.click(not 1, 2)",
    "pyautogui.click(True, 2)",
    "pyautogui.click(1j, 2)",
    "pyautogui.click(1e999, 2)",
    "pyautogui.click('image.png')",
    "pyautogui.click(1, 2, button=pyautogui.LEFT)",
    "pyautogui.click(1, 2, button='foo')",
    "pyautogui.click(1, 2, clicks=4)",
    "pyautogui.click(1, 2, clicks=2.0)",
    "pyautogui.click(1, 2, foo=3)",
    "pyautogui.click(1, 2, x=3)",
    "pyautogui.click(1, 2, 1, 0, 'left', 0, 7)",
    "pyautogui.click((1, 2, 3))",
    "pyautogui.click(1)",
    "pyautogui.click([[1, 2]])",
    "pyautogui.click({'x': 1})",
    "pyautogui.click(1, 2, interval='slow')",
    "pyautogui.write(b'bytes')",
    "pyautogui.write(...)",
    "pyautogui.write(123)",
    "pyautogui.write()",
    "pyautogui.write(['enter', 5])",
    "pyautogui.press()",
    "pyautogui.press('nosuchkey')",
    "pyautogui.press([])",
    "pyautogui.press('a', presses=0)",
    "pyautogui.press('a', presses=1000)",
    "pyautogui.hotkey()",
    "pyautogui.hotkey('ctrl', 1)",
    "pyautogui.keyDown()",
    "pyautogui.keyDown(['a', 'b'])",
    "pyautogui.scroll()",
    "pyautogui.scroll(0)",
    "pyautogui.scroll('up')",
    "pyautogui.scroll(1, x=5)",
    "pyautogui.moveTo()",
    "pyautogui.moveTo(1, 2, tween=pyautogui.easeInQuad)",
    "pyautogui.dragTo()",
    "pyautogui.dragTo(1, 2, 0.5, 'left')",
    "pyautogui.moveRel(10, 10)",
    "pyautogui.move(10, 10)",
    "pyautogui.dragRel(10, 10)",
    "pyautogui.drag(10, 10)",
    "pyautogui.screenshot()",
    "pyautogui.locateOnScreen('x.png')",
    "pyautogui.position()",
    "pyautogui.alert('hi')",
    "pyautogui.FAILSAFE",
    "time.time()",
    "time.sleep(-1)",
    "time.sleep(3600)",
    "time.sleep('1')",
    "time.sleep()",
    "subprocess.run(['ls'])",
    "sys.exit(0)",
    "print('hi')",
    "pyautogui.click(-5, 3)",
    "pyautogui.click(3, -5)",
    "pyautogui.click(-0.6, 3)",
    "pyautogui.click(1, 2)(3)",
    "pyautogui['click'](1, 2)",
    "pyautogui.click.__globals__['os'].system('x')",
    "().__class__.__base__.__subclasses__()",
    "'a string'",
    "42",
    "pyautogui",
    "pyautogui.click",
    "await pyautogui.click(1, 2)",
    "pyautogui.click(1, 2) if True else None",
    "pyautogui.click(x := 1, 2)",
    "pyautogui.click(1, 2",
    "pyautogui.click(1,, 2)",
    "def",
    "pyautogui.write('unterminated)",
    "pyautogui.click(1, 2)\x00",
    "(" * 500 + ")" * 500,
    "-" * 15_000 + "1",
    "pyautogui.click(" + "9" * 5000 + ", 1)",
]


@pytest.mark.parametrize("code", ATTACKS, ids=[c[:60] for c in ATTACKS])
def test_rejected(code: str) -> None:
    with pytest.raises(ActionError):
        parse_pyautogui(code)


@pytest.mark.parametrize("code", ATTACKS[:40], ids=[c[:60] for c in ATTACKS[:40]])
def test_rejected_via_parse_action(code: str) -> None:
    with pytest.raises(ActionError):
        parse_action(code)


@pytest.mark.parametrize(
    ("code", "fragment"),
    [
        ("os.system('x')", "line 1: call of os.system is not allowed"),
        ("import os", "import os"),
        ("import pyautogui as p", "import pyautogui as p"),
        ("from os import system", "from os import"),
        ("pyautogui.os.system('x')", "call of pyautogui.os.system"),
        ("pyautogui.screenshot()", "call of pyautogui.screenshot"),
        ("pyautogui.click(1, 2, foo=3)", "'foo'"),
        ("pyautogui.click(x, 1)", "'x'"),
        ("pyautogui.write(f'{x}')", "f-string"),
        ("pyautogui.click(1+1, 2)", "arithmetic"),
        ("pyautogui.click(*a)", "*args"),
        ("pyautogui.click(**k)", "**kwargs"),
        ("pyautogui.click(-5, 3)", "non-negative"),
        ("pyautogui.moveRel(1, 1)", "relative"),
        ("pyautogui.dragRel(1, 1)", "relative"),
        ("x = 1", "Assign"),
        ("for i in range(3): pass", "For"),
        ("pyautogui.click(1, 2", "syntax error"),
    ],
)
def test_error_message_names_the_construct(code: str, fragment: str) -> None:
    with pytest.raises(ActionError) as info:
        parse_pyautogui(code)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("code", "line"),
    [
        ("import pyautogui\nos.system('x')", 2),
        ("pyautogui.click(1, 2)\n\npyautogui.click(x, 2)", 3),
        ("pyautogui.click(1, 2)\npyautogui.write('a')\npyautogui.click(1, 2, foo=1)", 3),
        ("pyautogui.click(1, 2)\nx = 1\n", 2),
        ("pyautogui.click(1, 2)\npyautogui.click(1, 2\n", 2),
        ("pyautogui.click(1, 2)\n\n\n\npyautogui.move(1, 1)", 5),
    ],
)
def test_error_message_has_line_number(code: str, line: int) -> None:
    with pytest.raises(ActionError, match=rf"^line {line}: "):
        parse_pyautogui(code)


def test_too_long_input() -> None:
    code = "pyautogui.write('" + "a" * MAX_CODE_CHARS + "')"
    with pytest.raises(ActionError, match="too long"):
        parse_pyautogui(code)


def test_long_but_allowed_input() -> None:
    text = "a" * MAX_TEXT_CHARS
    lines = "\n".join([f"pyautogui.write('{text}')"] * ((MAX_CODE_CHARS - 100) // (len(text) + 20)))
    assert len(lines) > MAX_CODE_CHARS // 2
    assert parse_pyautogui(lines)[0] == Action("type", text=text)


@pytest.mark.parametrize(("code", "fragment"), [
    ("pyautogui.write('" + "a" * (MAX_TEXT_CHARS + 1) + "')", "at most 2000 characters"),
    ("pyautogui.scroll(100000)", "dy must be an integer in -100..100"),
    ("pyautogui.hscroll(-101)", "dx must be an integer in -100..100"),
    ("pyautogui.press('a', presses=101)", "presses must be an integer in 1..100"),
    ("pyautogui.press(['a', 'b', 'c'], presses=40)", "over the limit of 100 key presses"),
    ("pyautogui.sleep(61)", "seconds must be in 0..60"),
    ("pyautogui.hotkey(" + ", ".join(["'a'"] * 17) + ")", "at most 16 keys"),
])
def test_magnitudes_are_capped_where_parsed(code: str, fragment: str) -> None:
    with pytest.raises(ActionError, match=re.escape(fragment)):
        parse_pyautogui(code)


def test_too_many_actions() -> None:
    ok = "\n".join(["pyautogui.press('a')"] * MAX_TURN_ACTIONS)
    assert len(parse_pyautogui(ok)) == MAX_TURN_ACTIONS
    with pytest.raises(ActionError, match="too many actions"):
        parse_pyautogui(ok + "\npyautogui.press('a')")


def test_imports_do_not_count_as_actions() -> None:
    code = "import pyautogui\n" * 10 + "\n".join(["pyautogui.press('a')"] * MAX_TURN_ACTIONS)
    assert len(parse_pyautogui(code)) == MAX_TURN_ACTIONS


def test_non_string_input() -> None:
    with pytest.raises(ActionError):
        parse_pyautogui(b"pyautogui.click(1, 2)")  # type: ignore[arg-type]


# --- nothing is ever executed ------------------------------------------------------------------------


def _payloads(target: Path) -> list[str]:
    t = str(target)
    return [
        f"open({t!r}, 'w')",
        f"open({t!r}, 'w').write('x')",
        f"__import__('os').system('touch {t}')",
        f"import os\nos.system('touch {t}')",
        f"import pathlib\npathlib.Path({t!r}).touch()",
        f"exec(\"open({t!r}, 'w')\")",
        f"eval(\"open({t!r}, 'w')\")",
        f"pyautogui.click(1, 2)\nopen({t!r}, 'w')",
        f"pyautogui.write(open({t!r}, 'w'))",
        f"pyautogui.write(f\"{{open({t!r}, 'w')}}\")",
        f"pyautogui.click(x=__import__('os').system('touch {t}'), y=1)",
        f"pyautogui.os.system('touch {t}')",
        f"getattr(__import__('os'), 'system')('touch {t}')",
        f"[open({t!r}, 'w') for _ in range(1)]",
        f"(lambda: open({t!r}, 'w'))()",
        f"with open({t!r}, 'w') as f: pass",
        f"import subprocess\nsubprocess.run(['touch', {t!r}])",
        f"pyautogui.hotkey(*[open({t!r}, 'w')])",
        f"pyautogui.click(**{{'x': open({t!r}, 'w')}})",
    ]


@pytest.mark.parametrize("index", range(len(_payloads(Path("/tmp/x")))))
def test_payload_is_never_executed(index: int) -> None:
    target = Path(f"/tmp/retrace-pwned-{uuid.uuid4().hex}")
    code = _payloads(target)[index]
    try:
        with pytest.raises(ActionError):
            parse_pyautogui(code)
        assert not target.exists(), f"parsing executed model code: {code!r}"
    finally:
        target.unlink(missing_ok=True)


def test_side_effect_of_valid_looking_code_is_not_performed() -> None:
    # Even accepted code only produces data: typing a shell command yields a `type` action, nothing runs.
    target = Path(f"/tmp/retrace-pwned-{uuid.uuid4().hex}")
    actions = parse_pyautogui(f"pyautogui.write('touch {target}\\n')")
    assert actions == [Action("type", text=f"touch {target}\n")]
    assert not target.exists()


# --- Action, normalize_key, parse_action -------------------------------------------------------------

ROUND_TRIP: list[Action] = [
    Action("click"),
    Action("click", 1, 2, button="right", clicks=3),
    Action("move", 5, 6),
    Action("drag", x2=7, y2=8),
    Action("drag", 1, 2, 7, 8, button="middle"),
    Action("mouse_down", 1, 2),
    Action("mouse_up", button="right"),
    Action("scroll", 1, 2, dy=-3),
    Action("scroll", dx=4),
    Action("type", text="héllo €\n中"),
    Action("key", keys=("enter",), presses=3),
    Action("hotkey", keys=("ctrl", "shift", "t")),
    Action("key_down", keys=("shift",)),
    Action("key_up", keys=("shift",)),
    Action("wait", seconds=1.5),
    Action("done"),
    Action("fail"),
]


@pytest.mark.parametrize("action", ROUND_TRIP, ids=[a.describe() for a in ROUND_TRIP])
def test_dict_round_trip(action: Action) -> None:
    data = action.to_dict()
    assert data["action"] == action.kind
    assert Action.from_dict(data) == action
    assert parse_action(data) == [action]


def test_to_dict_omits_defaults() -> None:
    assert Action("click", 1, 2).to_dict() == {"action": "click", "x": 1, "y": 2}
    assert Action("hotkey", keys=("ctrl", "c")).to_dict() == {"action": "hotkey", "keys": ["ctrl", "c"]}


def test_from_dict_accepts_single_key_string() -> None:
    assert Action.from_dict({"action": "key", "keys": "Return"}) == Action("key", keys=("enter",))


@pytest.mark.parametrize(
    "data",
    [
        {"x": 1},
        {"action": "teleport"},
        {"action": "click", "z": 1},
        {"action": "click", "x": 1},
        {"action": "click", "x": -1, "y": 2},
        {"action": "click", "button": "foo"},
        {"action": "move"},
        {"action": "drag", "x2": 1},
        {"action": "scroll"},
        {"action": "key"},
        {"action": "key", "keys": ["nosuchkey"]},
        {"action": "wait", "seconds": 61},
    ],
)
def test_from_dict_rejects(data: dict[str, object]) -> None:
    with pytest.raises(ActionError):
        Action.from_dict(data)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Return", "enter"),
        ("return", "enter"),
        ("ENTER", "enter"),
        ("ctrl", "ctrl"),
        ("Control", "ctrl"),
        ("ctrl_l", "ctrl"),
        ("Escape", "esc"),
        ("cmd", "win"),
        ("command", "win"),
        ("super", "win"),
        ("option", "alt"),
        ("del", "delete"),
        ("PgUp", "pageup"),
        ("ArrowLeft", "left"),
        (" ", "space"),
        ("\n", "enter"),
        ("\t", "tab"),
        ("a", "a"),
        ("A", "A"),
        ("é", "é"),
        ("F5", "f5"),
        ("f24", "f24"),
    ],
)
def test_normalize_key(name: str, expected: str) -> None:
    assert normalize_key(name) == expected


@pytest.mark.parametrize("name", ["", "nosuchkey", "f25", None, 5])
def test_normalize_key_rejects(name: object) -> None:
    with pytest.raises(ActionError):
        normalize_key(name)  # type: ignore[arg-type]


def test_parse_action_dict_and_str() -> None:
    assert parse_action({"action": "click", "x": 1, "y": 2}) == [Action("click", 1, 2)]
    assert parse_action("pyautogui.click(1, 2)\npyautogui.press('enter')") == [
        Action("click", 1, 2),
        Action("key", keys=("enter",)),
    ]
    assert parse_action("DONE") == [Action("done")]


@pytest.mark.parametrize("value", [None, 1, ["pyautogui.click(1, 2)"], b"DONE"])
def test_parse_action_rejects_other_types(value: object) -> None:
    with pytest.raises(ActionError):
        parse_action(value)


def test_terminal_and_describe() -> None:
    assert Action("done").terminal and Action("fail").terminal
    assert not Action("click").terminal
    assert Action("click", 1, 2).describe() == "click(x=1, y=2)"
    assert Action("done").describe() == "done"
