"""Reaching a case's error state: today's replay against a CRIU checkpoint of the whole desktop (issue 26).

Today every test reaches s_error by reset (fresh Xvfb + openbox + the task's apps from its setup), then the
ground-truth prefix and the perturbation, each verified pixel for pixel. The plan (``--retrace-restore=
checkpoint``) dumps the desktop once per case with CRIU and restores it for every test of the case. This
measures both, side by side in one run, for one app of each kind the built-in suite uses (xterm, mousepad,
gnumeric, LibreOffice Calc and Writer, pcmanfm, chromium):

- checkpoint: a desktop (Xvfb, openbox, the app on a small file) in its own pid + IPC namespace is dumped with
  ``criu dump --leave-running``; printed: dump time, image size, restore time (median of --restores restores
  from the SAME image, the restored tree killed in between, as a test run would use it), whether every
  restored screen is pixel-identical to the screen before the dump and whether the restored app takes input
  (keys typed, the screen changes). If the plain dump or restore fails, the usual extra options are tried once
  and the error lines printed.
- replay: the real harness on 1-2 built-in cases of that app (the shortest and the longest prefix) with the
  oracle baseline; the time to a verified s_error is the first reconstruction's stages (reset, prefix, verify
  s_target, perturbation, verify s_error) as each stage ends (the plugin's stage hook). The record's
  ``timings`` cannot give it alone: the oracle's recovery reconstructs s_target a second time and its reset,
  prefix and verify are summed into the same keys (printed next to it).

The checkpointed desktop is the app's initial state, not the case's s_error: what is compared is the price of
restoring a desktop of that app against the price of replaying to one.

CRIU: Debian 12's criu 3.17 fails on this kernel; trixie's 4.1.1 works, run from the host through trixie's own
loader. ``--criu-root`` (default ``.tools/criu-root``) is a trixie root holding it; when it lacks
``usr/sbin/criu`` it is built with ``mmdebstrap`` (about 30 s). Needs root.

    .venv/bin/python benchmarks/bench_restore.py                       # every app, 2 cases each
    .venv/bin/python benchmarks/bench_restore.py --apps xterm,mousepad --cases 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mss
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SCREEN = (1280, 800)  # every built-in case's screen (pytest_retrace.screen.frames.DEFAULT_SCREEN)
STAGE_LOG = "RETRACE_BENCH_STAGES"  # where the stage hook below appends, inside the pytest run
FIRST_RECONSTRUCTION = ("reset", "prefix", "verify", "perturb")
# Tried once, together, when the plain dump or restore fails: what a desktop app most often needs
# (locks LibreOffice takes, files deleted while open, sockets to outside, chromium's big deleted shm files).
EXTRA_OPTIONS = ["--file-locks", "--link-remap", "--ext-unix-sk", "--tcp-established", "--ghost-limit", "512M"]


# -- the stage hook: this module is loaded into the measured pytest run with `-p bench_restore` -------------
def pytest_retrace_stage_end(item: Any, stage: Any) -> None:
    """Append each stage's name, title and seconds, in order: the first reconstruction is read from it."""
    path = os.environ.get(STAGE_LOG)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"name": stage.name, "title": stage.title, "seconds": stage.seconds}) + "\n")


# -- the apps ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class App:
    name: str
    suite: str  # the folder of its built-in cases
    argv: tuple[str, ...]  # {home} is the private HOME, {data} a folder next to it
    window: str  # xdotool --name pattern of its window
    files: dict[str, str] = field(default_factory=dict)  # small files it opens, relative to HOME
    keys: str = "retrace"  # typed to see the restored app take input


def flat_odf(kind: str, body: str) -> str:
    """A flat (one XML file) OpenDocument: LibreOffice opens it straight away (a CSV asks for import options)."""
    ns = " ".join(f'xmlns:{p}="urn:oasis:names:tc:opendocument:xmlns:{p}:1.0"' for p in ("office", "table", "text"))
    return (f'<?xml version="1.0" encoding="UTF-8"?><office:document {ns} office:version="1.2" '
            f'office:mimetype="application/vnd.oasis.opendocument.{kind}"><office:body><office:{kind}>{body}'
            f"</office:{kind}></office:body></office:document>")


