"""Throughput of the built-in suite with a model that answers slowly, at several xdist worker counts.

A real agent spends most of a case waiting: on its API (seconds per call) and on the desktop settling.
So workers should scale well past this machine's cores. Here a loopback server speaking Anthropic's wire
format answers every call after a fixed latency (default 2 s) — ctrl+z first, then "done" — through the
shipped Claude adapter and the official SDK, exactly as `pytest --retrace-model=claude -n N` would run.
For each worker count (and each way of starting workers, --start) it prints wall time, CPU-seconds, tests per
hour, the speed-up over the first run, errors, and whether every verdict equals the first run's, side by side.

    .venv/bin/python benchmarks/bench_agents.py                  # -n 1, 4 and 16, 2 s latency
    .venv/bin/python benchmarks/bench_agents.py --workers 1 8 --latency 1 -k spreadsheet
    .venv/bin/python benchmarks/bench_agents.py --workers 2 16 --start exec fork -k terminal
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import userrun
import yaml

from pytest_retrace.results import rundir
from pytest_retrace.testing import LoopbackServer, UndoingClaude

REPO = Path(__file__).resolve().parent.parent


def run(workers: int, start_mode: str, agents: Path, reports: Path, extra: list[str],
        env: dict[str, str]) -> tuple[float, float, list[dict]]:
    name = f"n{workers}-{start_mode}-{len(list(reports.glob('*')))}"  # a --start given twice runs twice
    cmd = [*userrun.PYTEST, "--retrace-model=loopback-claude", f"--retrace-agents={agents}",
           f"--retrace-report-dir={reports}", f"--retrace-run={name}", "-q", f"--retrace-workers={start_mode}",
           *(["-n", str(workers)] if workers > 1 else []), *extra]
    start = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    elapsed = time.monotonic() - start
    # every process of the run that was waited for (pytest, its workers, the fork server, xdotool, ...); a
    # desktop's Xvfb and apps are reaped by their worker, so they count too
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    path = rundir.results_file(reports / name)
    if proc.returncode not in (0, 1) or not path.exists():
        sys.exit(f"-n {workers} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, cpu, [json.loads(line) for line in path.read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per model answer")
    parser.add_argument("--start", nargs="+", default=["fork"], choices=("fork", "exec"),
                        help="--retrace-workers: how xdist starts workers; each runs every --workers count "
                             "(`--start exec fork exec fork`: each twice, alternating, as this machine's speed drifts)")
    parser.add_argument("-k", help="pytest -k expression (default: the whole suite)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-agents-") as tmp, LoopbackServer(UndoingClaude(args.latency)) as server:
        agents, reports = Path(tmp) / "agents", Path(tmp) / "reports"
        config = yaml.safe_load((REPO / "agents" / "claude-sonnet-4.6.yaml").read_text())
        # the endpoint's limit must not be what is measured: room for every worker's request
        config["options"]["transport"] = {"concurrency": max(args.workers) * 2}
        agents.mkdir()
        (agents / "prompts").symlink_to(REPO / "agents" / "prompts")
        (agents / "loopback-claude.yaml").write_text(yaml.safe_dump(config))
        env = userrun.environment(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="sk-bench")
        extra = ["-k", args.k] if args.k else []
        rows, notes, first = [], [], None
        for mode, n in ((m, n) for m in args.start for n in args.workers):
            server.responder.peak = 0  # type: ignore[attr-defined]
            elapsed, cpu, recs = run(n, mode, agents, reports, extra, env)
            verdicts = {r["nodeid"]: r["verdict"] for r in recs}
            first = first or (elapsed, verdicts)
            same = "yes" if verdicts == first[1] else (
                f"NO ({sum(verdicts.get(k) != v for k, v in first[1].items())} differ)")
            errors = sum(v == "error" for v in verdicts.values())
            peak = server.responder.peak  # type: ignore[attr-defined]
            rows.append((mode, n, len(recs), elapsed, cpu / len(recs), 3600 * len(recs) / elapsed, first[0] / elapsed,
                         errors, peak, same))
            notes += [f"  -n {n} {mode}: {r['case']}: {r['error']['kind']} at {r['error']['stage']}: {r['error']['message'][:300]}"
                      for r in recs if r["verdict"] == "error"]
            print(f"  -n {n} ({mode}): {len(recs)} tests in {elapsed:.0f} s, {cpu:.0f} CPU-s", flush=True)
    print(f"\nbuilt-in suite, loopback Claude answering after {args.latency:g} s, {os.cpu_count()} cores")
    head = ("start", "workers", "tests", "wall (s)", "CPU-s/test", "tests/hour", "speed-up", "errors", "in flight",
            "verdicts = first")
    print("  ".join(f"{h:>11}" for h in head))
    for mode, n, tests, elapsed, cpu, rate, speed, errors, peak, same in rows:
        print("  ".join(f"{v:>11}" for v in (mode, n, tests, f"{elapsed:.0f}", f"{cpu:.2f}", f"{rate:.0f}",
                                                 f"{speed:.2f}x", errors, peak, same)))
    if notes:
        print("\ninfrastructure errors (excluded from rates):", *notes, sep="\n")


if __name__ == "__main__":
    main()
