"""Speed of the docker environment against the xvfb one, measured side by side in one run.

    .venv/bin/python benchmarks/bench_docker.py [--resets 5] [--cases 3] [--actions 20] [--case PATH ...]

Both providers are started first, and their start times are reported on their own (docker's builds its
desktop image on the engine when the recipe or the package source changed: about 75 s once). Then, with the
measurements alternating between the providers so that a change in the machine's load hits both alike:
- reset: --resets resets of each to a realistic task (a built-in case's setup: files, an app and its
  window), as replay does them; median, min and max seconds, and the ratio docker / xvfb;
- action: --actions ``move`` actions alternating between two points, each ``execute`` to a settled screen;
  median seconds per action, and the part before settling (docker sends the xvfb provider's xdotool commands
  to the guest's /execute, xvfb runs them here) next to the settle wait (docker polls screenshots over
  HTTP, xvfb grabs them from the X server);
- screenshot: the cost of one settling poll, --actions (at least 10) of each alternating: xvfb's grab in this
  process; docker's over HTTP as a PNG (``GET /screenshot``: encoded by the guest, decoded here) and as raw RGB
  (``GET /screenshot?format=rgb``; a guest from before that format answers PNG, and the line says so), each
  split into the request (grab, encode, transfer) and the decode here; and the environment's own
  ``screenshot()``, which is what settling polls;
- reset split: where each timed reset's seconds went, by the methods it calls (wrapped to time them, each run
  as is): docker's removal of a container, creating and starting one, waiting for its guest to answer (in
  the reset's own thread: only where no spare was ready), and for both providers the task's files, its app
  launch (with the window wait), the final settle, and the rest (docker's: waiting for its thread); then,
  marked [thread], what docker's reset did alongside in a thread (the last container removed, the next case's
  booted: ``spare``); the screenshots taken inside them are counted;
- case: the full replay (replay.run_case) of --cases built-in cases with the ``oracle`` baseline, as
  ``pytest --retrace-model=oracle`` runs them; seconds per case and of them in resets (the oracle resets
  twice), the ratio, and whether the verdicts (recovered, R_O, R_TC) agree.
No timed tests: shared machines are too noisy for thresholds; the load average is printed with the numbers.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_retrace.actions import Action
from pytest_retrace.agents import create_agent, load_model_config
from pytest_retrace.envs import Environment, create_environment
from pytest_retrace.envs.docker.environment import GUEST_PYTHON, DockerEnvironment
from pytest_retrace.envs.remote.environment import RemoteEnvironment
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import RecoveryCase, load_case
from pytest_retrace.replay.result import RecoveryResult, ReplayOptions
from pytest_retrace.replay.run import run_case
from pytest_retrace.screen.settle import SettleConfig

REPO = Path(__file__).resolve().parent.parent
PROVIDERS = ("xvfb", "docker")
RESET_CASE = REPO / "cases" / "app-settings" / "indent-and-save-t1-close-window.yaml"
# Replayed by default, in this order: one per app.
DEFAULT_CASES = [
    "app-settings/indent-and-save-t1-close-window",
    "text-editor/append-line-t2-unmaximize",
    "terminal/config-file-t1-close-window",
    "spreadsheet/add-row-t2-scroll-far",
    "files/cleanup-tmp-t4-unmaximize",
]
# Two points in the middle of mousepad's text area: nothing there reacts to hovering.
MOVE_POINTS = ((600, 400), (680, 440))


RAW_TYPE = "application/octet-stream"  # GET /screenshot?format=rgb's reply from a guest that has it
# What a reset calls, by provider class: (method, label). Disjoint at the top of a reset's own thread: nothing
# here calls another of its list there (screenshots are counted on their own: settle and launch take them).
# Docker's reset removes the last container and boots the next one in a thread while it prepares the task: what
# runs there is labelled THREAD, shown on its own and not subtracted from the reset's "rest" (it overlaps).
RESET_PHASES: dict[type, list[tuple[str, str]]] = {
    DockerEnvironment: [("_remove", "remove a container"), ("_start", "create and start a container"),
                        ("_wait_ready", "wait for its guest (/health)"),
                        ("_next_container", "remove the last, boot the next (spare)")],
    RemoteEnvironment: [("write_file", "task files"), ("launch", "launch the app, wait for its window"),
                        ("settle", "settle (the reset's last step)")],
}
RESET_PHASES[XvfbEnvironment] = [("kill_session", "xvfb: kill the previous session"),
                                 ("_restart_display", "xvfb: restart its display"), *RESET_PHASES[RemoteEnvironment]]


THREAD = " [thread]"


class Phases:
    """Seconds per labelled method while `active`, by wrapping the methods on their classes (timing only)."""

    def __init__(self) -> None:
        self.active = False
        self.seconds: dict[str, float] = defaultdict(float)
        self.shots = 0

    def wrap(self, owner: type, name: str, label: str | None) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed_call(*args: Any, **kw: Any) -> Any:
            if not self.active:
                return original(*args, **kw)
            start = time.perf_counter()
            try:
                return original(*args, **kw)
            finally:
                if label is None:
                    self.shots += 1
                else:
                    main = threading.current_thread() is threading.main_thread()
                    self.seconds[label if main else label + THREAD] += time.perf_counter() - start

        setattr(owner, name, timed_call)

    def run(self, fn: Callable[[], Any]) -> tuple[float, dict[str, float], int]:
        """`fn`'s seconds, its split by label, and the screenshots it took."""
        self.seconds, self.shots, self.active = defaultdict(float), 0, True
        try:
            seconds, _ = timed(fn)
        finally:
            self.active = False
        return seconds, dict(self.seconds), self.shots