def cell(text: str) -> str:
    return f"<table:table-cell office:value-type='string'><text:p>{text}</text:p></table:table-cell>"


CHROMIUM = ("chromium", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--user-data-dir={data}/chromium",
            "file://{home}/form.html")
APPS = [
    App("xterm", "terminal", ("xterm", "-fa", "DejaVu Sans Mono", "-fs", "11", "-bg", "white", "-fg", "black"),
        "xterm", keys="echo retrace"),
    App("mousepad", "text-editor", ("mousepad", "{home}/notes.txt"), "Mousepad",
        {"notes.txt": "Minutes\n- topic 1\n- topic 2\n"}),
    App("gnumeric", "spreadsheet", ("gnumeric", "{home}/book.csv"), "Gnumeric",
        {"book.csv": "Item,Qty\napple,3\npear,5\n"}),
    App("lo-calc", "libreoffice-calc", ("libreoffice", "--calc", "--norestore", "--nologo", "{home}/book.fods"),
        "LibreOffice Calc", {"book.fods": flat_odf("spreadsheet", "<table:table table:name='Sheet1'>"
                                                   "<table:table-row>" + cell("Item") + cell("Qty") +
                                                   "</table:table-row></table:table>")}),
    App("lo-writer", "libreoffice-writer", ("libreoffice", "--writer", "--norestore", "--nologo",
                                            "{home}/doc.fodt"), "LibreOffice Writer",
        {"doc.fodt": flat_odf("text", "<text:p>Meeting notes</text:p><text:p>Budget is approved.</text:p>")}),
    App("pcmanfm", "file-manager", ("pcmanfm", "{home}/inbox"), "inbox",
        {"inbox/draft1.txt": "draft one\n", "inbox/report.txt": "Q3 report\n"}, keys="r"),
    App("chromium", "browser", CHROMIUM, "Chromium",
        {"form.html": "<title>Form</title><p>Name: <input autofocus></p>"}),
]


# -- CRIU -------------------------------------------------------------------------------------------------
class Criu:
    """trixie's criu, run from the host through trixie's own loader and libraries (no chroot: it must see
    the host's /proc and the desktop's files)."""

    def __init__(self, root: Path) -> None:
        libs = f"{root}/usr/lib/x86_64-linux-gnu:{root}/lib/x86_64-linux-gnu"
        self.argv = [f"{root}/lib64/ld-linux-x86-64.so.2", "--library-path", libs, f"{root}/usr/sbin/criu"]

    def run(self, *args: str, log: Path | None = None) -> tuple[bool, float, str]:
        """(succeeded, wall seconds, its error lines)."""
        logging = ["-o", str(log), "-v2"] if log else []
        start = time.perf_counter()
        proc = subprocess.run([*self.argv, *args, *logging], check=False, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        text = proc.stdout + proc.stderr + (log.read_text(errors="replace") if log and log.exists() else "")
        # criu 4.1.1 always logs "rlimit: Can't setup RLIMIT_NOFILE for self" as an error here; it is harmless
        errors = [line for line in text.splitlines() if "Error" in line and "RLIMIT_NOFILE" not in line]
        return proc.returncode == 0, seconds, "\n".join(errors[-6:]) or text.strip()[-600:]


def criu_root(path: Path) -> Path:
    """A trixie root holding criu 4.x; built with mmdebstrap when missing (installed with apt if need be)."""
    if (path / "usr/sbin/criu").exists():
        return path
    print(f"{path} has no usr/sbin/criu: building it with mmdebstrap (trixie, criu; about 30 s)", flush=True)
    if shutil.which("mmdebstrap") is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "mmdebstrap"], check=True, stdout=subprocess.DEVNULL)
    if path.exists() and not any(path.iterdir()):
        path.rmdir()  # mmdebstrap wants a missing or empty target; an empty dir it refuses on some versions
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mmdebstrap", "--variant=apt", "--include=criu", "trixie", str(path),
                    "http://deb.debian.org/debian"], check=True, stdout=subprocess.DEVNULL)
    return path


