"""The docker provider on a real engine with the desktop image built from the repository's recipe.

Skipped when no engine answers, except under CI (RETRACE_REQUIRE_DOCKER=1, set by .ci/run after it starts
dockerd), where a missing engine fails: the docker path must not pass by not running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from pytest_retrace.actions import Action
from pytest_retrace.envs import ActionFailed, EnvError
from pytest_retrace.envs.config import EnvConfigError, load_env_config
from pytest_retrace.envs.docker.environment import LABEL, NETWORKS, DockerEnvironment
from pytest_retrace.envs.steps import FileStep, LaunchStep
from pytest_retrace.screen.settle import SettleConfig
from tests.helpers import REPO, docker_client, interruptible

SIZE = (640, 480)
FAST = SettleConfig(timeout=5.0, quiet=0.2, interval=0.03)
TERM = ["xterm", "-title", "docker-term", "-geometry", "60x12", "-e", "bash", "--norc", "--noprofile"]


def _engine():
    client = docker_client()
    if client is None:
        pytest.skip("no docker engine answers (under CI, RETRACE_REQUIRE_DOCKER=1 makes this a failure)")
    return client


@dataclass
class Task:
    id: str
    setup: list = field(default_factory=list)
    network: bool = False
    settle_quiet: float | None = None
    accessibility: bool = False


@pytest.fixture(scope="module")
def client():
    return _engine()


@pytest.fixture
def env(client) -> Iterator[DockerEnvironment]:
    e = DockerEnvironment(size=SIZE, settle=FAST)
    e.start()
    yield e
    e.close()


def _gone(client, container_id: str, timeout: float = 20.0) -> bool:
    import docker.errors

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return True
        time.sleep(0.2)
    return False


def test_options_are_checked_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="memory: bytes or a size like 4g, got 'lots'"):
        DockerEnvironment(memory="lots")
    with pytest.raises(ValueError, match="hosts: 'docker.example:2376' is not an engine URL"):
        DockerEnvironment(hosts="docker.example:2376")
    with pytest.raises(ValueError, match="pids_limit"):
        DockerEnvironment(pids_limit=3)
    with pytest.raises(ValueError, match="spare: true or false"):
        DockerEnvironment(spare="yes")
    with pytest.raises(EnvConfigError, match="provider 'docker' has no option 'memroy'.*memory"):
        load_env_config("docker", overrides=["memroy=2g"])
    config = load_env_config("docker", overrides=["memory=2g", "hosts=unix:///var/run/docker.sock,tcp://h:2376"])
    env = config.create(size=SIZE)
    assert env.memory == 2 << 30 and env.hosts == ["unix:///var/run/docker.sock", "tcp://h:2376"]


@pytest.mark.desktop
def test_each_case_gets_a_fresh_container(env: DockerEnvironment, client, tmp_path: Path) -> None:
    (tmp_path / "seed.txt").write_text("from a file\n")
    task = Task("t", [FileStep(type="file", path="~/task/seed.txt", src="seed.txt"), LaunchStep(type="launch", command=TERM, window="docker-term")])
    env.reset(task, tmp_path)
    first = env.container_id
    assert env.read_file("~/task/seed.txt") == b"from a file\n"
    assert env.run("id -un; echo $HOME; pwd").stdout.split() == ["user", "/home/user", "/home/user"]
    # the agent changes what it can: its home, /tmp, the X server's keymap
    env.run("echo left > ~/left-behind; echo x > /tmp/left-behind; xmodmap -e 'keycode 38 = z'")
    before = env.screenshot()
    env.execute(Action("click", x=100, y=100))
    env.execute(Action("type", text="echo hello > ~/typed.txt\n"))
    assert env.read_file("~/typed.txt") == b"hello\n"
    assert np.any(env.screenshot() != before)

    uid = int(env.run("id -u").stdout)
    env.reset(Task("t2"), tmp_path)
    assert env.container_id != first
    # a uid of its own per container: process limits count a uid's processes in every container of the machine
    assert int(env.run("id -u").stdout) != uid and uid >= 2_000_000_000
    assert _gone(client, first), "the previous case's container is still there"
    for path in ("~/left-behind", "/tmp/left-behind", "~/task/seed.txt", "~/typed.txt"):
        assert env.read_file(path) is None, path
    assert "keycode  38 = a A" in env.run("xmodmap -pke").stdout


@pytest.mark.desktop
def test_the_spare_is_a_fresh_container_too(client, tmp_path: Path) -> None:
    env = DockerEnvironment(size=SIZE, settle=FAST, spare=True)
    env.start()
    try:
        env.reset(Task("t"), tmp_path)
        env.run("echo left > ~/left-behind; echo x > /tmp/left-behind; xmodmap -e 'keycode 38 = z'")
        first = env.container_id
        env.reset(Task("t2"), tmp_path)
        assert env.container_id != first and _gone(client, first)
        assert env.read_file("~/left-behind") is None and env.read_file("/tmp/left-behind") is None
        assert "keycode  38 = a A" in env.run("xmodmap -pke").stdout
    finally:
        env.close()


@pytest.mark.desktop
def test_the_spare_serves_before_the_reset_returns_and_one_that_fails_is_dropped(client, tmp_path: Path,
                                                                                monkeypatch) -> None:
    import urllib.request

    env = DockerEnvironment(size=SIZE, settle=FAST)  # the spare is the default
    env.start()
    try:
        env.reset(Task("t", [FileStep(type="file", path="~/task/seed.txt", content="seed")]), tmp_path)
        spare = env._spare
        assert spare is not None and spare.id != env.container_id
        # booted within the reset: its guest already serves, so nothing of it runs alongside the case
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(spare.url + "/health", timeout=2) as r:
            assert r.status == 200
        env.reset(Task("t2"), tmp_path)
        assert env.container_id == spare.id and env.read_file("~/task/seed.txt") is None

        def engine_says_no(net: str, accessibility: bool = False):
            raise EnvError("the engine refused")

        real_start = env._start
        monkeypatch.setattr(env, "_start", engine_says_no)
        env.reset(Task("t3"), tmp_path)  # takes the last reset's spare; the next one cannot start: dropped
        assert env._spare is None and env.run("echo ok").stdout == "ok\n"
        monkeypatch.setattr(env, "_start", real_start)
        env.reset(Task("t4"), tmp_path)  # no spare: starts its own, and a spare again
        assert env.run("echo ok").stdout == "ok\n" and env._spare is not None
        assert len(_owned_by(client, os.getpid())) == 2
    finally:
        env.close()


@pytest.mark.desktop
def test_the_agent_cannot_end_its_own_desktop(env: DockerEnvironment, tmp_path: Path) -> None:
    """Everything of the task runs as `user`; the guest server and the X server are root's, so an agent that
    kills all it can still has a desktop (its case fails, it does not become an infrastructure error)."""
    env.reset(Task("t", [LaunchStep(type="launch", command=TERM, window="docker-term")]), tmp_path)
    token_read = env.run("cat /proc/1/environ")
    assert token_read.returncode != 0 and "RETRACE_GUEST_TOKEN" not in token_read.stdout
    res = env.run("kill -9 -1; sleep 1; echo survived", timeout=10)
    assert res.returncode in (-9, 137, 0)
    assert env.screenshot().shape == (SIZE[1], SIZE[0], 3)
    assert env.run("pgrep -u root -x Xvfb && pgrep -u root -f pytest_retrace.guest.container").returncode == 0
    assert env.run("echo alive").stdout == "alive\n"
    # the agent's own failure stays its own: an action the desktop cannot do is ActionFailed, not EnvError
    with pytest.raises(ActionFailed):
        env.execute(Action("click", x=SIZE[0] + 5, y=10))


@pytest.mark.desktop
def test_limits_labels_and_no_network(env: DockerEnvironment, client, tmp_path: Path) -> None:
    env.reset(Task("t"), tmp_path)
    info = client.api.inspect_container(env.container_id)
    labels = info["Config"]["Labels"]
    assert labels[LABEL] == "desktop" and labels[f"{LABEL}.owner"].endswith(f":{os.getpid()}")
    host = info["HostConfig"]
    assert host["Memory"] == 4 << 30 and host["PidsLimit"] == 4096 and host["NanoCpus"] == 2_000_000_000
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"] and host["AutoRemove"]
    assert list(info["NetworkSettings"]["Networks"]) == [NETWORKS["none"]]
    assert client.networks.get(NETWORKS["none"]).attrs["Internal"] is True
    out = env.run("timeout 5 bash -c 'echo > /dev/tcp/1.1.1.1/80' && echo reached || echo blocked", timeout=15)
    assert out.stdout.strip() == "blocked"
    # a task that asks for the network gets the non-internal one
    env.reset(Task("t", network=True), tmp_path)
    info = client.api.inspect_container(env.container_id)
    assert list(info["NetworkSettings"]["Networks"]) == [NETWORKS["host"]]


def _owned_by(client, pid: int) -> list:
    listed = client.containers.list(all=True, filters={"label": f"{LABEL}=desktop"}, ignore_removed=True)
    return [c for c in listed
            if c.labels.get(f"{LABEL}.owner", "").endswith(f":{pid}")]


@pytest.mark.desktop
def test_close_removes_the_container_and_the_spare(client, tmp_path: Path) -> None:
    env = DockerEnvironment(size=SIZE, settle=FAST, spare=True)
    env.start()
    env.reset(Task("t"), tmp_path)
    mine = _owned_by(client, os.getpid())
    assert len(mine) == 2  # the case's and the next one's, booting
    env.close()
    assert all(_gone(client, c.id, timeout=5) for c in mine)
    with pytest.raises(EnvError, match="not started"):
        env.reset(Task("t"), tmp_path)


_OWNER = """
import sys, time
from pathlib import Path
from pytest_retrace.envs.docker.environment import DockerEnvironment
from pytest_retrace.screen.settle import SettleConfig
class Task:
    id = "t"; setup = []; network = False; settle_quiet = None; accessibility = False