def instrument(envs: dict[str, Environment]) -> Phases:
    phases = Phases()
    classes = {type(env) for env in envs.values()} | {RemoteEnvironment}  # docker's guest is a RemoteEnvironment
    for cls in classes:
        for name, label in RESET_PHASES.get(cls, ()):
            phases.wrap(cls, name, label)
        if cls is not DockerEnvironment:  # its screenshot is its guest's, counted there
            phases.wrap(cls, "screenshot", None)
    return phases


def http_screenshot(guest: RemoteEnvironment, path: str) -> tuple[float, float, str]:
    """One ``GET path`` of the guest's screenshot and its decode here: (request s, decode s, format answered).
    Decoded as the environment does (envs/remote/decode.py) but here, so that an older guest can be measured."""
    start = time.perf_counter()
    reply = guest.client.request("GET", path, limit=256 * 1024 * 1024)
    asked = time.perf_counter()
    if reply.status != 200:
        raise RuntimeError(f"{guest.url}{path}: HTTP {reply.status}")
    if reply.content_type == RAW_TYPE:
        headers = reply.headers  # type: ignore[attr-defined] # a guest with format=rgb: a client with headers
        width, height = int(headers["x-screen-width"]), int(headers["x-screen-height"])
        np.frombuffer(reply.body, dtype=np.uint8).reshape(height, width, 3)
        return asked - start, time.perf_counter() - asked, "rgb"
    from PIL import Image

    with Image.open(io.BytesIO(reply.body)) as image:
        np.asarray(image.convert("RGB"), dtype=np.uint8)
    return asked - start, time.perf_counter() - asked, "png"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def ratio(docker: float, xvfb: float) -> str:
    return f"×{docker / xvfb:.1f}" if xvfb > 0 else "-"


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) {five:.1f} (5 min) on {os.cpu_count()} cores"


def other_containers(mine: set[str]) -> int | None:
    """Desktop containers of other processes on the local engine right now (other runs share the machine)."""
    try:
        import docker

        client = docker.from_env()
        try:
            found = client.containers.list(filters={"label": "pytest-retrace=desktop"}, ignore_removed=True)
            return sum(c.id not in mine for c in found)
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - only a note for the reader
        return None


