"""OSWorld's evaluator blocks judged by OSWorld's own code (desktop-env) against a real ``retrace guest`` on an
Xvfb display: files written by real apps, OSWorld's scoring rules, and whose failure each failure is."""

from __future__ import annotations

import collections
import contextlib
import http.server
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pytest_retrace.envs import EnvError
from pytest_retrace.evaluators import EvaluatorError
from pytest_retrace.osworld import evaluate, package
from pytest_retrace.osworld.server import VMServer
from tests.guests import Display, Guest, needs_desktop

pytestmark = pytest.mark.skipif(package.root() is None, reason="desktop-env is not installed (scripts/bootstrap)")
EXAMPLES = Path("/work/shared/osworld/evaluation_examples/examples")
TABLE_RULES = {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}  # as OSWorld's calc tasks


def server_of(guest: Guest) -> VMServer:
    return VMServer("127.0.0.1", guest.port, chromium_port=9222, vlc_port=8080)


def vm_file(path: Path) -> dict[str, Any]:
    return {"type": "vm_file", "path": str(path), "dest": path.name}


def rule(rules: Any) -> dict[str, Any]:
    return {"type": "rule", "rules": rules}


def command(cmd: str | list[str], shell: bool = False) -> dict[str, Any]:
    return {"type": "vm_command_line", "command": cmd, "shell": shell}


class Counting(http.server.BaseHTTPRequestHandler):
    """A loopback web server counting every request: a getter that must not download must leave it at 0."""

    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        Counting.hits.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"downloaded")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def web() -> Iterator[str]:
    with counting_server() as url:
        yield url


@contextlib.contextmanager
def counting_server() -> Iterator[str]:
    """The base URL of a fresh :class:`Counting` server (its hits emptied)."""
    Counting.hits = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


# --- validate: OSWorld's block shape and what the package has -------------------------------------------


@pytest.mark.parametrize(("block", "message"), [
    ({"func": ["exact_match", "exact_match"], "result": [rule(1)], "expected": [rule(1), rule(1)]},
     "evaluator.result: invalid evaluator: must be a list of 2"),
    ({"func": "exact_match", "result": rule(1), "conj": "xor"}, "evaluator.conj: invalid evaluator: must be 'and'"),
    ({"func": 3, "result": rule(1)}, "evaluator.func: invalid evaluator"),
    ({"func": "exact_match"}, "evaluator.result: invalid evaluator: missing"),
    ({"func": ["exact_match", "no_such_metric"], "result": [rule(1), rule(1)]},
     "evaluator.func[1]: unknown metric: no_such_metric"),
    ({"func": "exact_match", "result": {"type": "no_such_getter"}}, "evaluator.result.type: unknown getter"),
    ({"func": "compare_audios", "result": rule(1)}, "evaluator.func: missing package: librosa"),
    ({"func": "exact_match", "result": {"type": "googledrive_file", "path": "x"}},
     "evaluator.result: needs a Google account: googledrive_file"),
    ({"func": "exact_match", "result": rule(1), "postconfig": [{"type": "login", "parameters": {}}]},
     "evaluator.postconfig[0] (login): needs a Google account: login (not supported)"),
    ({"func": "exact_match", "result": rule(1), "postconfig": [{"type": "execute", "parameters": {"command": "ls", "cmd": 1}}]},
     "evaluator.postconfig[0] (execute): bad config step: got an unexpected keyword argument 'cmd'"),
])
def test_validate_names_the_field_and_the_reason(block: dict[str, Any], message: str) -> None:
    if "librosa" in message and package.problem("metric", "compare_audios") is None:
        pytest.skip("librosa is installed here")
    with pytest.raises(EvaluatorError) as caught:
        evaluate.validate(block)
    assert str(caught.value).startswith(message)
    # the first of evaluator_problems, so validate and `retrace osworld check` cannot disagree
    reason, _ = evaluate.evaluator_problems(block)[0]
    assert str(caught.value).split(": ")[1] == reason


