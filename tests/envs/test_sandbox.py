"""A hostile agent on the real desktop: every escape it tries is typed into the task's own terminal.

Each test plays one attack the way a model under test could (keystrokes into xterm), then checks what the
harness sees: nothing survives reset, nothing blocks the evaluator, nothing becomes an infrastructure error,
nothing of the host or of another desktop is reachable, and the next case on the same desktop starts exactly
as on a fresh one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pytest_retrace.actions import Action
from pytest_retrace.envs import EnvError
from pytest_retrace.envs.desktop import DESKTOP_MENU
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.envs.xvfb.sandbox import NPROC_LIMIT, Sandbox, available
from pytest_retrace.evaluators import evaluate
from pytest_retrace.replay.cases import Task
from tests.helpers import REPO

pytestmark = [pytest.mark.desktop,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]


def task(*setup: dict, network: bool = False) -> Task:
    ok = {"func": "exact_match", "result": {"type": "rule", "rules": 1}, "expected": {"type": "rule", "rules": 1}}
    return Task.model_validate({"id": "t", "instruction": "x", "domain": "test", "setup": list(setup),
                                "evaluator": ok, "network": network})


XTERM = task({"type": "launch", "command": list(DESKTOP_MENU[0][1]), "window": "XTerm"})


@pytest.fixture(scope="module")
def env() -> Iterator[XvfbEnvironment]:
    e = XvfbEnvironment(hide=[REPO])
    e.start()
    yield e
    e.close()


def agent_types(env: XvfbEnvironment, command: str) -> None:
    """What a model does with a terminal: type a command line and press Enter."""
    env.execute(Action("type", text=command + "\n"))


def cmdline_pids(marker: str) -> list[int]:
    """Host processes whose command line contains `marker` (however they hid their environment)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                found.append(int(entry.name))
    return found


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_background_processes_that_hide_do_not_survive_reset(env: XvfbEnvironment) -> None:
    env.reset(XTERM, Path("."))
    # cleared environment, a new session, a double fork re-parented to the init, and a nohup'd loop
    agent_types(env, "nohup env -i sleep 987601 >/dev/null 2>&1 &")
    agent_types(env, "setsid sh -c 'sleep 987602' &")
    agent_types(env, "(sh -c 'sleep 987603 &' &) ; exec sh -c 'while :; do sleep 987604; done' &")
    assert wait_for(lambda: all(cmdline_pids(f"sleep 98760{i}") for i in (1, 2, 3, 4)))
    env.reset(XTERM, Path("."))
    assert [p for i in (1, 2, 3, 4) for p in cmdline_pids(f"sleep 98760{i}")] == []


def test_the_agent_runs_as_an_unprivileged_user_in_its_own_pid_space(env: XvfbEnvironment) -> None:
    env.reset(XTERM, Path("."))
    uid, name = env.run("id -u; id -un").stdout.split()
    procs = env.run("ps -e -o comm=").stdout.split()
    nproc = env.run("grep 'Max processes' /proc/self/limits").stdout.split()[2]
    init = env.run("kill -9 1 2>/dev/null && echo killed-init || echo init-untouchable").stdout.strip()
    assert int(uid) != 0 and name == "user"
    assert "Xvfb" not in procs and "openbox" not in procs and "python" not in procs and "xterm" in procs
    assert int(nproc) == NPROC_LIMIT
    assert init == "init-untouchable"
    # setuid programs cannot give root back (no_new_privs)
    assert env.run("su -c id root </dev/null").returncode != 0


def test_files_outside_home_do_not_reach_the_host_or_the_next_task(env: XvfbEnvironment, tmp_path: Path) -> None:
    env.reset(XTERM, Path("."))
    marker = f"retrace-escape-{os.getpid()}"
    for place in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "~/../..", "/home"):
        agent_types(env, f"echo hostile > {place}/{marker}")
    agent_types(env, f"echo hostile > ~/../../tmp/{marker}-dots; mkfifo /tmp/{marker}-fifo")
    assert env.run(f"cat /tmp/{marker}").stdout == "hostile\n"  # the task's own /tmp works
    for place in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/home", "/"):
        assert not Path(place, marker).exists(), f"{place}/{marker} reached the host"
    assert not Path(f"/tmp/{marker}-dots").exists() and not Path(f"/tmp/{marker}-fifo").exists()
    env.reset(XTERM, Path("."))
    res = env.run(f"ls -a /tmp /var/tmp /dev/shm; cat /tmp/{marker} /var/tmp/{marker}")
    assert marker not in res.stdout and res.returncode != 0  # nothing carried over to the next task


