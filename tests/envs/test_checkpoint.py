"""Checkpoints of a whole desktop (envs/xvfb/checkpoint.py) on a real Xvfb desktop with real apps and CRIU.

A restored desktop must be the dumped one (every pixel, the files, an app that takes input), as often as it is
restored; what cannot be dumped must say why and leave the desktop as it was; and the in-task layout the
checkpoints need must keep the sandbox's promises (the task cannot end the X server)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pytest_retrace.actions import Action
from pytest_retrace.envs import EnvError
from pytest_retrace.envs.desktop import CHROMIUM_FLAGS, DESKTOP_MENU
from pytest_retrace.envs.xvfb.checkpoint import Criu
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.envs.xvfb.sandbox import available
from pytest_retrace.replay.cases import Task
from tests.helpers import REPO


def _criu_problem() -> str | None:
    if available() is not None:
        return f"no sandbox here: {available()}"
    try:
        Criu._command()
    except EnvError as exc:
        return str(exc)
    return None


# CI sets RETRACE_REQUIRE_CRIU=1 (scripts/bootstrap installs CRIU): there a missing CRIU fails instead of skipping
_SKIP = None if os.environ.get("RETRACE_REQUIRE_CRIU") == "1" else _criu_problem()
pytestmark = [pytest.mark.desktop, pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))]

ok = {"func": "exact_match", "result": {"type": "rule", "rules": 1}, "expected": {"type": "rule", "rules": 1}}
XTERM = Task.model_validate({"id": "t", "instruction": "x", "domain": "test", "evaluator": ok, "setup": [
    {"type": "launch", "command": list(DESKTOP_MENU[0][1]), "window": "XTerm"}]})


@pytest.fixture(scope="module")
def env() -> Iterator[XvfbEnvironment]:
    e = XvfbEnvironment(hide=[REPO])
    e.enable_checkpoints()
    e.start()
    yield e
    e.close()


def typed(env: XvfbEnvironment, line: str) -> None:
    env.execute(Action("type", text=line + "\n"))


def test_a_restored_desktop_is_the_dumped_one_every_time(env: XvfbEnvironment, tmp_path) -> None:
    env.reset(XTERM, tmp_path)
    typed(env, "echo before > ~/kept.txt; echo dumped here")
    env.settle()
    dumped = env.screenshot()
    assert env.take_checkpoint("k", payload={"p": 1}) is None
    # the dumped desktop goes on as it was, and what it writes after the dump is not in the checkpoint
    assert np.array_equal(env.screenshot(), dumped)
    typed(env, "echo after > ~/later.txt")
    deadline = time.monotonic() + 10
    while env.read_file("~/later.txt") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert env.read_file("~/later.txt") == b"after\n"
    for _ in range(2):  # the same images, restored twice: each restore starts from the dump, not the last one
        payload, why = env.restore_checkpoint("k")
        assert why is None and payload == {"p": 1}
        assert np.array_equal(env.screenshot(), dumped)
        assert env.read_file("~/kept.txt") == b"before\n"
        assert env.read_file("~/later.txt") is None  # written after the dump, or after the previous restore: gone
        typed(env, "echo after > ~/later.txt")  # the restored shell takes input and writes files
        deadline = time.monotonic() + 10
        while env.read_file("~/later.txt") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert env.read_file("~/later.txt") == b"after\n"
        assert not np.array_equal(env.screenshot(), dumped)


def test_a_process_started_from_outside_is_a_reason_and_the_desktop_stays(env: XvfbEnvironment, tmp_path) -> None:
    env.reset(XTERM, tmp_path)
    env.run("sleep 60 >/dev/null 2>&1 &")  # a setup command's background process: its session is outside the tree
    before = env.screenshot()
    why = env.take_checkpoint("k2")
    assert why is not None and "sleep" in why and "outside the task" in why
    assert np.array_equal(env.screenshot(), before)  # nothing was dumped, nothing ended
    typed(env, "echo still here")
    assert not env.has_checkpoint("k2")


def test_the_task_cannot_end_the_x_server_inside_its_namespaces(env: XvfbEnvironment, tmp_path) -> None:
    env.reset(XTERM, tmp_path)
    typed(env, "pkill -9 Xvfb; pkill -9 openbox; kill -9 -1")  # the X server is root's, in the task's pid namespace
    time.sleep(0.5)
    assert env.harness_fault() is None
    env.screenshot()  # still drawing


def test_the_harness_sees_the_x_server_end(tmp_path) -> None:
    e = XvfbEnvironment(hide=[REPO])
    e.enable_checkpoints()
    e.start()
    try:
        e.reset(XTERM, tmp_path)
        assert e._xvfb is not None
        os.kill(e._xvfb.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while e.harness_fault() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "the X server exited" in (e.harness_fault() or "")
    finally:
        e.close()


def test_no_working_criu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRACE_CRIU", "/nonexistent/criu")
    e = XvfbEnvironment()
    with pytest.raises(EnvError, match="does not run"):
        e.enable_checkpoints()
    assert not e.in_task


def test_an_app_opened_from_the_menu_runs_as_the_task_and_is_checkpointed(env: XvfbEnvironment, tmp_path) -> None:
    empty = Task.model_validate({"id": "e", "instruction": "x", "domain": "test", "evaluator": ok})
    env.reset(empty, tmp_path)
    env.execute(Action("click", x=640, y=400, button="right"))  # openbox's root menu; its first entry: Terminal
    env.execute(Action("key", keys=("Down",)))
    env.execute(Action("key", keys=("Return",)))
    deadline = time.monotonic() + 30
    while not env.find_windows("XTerm") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert env.find_windows("XTerm")
    assert env.sandbox is not None
    names = {Path(f"/proc/{pid}/comm").read_text().strip(): Path(f"/proc/{pid}/status").read_text()
             for pid in env.sandbox.pids()}
    assert "xterm" in names and f"Uid:\t{env.sandbox.uid}" in names["xterm"]  # the task's user, not root
    env.settle()
    before = env.screenshot()
    assert env.take_checkpoint("menu") is None
    _payload, why = env.restore_checkpoint("menu")
    assert why is None and np.array_equal(env.screenshot(), before)


PAGE = ("<html><head><title>Checkpointed page</title></head><body style='font: 24px sans-serif'>"
        "<h1>A page</h1><p>Some text to select.</p></body></html>")
CHROMIUM = Task.model_validate({"id": "c", "instruction": "x", "domain": "test", "evaluator": ok, "setup": [
    {"type": "file", "path": "~/page.html", "content": PAGE},
    {"type": "launch", "command": ["chromium", *CHROMIUM_FLAGS, "--user-data-dir=/home/user/.config/chromium",
                                   "--remote-debugging-port=9222", "--disable-smooth-scrolling",
                                   "--hide-crash-restore-bubble", "file:///home/user/page.html"],
     "window": "^Checkpointed page - Chromium$", "timeout": 60}]})


def test_chromium_is_checkpointed_and_draws_what_its_sandboxed_self_draws(env: XvfbEnvironment, tmp_path) -> None:
    """Chromium's sandbox runs its renderers in pid namespaces of their own, which CRIU cannot dump: on a
    checkpointable desktop the task's `chromium` runs without it (envs/xvfb/checkpoint.py). The same page must
    look the same, pixel for pixel, as with the sandbox on the default desktop (no warning bar), and be dumped
    and restored like any app, taking input after; with its DevTools port open, as the browser cases have it (a
    TCP socket, which CRIU 4.1 cannot dump on kernels from 6.16 without criu_preload.c)."""
    plain = XvfbEnvironment(hide=[REPO])
    plain.start()
    try:
        plain.reset(CHROMIUM, tmp_path)
        sandboxed = plain.screenshot()
    finally:
        plain.close()
    env.reset(CHROMIUM, tmp_path)
    assert np.array_equal(env.screenshot(), sandboxed)
    assert env.take_checkpoint("chromium") is None
    for _ in range(2):
        assert env.restore_checkpoint("chromium")[1] is None
        assert np.array_equal(env.screenshot(), sandboxed)
        env.execute(Action("hotkey", keys=("ctrl", "a")))  # selects the page's text: it takes input
        assert not np.array_equal(env.screenshot(), sandboxed)


def test_a_namespace_file_bound_on_the_host_does_not_stop_a_dump(env: XvfbEnvironment, tmp_path) -> None:
    """As docker binds each container's /run/docker/netns/ID (CI runs docker tests beside these): the task's copy
    of the host's mounts must not hold it, or CRIU refuses the dump ("doesn't have a proper root mount")."""
    import subprocess

    target = tmp_path / "netns"
    target.touch()
    subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(target)], check=True)
    try:
        env.reset(XTERM, tmp_path)
        assert env.take_checkpoint("nsfs") is None
        assert env.restore_checkpoint("nsfs")[1] is None
    finally:
        subprocess.run(["umount", str(target)], check=False)