# -- a desktop in its own pid + IPC namespace ------------------------------------------------------------
def free_display(start: int = 300) -> int:
    n = start
    while Path(f"/tmp/.X11-unix/X{n}").exists() or Path(f"/tmp/.X{n}-lock").exists():
        n += 1
    return n


def desk_script(display: int, app: App, home: Path, data: Path) -> str:
    """PID 1 of the namespace: Xvfb (its socket file only, no TCP or abstract socket: nothing outside can
    reach it but through the file, and CRIU re-binds a path), openbox, the app, then sleep as the init. Output
    goes to /dev/null: CRIU restores a regular file only at the size it had at the dump ("has bad size"), and a
    log keeps growing after it."""
    # the harness's app environment: no cursor blink, no D-Bus, GSettings in a keyfile
    from pytest_retrace.envs.desktop import task_environment

    env = task_environment(f":{display}", home=str(home), runtime=str(data / "runtime"))
    exports = " ".join(f"{k}='{v}'" for k, v in env.items())
    argv = " ".join(f"'{a.format(home=home, data=data)}'" for a in app.argv)
    w, h = SCREEN
    return f"""#!/bin/sh
export {exports}
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
Xvfb :{display} -screen 0 {w}x{h}x24 -nolisten tcp -nolisten local -nocursor -dpi 96 +extension XTEST -noreset -r \
  >/dev/null 2>&1 &
for i in $(seq 200); do [ -e /tmp/.X11-unix/X{display} ] && break; sleep 0.05; done
openbox >/dev/null 2>&1 &
sleep 0.5
cd {home} && {argv} >/dev/null 2>&1 &
exec sleep infinity
"""