@pytest.mark.parametrize("host_has_home_user", [False, True])
def test_apps_start_in_the_tasks_home_whether_or_not_the_machine_has_a_home_user(env: XvfbEnvironment,
                                                                                host_has_home_user: bool) -> None:
    """nsenter's --wd opened its directory before entering the namespace: on a machine without /home/user no app
    started, and on one with it a relative path the agent typed wrote to the machine's /home/user."""
    host = Path("/home/user")
    made = host_has_home_user and not host.exists()
    if made:
        host.mkdir()
    try:
        if not host_has_home_user and host.exists():
            pytest.skip("this machine has a /home/user")
        marker = f"retrace-cwd-{os.getpid()}"
        env.reset(XTERM, Path("."))
        agent_types(env, f"echo relative > {marker}")
        assert wait_for(lambda: env.read_file(f"~/{marker}") == b"relative\n")
        assert env.run("pwd").stdout == "/home/user\n" and not (host / marker).exists()
    finally:
        if made:
            host.rmdir()


def test_the_harness_and_other_desktops_are_invisible(env: XvfbEnvironment) -> None:
    other = XvfbEnvironment()
    other.start()
    try:
        other.reset(task({"type": "file", "path": "~/secret.txt", "content": "other worker"}), Path("."))
        env.reset(XTERM, Path("."))
        assert env.run(f"ls -A {REPO}").stdout == ""  # the project: an empty, read-only directory
        assert env.run(f"ls -A {sys.prefix}").stdout == ""  # the virtualenv (inside it, or hidden itself)
        assert env.run(f"cat /proc/{os.getpid()}/environ").returncode != 0  # the harness's keys and tokens
        res = env.run(f"ls /home; ls /tmp/.X11-unix; cat {other.home}/secret.txt")
        assert res.stdout.split() == ["user", f"X{env.display.lstrip(':')}"]
        assert "other worker" not in res.stdout
        # the other desktop's display cannot be reached either (no TCP, no abstract socket, no socket file)
        assert env.run(f"DISPLAY={other.display} xdpyinfo >/dev/null 2>&1").returncode != 0
        assert env.run("xdpyinfo >/dev/null 2>&1").returncode == 0
    finally:
        other.close()


def test_network_is_off_unless_the_case_asks_for_it(env: XvfbEnvironment) -> None:
    links = "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"
    env.reset(XTERM, Path("."))
    assert env.run(links).stdout.split() == ["lo"]
    env.reset(task(network=True), Path("."))
    host = subprocess.run(["sh", "-c", links], check=True, capture_output=True, text=True).stdout.split()
    assert sorted(env.run(links).stdout.split()) == sorted(host)


@pytest.mark.parametrize(("attack", "reason"), [
    ("rm -f ~/out.txt; mkfifo ~/out.txt", "is a FIFO"),
    ("ln -sf /dev/zero ~/out.txt", "outside the sandbox's home"),
    ("ln -sf /etc/shadow ~/out.txt", "outside the sandbox's home"),
    ("ln -sf ../../../etc/passwd ~/out.txt", "leaves /home/user"),
    ("ln -sf /proc/self/root/etc/shadow ~/out.txt", "outside the sandbox's home"),
    ("rm -f ~/out.txt; mkdir ~/out.txt", "is a directory"),
    ("truncate -s 100M ~/out.txt", "over the"),
    ("rm -f ~/out.txt; ln -s out.txt ~/loop; ln -s loop ~/out.txt", "symbolic links"),
], ids=["fifo", "dev-zero", "shadow", "dotdot", "proc-root", "directory", "huge", "link-loop"])
def test_an_evaluator_never_blocks_or_reads_outside_and_scores_it_zero(env: XvfbEnvironment, attack: str,
                                                                         reason: str) -> None:
    env.reset(task({"type": "file", "path": "~/out.txt", "content": "expected\n"},
                   {"type": "launch", "command": list(DESKTOP_MENU[0][1]), "window": "XTerm"}), Path("."))
    agent_types(env, attack)
    spec = {"func": "compare_text_file", "result": {"type": "vm_file", "path": "~/out.txt"},
            "expected": {"type": "rule", "rules": {"text": "expected\n"}}}
    start = time.monotonic()
    result = evaluate(spec, env)
    assert time.monotonic() - start < 5.0
    assert result.score == 0.0 and reason in "\n".join(result.details), result.details
    negated = evaluate({**spec, "negate": True}, env)  # a check that could not look has not seen it absent
    assert negated.score == 0.0