env = DockerEnvironment(size=(640, 480), settle=SettleConfig(timeout=5.0, quiet=0.2, interval=0.03), spare=True)
env.start()
env.reset(Task(), Path("."))
print(env.container_id, flush=True)
time.sleep(600)
"""


@pytest.mark.desktop
def test_a_killed_worker_leaves_no_container(client) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None
        container = proc.stdout.readline().strip()
        assert container, "the owner process did not start a container"
        assert client.api.inspect_container(container)["State"]["Running"]
        mine = _owned_by(client, proc.pid)
        assert len(mine) == 2, mine  # the case's and the spare
    finally:
        proc.send_signal(signal.SIGKILL)  # no close(), no atexit, no finally
        proc.wait()
    assert all(_gone(client, c.id) for c in mine), "a SIGKILLed owner's containers are still there"


@pytest.mark.desktop
def test_leftovers_of_dead_owners_are_removed_at_start(client) -> None:
    import socket

    pid = 2 ** 22 + 7  # above the largest pid_max: certainly no live process here
    builder = DockerEnvironment(size=SIZE)
    builder.start()  # builds or finds the image
    leftover = client.containers.create(builder.image, entrypoint=["sleep", "600"], labels={
        LABEL: "desktop", f"{LABEL}.owner": f"{socket.gethostname()}:{pid}"})
    leftover.start()
    other = client.containers.create(builder.image, entrypoint=["sleep", "600"], labels={
        LABEL: "desktop", f"{LABEL}.owner": f"another-machine:{pid}"})
    try:
        env = DockerEnvironment(size=SIZE)
        env.start()
        env.close()
        assert _gone(client, leftover.id, timeout=5)
        assert client.api.inspect_container(other.id)["Id"] == other.id  # another machine's: not ours to judge
    finally:
        builder.close()
        other.remove(force=True)


@pytest.mark.desktop
def test_xdist_workers_each_get_their_own_container(client, tmp_path: Path) -> None:
    """Two workers, two cases each, through the plugin: -n 2 under --retrace-env=docker. It asks for the engine
    (`client`) although only the pytest it starts talks to it: without an engine it skips (fails under CI)."""
    cases = sorted((REPO / "cases" / "app-settings").glob("indent-and-save-t2-*.yaml"))[:2]
    reports = tmp_path / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *map(str, cases), "--retrace-env=docker", "--retrace-model=oracle,noop",
         "-n", "2", "-p", "no:cacheprovider", "-q", f"--retrace-report-dir={reports}", "--retrace-run=d"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    records = [json.loads(line) for line in (reports / "d" / "results.jsonl").read_text().splitlines()]
    assert proc.returncode == 1, proc.stdout[-2000:]  # noop fails its cases
    verdicts = {(r["case"], r["model"]): r["verdict"] for r in records}
    assert verdicts == {(c.stem, "oracle"): "recovered" for c in cases} | {(c.stem, "noop"): "not_recovered" for c in cases}


class _EngineOverTcp:
    """The local engine's socket forwarded to a TCP port on loopback: to the provider a remote engine
    (``tcp://``), reached as a remote one is — the guest's port published, not the container's address."""

    def __init__(self, sock_path: str = "/var/run/docker.sock") -> None:
        import socket
        import threading

        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sock_path = sock_path
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.sock_path)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        import socket

        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()


