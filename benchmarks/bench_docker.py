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
- case: the full replay (replay.run_case) of --cases built-in cases with the ``oracle`` baseline, as
  ``pytest --retrace-model=oracle`` runs them; seconds per case and of them in resets (the oracle resets
  twice), the ratio, and whether the verdicts (recovered, R_O, R_TC) agree.
No timed tests: shared machines are too noisy for thresholds; the load average is printed with the numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_retrace.actions import Action
from pytest_retrace.agents import create_agent, load_model_config
from pytest_retrace.envs import Environment, create_environment
from pytest_retrace.envs.docker.environment import GUEST_PYTHON
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
            found = client.containers.list(filters={"label": "pytest-retrace=desktop"})
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
        for i in range(args.resets):
            for name in PROVIDERS if i % 2 == 0 else PROVIDERS[::-1]:
                seconds, _ = timed(lambda e=envs[name]: e.reset(task, files, masks))
                resets[name].append(seconds)
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
                actions[name].append((seconds, settled))
        # what pyautogui's path (the remote provider's, and docker's for text the keymap lacks) would cost per
        # action: /execute of a new guest python, bare and with pyautogui
        guest = envs["docker"].guest  # type: ignore[attr-defined]
        probes: dict[str, list[float]] = {"pass": [], "import pyautogui": []}
        for _ in range(max(3, args.actions // 4)):
            for code, times in probes.items():
                times.append(timed(lambda c=code: guest._execute([GUEST_PYTHON, "-c", c], shell=False,
                                                                 timeout=30.0))[0])

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