def test_a_command_an_evaluator_runs_that_hangs_on_the_agents_fifo_is_a_failed_check(env: XvfbEnvironment) -> None:
    env.reset(XTERM, Path("."))
    agent_types(env, "mkfifo ~/out.txt")
    spec = {"func": "exact_match", "result": {"type": "vm_command_line", "command": "cat ~/out.txt", "timeout": 1},
            "expected": {"type": "rule", "rules": "expected"}}
    result = evaluate(spec, env)  # no EnvError: what a command waits on inside the sandbox is the task's state
    assert result.score == 0.0


def test_an_agent_that_kills_the_window_manager_fails_its_case_but_the_desktop_recovers(env: XvfbEnvironment) -> None:
    env.reset(XTERM, Path("."))
    fresh = env.screenshot()
    agent_types(env, "xkill -id $(xprop -root _NET_SUPPORTING_WM_CHECK | awk '{print $5}')")
    assert wait_for(lambda: env._wm is not None and env._wm.poll() is not None)
    env.execute(Action("click", x=100, y=100))  # the desktop itself is fine: no EnvError
    env.reset(XTERM, Path("."))
    assert np.array_equal(env.screenshot(), fresh)


def test_the_next_case_on_the_same_desktop_starts_as_on_a_fresh_one(env: XvfbEnvironment) -> None:
    env.reset(XTERM, Path("."))
    fresh = env.screenshot()
    # state of the X server itself, which no process of the task holds: remapped keys and buttons, a root
    # window colour, autorepeat, a held modifier
    agent_types(env, "echo 'PS1=x' >> ~/.bashrc; xmodmap -e 'keycode 38 = z'; "
                     "xsetroot -solid red; xset r on; cd /")
    env.execute(Action("key_down", keys=("ctrl",)))
    assert "z" in env.run("xmodmap -pke | grep '^keycode  38 '").stdout.split()  # the attack took effect
    assert "on" in env.run("xset q | grep 'auto repeat:'").stdout.split()[:3]
    env.reset(XTERM, Path("."))
    assert np.array_equal(env.screenshot(), fresh)
    assert "z" not in env.run("xmodmap -pke | grep '^keycode  38 '").stdout.split()
    assert "off" in env.run("xset q | grep 'auto repeat:'").stdout.split()[:3]
    agent_types(env, "echo abc > ~/typed.txt")  # 'a' is keycode 38: the keyboard is back to normal
    assert env.read_file("~/typed.txt") == b"abc\n"


def test_kill_9_of_a_worker_mid_case_leaves_no_process_of_its_task(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(f"""
import sys, time
from pathlib import Path
sys.path.insert(0, {str(REPO)!r})
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from tests.envs.test_sandbox import XTERM, agent_types
env = XvfbEnvironment()
env.start()
env.reset(XTERM, Path("."))
agent_types(env, "nohup env -i sleep 987605 >/dev/null 2>&1 & setsid sleep 987606 &")
print(env.sandbox.init_pid, env._xvfb.pid, flush=True)
time.sleep(600)
""")
    worker = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        init_pid, xvfb_pid = (int(v) for v in worker.stdout.readline().split())  # type: ignore[union-attr]
        assert wait_for(lambda: cmdline_pids("sleep 987605") and cmdline_pids("sleep 987606"))
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    assert wait_for(lambda: not (cmdline_pids("sleep 98760") or Path(f"/proc/{init_pid}").exists()
                                 or Path(f"/proc/{xvfb_pid}").exists()))


def test_a_task_without_a_live_sandbox_is_an_env_error_not_a_hang() -> None:
    e = XvfbEnvironment()
    e.start()
    try:
        e.kill_session()
        with pytest.raises(EnvError, match="no task is running"):
            e.run("true")
    finally:
        e.close()


def test_setup_steps_write_as_the_tasks_user_never_as_root_on_the_host(env: XvfbEnvironment) -> None:
    """A case's `command` step runs in the sandbox; a link it leaves must not let a later `file` step write
    with root's rights where the link points."""
    target = Path(f"/etc/retrace-escape-{os.getpid()}")
    evil = task({"type": "command", "command": f"ln -s {target} ~/notes.txt"},
                {"type": "file", "path": "~/notes.txt", "content": "pwned"})
    with pytest.raises(EnvError, match="Permission denied"):
        env.reset(evil, Path("."))
    assert not target.exists()


def test_a_task_that_exhausts_memory_is_killed_inside_its_own_group() -> None:
    """The kernel's OOM killer picks among the task's processes only, never another worker or the harness."""
    e = XvfbEnvironment(memory_limit=256 << 20)
    e.start()
    try:
        if e.sandbox.group.problem:  # type: ignore[union-attr]
            pytest.skip(f"no control group here: {e.sandbox.group.problem}")  # type: ignore[union-attr]
        groups = list(e.sandbox.group.dirs)  # type: ignore[union-attr]
        e.reset(XTERM, Path("."))
        res = e.run("python3 -c \"a = b'x' * (1 << 30)\"; echo $?")
        assert res.stdout.split() == ["137"]  # SIGKILL from the group's OOM killer
        assert e.find_windows("XTerm")  # the desktop and the task's other apps live on
        assert e.run("echo alive").stdout == "alive\n"
    finally:
        e.close()
    assert not any(g.exists() for g in groups)  # the group is removed with the desktop


def ipc_keys(listing: str, owner: str) -> set[str]:
    """The keys of the SysV objects in an ``ipcs`` listing (segments, semaphores, queues) owned by `owner`
    with mode 666: the ones ``ipcmk -p 0666`` made (the segments apps share with the X server are 600)."""
    keys = set()
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0].startswith("0x") and fields[2] == owner and fields[3] == "666":
            keys.add(fields[0])
    return keys