def test_evaluator_problems_lists_every_problem() -> None:
    block = {"func": ["nope1", "exact_match", "infeasible"], "result": [rule(1), {"type": "nope2"}, {}],
             "postconfig": [{"type": "googledrive", "parameters": {}}, {"type": "frobnicate", "parameters": {}}]}
    assert evaluate.evaluator_problems(block) == [
        ("unknown metric", "nope1"), ("unknown getter", "nope2"),
        ("needs a Google account", "googledrive"), ("unsupported config step", "frobnicate")]
    evaluate.validate({"func": "infeasible"})  # OSWorld's infeasible tasks have no result getter


def test_a_cloud_file_is_looked_up_in_the_cache_when_one_is_given(tmp_path: Path) -> None:
    block = {"func": "compare_text_file", "result": rule(1),
             "expected": {"type": "cloud_file", "path": "https://example.com/gold.txt", "dest": "gold.txt"}}
    assert evaluate.evaluator_problems(block) == []
    assert evaluate.evaluator_problems(block, tmp_path) == [("cloud file not in cache", "gold.txt")]
    (tmp_path / "gold.txt").write_text("x")
    assert evaluate.evaluator_problems(block, tmp_path) == []


def test_osworlds_own_linux_tasks_fail_validation_only_for_listed_reasons() -> None:
    files = sorted(EXAMPLES.glob("*/*.json"))
    if not files:
        pytest.skip(f"OSWorld's task files are not in {EXAMPLES}")
    first: collections.Counter[str] = collections.Counter()
    for path in files:
        block = json.loads(path.read_text(encoding="utf-8"))["evaluator"]
        problems = evaluate.evaluator_problems(block)
        try:
            evaluate.validate(block)
        except EvaluatorError as exc:
            assert problems and str(exc).split(": ")[1] == problems[0][0], path
            first[problems[0][0]] += 1
        else:
            assert problems == [], path
    # desktop-env 1.0.2 without easyocr (torch); a task's evaluator names a function its package lacks
    assert set(first) <= {"missing package", "needs a Google account", "unknown metric", "unknown getter",
                          "needs the accessibility tree"}, first
    # 33 tasks read the accessibility tree (AT-SPI), which our desktops do not serve yet: 326 of 369 validate
    assert len(files) - sum(first.values()) >= 320, first


# --- real files, OSWorld's metrics ---------------------------------------------------------------------


def soffice_xlsx(csv: Path, outdir: Path, profile: Path) -> Path:
    """A spreadsheet LibreOffice wrote (its own user profile: two instances on one profile block each other)."""
    subprocess.run(["soffice", f"-env:UserInstallation=file://{profile}", "--headless", "--convert-to", "xlsx",
                    "--outdir", str(outdir), str(csv)], check=True, capture_output=True, timeout=180)
    return outdir / f"{csv.stem}.xlsx"