class Desktop:
    """One app's desktop; `init` is the namespace's init (kill it and the namespace ends)."""

    def __init__(self, app: App, work: Path) -> None:
        self.app, self.display = app, free_display()
        self.home, self.data = work / "home", work / "data"
        shutil.copytree(REPO / "pytest_retrace/envs/home-template", self.home)
        self.data.mkdir()
        for rel, text in app.files.items():
            (self.home / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.home / rel).write_text(text)
        script = work / "desk.sh"
        script.write_text(desk_script(self.display, app, self.home, self.data))
        script.chmod(0o755)
        # stdio /dev/null, not pipes to us: a pipe to a process outside the tree is an external resource
        self.unshare = subprocess.Popen(["unshare", "--pid", "--fork", "--ipc", "setsid", str(script)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        self.init = wait_for(lambda: children(self.unshare.pid), 5, "the namespace's init")[0]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DISPLAY": f":{self.display}"}

    def xdotool(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["xdotool", *args], check=False, env=self.env, capture_output=True, text=True, timeout=30)

    def wait_window(self, timeout: float) -> None:
        wait_for(lambda: self.xdotool("search", "--onlyvisible", "--name", self.app.window).stdout.strip(),
                 timeout, f"a window named {self.app.window!r}")

    def shot(self) -> np.ndarray:
        """The screen; the connection is closed again (an X client outside the tree blocks a dump). XGetImage:
        MIT-SHM would ask a server in another IPC namespace to attach our segment."""
        with mss.MSS(display=f":{self.display}", backend="xgetimage") as grab:
            return np.asarray(grab.grab(grab.monitors[1]))[:, :, :3].copy()

    def settle(self, quiet: float = 2.0, timeout: float = 60) -> np.ndarray:
        """The screen once it has not changed for `quiet` seconds."""
        last, since, deadline = self.shot(), time.monotonic(), time.monotonic() + timeout
        while time.monotonic() - since < quiet and time.monotonic() < deadline:
            time.sleep(0.25)
            now = self.shot()
            if not np.array_equal(now, last):
                last, since = now, time.monotonic()
        return last

    def close(self) -> None:
        kill_tree(self.init)
        if self.unshare.poll() is None:
            self.unshare.kill()
        self.unshare.wait()
        for leftover in (f"/tmp/.X11-unix/X{self.display}", f"/tmp/.X{self.display}-lock"):
            Path(leftover).unlink(missing_ok=True)


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"no {what} after {timeout:.0f} s")


def kill_tree(pid: int | None) -> None:
    """SIGKILL a namespace's init (the kernel kills the rest of its namespace) and wait until it is gone."""
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:  # ours to reap if it is our child; a restored tree is reaped by init
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            break  # a zombie: already dead, its namespace gone
        time.sleep(0.02)


# -- the checkpoint measurement ---------------------------------------------------------------------------
@dataclass
class Checkpoint:
    dump: float | None = None
    image_mb: float | None = None
    restores: list[float] = field(default_factory=list)
    identical: list[bool] = field(default_factory=list)
    takes_input: bool | None = None
    files: list[float] = field(default_factory=list)  # seconds to put HOME and data back before each restore
    options: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def restore(self) -> float | None:
        return statistics.median(self.restores) if self.restores else None


def dump(criu: Criu, desk: Desktop, images: Path, options: list[str], result: Checkpoint) -> bool:
    """Dump the running tree, leaving it running. "External socket is used" right after our last screenshot
    means the server has not yet seen that connection close: retried."""
    for attempt in range(4):
        shutil.rmtree(images, ignore_errors=True)
        images.mkdir()
        # with the extra options the tree is left stopped, not running: its files are then copied as they were
        # at the dump (chromium removes a BrowserMetrics file it holds open within milliseconds)
        leave = "--leave-stopped" if options else "--leave-running"
        ok, seconds, errors = criu.run("dump", "-t", str(desk.init), "-D", str(images), leave, *options,
                                       log=images.parent / f"dump-{attempt}.log")
        if ok:
            result.dump = seconds
            result.image_mb = sum(f.stat().st_size for f in images.iterdir()) / 1e6
            return True
        if "External socket" not in errors or attempt == 3:
            result.problems.append(f"dump {' '.join(options) or '(no options)'}: {errors}")
            return False
        time.sleep(0.5)
    return False


def copy_files(source: Path, target: Path) -> None:
    """HOME and the data folder, as they are: `cp -a` also copies the unix sockets apps bind there (pcmanfm)."""
    subprocess.run(["cp", "-a", str(source / "home"), str(source / "data"), str(target)], check=True)


def restore_cycles(criu: Criu, desk: Desktop, images: Path, before: np.ndarray, restores: int, options: list[str],
                   result: Checkpoint) -> None:
    """Restore from the same image `restores` times, killing each restored tree before the next."""
    work = images.parent
    for i in range(restores):
        start = time.perf_counter()
        for name in ("home", "data"):
            shutil.rmtree(work / name)
        copy_files(work / "snapshot", work)
        result.files.append(time.perf_counter() - start)
        pidfile = images.parent / f"restored-{i}.pid"
        ok, seconds, errors = criu.run("restore", "-D", str(images), "-d", "--pidfile", str(pidfile), *options,
                                       log=images.parent / f"restore-{i}.log")
        if not ok:
            result.problems.append(f"restore {' '.join(options) or '(no options)'}: {errors}")
            return
        pid = int(pidfile.read_text())
        try:
            result.restores.append(seconds)
            after = desk.shot()
            result.identical.append(bool(np.array_equal(after, before)))
            if i == 0:  # the restored app answers keys: type, and the screen changes
                desk.xdotool("type", "--delay", "30", desk.app.keys)
                time.sleep(1.5)
                result.takes_input = not np.array_equal(desk.shot(), after)
        finally:
            kill_tree(pid)


def measure_checkpoint(criu: Criu, app: App, restores: int) -> Checkpoint:
    """Plain criu first; if the dump or the first restore fails, once more on a new desktop with EXTRA_OPTIONS."""
    result = Checkpoint()
    for options in ([], EXTRA_OPTIONS):
        result.options = options
        done = checkpoint_once(criu, app, restores, options, result)
        if done is not False:  # measured, or the app did not start (no matter of criu options)
            break
    return result


def checkpoint_once(criu: Criu, app: App, restores: int, options: list[str], result: Checkpoint) -> bool | None:
    """Start the app's desktop, dump it, restore it `restores` times; False if it could not dump or restore
    even once, None if the app did not start."""
    with tempfile.TemporaryDirectory(prefix=f"bench-restore-{app.name}-") as tmp, ExitStack() as cleanup:
        work = Path(tmp)
        desk = Desktop(app, work)
        cleanup.callback(desk.close)  # also after a failure: the namespace, the X socket; then tmp goes
        try:
            desk.wait_window(120)
            before = desk.settle()
        except TimeoutError as exc:
            result.problems.append(f"start: {exc}")
            return None
        images = work / "images"
        if not dump(criu, desk, images, options, result):
            return False
        # CRIU checkpoints processes, not files: a file it finds changed or gone on restore fails it ("has bad
        # size", "Can't open file"; chromium rewrites its profile). So HOME and the data folder are copied right
        # after the dump (the tree is running again: a small race) and put back before every restore, as a
        # test would have its files reset anyway.
        snapshot = work / "snapshot"
        snapshot.mkdir()
        copy_files(work, snapshot)
        kill_tree(desk.init)  # the original must be gone: the restore takes its pids and its X socket path
        desk.init = None
        restore_cycles(criu, desk, images, before, restores, options, result)
        return bool(result.restores)


# -- the replay measurement -------------------------------------------------------------------------------
@dataclass
class Replay:
    case: str
    prefix: int
    to_error: float | None = None  # the first reconstruction, from the stage hook
    record: dict[str, float] = field(default_factory=dict)  # the record's timings (both reconstructions folded)
    problem: str = ""


def pick_cases(app: App, count: int) -> list[tuple[Path, int]]:
    """The case with the shortest and the one with the longest prefix (first by name on a tie)."""
    from pytest_retrace.replay.cases import load_case

    cases = sorted((len(load_case(p).prefix), p) for p in sorted((REPO / "cases" / app.suite).glob("*.yaml")))
    chosen = ([cases[0], cases[-1]] if cases[0][0] != cases[-1][0] else [cases[0]])[:count]
    return [(p, n) for n, p in chosen]


def measure_replay(case: Path, prefix: int) -> Replay:
    import userrun

    result = Replay(case.stem, prefix)
    with tempfile.TemporaryDirectory(prefix="bench-restore-replay-") as tmp:
        stages = Path(tmp) / "stages.jsonl"
        env = userrun.environment(**{STAGE_LOG: str(stages),
                                     "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "benchmarks")])})
        proc = subprocess.run([*userrun.PYTEST, "-p", "bench_restore", str(case.relative_to(REPO)),
                               "--retrace-model=oracle", f"--retrace-report-dir={tmp}", "--retrace-run=x", "-q"],
                              check=False, cwd=REPO, env=env, capture_output=True, text=True)
        records = Path(tmp) / "x" / "results.jsonl"
        if not records.exists():
            result.problem = f"pytest exited {proc.returncode}: {proc.stdout[-400:]}{proc.stderr[-400:]}"
            return result
        record = json.loads(records.read_text().splitlines()[0])
        result.record = {k: v for k, v in record["timings"].items() if k in FIRST_RECONSTRUCTION + ("recover",)}
        if record.get("error"):
            result.problem = f"record error: {record['error']}"
        result.to_error = first_reconstruction(stages)
    return result


def first_reconstruction(stages: Path) -> float | None:
    """Seconds from the first reset to the end of "verify s_error" (retried attempts included, as a test pays)."""
    total = 0.0
    for line in stages.read_text().splitlines() if stages.exists() else []:
        stage = json.loads(line)
        if stage["name"] in FIRST_RECONSTRUCTION:
            total += stage["seconds"]
        if stage["title"] == "verify s_error":
            return total
    return None


# -- the report -------------------------------------------------------------------------------------------
def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def yes_no(values: list[bool] | bool | None) -> str:
    if values is None or values == []:
        return "-"
    if isinstance(values, bool):
        return "yes" if values else "NO"
    return "yes" if all(values) else f"NO ({sum(values)}/{len(values)})"


HEADER = (f"{'app':<10} {'case':<44} {'prefix':>6} {'replay s':>9} {'dump s':>7} {'image MB':>9} "
          f"{'restore s':>9} {'identical':>10} {'input':>6} {'restore/replay':>15}")


def print_app(app: App, point: Checkpoint, replays: list[Replay]) -> None:
    print(HEADER)
    for replay in replays or [Replay("-", 0)]:
        ratio = (f"{point.restore / replay.to_error:.4f}" if point.restore and replay.to_error else "-")
        print(f"{app.name:<10} {replay.case[:44]:<44} {replay.prefix:>6} {fmt(replay.to_error):>9} "
              f"{fmt(point.dump, '.3f'):>7} {fmt(point.image_mb, '.1f'):>9} {fmt(point.restore, '.3f'):>9} "
              f"{yes_no(point.identical):>10} {yes_no(point.takes_input):>6} {ratio:>15}")
    for replay in replays:
        folded = " ".join(f"{k} {v:.2f}" for k, v in replay.record.items())
        print(f"  {replay.case}: record timings (oracle's 2nd reconstruction folded in): {folded}")
        if replay.problem:
            print(f"  {replay.case}: {replay.problem}")
    if point.options:
        print(f"  criu options needed: {' '.join(point.options)} (dumped with --leave-stopped)")
    if point.restores:
        print(f"  restores: {', '.join(f'{s:.3f}' for s in point.restores)} s; putting HOME and data back first: "
              f"{', '.join(f'{s:.3f}' for s in point.files)} s")
    for problem in point.problems:
        print("  " + problem.replace("\n", "\n    "))
    print(flush=True)


@contextmanager
def timing(label: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    print(f"  ({label}: {time.perf_counter() - start:.0f} s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--criu-root", type=Path, default=REPO / ".tools/criu-root")
    parser.add_argument("--apps", default=",".join(a.name for a in APPS))
    parser.add_argument("--cases", type=int, default=2, help="built-in cases replayed per app (0 to 2)")
    parser.add_argument("--restores", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (criu)", file=sys.stderr)
        return 2
    criu = Criu(criu_root(args.criu_root))
    ok, _, message = criu.run("check")
    if not ok:
        print(f"criu check failed: {message}", file=sys.stderr)
        return 1
    version = subprocess.run([*criu.argv, "--version"], check=False, capture_output=True, text=True).stdout.split("\n")[0]
    print(f"{version}, root {args.criu_root}; criu check: Looks good. Load average {os.getloadavg()}")
    print(f"restore: median of {args.restores} from the same image; replay: first reconstruction of the oracle run")
    print()
    for app in [a for a in APPS if a.name in args.apps.split(",")]:
        print(f"== {app.name}", flush=True)
        with timing("checkpoint"):
            try:
                point = measure_checkpoint(criu, app, args.restores)
            except Exception as exc:  # noqa: BLE001 - one app's failure is reported, the others still measured
                point = Checkpoint(problems=[f"checkpoint: {type(exc).__name__}: {exc}"])
        with timing("replays"):
            replays = [measure_replay(path, n) for path, n in pick_cases(app, args.cases)]
        print_app(app, point, replays)
    print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
