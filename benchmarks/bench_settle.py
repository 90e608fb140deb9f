"""Adaptive settling against the paper's fixed 10 s window, against waiting for quiet alone, and against
polling the screen instead of waiting for X DAMAGE: the same verdicts, how much time and CPU each costs,
and which one holds at -n 16.

    .venv/bin/python benchmarks/bench_settle.py [--cases 21] [--models oracle,noop,undo] [-n 16] [--settle 10]
                                                [--configs adaptive,poll,quiet-only,fixed]

Runs the same built-in cases (every k-th case in name order, so every app is in) with the scripted baselines
three times under pytest, each as ``retrace run`` would: ``adaptive`` (the default: wait up to 1 s for an
action's effect to start, then 0.3 s of quiet), ``quiet-only`` (``--retrace-settle-react 0``: 0.3 s of quiet,
the rule before issue 11), ``poll`` (``--retrace-settle-signal poll``: adaptive, grabbing a screenshot every
30 ms instead of after the X server reports drawing) and ``fixed`` (``--retrace-settle-mode fixed``: the paper's 10 s after every
action). It prints side by side: wall time, CPU seconds of everything it ran (apps and X servers included), tests, infrastructure errors, actions, their mean settle time and
how many never settled; then, against the adaptive run, whether every (case, model) verdict, R_O and R_TC
is identical, and the time and CPU ratios. No thresholds: it reports; the load average is printed with
the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import userrun

REPO = Path(__file__).resolve().parent.parent


def pick(n: int) -> list[Path]:
    files = sorted((REPO / "cases").glob("*/*.yaml"))
    step = max(1, len(files) // n)
    return files[::step][:n]


CONFIGS = {  # name: the pytest options that make it
    "adaptive": ["--retrace-settle-mode=adaptive"],
    "poll": ["--retrace-settle-mode=adaptive", "--retrace-settle-signal=poll"],
    "quiet-only": ["--retrace-settle-mode=adaptive", "--retrace-settle-react=0"],
    "fixed": ["--retrace-settle-mode=fixed"],
}


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # every waited-for descendant: workers, apps, Xvfb
    return usage.ru_utime + usage.ru_stime


def run(mode: str, cases: list[Path], models: str, workers: int, settle: float,
        out: Path) -> tuple[float, float, list[dict]]:
    args = [*userrun.PYTEST, *map(str, cases), f"--retrace-model={models}", "-n", str(workers),
            *CONFIGS[mode], f"--retrace-settle={settle}", f"--retrace-report-dir={out}",
            f"--retrace-run={mode}", "-q"]
    start, cpu = time.monotonic(), cpu_of_children()
    subprocess.run(args, cwd=REPO, stdout=subprocess.DEVNULL, check=False, env=userrun.environment())
    seconds, cpu = time.monotonic() - start, cpu_of_children() - cpu
    lines = (out / mode / "results.jsonl").read_text().splitlines()
    return seconds, cpu, [json.loads(line) for line in lines]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=21)
    ap.add_argument("--models", default="oracle,noop,undo")
    ap.add_argument("-n", "--workers", type=int, default=16)
    ap.add_argument("--settle", type=float, default=10.0, help="the fixed window and the adaptive cap (seconds)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="which of " + ", ".join(CONFIGS))
    args = ap.parse_args()
    configs = ["adaptive", *(c for c in args.configs.split(",") if c != "adaptive")]
    if unknown := set(configs) - set(CONFIGS):
        ap.error(f"--configs: unknown {sorted(unknown)}")
    cases = pick(args.cases)
    print(f"{len(cases)} cases x {args.models}, -n {args.workers}, load average {os.getloadavg()[0]:.1f}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in configs:
            results[mode] = run(mode, cases, args.models, args.workers, args.settle, Path(tmp))
            print(f"  {mode} done in {results[mode][0]:.0f} s, load average {os.getloadavg()[0]:.1f}")
    print(f"\n{'mode':<11}{'wall s':>8}{'CPU s':>8}{'tests':>7}{'errors':>8}{'actions':>9}{'settle s/action':>17}"
          f"{'unsettled':>11}")
    verdicts = {}
    for mode, (seconds, cpu, records) in results.items():
        steps = [a for r in records for a in r["actions"]]
        mean = sum(a["settle"] for a in steps) / max(1, len(steps))
        unsettled = sum(not a.get("settled", True) for a in steps)
        errors = sum(r["verdict"] == "error" for r in records)
        print(f"{mode:<11}{seconds:>8.0f}{cpu:>8.0f}{len(records):>7}{errors:>8}{len(steps):>9}{mean:>17.3f}"
              f"{unsettled:>11}")
        verdicts[mode] = {(r["case"], r["model"]): (r["verdict"], r["r_o"], r["r_tc"]) for r in records}
    a = verdicts["adaptive"]
    any_differ = False
    for mode in configs[1:]:
        other = verdicts[mode]
        differ = sorted(k for k in a.keys() | other.keys() if a.get(k) != other.get(k))
        any_differ |= mode in ("fixed", "poll") and bool(differ)
        wall, cpu = results[mode][0] / results["adaptive"][0], results[mode][1] / results["adaptive"][1]
        print(f"\n{mode} vs adaptive: verdicts, R_O, R_TC identical on {len(a.keys() & other.keys()) - len(differ)} "
              f"of {len(a.keys() | other.keys())} (case, model) pairs; {mode} / adaptive: wall {wall:.2f}x, "
              f"CPU {cpu:.2f}x")
        for key in differ:
            print(f"  differs: {key}: adaptive {a.get(key)}, {mode} {other.get(key)}")
    return 0 if not any_differ else 1


if __name__ == "__main__":
    raise SystemExit(main())
