"""Throughput of the built-in suite with a model that answers slowly, at several xdist worker counts.

A real agent spends most of a case waiting: on its API (seconds per call) and on the desktop settling.
So workers should scale well past this machine's cores. Here a loopback server speaking Anthropic's wire
format answers every call after a fixed latency (default 2 s) — ctrl+z first, then "done" — through the
shipped Claude adapter and the official SDK, exactly as `pytest --retrace-model=claude -n N` would run.
For each worker count it prints wall time, tests per hour, the speed-up over the first count, errors, and
whether every verdict equals the first run's, side by side.

    .venv/bin/python benchmarks/bench_agents.py                  # -n 1, 4 and 16, 2 s latency
    .venv/bin/python benchmarks/bench_agents.py --workers 1 8 --latency 1 -k spreadsheet
"""

from __future__ import annotations

import argparse
import json
import os
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


def run(workers: int, agents: Path, reports: Path, extra: list[str], env: dict[str, str]) -> tuple[float, list[dict]]:
    name = f"n{workers}"
    cmd = [*userrun.PYTEST, "--retrace-model=loopback-claude", f"--retrace-agents={agents}",
           f"--retrace-report-dir={reports}", f"--retrace-run={name}", "-q",
           *(["-n", str(workers)] if workers > 1 else []), *extra]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, check=False)
    elapsed = time.monotonic() - start
    path = rundir.results_file(reports / name)
    if proc.returncode not in (0, 1) or not path.exists():
        sys.exit(f"-n {workers} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, [json.loads(line) for line in path.read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per model answer")
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
        for n in args.workers:
            server.responder.peak = 0  # type: ignore[attr-defined]
            elapsed, recs = run(n, agents, reports, extra, env)
            verdicts = {r["nodeid"]: r["verdict"] for r in recs}
            first = first or (elapsed, verdicts)
            same = "yes" if verdicts == first[1] else (
                f"NO ({sum(verdicts.get(k) != v for k, v in first[1].items())} differ)")
            errors = sum(v == "error" for v in verdicts.values())
            peak = server.responder.peak  # type: ignore[attr-defined]
            rows.append((n, len(recs), elapsed, 3600 * len(recs) / elapsed, first[0] / elapsed, errors, peak, same))
            notes += [f"  -n {n}: {r['case']}: {r['error']['kind']} at {r['error']['stage']}: {r['error']['message'][:300]}"
                      for r in recs if r["verdict"] == "error"]
            print(f"  -n {n}: {len(recs)} tests in {elapsed:.0f} s", flush=True)
    print(f"\nbuilt-in suite, loopback Claude answering after {args.latency:g} s, {os.cpu_count()} cores")
    head = ("workers", "tests", "wall (s)", "tests/hour", "speed-up", "errors", "calls in flight", "verdicts = first")
    print("  ".join(f"{h:>15}" for h in head))
    for n, tests, elapsed, rate, speed, errors, peak, same in rows:
        print("  ".join(f"{v:>15}" for v in (n, tests, f"{elapsed:.0f}", f"{rate:.0f}", f"{speed:.2f}x", errors, peak,
                                                 same)))
    if notes:
        print("\ninfrastructure errors (excluded from rates):", *notes, sep="\n")


if __name__ == "__main__":
    main()