def test_a_container_that_ends_between_dump_and_restore_does_not_stop_the_restore(env: XvfbEnvironment,
                                                                                   tmp_path) -> None:
    """As docker mounts each container's file system at /var/lib/docker/overlay2/ID/merged and removes it when the
    container ends (CI runs docker tests beside these): the task's copy of the host's mounts must not hold it, or
    CRIU cannot restore ("Can't stat mountpoint"), which once made a restore fall back to replay in CI."""
    import shutil
    import subprocess

    if not Path("/var/lib/docker").is_dir():
        pytest.skip("no /var/lib/docker here")
    where = Path("/var/lib/docker") / f"retrace-test-{os.getpid()}" / "merged"
    where.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "retrace-test", str(where)], check=False).returncode == 0
    try:
        env.reset(XTERM, tmp_path)
        assert env.take_checkpoint("gone") is None
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], check=False)
        shutil.rmtree(where.parent, ignore_errors=True)
    assert mounted
    assert env.restore_checkpoint("gone")[1] is None

def test_the_criu_preload_is_built_once_into_the_private_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where root lacks CAP_SYS_RESOURCE or the kernel refuses CRIU 4.1's socket option reads, CRIU runs with
    criu_preload.so preloaded: built once per source into the user's cache (not by every worker), and never
    taken from a cache others could write to."""
    monkeypatch.setenv("RETRACE_CACHE_DIR", str(tmp_path / "cache"))
    first = Criu.find(tmp_path / "w1").env.get("LD_PRELOAD")
    if first is None:
        pytest.skip("CRIU needs no preload here")
    built = Path(first).stat()
    assert Path(first).parent == tmp_path / "cache" / "criu"
    assert Criu.find(tmp_path / "w2").env["LD_PRELOAD"] == first and Path(first).stat().st_mtime_ns == built.st_mtime_ns
    (tmp_path / "cache" / "criu").chmod(0o777)
    (tmp_path / "w3").mkdir()
    assert Path(Criu.find(tmp_path / "w3").env["LD_PRELOAD"]).parent == tmp_path / "w3"
