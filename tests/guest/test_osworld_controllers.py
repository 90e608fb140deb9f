"""desktop-env's own PythonController and SetupController (OSWorld's package, imported module by module)
driving `retrace guest` on a real Xvfb desktop, then `serve_environment` on a real XvfbEnvironment: every
endpoint the package's controllers and getters call, with the shapes they read."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from PIL import Image

from pytest_retrace.envs.xvfb.environment import GUEST_HOME, XvfbEnvironment
from pytest_retrace.guest.server import serve_environment
from pytest_retrace.replay.cases import Task
from pytest_retrace.screen.frames import park_point
from tests.guests import Display, Guest, needs_desktop, osworld_module

pytestmark = [pytest.mark.desktop, needs_desktop]
SIZE = (640, 480)
FAST = 0.05  # the controllers' retry_interval: a call that fails is retried 3 times, 5 s apart by default


@pytest.fixture(scope="module")
def desktop_env() -> Any:
    return osworld_module("desktop_env.controllers.setup")  # imports controllers.python too


@pytest.fixture(scope="module")
def display() -> Iterator[Display]:
    d = Display(SIZE, wm=True)  # a window manager: activate and close act through it, as on OSWorld's VM
    yield d
    d.close()


@pytest.fixture(scope="module")
def guest(display: Display, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    g = Guest(display, tmp_path_factory.mktemp("osworld") / "home").start()
    yield g
    g.close()


def controllers(desktop_env: Any, port: int, cache: Path, **python: Any) -> tuple[Any, Any]:
    python_ctl = desktop_env.PythonController("127.0.0.1", port, **python)
    python_ctl.retry_interval = FAST
    setup_ctl = desktop_env.SetupController("127.0.0.1", port, cache_dir=str(cache), screen_width=SIZE[0],
                                            screen_height=SIZE[1])
    return python_ctl, setup_ctl


@pytest.fixture
def ctl(desktop_env: Any, guest: Guest, tmp_path: Path) -> tuple[Any, Any]:
    return controllers(desktop_env, guest.port, tmp_path)


def wait_until(check: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.05)
    return value


def test_get_file_present_and_missing(ctl: tuple[Any, Any], guest: Guest) -> None:
    python, _ = ctl
    (guest.home / "present.bin").write_bytes(b"\x00data\xff")
    assert python.get_file(str(guest.home / "present.bin")) == b"\x00data\xff"
    assert python.get_file("~/present.bin") == b"\x00data\xff"
    assert python.get_file(str(guest.home / "missing.bin")) is None


def test_python_commands_and_scripts(ctl: tuple[Any, Any], guest: Guest) -> None:
    python, _ = ctl
    # the default prefix imports pyautogui, as on OSWorld's VMs (the guest's `python` is the venv's)
    res = python.execute_python_command("print(pyautogui.size())")
    assert res["returncode"] == 0 and f"width={SIZE[0]}, height={SIZE[1]}" in res["output"], res
    assert python.get_vm_platform() == "Linux"
    ok = python.run_python_script("import os\nprint(os.getcwd())")
    assert ok["status"] == "success" and ok["return_code"] == 0 and ok["output"].strip() == str(guest.home), ok
    bad = python.run_python_script("import sys\nprint('partial')\nsys.exit(3)")
    assert (bad["status"], bad["return_code"], bad["output"]) == ("error", 3, "partial\n"), bad
    assert bad["error"] == "Process exited with code 3"
    raised = python.run_python_script("raise ValueError('nope')")
    assert raised["status"] == "error" and "ValueError: nope" in raised["error"], raised
    assert not list(Path("/tmp").glob("retrace-guest-*.py"))  # the script file is removed


def test_bash_scripts(ctl: tuple[Any, Any], guest: Guest) -> None:
    python, _ = ctl
    (guest.home / "work dir").mkdir(exist_ok=True)
    res = python.run_bash_script("echo out\necho err >&2\npwd\nexit 4", timeout=20, working_dir="~/work dir")
    assert res == {"status": "error", "output": f"out\nerr\n{guest.home}/work dir\n", "error": "", "returncode": 4}
    assert python.run_bash_script("[[ -n $BASH_VERSION ]] && echo bash")["output"] == "bash\n"  # bash, not sh
    missing = guest.post_json("/run_bash_script", {"script": "true", "working_dir": "~/no-such-dir"})
    assert missing.status == 400 and "Working directory does not exist" in missing.json()["output"]
    started = time.monotonic()
    slow = guest.post_json("/run_bash_script", {"script": "sleep 30", "timeout": 1})
    assert slow.status == 500 and time.monotonic() - started < 15
    assert slow.json() == {"status": "error", "output": "Script execution timed out after 1 seconds", "error": "",
                           "returncode": -1}


def test_screen_window_wallpaper_desktop_and_directory(ctl: tuple[Any, Any], guest: Guest) -> None:
    python, setup = ctl
    assert python.get_vm_screen_size() == {"width": SIZE[0], "height": SIZE[1]}
    assert python.get_terminal_output() is None  # OSWorld's answer when no terminal is active (no AT-SPI here)
    assert python.get_accessibility_tree() is None  # a 501: unsupported here, never a made-up tree
    reply = guest.request("GET", "/accessibility")
    assert reply.status == 501 and "AT-SPI" in reply.json()["error"]

    setup.setup([{"type": "launch", "parameters": {"command": ["xterm", "-title", "sized", "-geometry", "40x8+5+5"]}}])
    guest.display.wait_window("sized")
    size = python.get_vm_window_size("XTerm")  # WM_CLASS "xterm", "XTerm", either one, ignoring case
    from Xlib import display as xdisplay

    wid = int(guest.display.windows("sized")[0])
    d = xdisplay.Display(guest.display.name)
    geometry = d.create_resource_object("window", wid).get_geometry()
    d.close()
    assert size == {"width": geometry.width, "height": geometry.height} and 0 < size["width"] < SIZE[0], size
    assert python.get_vm_window_size("no-such-class") is None

    picture = io.BytesIO()
    Image.new("RGB", (4, 3), (10, 200, 30)).save(picture, format="PNG")
    (guest.home / "wall.png").write_bytes(picture.getvalue())
    setup.setup([{"type": "change_wallpaper", "parameters": {"path": "~/wall.png"}}])
    assert python.get_vm_wallpaper() == picture.getvalue()

    assert python.get_vm_desktop_path() is None or (guest.home / "Desktop").is_dir()  # OSWorld's 404 without one
    (guest.home / "Desktop").mkdir(exist_ok=True)
    assert python.get_vm_desktop_path() == str(guest.home / "Desktop")

    tree = guest.home / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True, exist_ok=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "b.txt").write_text("b")
    (tree / "link").symlink_to("sub")  # a link to a directory is listed as one, as os.path.isdir says
    got = python.get_vm_directory_tree(str(tree))
    assert normalized(got) == {"type": "directory", "name": "tree", "children": [
        {"type": "file", "name": "a.txt"},
        {"type": "directory", "name": "link", "children": [
            {"type": "file", "name": "b.txt"}, {"type": "directory", "name": "deeper", "children": []}]},
        {"type": "directory", "name": "sub", "children": [
            {"type": "file", "name": "b.txt"}, {"type": "directory", "name": "deeper", "children": []}]}]}
    assert python.get_vm_directory_tree("/etc") is None  # outside the home and /tmp: 403
    assert guest.post_json("/list_directory", {"path": "/etc"}).status == 403
    assert guest.post_json("/list_directory", {"path": str(tree / "a.txt")}).status == 400


def normalized(node: dict[str, Any]) -> dict[str, Any]:
    """A directory tree with every node's children in name order (OSWorld's, like ours, lists them unsorted)."""
    if "children" not in node:
        return node
    kids = sorted((normalized(c) for c in node["children"]), key=lambda c: (c["name"], c["type"]))
    return {**node, "children": sorted(kids, key=lambda c: c["name"])}


def test_setup_steps(ctl: tuple[Any, Any], guest: Guest, tmp_path: Path) -> None:
    python, setup = ctl
    local = tmp_path / "upload.txt"
    local.write_bytes(b"uploaded\n")
    counter = "n=$(cat ~/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > ~/count; echo $n"
    tag = uuid.uuid4().hex[:8]
    assert setup.setup([
        {"type": "launch", "parameters": {"command": ["xterm", "-title", f"first-{tag}"]}},
        {"type": "upload_file", "parameters": {"files": [{"local_path": str(local), "path": "~/up/loaded.txt"}]}},
        # `until`: OSWorld's controller repeats the request until the output holds the string
        {"type": "execute", "parameters": {"command": ["sh", "-c", counter], "until": {"stdout": "3"}}},
        {"type": "execute", "parameters": {"command": "echo {SCREEN_WIDTH} $HOME > ~/shell.txt", "shell": True}},
        {"type": "command", "parameters": {"command": ["touch", "~/by-command"]}},
        {"type": "execute_with_verification", "parameters": {
            "command": f"xterm -title second-{tag} >/dev/null 2>&1 &", "shell": True,
            "verification": {"window_exists": f"SECOND-{tag}"}, "max_wait_time": 1, "check_interval": 0.2}},
    ]) is True
    assert (guest.home / "up" / "loaded.txt").read_bytes() == b"uploaded\n"
    assert (guest.home / "count").read_text() == "3\n"
    assert (guest.home / "shell.txt").read_text() == f"{SIZE[0]} {guest.home}\n"
    assert (guest.home / "by-command").exists()
    guest.display.wait_window(f"first-{tag}")


def test_verification_waits_and_fails(ctl: tuple[Any, Any], guest: Guest) -> None:
    _, setup = ctl
    # the command starts the window; its verification waits for it (OSWorld's execute_with_verification)
    setup.setup([{"type": "execute_with_verification", "parameters": {
        "command": "(sleep 0.5; touch ~/verified) >/dev/null 2>&1 &", "shell": True,
        "verification": {"command_success": "test -f ~/verified"}, "max_wait_time": 20, "check_interval": 0.1}}])
    assert (guest.home / "verified").exists()
    with pytest.raises(Exception, match="verification failed"):
        setup.setup([{"type": "execute_with_verification", "parameters": {
            "command": ["true"], "verification": {"window_exists": "no such window anywhere"}, "max_wait_time": 1}}])
    bad = guest.post_json("/setup/execute_with_verification", {"command": ["true"], "verification": {"x": "y"}})
    assert bad.status == 400 and "unknown key 'x'" in bad.json()["error"]


def active_title(display: Display) -> str:
    res = subprocess.run(["xdotool", "getactivewindow", "getwindowname"], env=display.env(), capture_output=True,
                         text=True, check=False)
    return res.stdout.strip()


def test_open_activate_and_close_windows(ctl: tuple[Any, Any], guest: Guest) -> None:
    _, setup = ctl
    tag = uuid.uuid4().hex[:8]
    setup.setup([{"type": "launch", "parameters": {"command": f"xterm -title one-{tag} & xterm -title two-{tag}",
                                                    "shell": True}}])
    guest.display.wait_window(f"one-{tag}")
    guest.display.wait_window(f"two-{tag}")
    for name in (f"ONE-{tag}", f"two-{tag}"):  # a substring ignoring case, as wmctrl -a
        setup.setup([{"type": "activate_window", "parameters": {"window_name": name}}])
        wait_until(lambda: active_title(guest.display).lower() == name.lower(), f"{name} active")
    strict = guest.post_json("/setup/activate_window", {"window_name": f"ONE-{tag}", "strict": True})
    assert strict.status == 404  # strict: the whole title, case and all
    by_class = guest.post_json("/setup/activate_window", {"window_name": "xterm.XTerm", "by_class": True})
    assert by_class.status == 200, by_class.body
    setup.setup([{"type": "close_window", "parameters": {"window_name": f"one-{tag}", "strict": True}}])
    wait_until(lambda: not guest.display.windows(f"one-{tag}"), "the window closed")
    assert guest.display.windows(f"two-{tag}")
    assert guest.post_json("/setup/close_window", {"window_name": "no such window"}).status == 404
    assert guest.post_json("/setup/close_window", {"strict": True}).status == 400

    setup.setup([{"type": "open", "parameters": {"path": "xterm"}}])  # an application by name: waits for it
    assert guest.display.windows("^xterm$")
    (guest.home / f"notes-{tag}.txt").write_text("opened\n")
    setup.setup([{"type": "open", "parameters": {"path": f"~/notes-{tag}.txt"}}])  # xdg-open, then its window
    assert guest.display.windows(f"notes-{tag}")


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg (apt install ffmpeg)")
def test_recording(ctl: tuple[Any, Any], guest: Guest, tmp_path: Path) -> None:
    python, _ = ctl
    assert guest.request("POST", "/end_recording", b"").status == 400  # none in progress
    python.start_recording()
    again = guest.request("POST", "/start_recording", b"")
    assert again.status == 400 and "already in progress" in again.json()["error"]
    subprocess.run(["xdotool", "mousemove", "100", "100"], env=guest.display.env(), check=True)
    time.sleep(1)
    python.end_recording(str(tmp_path / "video.mp4"))
    video = (tmp_path / "video.mp4").read_bytes()
    assert video[4:8] == b"ftyp" and len(video) > 1000  # an MP4 with its index written (ffmpeg stopped cleanly)
    probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=width,height", "-of", "csv=p=0",
                            str(tmp_path / "video.mp4")], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == f"{SIZE[0]},{SIZE[1]}"
    assert not list(Path("/tmp").glob("retrace-recording-*"))  # the guest's files are removed


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg (apt install ffmpeg)")
def test_a_recording_ends_with_its_server(display: Display, tmp_path: Path) -> None:
    own = Guest(display, tmp_path / "home").start()
    try:
        assert own.request("POST", "/start_recording", b"").status == 200
        files = wait_until(lambda: list(Path("/tmp").glob("retrace-recording-*.mp4")), "the recording's file")
        pid = int(subprocess.run(["pgrep", "-n", "-f", f"ffmpeg .*{files[0].name}"], capture_output=True,
                                 text=True, check=True).stdout)
    finally:
        own.close()  # SIGTERM: uvicorn's shutdown runs the app's lifespan end
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2],
               "ffmpeg gone after its server")
    assert not files[0].exists()


def assert_execute_shapes(url: str) -> None:
    """/execute as OSWorld's server runs it: a string split without `shell`, run by sh with it, and a list with
    `shell` as subprocess does (its first item the script, the rest $0, $1, ...)."""
    def execute(command: Any, shell: bool) -> dict[str, Any]:
        reply = requests.post(url + "/execute", json={"command": command, "shell": shell}, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()

    assert execute("printf %s-%s 'a b' c", False)["output"] == "a b-c"
    assert execute("printf %s-%s $((1+1)) x | tr x y", True)["output"] == "2-y"
    assert execute(["printf %s-%s \"$0\" \"$1\"", "a", "b"], True)["output"] == "a-b"
    assert execute(["python", "-c", "import sys; print(sys.version_info[0])"], False)["output"] == "3\n"
    assert execute("python -c 'print(6*7)'", True)["output"] == "42\n"


def test_execute_shapes(guest: Guest) -> None:
    assert_execute_shapes(guest.url)


def test_every_endpoint_the_package_calls_is_served(desktop_env: Any, guest: Guest) -> None:
    """Every "/..." path desktop-env's code sends a request to, read from its source: a new desktop-env
    version that calls a new endpoint fails here, not silently in a getter."""
    root = Path(desktop_env.__file__).parents[1]
    calls: set[tuple[str, str]] = set()
    for source in root.rglob("*.py"):
        if "providers" in source.parts or "server" in source.parts:
            continue  # the cloud providers talk to their own APIs
        text = source.read_text(errors="replace")
        for match in re.finditer(r"requests\.(get|post)\(\s*([^,)]*)", text):
            method, target = match.group(1).upper(), match.group(2)
            literals = re.findall(r"""f?["']([^"']*)["']""", target)
            if len(literals) == 1 and (tail := re.search(r"\}(/[\w/]*)$", literals[0])):
                path = tail.group(1)  # f"http://{vm_ip}:{port}/execute"
            else:
                path = "".join(lit for lit in literals if lit.startswith("/"))
            if path.startswith("/") and ("http_server" in target or "server_port" in target or "backend_url" in target
                                         or "port}" in target):
                calls.add((method, path))
    paths = {path for _, path in calls}
    assert {"/terminal", "/file", "/execute", "/setup/upload", "/setup/launch", "/run_bash_script",
            "/list_directory", "/setup/close_window"} <= paths, sorted(calls)
    assert len(calls) >= 22, sorted(calls)  # 22 in desktop-env 1.0.2: the grep still finds them
    unserved = []
    for method, path in sorted(calls):
        reply = guest.request(method, path, b"{}" if method == "POST" else None,
                              {"Content-Type": "application/json"} if method == "POST" else None)
        routed_404 = reply.status == 404 and reply.json().get("error") == "Not Found"
        if reply.status == 405 or routed_404:
            unserved.append((method, path, reply.status))
    guest.request("POST", "/end_recording", b"")  # the loop's /start_recording began one
    assert not unserved, unserved


# --- serve_environment: the same API for a desktop the server runs beside ------------------------------

def _task(*setup: dict) -> Task:
    true = {"func": "exact_match", "result": {"type": "rule", "rules": 1}, "expected": {"type": "rule", "rules": 1}}
    return Task.model_validate({"id": "t", "instruction": "x", "domain": "test", "setup": list(setup),
                                "evaluator": true})


def test_serve_environment_acts_inside_the_sandbox(env: XvfbEnvironment, desktop_env: Any, tmp_path: Path) -> None:
    name = f"inside-{uuid.uuid4().hex[:8]}.txt"
    env.reset(_task({"type": "file", "path": f"~/{name}", "content": "from the sandbox"}), Path("."))
    assert not Path(GUEST_HOME, name).exists()  # the file is the sandbox's, not this machine's
    with serve_environment(env) as served:
        python, setup = controllers(desktop_env, served.port, tmp_path)
        python_plain, _ = controllers(desktop_env, served.port, tmp_path, pkgs_prefix="{command}")
        assert python.get_file(f"{GUEST_HOME}/{name}") == b"from the sandbox"
        assert python.get_file(f"~/{name}") == b"from the sandbox"
        assert python.get_file(f"{GUEST_HOME}/missing") is None
        res = python_plain.execute_python_command(
            f"import os; print(os.path.expanduser('~'), open('{GUEST_HOME}/{name}').read())")
        assert res["returncode"] == 0 and res["output"] == f"{GUEST_HOME} from the sandbox\n", res
        # OSWorld's default prefix imports pyautogui: the sandbox's python3 (Debian's) has it from scripts/bootstrap,
        # and moves the task's own pointer on the task's own display
        default = python.execute_python_command("pyautogui.moveTo(7, 9); print(pyautogui.position(), pyautogui.size())")
        assert default["returncode"] == 0, default
        assert default["output"] == f"Point(x=7, y=9) Size(width={env.size[0]}, height={env.size[1]})\n", default
        assert env.cursor_position() == (7, 9)
        assert python.get_vm_screen_size() == {"width": env.size[0], "height": env.size[1]}
        assert python.get_screenshot().startswith(b"\x89PNG")
        raw = requests.get(f"{served.url}/screenshot", params={"format": "rgb"}, timeout=30)
        assert raw.headers["Content-Type"] == "application/octet-stream"
        assert (int(raw.headers["X-Screen-Width"]), int(raw.headers["X-Screen-Height"])) == env.size
        with Image.open(io.BytesIO(python.get_screenshot())) as image:
            assert raw.content == image.convert("RGB").tobytes() == env.screenshot().tobytes()
        tag = uuid.uuid4().hex[:8]
        assert setup.setup([
            {"type": "launch", "parameters": {"command": ["xterm", "-title", f"env-{tag}"]}},
            {"type": "execute", "parameters": {"command": "echo $HOME $DISPLAY > ~/shell.txt", "shell": True}},
            {"type": "open", "parameters": {"path": "xterm"}},
        ]) is True
        wait_until(lambda: env.find_windows(f"env-{tag}"), "the launched window")
        assert env.find_windows("^xterm$")
        assert env.read_file("~/shell.txt") == f"{GUEST_HOME} {env.display}\n".encode()
        assert python.run_bash_script("pwd")["output"] == f"{GUEST_HOME}\n"
        assert_execute_shapes(served.url)
        if shutil.which("ffmpeg"):  # ffmpeg runs in the sandbox, on its display, and its file is read from there
            python.start_recording()
            python.end_recording(str(tmp_path / "env.mp4"))
            assert (tmp_path / "env.mp4").read_bytes()[4:8] == b"ftyp"
        tree = python.get_vm_directory_tree(GUEST_HOME)
        assert {"type": "file", "name": name} in tree["children"]


def test_pyautogui_acts_right_after_a_reset(env: XvfbEnvironment, desktop_env: Any, tmp_path: Path) -> None:
    """OSWorld's config and postconfig steps press keys with ``python -c "import pyautogui; ..."``, its fail-safe on:
    the reset parks the pointer off the corners where pyautogui refuses to act (FailSafeException), so a step run
    before anything has moved the pointer still acts."""
    env.reset(_task(), Path("."))
    assert env.cursor_position() == park_point(env.size)
    with serve_environment(env) as served:
        _, setup = controllers(desktop_env, served.port, tmp_path)
        setup.setup([{"type": "execute", "parameters": {"command": [
            "python", "-c", "import pyautogui; pyautogui.hotkey('shift'); open('/home/user/acted', 'w').write('yes')"]}}])
    assert env.read_file("~/acted") == b"yes"