def image_cached() -> bool | None:
    """Whether the docker provider's desktop image for this source exists already (no build at start)."""
    try:
        import docker
        import docker.errors

        from pytest_retrace.envs.docker.image import desktop_tag

        client = docker.from_env()
        try:
            client.images.get(desktop_tag())
            return True
        except docker.errors.ImageNotFound:
            return False
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - only a note for the reader
        return None


def verdict(result: RecoveryResult) -> tuple[Any, ...]:
    if result.error is not None:
        return ("error", result.error.kind, result.error.stage)
    return (result.verdict, result.r_o, result.r_tc)


def describe(result: RecoveryResult) -> str:
    if result.error is not None:
        return f"error ({result.error.kind} at {result.error.stage}: {result.error.message[:160]})"
    return f"{result.verdict} (R_O {result.r_o}, SSIM {result.ssim}, R_TC {result.r_tc})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resets", type=int, default=5, help="timed resets per provider")
    parser.add_argument("--cases", type=int, default=3, help="cases replayed with the oracle per provider")
    parser.add_argument("--actions", type=int, default=20, help="timed move actions per provider")
    parser.add_argument("--case", action="append", type=Path, default=[],
                        help="a case file to replay instead of the built-in choice (repeatable)")
    parser.add_argument("--budget", type=int, default=10)
    args = parser.parse_args()

    reset_case = load_case(RESET_CASE)
    paths = args.case or [REPO / "cases" / f"{name}.yaml" for name in DEFAULT_CASES]
    cases: list[RecoveryCase] = [load_case(p) for p in paths[: args.cases]]
    size = tuple(reset_case.screen)
    settle = SettleConfig(timeout=10.0, quiet=0.3)  # the plugin's --retrace-settle and --retrace-settle-quiet
    # what the plugin hides from a task: the repository, its cases, the venv (the docker provider ignores it)
    hide = (REPO, REPO / "cases", Path(sys.prefix))
    config = load_model_config("oracle", [REPO / "agents"])
    opts = ReplayOptions(budget=args.budget, strategy=config.strategies[0], ssim_threshold=0.99, attempts=3,
                         verify_tolerance=0)  # the plugin's defaults

    print(f"docker vs xvfb, {size[0]}x{size[1]}; {load_note()}", flush=True)
    cached = image_cached()
    envs: dict[str, Environment] = {}
    agent = create_agent(config)
    try:
        # -- start: both before anything is timed -----------------------------------------------------
        start_s: dict[str, float] = {}
        for name in PROVIDERS:
            env = envs[name] = create_environment(name, size=size, settle=settle, network="none", hide=hide)
            start_s[name], _ = timed(env.start)
            print(f"  start {name}: {start_s[name]:.2f} s", flush=True)

        # -- reset ------------------------------------------------------------------------------------
        task, files, masks = reset_case.task, reset_case.dir, reset_case.masks
        for name in PROVIDERS:  # one untimed reset each: a cold first container or app start is not the point
            envs[name].reset(task, files, masks)
        others = other_containers({getattr(envs["docker"], "container_id", None) or ""})
        resets: dict[str, list[float]] = {name: [] for name in PROVIDERS}
        splits: dict[str, list[tuple[dict[str, float], int]]] = {name: [] for name in PROVIDERS}
        phases = instrument(envs)
        for i in range(args.resets):
            for name in PROVIDERS if i % 2 == 0 else PROVIDERS[::-1]:
                seconds, split, shots = phases.run(lambda e=envs[name]: e.reset(task, files, masks))
                resets[name].append(seconds)
                own = sum(v for k, v in split.items() if not k.endswith(THREAD))
                splits[name].append(({**split, "rest": seconds - own}, shots))
        print("  resets: " + ", ".join(f"{n} " + " ".join(f"{s:.2f}" for s in resets[n]) for n in PROVIDERS),
              flush=True)

        # -- one action -------------------------------------------------------------------------------
        actions: dict[str, list[tuple[float, float]]] = {name: [] for name in PROVIDERS}  # (wall, settle)
        for name in PROVIDERS:
            envs[name].execute(Action("move", x=MOVE_POINTS[1][0], y=MOVE_POINTS[1][1]))
        for i in range(args.actions):
            move = Action("move", x=MOVE_POINTS[i % 2][0], y=MOVE_POINTS[i % 2][1])
            for name in PROVIDERS if i % 2 == 0 else PROVIDERS[::-1]:
                seconds, settled = timed(lambda e=envs[name], a=move: e.execute(a))
                actions[name].append((seconds, settled.seconds))
        # what pyautogui's path (the remote provider's, and docker's for text the keymap lacks) would cost per
        # action: /execute of a new guest python, bare and with pyautogui
        guest = envs["docker"].guest  # type: ignore[attr-defined]
        probes: dict[str, list[float]] = {"pass": [], "import pyautogui": []}
        for _ in range(max(3, args.actions // 4)):
            for code, times in probes.items():
                times.append(timed(lambda c=code: guest.client.execute([GUEST_PYTHON, "-c", c], shell=False,
                                                                       timeout=30.0))[0])

        # -- one settling poll: a screenshot ------------------------------------------------------------
        polls: dict[str, list[tuple[float, float]]] = {"xvfb": [], "png": [], "rgb": [], "docker": []}
        answered: set[str] = set()
        for i in range(max(10, args.actions)):
            kinds = ["xvfb", "png", "rgb", "docker"]
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                if kind == "xvfb":
                    polls[kind].append((timed(envs["xvfb"].screenshot)[0], 0.0))
                elif kind == "docker":  # the environment's own call, as settling makes it
                    polls[kind].append((timed(guest.screenshot)[0], 0.0))
                else:
                    request_s, decode_s, got = http_screenshot(guest, "/screenshot" if kind == "png"
                                                               else "/screenshot?format=rgb")
                    polls[kind].append((request_s, decode_s))
                    if kind == "rgb":
                        answered.add(got)

        # -- whole cases with the oracle ----------------------------------------------------------------
        results: dict[str, dict[str, RecoveryResult]] = {name: {} for name in PROVIDERS}
        for i, case in enumerate(cases):
            for name in PROVIDERS if i % 2 == 0 else PROVIDERS[::-1]:
                result = results[name][case.id] = run_case(envs[name], case, agent, opts)
                print(f"  {case.id} on {name}: {result.timings['total']:.1f} s, {describe(result)}",
                      flush=True)
    finally:
        for env in envs.values():
            try:
                env.close()
            except Exception as exc:  # noqa: BLE001 - close the other one too
                print(f"  closing {env.name}: {exc}", file=sys.stderr)
        agent.close()

    # -- the table ------------------------------------------------------------------------------------
    def line(label: str, xvfb: float, docker: float, unit: str = "s", note: str = "") -> None:
        print(f"  {label:<44} xvfb {xvfb:7.2f} {unit}  docker {docker:7.2f} {unit}  {ratio(docker, xvfb):>6}"
              f"  {note}".rstrip())

    image = {True: "image was there", False: "image built", None: "image: unknown"}[cached]
    print(f"\ndocker vs xvfb, {size[0]}x{size[1]}; {load_note()}; "
          f"{'?' if others is None else others} other desktop container(s) running")
    line("start (once per worker)", start_s["xvfb"], start_s["docker"], note=f"({image})")
    med = {n: statistics.median(resets[n]) for n in PROVIDERS}
    line(f"reset, median of {args.resets} ({reset_case.id[:16]}...)", med["xvfb"], med["docker"])
    line("  min", min(resets["xvfb"]), min(resets["docker"]))
    line("  max", max(resets["xvfb"]), max(resets["docker"]))
    labels = [*(lb for _, lb in RESET_PHASES[DockerEnvironment]), *(lb for _, lb in RESET_PHASES[XvfbEnvironment]),
              "rest", *(lb + THREAD for _, lb in RESET_PHASES[DockerEnvironment])]
    for label in labels:
        got = {n: statistics.median(split.get(label, 0.0) for split, _ in splits[n]) for n in PROVIDERS}
        line(f"    {label}", got["xvfb"], got["docker"],
             note="(median over the resets)" if label == labels[0] else "")
    shots = {n: statistics.median(s for _, s in splits[n]) for n in PROVIDERS}
    print(f"    {'screenshots taken (inside the above)':<42} xvfb {shots['xvfb']:7.0f}    docker {shots['docker']:7.0f}")
    if args.actions:
        wall = {n: statistics.median(w for w, _ in actions[n]) for n in PROVIDERS}
        before = {n: statistics.median(w - s for w, s in actions[n]) for n in PROVIDERS}
        waited = {n: statistics.median(s for _, s in actions[n]) for n in PROVIDERS}
        line(f"move action, settled, median of {args.actions}", wall["xvfb"], wall["docker"])
        line("  send and perform (before settling)", before["xvfb"] * 1000, before["docker"] * 1000, "ms",
             note="xvfb: xdotool here; docker: the same xdotool commands via /execute")
        line("  settle (quiet 0.3 s)", waited["xvfb"], waited["docker"])
        bare, imported = (statistics.median(probes[k]) * 1000 for k in ("pass", "import pyautogui"))
        print(f"  {'  docker /execute of python -c pass':<44} {bare:7.0f} ms, "
              f"of python -c 'import pyautogui' {imported:7.0f} ms (median of {len(probes['pass'])})")
    ms = {k: (statistics.median(r + d for r, d in v) * 1000, statistics.median(r for r, _ in v) * 1000,
              statistics.median(d for _, d in v) * 1000) for k, v in polls.items()}
    n = len(polls["xvfb"])
    rgb_note = "raw RGB" if answered == {"rgb"} else f"answered {'/'.join(sorted(answered))}: no raw format"
    print(f"  {f'screenshot per poll, median of {n}':<44} xvfb {ms['xvfb'][0]:7.1f} ms (grab in this process)")
    print(f"  {'  docker over HTTP: PNG (GET /screenshot)':<44} {ms['png'][0]:7.1f} ms = request {ms['png'][1]:.1f} "
          f"(grab, encode, transfer) + decode {ms['png'][2]:.1f}")
    print(f"  {'  docker over HTTP: ?format=rgb':<44} {ms['rgb'][0]:7.1f} ms = request {ms['rgb'][1]:.1f} "
          f"+ decode {ms['rgb'][2]:.1f}  ({rgb_note})")
    print(f"  {'  docker: the environment.screenshot()':<44} {ms['docker'][0]:7.1f} ms  ({ratio(ms['docker'][0], ms['xvfb'][0])} "
          f"xvfb's; what settling polls)")
    agree_all = True
    totals = {n: 0.0 for n in PROVIDERS}
    for case in cases:
        rx, rd = results["xvfb"][case.id], results["docker"][case.id]
        agree = verdict(rx) == verdict(rd)
        agree_all &= agree
        totals["xvfb"] += rx.timings["total"]
        totals["docker"] += rd.timings["total"]
        line(f"case {case.id[:39]}", rx.timings["total"], rd.timings["total"],
             note=f"verdicts agree: {verdict(rx)[0]}" if agree
             else f"verdicts DIFFER: xvfb {verdict(rx)}, docker {verdict(rd)}")
        line("  of which resets", rx.timings.get("reset", 0.0), rd.timings.get("reset", 0.0),
             note="(the reset stage, summed: the oracle resets again to recover)")
    if cases:
        n = len(cases)
        line(f"case, mean of {n} (oracle, budget {args.budget})", totals["xvfb"] / n, totals["docker"] / n,
             note=f"verdicts {'agree on all' if agree_all else 'DIFFER'}")
    return 0 if agree_all else 1


if __name__ == "__main__":
    sys.exit(main())