@pytest.mark.desktop
def test_engines_from_a_list_docker_host_and_a_remote_engine(client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = _EngineOverTcp()
    hosts = f"unix:///var/run/docker.sock,tcp://127.0.0.1:{proxy.port}"
    try:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")  # 3 % 2: the second engine, the "remote" one
        env = DockerEnvironment(size=SIZE, settle=FAST, hosts=hosts)
        env.start()
        try:
            assert env.engine == f"tcp://127.0.0.1:{proxy.port}"
            env.reset(Task("t", [LaunchStep(type="launch", command=TERM, window="docker-term")]), tmp_path)
            info = client.api.inspect_container(env.container_id)
            published = info["NetworkSettings"]["Ports"]["5000/tcp"][0]["HostPort"]
            assert env.guest.url == f"http://127.0.0.1:{published}"  # the engine's address, the published port
            assert list(info["NetworkSettings"]["Networks"]) == [NETWORKS["host"]]
            assert env.run("echo via tcp").stdout == "via tcp\n"
        finally:
            env.close()
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{proxy.port}")  # honoured without `hosts`
        env = DockerEnvironment(size=SIZE, settle=FAST)
        env.start()
        try:
            assert env.engine == f"tcp://127.0.0.1:{proxy.port}"
            env.reset(Task("t"), tmp_path)
            assert env.guest.url.startswith("http://127.0.0.1:")
        finally:
            env.close()
        monkeypatch.delenv("DOCKER_HOST")
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw4")  # 4 % 2: the first, local engine
        env = DockerEnvironment(size=SIZE, settle=FAST, hosts=hosts)
        env.start()
        try:
            assert env.engine == "unix:///var/run/docker.sock"
            env.reset(Task("t"), tmp_path)
            assert env.guest.url.endswith(":5000") and not env.guest.url.startswith("http://127.")
        finally:
            env.close()
    finally:
        proxy.close()


@pytest.mark.desktop
def test_the_remote_provider_on_a_pool_of_two_guests_under_xdist(client, tmp_path: Path) -> None:
    """`-n 2` through the plugin, the remote provider against two guests on loopback (desktop-image containers
    publishing `retrace guest` on 127.0.0.1, each with a token), reset by the pool's own `host:` command that
    recreates the worker's container. Real built-in cases, so the verdicts are the suite's."""
    import socket

    builder = DockerEnvironment(size=SIZE)
    builder.start()  # the image
    image = builder.image
    builder.close()
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    prefix = f"retrace-pool-{os.getpid()}"  # guest i is the container prefix-i
    token = "pool-" + os.urandom(8).hex()
    run = (f'docker run -d --rm --name {prefix}-$I -p 127.0.0.1:$P:5000 -e RETRACE_GUEST_TOKEN '
           f'--label {LABEL}=test {image} >/dev/null')
    recreate = (f'I=$RETRACE_GUEST_INDEX; P=${{RETRACE_GUEST_URL##*:}}; docker rm -f {prefix}-$I '
                f'>/dev/null 2>&1; {run}')
    env = {**os.environ, "RETRACE_GUEST_TOKEN": token}
    try:
        for i, port in enumerate(ports):
            subprocess.run(["sh", "-c", run], env={**env, "I": str(i), "P": str(port)}, check=True)
        cases = sorted((REPO / "cases" / "app-settings").glob("indent-and-save-t2-*.yaml"))[:2]
        reports = tmp_path / "reports"
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *map(str, cases), "--retrace-env=remote", "--retrace-model=oracle,noop",
             "--retrace-env-option", f"urls={','.join(f'http://127.0.0.1:{p}' for p in ports)}",
             "--retrace-env-option", "token_env=RETRACE_GUEST_TOKEN",
             "--retrace-env-option", "python=/opt/retrace/bin/python",
             "--retrace-env-option", f"reset=host:{recreate}",
             "-n", "2", "-p", "no:cacheprovider", "-q", f"--retrace-report-dir={reports}", "--retrace-run=pool"],
            cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
        records = [json.loads(line) for line in (reports / "pool" / "results.jsonl").read_text().splitlines()]
        assert proc.returncode == 1, proc.stdout[-3000:]
        verdicts = {(r["case"], r["model"]): r["verdict"] for r in records}
        assert verdicts == ({(c.stem, "oracle"): "recovered" for c in cases}
                            | {(c.stem, "noop"): "not_recovered" for c in cases}), proc.stdout[-3000:]
        assert token not in proc.stdout + proc.stderr + (reports / "pool" / "results.jsonl").read_text()
    finally:
        for i in range(2):
            subprocess.run(["docker", "rm", "-f", f"{prefix}-{i}"], capture_output=True, check=False)