@needs_desktop
@pytest.mark.desktop
@pytest.mark.skipif(shutil.which("soffice") is None, reason="needs LibreOffice")
def test_compare_table_on_a_spreadsheet_libreoffice_wrote_in_the_guest(guest: Guest, tmp_path: Path) -> None:
    home = guest.home
    (home / "sales.csv").write_text("item,qty,price\napple,3,1.5\npear,7,2.25\n")
    reply = guest.post_json("/execute", {"command": ["soffice", "--headless", "--convert-to", "xlsx", "--outdir",
                                                     "~", "~/sales.csv"], "timeout": 180}, timeout=200)
    assert reply.status == 200 and reply.json()["returncode"] == 0, reply.body
    assert (home / "sales.xlsx").is_file()
    cache = tmp_path / "cache"
    (tmp_path / "same").mkdir()
    (tmp_path / "same" / "sales.csv").write_text("item,qty,price\napple,3,1.5\npear,7,2.25\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "sales.csv").write_text("item,qty,price\napple,3,1.5\npear,8,2.25\n")
    for name in ("same", "other"):
        gold = soffice_xlsx(tmp_path / name / "sales.csv", tmp_path / name, tmp_path / "profile")
        cache.mkdir(exist_ok=True)
        shutil.copy(gold, cache / f"gold-{name}.xlsx")
    block = {"func": "compare_table", "result": vm_file(home / "sales.xlsx"), "options": TABLE_RULES,
             "expected": {"type": "cloud_file", "path": "https://example.com/gold.xlsx", "dest": "gold-same.xlsx"}}
    passed = evaluate.evaluate(block, server_of(guest), cache)
    assert (passed.score, passed.passed) == (1.0, True), passed.details
    block["expected"]["dest"] = "gold-other.xlsx"
    failed = evaluate.evaluate(block, server_of(guest), cache)
    assert (failed.score, failed.passed) == (0.0, False), failed.details
    assert failed.details[0].startswith(f"compare_table(vm_file {home / 'sales.xlsx'}): 0")


@needs_desktop
@pytest.mark.desktop
def test_vm_command_line_with_a_shell_and_with_a_list(guest: Guest, tmp_path: Path) -> None:
    (guest.home / "notes.txt").write_text("hello world\n")
    shell = {"func": "check_include_exclude", "result": command("cat ~/notes.txt | tr a-z A-Z", shell=True),
             "expected": rule({"include": ["HELLO WORLD"], "exclude": ["hello"]})}
    assert evaluate.evaluate(shell, server_of(guest), tmp_path).score == 1.0
    listed = {**shell, "result": command(["cat", str(guest.home / "notes.txt")])}  # no shell: lower case stays
    judged = evaluate.evaluate(listed, server_of(guest), tmp_path)
    assert judged.score == 0.0 and judged.details == [(f"check_include_exclude(vm_command_line "
                                                       f"{['cat', str(guest.home / 'notes.txt')]!r}): 0")]


@needs_desktop
@pytest.mark.desktop
def test_compare_text_file_against_a_cached_cloud_file(guest: Guest, tmp_path: Path, web: str) -> None:
    (guest.home / "poem.txt").write_text("roses are red\n")
    (tmp_path / "gold.txt").write_text("roses are red\n")
    block = {"func": "compare_text_file", "result": vm_file(guest.home / "poem.txt"),
             "expected": {"type": "cloud_file", "path": f"{web}/gold.txt", "dest": "gold.txt"}}
    assert evaluate.evaluate(block, server_of(guest), tmp_path).passed
    (guest.home / "poem.txt").write_text("violets are blue\n")
    assert evaluate.evaluate(block, server_of(guest), tmp_path).score == 0.0
    assert Counting.hits == []  # the gold file was in the cache: never fetched


@needs_desktop
@pytest.mark.desktop
@pytest.mark.parametrize(("conj", "funcs", "score", "not_run"), [
    ("and", ["one", "half"], 0.75, 0),  # the mean
    ("and", ["zero", "one"], 0.0, 1),  # 0 at the first 0, the rest not run
    ("or", ["half", "zero"], 0.5, 0),  # the max
    ("or", ["one", "zero"], 1.0, 1),  # 1 at the first 1
])
def test_conj_as_osworld_combines(guest: Guest, tmp_path: Path, conj: str, funcs: list[str], score: float,
                                  not_run: int) -> None:
    metric = {"one": ("check_include_exclude", command("echo yes", shell=True), rule({"include": ["yes"]})),
              "zero": ("check_include_exclude", command("echo no", shell=True), rule({"include": ["yes"]})),
              # fuzz.ratio("ab", "abcdef") = 2 * 2 / 8: OSWorld's fuzzy_match scores 0.5
              "half": ("fuzzy_match", command(["printf", "ab"]), rule({"expected": "abcdef"}))}
    block = {"func": [metric[f][0] for f in funcs], "result": [metric[f][1] for f in funcs],
             "expected": [metric[f][2] for f in funcs], "conj": conj}
    judged = evaluate.evaluate(block, server_of(guest), tmp_path)
    assert judged.score == score and judged.passed == (score >= 1.0), judged.details
    assert sum("not run" in line for line in judged.details) == not_run


@needs_desktop
@pytest.mark.desktop
def test_infeasible_and_a_last_action_fail(guest: Guest, tmp_path: Path) -> None:
    infeasible = {"func": "infeasible"}
    assert evaluate.evaluate(infeasible, server_of(guest), tmp_path, last_action="FAIL").score == 1.0
    assert evaluate.evaluate(infeasible, server_of(guest), tmp_path, last_action="DONE").score == 0.0
    assert evaluate.evaluate(infeasible, server_of(guest), tmp_path).score == 0.0
    feasible = {"func": "check_include_exclude", "result": command("echo yes", shell=True),
                "expected": rule({"include": ["yes"]})}
    assert evaluate.evaluate(feasible, server_of(guest), tmp_path).score == 1.0
    assert evaluate.evaluate(feasible, server_of(guest), tmp_path, last_action="FAIL").score == 0.0


@needs_desktop
@pytest.mark.desktop
def test_postconfig_runs_first_and_execute_waits_until(guest: Guest, tmp_path: Path) -> None:
    counter = guest.home / "count"
    counter.unlink(missing_ok=True)
    # each run adds one; `until` makes OSWorld's SetupController run it again until it prints 3
    bump = f"n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}; echo $n"
    block = {"func": "check_include_exclude", "result": command(["cat", str(counter)]),
             "expected": rule({"include": ["3"]}),
             "postconfig": [{"type": "execute", "parameters": {"command": bump, "shell": True,
                                                               "until": {"stdout": "3"}}}]}
    judged = evaluate.evaluate(block, server_of(guest), tmp_path)
    assert judged.passed, judged.details
    assert counter.read_text() == "3\n"
    assert judged.details[0] == "postconfig: 1 step(s) run"


@needs_desktop
@pytest.mark.desktop
def test_a_postconfig_failing_on_what_the_agent_left_scores_0(guest: Guest, tmp_path: Path) -> None:
    block = {"func": "check_include_exclude", "result": command("echo yes", shell=True),
             "expected": rule({"include": ["yes"]}),
             "postconfig": [{"type": "open", "parameters": {"path": str(guest.home / "never-saved.odt")}}]}
    judged = evaluate.evaluate(block, server_of(guest), tmp_path)
    assert judged.score == 0.0 and judged.details[0].startswith("postconfig: Setup step 1 failed: _open_setup")


@needs_desktop
@pytest.mark.desktop
def test_a_missing_vm_file_scores_0_in_seconds(guest: Guest, tmp_path: Path) -> None:
    (tmp_path / "gold.txt").write_text("x\n")
    block = {"func": "compare_text_file", "result": vm_file(guest.home / "not-saved.txt"),
             "expected": {"type": "cloud_file", "path": "https://example.com/gold.txt", "dest": "gold.txt"}}
    evaluate.evaluate(block, server_of(guest), tmp_path)  # desktop-env's modules imported before timing
    started = time.monotonic()
    judged = evaluate.evaluate(block, server_of(guest), tmp_path)
    took = time.monotonic() - started
    assert judged.score == 0.0
    assert "[the result getter gave None]: 0" in judged.details[0]
    assert "Failed to get file. Status code: 404 (x3)" in judged.details[0]  # desktop-env's log, in the details
    assert took < 8.0, f"{took:.1f} s: desktop-env's controller sleeps 15 s on it unless told otherwise"


@needs_desktop
@pytest.mark.desktop
def test_a_cloud_file_not_in_the_cache_is_an_evaluator_error_before_any_request(
        guest: Guest, tmp_path: Path, web: str) -> None:
    (guest.home / "poem.txt").write_text("x\n")
    block = {"func": "compare_text_file", "result": vm_file(guest.home / "poem.txt"),
             "expected": {"type": "cloud_file", "path": f"{web}/gold.txt", "dest": "gold.txt"}}
    with pytest.raises(EvaluatorError, match=r"^evaluator.expected: cloud file not in cache: gold.txt"):
        evaluate.evaluate(block, server_of(guest), tmp_path)
    assert Counting.hits == []
    assert not (tmp_path / "poem.txt").exists()  # not even the result was fetched


@needs_desktop
@pytest.mark.desktop
def test_the_guest_dying_mid_evaluation_is_an_env_error(tmp_path: Path) -> None:
    display = Display()
    doomed = Guest(display, tmp_path / "home").start()
    try:
        assert doomed.proc is not None
        # the first func's command kills the VM server; the second func then finds nobody to ask
        block = {"func": ["check_include_exclude", "compare_text_file"], "conj": "or",
                 "result": [command(f"kill {doomed.proc.pid}; echo no", shell=True), vm_file(tmp_path / "x")],
                 "expected": [rule({"include": ["yes"]}), rule(str(tmp_path / "x"))]}
        with pytest.raises(EnvError, match="VM server .* is unreachable"):
            evaluate.evaluate(block, server_of(doomed), tmp_path / "cache")
        assert doomed.proc.wait(timeout=30) is not None
    finally:
        doomed.close()
        display.close()


def test_an_unreachable_server_is_an_env_error_before_any_step(tmp_path: Path) -> None:
    gone = VMServer("127.0.0.1", 9, chromium_port=9222, vlc_port=8080)  # the discard port: nothing listens
    block = {"func": "check_include_exclude", "result": command("echo yes"), "expected": rule({"include": ["y"]})}
    with pytest.raises(EnvError, match="unreachable"):
        evaluate.evaluate(block, gone, tmp_path)


def test_a_package_missing_at_run_time_is_an_evaluator_error(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    def stand_in(kind: str, name: str) -> Any:
        def missing(*args: Any, **kwargs: Any) -> Any:
            raise package.Unavailable("docs.easyocr.Reader needs easyocr (needs torch), which is not installed")
        return missing
    monkeypatch.setattr(package, "load", stand_in)
    monkeypatch.setattr(evaluate, "alive", lambda server: None)
    monkeypatch.setattr(evaluate, "run_steps", lambda *args: None)
    block = {"func": "exact_match", "result": rule("x"), "expected": rule({"expected": "x"})}
    with pytest.raises(EvaluatorError, match="harness cannot run this evaluator: .*easyocr"):
        evaluate.evaluate(block, VMServer("127.0.0.1", 9, 9222, 8080), tmp_path)


# OSWorld's own DesktopEnv.evaluate(), run in a child process on a DesktopEnv that is only the attributes its
# evaluate() and getters read (no VM provider is made). desktop_env.desktop_env imports gymnasium (for a base
# class) and every metric module (easyocr, librosa): stand-ins here, as none of the blocks compared use them.
_OSWORLD = r"""
import importlib.abc, importlib.machinery, json, sys, types
gym = types.ModuleType("gymnasium"); gym.Env = type("Env", (), {}); sys.modules.setdefault("gymnasium", gym)
class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"easyocr", "librosa", "torch"}:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec): return None
    def exec_module(self, module): module.__path__ = []
sys.meta_path.insert(0, Stub())
from desktop_env.desktop_env import DesktopEnv
from desktop_env.controllers.python import PythonController
from desktop_env.controllers.setup import SetupController
job = json.load(sys.stdin)
scores = []
for case in job["cases"]:
    env = object.__new__(DesktopEnv)
    env.vm_ip, env.server_port, env.chromium_port, env.vlc_port = "127.0.0.1", job["port"], 9222, 8080
    env.cache_dir, env.enable_proxy, env.current_use_proxy, env.is_environment_used = job["cache"], False, False, False
    env.controller = PythonController("127.0.0.1", job["port"])
    env.controller.retry_interval = 0.2  # the score is the same; only the waiting differs
    env.setup_controller = SetupController("127.0.0.1", job["port"], 9222, 8080, job["cache"])
    env.action_history = [case["last"]] if case["last"] else []
    env._set_evaluator_info({"evaluator": case["evaluator"]})
    scores.append(float(env.evaluate()))
print("SCORES " + json.dumps(scores))
"""


@needs_desktop
@pytest.mark.desktop
def test_the_same_scores_as_osworlds_own_evaluate(guest: Guest, tmp_path: Path) -> None:
    home = guest.home
    (home / "same.txt").write_text("alpha\nbeta\n")
    (home / "other.txt").write_text("alpha\ngamma\n")
    (home / "post.txt").unlink(missing_ok=True)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for cache in (ours, theirs):
        cache.mkdir()
        (cache / "gold.txt").write_text("alpha\nbeta\n")
    gold = {"type": "cloud_file", "path": "https://example.com/gold.txt", "dest": "gold.txt"}
    yes, no = command("echo yes", shell=True), command(["echo", "no"])
    has_yes = rule({"include": ["yes"], "exclude": ["no"]})
    half = ("fuzzy_match", command(["printf", "ab"]), rule({"expected": "abcdef"}))

    def many(conj: str, *funcs: tuple[str, Any, Any]) -> dict[str, Any]:
        return {"func": [f[0] for f in funcs], "result": [f[1] for f in funcs],
                "expected": [f[2] for f in funcs], "conj": conj}

    one, zero = ("check_include_exclude", yes, has_yes), ("check_include_exclude", no, has_yes)
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"func": "compare_text_file", "result": vm_file(home / "same.txt"), "expected": gold}, None),
        ({"func": "compare_text_file", "result": vm_file(home / "other.txt"), "expected": gold}, None),
        ({"func": "compare_text_file", "result": vm_file(home / "never.txt"), "expected": gold}, None),
        ({"func": "compare_text_file", "result": vm_file(home / "same.txt"), "expected": gold}, "FAIL"),
        ({"func": "check_include_exclude", "result": yes, "expected": has_yes}, "DONE"),
        ({"func": "infeasible"}, "FAIL"), ({"func": "infeasible"}, None),
        (many("and", one, half), None), (many("and", half, zero, one), None), (many("and", zero, one), None),
        (many("or", half, zero), None), (many("or", zero, one, half), None), (many("or", zero, zero), None),
        ({"func": "check_include_exclude", "result": command(["cat", str(home / "post.txt")]),
          "expected": rule({"include": ["after"]}),
          "postconfig": [{"type": "execute", "parameters": {"command": f"echo after > {home / 'post.txt'}",
                                                            "shell": True}}]}, None),
    ]
    mine = [evaluate.evaluate(block, server_of(guest), ours, last_action=last).score for block, last in cases]
    (home / "post.txt").unlink()
    job = json.dumps({"port": guest.port, "cache": str(theirs),
                      "cases": [{"evaluator": block, "last": last} for block, last in cases]})
    run = subprocess.run([sys.executable, "-c", _OSWORLD], input=job, capture_output=True, text=True,
                         timeout=600, cwd=tmp_path, check=False)
    found = [line for line in run.stdout.splitlines() if line.startswith("SCORES ")]
    assert run.returncode == 0 and found, run.stderr[-3000:]
    assert mine == json.loads(found[0].removeprefix("SCORES "))
    assert mine == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.75, 0.0, 0.0, 0.5, 1.0, 0.0, 1.0]


class Broken(http.server.BaseHTTPRequestHandler):
    """A VM server failing for its own reasons: 500 on every request once ``failing`` is set."""

    failing: ClassVar[list[bool]] = [False]

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self) -> None:
        status = 500 if Broken.failing[0] else 200
        body = b"Linux" if self.path == "/platform" else json.dumps({"output": "yes", "error": "", "returncode": 0,
                                                                     "status": "success"}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.path == "/execute":  # it breaks after answering the first func's command
            Broken.failing[0] = True

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_answering_500_is_an_env_error_not_a_score(tmp_path: Path) -> None:
    Broken.failing = [False]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = VMServer("127.0.0.1", httpd.server_address[1], 9222, 8080)
        ask = ("check_include_exclude", command("echo yes", shell=True), rule({"include": ["yes"]}))
        block = {"func": [ask[0]] * 2, "result": [ask[1]] * 2, "expected": [ask[2]] * 2}
        with pytest.raises(EnvError, match=r"/platform answers 500"):
            evaluate.evaluate(block, server, tmp_path)
    finally:
        httpd.shutdown()
        httpd.server_close()
