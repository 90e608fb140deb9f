"""What the remote provider sends a Windows guest (WindowsAgentArena's VMs run OSWorld's server): the programs
as text, compiled to prove they are valid Python, and the requests to an OSWorld-like guest whose /platform says
Windows. No Windows VM is on this machine: none of it ran on Windows (docs/environments.md)."""

from __future__ import annotations

import ast
import base64
import json
import re
import urllib.parse

import pytest

from pytest_retrace.actions import Action
from pytest_retrace.envs.remote.actions import action_program
from pytest_retrace.envs.remote.windows import UNICODE_TYPING, command_program, shell_argv, windows_path
from tests.envs.test_remote import EVERY_KIND
from tests.envs.test_remote_errors import Leaky, leaky, start_env  # noqa: F401 (leaky: the fixture)


def _compiles(program: str) -> ast.Module:
    compile(program, "<guest program>", "exec")
    return ast.parse(program)


def test_paths() -> None:
    assert windows_path("~/Desktop/notes.txt") == r"%USERPROFILE%\Desktop\notes.txt"
    assert windows_path("/home/user/a b/c.xlsx") == r"%USERPROFILE%\a b\c.xlsx"  # GUEST_HOME is the home
    assert windows_path("report.docx") == r"%USERPROFILE%\report.docx"
    assert windows_path("~") == "%USERPROFILE%"
    assert windows_path("/tmp/x/y.txt") == r"%TEMP%\x\y.txt"
    assert windows_path(r"C:\Users\User\Desktop\a.txt") == r"C:\Users\User\Desktop\a.txt"
    assert windows_path("C:/Users/User/a.txt") == r"C:\Users\User\a.txt"


def test_command_programs() -> None:
    # cmd gets the command line as written: /s drops the outer quotes, the inner ones are cmd's own
    command = r'mkdir "C:\Users\User\Desktop\students work" && echo 100% > "%TEMP%\o.txt"'
    assert shell_argv(command, "cmd") == f'cmd /d /s /c "{command}"'
    program = command_program(command, 7.5)
    tree = _compiles(program)
    popen = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "subprocess.Popen")
    assert ast.literal_eval(popen.args[0]) == f'cmd /d /s /c "{command}"'  # the string reaches Popen unchanged
    assert "communicate(timeout=7.5)" in program and "code = 124" in program
    assert '["taskkill", "/T", "/F", "/PID", str(proc.pid)]' in program  # the whole tree, not only cmd.exe
    assert 'os.chdir(os.path.expanduser("~"))' in program  # the home: %USERPROFILE%
    # PowerShell gets it encoded: no character of it is quoted anywhere
    script = "Get-ChildItem \"$env:USERPROFILE\\Desktop\" | ForEach-Object { $_.Name + ' `\"' }"
    argv = shell_argv(script, "powershell")
    assert argv[:-1] == ["powershell", "-NoLogo", "-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass",
                         "-EncodedCommand"]
    assert base64.b64decode(argv[-1]).decode("utf-16-le") == script
    _compiles(command_program(script, 30, "powershell"))
    with pytest.raises(ValueError, match="shell: 'bash'"):
        shell_argv("ls", "bash")


def test_action_programs() -> None:
    for action in EVERY_KIND:
        program = action_program(action, windows=True)
        if program is not None:
            _compiles(program)
            assert "xdotool" not in program  # nothing of X11 on Windows
    typed = str(action_program(Action("type", text="Grüße €5"), windows=True))
    assert UNICODE_TYPING in typed
    assert "pyautogui.write('Gr', interval=0.025)" in typed and "_unicode('üß', 0.025)" in typed
    assert "pyautogui.write('e ', interval=0.025)" in typed and "_unicode('€', 0.025)" in typed
    assert UNICODE_TYPING not in str(action_program(Action("type", text="ascii"), windows=True))  # only when needed
    # the same pyautogui calls as on Linux otherwise
    click = Action("click", x=3, y=4, clicks=2)
    assert action_program(click, windows=True) == action_program(click)


def test_a_windows_guest_gets_windows_programs_and_paths(leaky: tuple[Leaky, str],  # noqa: F811
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    guest, url = leaky
    guest.platform = "Windows"
    env = start_env(url, monkeypatch, windows_shell="powershell")
    assert env.windows and env.platform == "Windows" and env.window_tool == "pygetwindow"
    assert not any("command -v" in str(c) for c in guest.executed)  # no probe for xdotool or wmctrl there
    guest.executed.clear()
    assert env.run("Remove-Item -Recurse $env:TEMP\\x", timeout=12).returncode == 0
    (argv,) = guest.executed
    assert isinstance(argv, list) and argv[:2] == ["python", "-c"]
    assert argv[2] == command_program("Remove-Item -Recurse $env:TEMP\\x", 12, "powershell")
    guest.executed.clear()
    assert env.read_file("~/Documents/a.txt") == b"data"
    env.write_file("/home/user/b c.txt", b"x")
    read, upload = guest.executed
    assert urllib.parse.parse_qs(read.decode()) == {"file_path": [r"%USERPROFILE%\Documents\a.txt"]}
    assert b'name="file_path"\r\n\r\n%USERPROFILE%\\b c.txt\r\n' in upload
    guest.output = "Book1 - Excel\nProgram Manager\n"
    guest.executed.clear()
    assert env.find_windows(r"excel$") == ["Book1 - Excel"]
    assert "pygetwindow.getAllTitles()" in guest.executed[0][2]
    guest.executed.clear()
    env.execute(Action("type", text="ñ"))
    assert re.search(r"_unicode\('ñ', 0\.025\)", guest.executed[-1][2])
    assert json.dumps(guest.executed[-1][2])  # a plain string program, as OSWorld's client sends