@pytest.mark.desktop
def test_ctrl_c_leaves_no_container(client) -> None:
    """SIGINT (Ctrl-C) to a pytest run in the middle of a case: pytest's interrupted teardown and the
    container's stdin-once end remove it."""
    case = sorted((REPO / "cases" / "text-editor").glob("*.yaml"))[0]
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(case), "--retrace-env=docker", "--retrace-model=oracle",
                             "-p", "no:xdist", "-p", "no:cacheprovider", "-q"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 120
        mine: list = []
        while not mine:
            assert proc.poll() is None and time.monotonic() < deadline, "no container showed up"
            mine = _owned_by(client, proc.pid)
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert "KeyboardInterrupt" in out or proc.returncode == 2, out[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert all(_gone(client, c.id, timeout=20) for c in mine)


@pytest.mark.desktop
def test_retrace_build_on_docker_from_osworld_results(client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSWorld results directory (traj.jsonl, step screenshots, result.txt) with its task's config
    (download, launch, activate_window) and evaluator, through `retrace build --env docker`, end to end: the case
    keeps OSWorld's config, which desktop-env's SetupController runs against the container's desktop."""
    from pytest_retrace.cli import main
    from pytest_retrace.replay.cases import load_case
    from tests.dataset.test_osworld_setup import build_arguments, check_the_case_sets_up

    monkeypatch.chdir(tmp_path)
    assert main([*build_arguments(tmp_path), "--env", "docker"]) == 0
    [path] = sorted((tmp_path / "cases").rglob("*.yaml"))
    case = load_case(path)
    assert case.metadata["kind"] == "hidden-state" and case.task.setup == [] and case.task.osworld is not None
    assert [step["type"] for step in case.task.osworld.config] == ["download", "launch", "activate_window"]
    check_the_case_sets_up(DockerEnvironment(settle=FAST), case)