def host_ipcs() -> str:
    return subprocess.run(["ipcs", "-m", "-s", "-q"], capture_output=True, text=True, check=True).stdout


def test_sysv_ipc_a_task_makes_reaches_neither_the_host_nor_the_next_task(env: XvfbEnvironment) -> None:
    """Shared memory, semaphores and message queues outlive every process: before the task had an IPC
    namespace, ``ipcmk`` segments stayed on the host after the case and were there in the next one."""
    env.reset(XTERM, Path("."))
    made = env.run("ipcmk -M 4096 -p 0666 && ipcmk -S 1 -p 0666 && ipcmk -Q -p 0666")
    assert made.returncode == 0, made.stderr
    assert [line.split(":")[0] for line in made.stdout.splitlines()] == [
        "Shared memory id", "Semaphore id", "Message queue id"]
    keys = ipc_keys(env.run("ipcs -m -s -q").stdout, "user")
    assert len(keys) == 3  # the task sees its own three objects
    assert not ipc_keys(host_ipcs(), str(env.sandbox.uid)), "the task's IPC objects are on the host"
    assert not keys & {line.split()[0] for line in host_ipcs().splitlines() if line.startswith("0x")}
    env.reset(XTERM, Path("."))
    assert ipc_keys(env.run("ipcs -m -s -q").stdout, "user") == set()  # nothing carried over to the next task
    assert not ipc_keys(host_ipcs(), str(env.sandbox.uid))  # nor left on the host after it


def test_a_task_shares_the_ipc_namespace_of_its_x_server_and_has_its_own_uts_and_cgroup(env: XvfbEnvironment) -> None:
    """GTK apps draw through SysV MIT-SHM segments the X server attaches by id; an id means a segment only in
    its own IPC namespace, so the task is in the X server's, which is new with every reset's X server."""
    env.reset(task({"type": "launch", "command": ["mousepad"], "window": "Mousepad"}), Path("."))
    theirs = dict(line.split(" ", 1) for line in env.run(
        "for ns in ipc uts cgroup; do echo $ns $(readlink /proc/self/ns/$ns); done").stdout.splitlines())
    ours = {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("ipc", "uts", "cgroup")}
    assert all(theirs[ns] != ours[ns] for ns in ours), (theirs, ours)
    assert theirs["ipc"] == os.readlink(f"/proc/{env._xvfb.pid}/ns/ipc")  # type: ignore[union-attr]
    # the app's segments are attached twice, by the app and by the X server: MIT-SHM works as on any desktop
    def shared_with_the_x_server() -> bool:
        rows = [line.split() for line in env.run("ipcs -m").stdout.splitlines() if line.startswith("0x")]
        return any(row[2] == "user" and row[5] == "2" for row in rows)  # owner, nattch

    assert wait_for(shared_with_the_x_server), env.run("ipcs -m").stdout
    # the UTS namespace is a copy: the host's name, so a title or prompt that shows it is unchanged
    assert env.run("hostname").stdout.strip() == socket.gethostname()
    assert env.run("hostname other 2>/dev/null").returncode != 0  # and the user cannot rename it anyway


def test_a_sandbox_refuses_to_join_the_harnesss_own_ipc_namespace(tmp_path: Path) -> None:
    """An X server started without x_server_argv shares the host's IPC namespace: a task joined to it would
    see (and make) the host's segments, so start() says so instead."""
    box = Sandbox(tmp_path, ":99", REPO / "pytest_retrace" / "envs" / "home-template")
    (tmp_path / "logs").mkdir()
    try:
        with pytest.raises(EnvError, match=f"X server \\(pid {os.getpid()}\\) runs in the harness's own IPC"):
            box.start(network=False, ipc_of=os.getpid())
        with pytest.raises(EnvError, match="pid 0\\) is gone"):
            box.start(network=False, ipc_of=0)
    finally:
        box.close()
