"""Where a test's CPU goes: every process of a run, by program, and the harness's own share split by stage.

An API-bound agent should scale far past the cores (it mostly waits); the harness's own CPU is the ceiling. This
runs cases with the loopback Claude answering after a fixed latency (default 2 s: the agent costs no CPU to
speak of), under the kernel's process accounting (BSD acct, the `acct` syscall: every process that ends writes
its user and system CPU and its command name; processes in the sandboxes' own pid namespaces too). It prints:

- the CPU-seconds of the whole run by program (Xvfb, openbox, xdotool, nsenter, the apps, the pytest workers
  ...), per test and as a share: the split to check the next change against;
- the pytest workers' own CPU by stage (records' ``cpu``: reset, prefix, verify, perturb, recover, observe,
  suffix, evaluate; per test), and what the workers spent outside any test (start-up, imports, xdist);
- per app (a run each): tests, wall time, CPU-seconds per test (every process the run started, from
  getrusage: exact, where accounting rounds each process to 10 ms ticks), and the programs that cost most.

Needs root (the acct syscall). The machine should be otherwise idle: accounting is system-wide.

    .venv/bin/python benchmarks/bench_cpu.py --sample 1                   # every app, 4 cases each, -n 2
    .venv/bin/python benchmarks/bench_cpu.py --workers 16 cases/terminal
    .venv/bin/python benchmarks/bench_cpu.py --workers 16 --sample 2 --model oracle,noop,undo \
        --restore checkpoint cases                                        # the calibration's conditions
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import userrun
import yaml

from pytest_retrace.results import rundir
from pytest_retrace.testing import LoopbackServer, UndoingClaude

REPO = Path(__file__).resolve().parent.parent
# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime (float),
# utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]
_ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
_AHZ = 100  # accounting ticks per second (AHZ, USER_HZ)
STAGES = ("reset", "prefix", "verify", "perturb", "context", "recover", "observe", "suffix", "evaluate")


def comp_t(value: int) -> int:
    """A comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_acct(path: Path) -> Iterator[tuple[str, float, int, int]]:
    """(command, CPU-seconds, pid, ppid) of every process the accounting file recorded."""
    data = path.read_bytes()
    for offset in range(0, len(data) - _ACCT_V3.size + 1, _ACCT_V3.size):
        fields = _ACCT_V3.unpack_from(data, offset)
        if fields[1] != 3:
            sys.exit(f"{path}: accounting record version {fields[1]}, this reads version 3 only")
        pid, ppid, utime, stime, comm = fields[6], fields[7], fields[10], fields[11], fields[-1]
        yield comm.split(b"\0")[0].decode(errors="replace"), (comp_t(utime) + comp_t(stime)) / _AHZ, pid, ppid


class Accounting:
    """The kernel's process accounting into a file, on for the duration of a ``with``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.libc = ctypes.CDLL(None, use_errno=True)

    def __enter__(self) -> Self:
        self.path.touch()
        if self.libc.acct(str(self.path).encode()) != 0:
            sys.exit(f"acct({self.path}): {os.strerror(ctypes.get_errno())} (needs root)")
        return self

    def __exit__(self, *exc: object) -> None:
        self.libc.acct(None)


def run_app(cases: str, args: argparse.Namespace, agents: Path, reports: Path, env: dict[str, str],
            pacct: Path) -> tuple[float, float, list[dict], list[tuple[str, float, int, int]]]:
    """One pytest run over ``cases`` under process accounting: (wall, CPU-seconds of every process it started and
    reaped, its records, the accounted processes)."""
    name = cases.strip("/").replace("/", "-")
    cmd = [*userrun.PYTEST, cases, f"--retrace-model={args.model}",
           *([f"--retrace-agents={agents}"] if args.model == "loopback-claude" else []),
           f"--retrace-report-dir={reports}", f"--retrace-run={name}", f"--retrace-restore={args.restore}", "-q",
           *(["-n", str(args.workers)] if args.workers > 1 else []),
           *(["--retrace-sample", str(args.sample)] if args.sample else [])]
    pacct.unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with Accounting(pacct):
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    results = rundir.results_file(reports / name)
    if proc.returncode not in (0, 1) or not results.exists():
        sys.exit(f"{cases}: the run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, [json.loads(line) for line in results.read_text().splitlines()], list(read_acct(pacct))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help="case directories, one run each (default: every app of cases/)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sample", type=int, help="--retrace-sample K of each run (default: every case)")
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per model answer")
    parser.add_argument("--model", default="loopback-claude",
                        help="--retrace-model (oracle,noop,undo: the suite calibration's baselines)")
    parser.add_argument("--restore", default="replay", choices=("replay", "checkpoint"), help="--retrace-restore")
    parser.add_argument("--top", type=int, default=14, help="programs listed (the rest summed)")
    args = parser.parse_args()
    apps = args.cases or sorted(f"cases/{p.name}" for p in (REPO / "cases").iterdir()
                                if p.is_dir() and any(p.glob("*.yaml")))

    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp, LoopbackServer(UndoingClaude(args.latency)) as server:
        agents, reports, pacct = Path(tmp) / "agents", Path(tmp) / "reports", Path(tmp) / "pacct"
        config = yaml.safe_load((REPO / "agents" / "claude-sonnet-4.6.yaml").read_text())
        config["options"]["transport"] = {"concurrency": args.workers * 2}
        agents.mkdir()
        (agents / "prompts").symlink_to(REPO / "agents" / "prompts")
        (agents / "loopback-claude.yaml").write_text(yaml.safe_dump(config))
        env = userrun.environment(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="sk-bench")
        for app in apps:
            runs.append((app, *run_app(app, args, agents, reports, env, pacct)))
            print(f"  {app}: {len(runs[-1][3])} tests in {runs[-1][1]:.0f} s", flush=True)

    model = (f"loopback Claude answering after {args.latency:g} s" if args.model == "loopback-claude"
             else f"--retrace-model={args.model}")
    print(f"\n-n {args.workers}, {model}, --retrace-restore={args.restore}, {os.cpu_count()} cores; CPU-s: "
          "every process the run started (getrusage of the reaped children)")
    print(f"{'cases':<26}{'tests':>6}{'errors':>7}{'wall (s)':>9}{'CPU-s':>8}{'per test':>9}   the most CPU")
    for app, wall, cpu, records, processes in runs:
        by: Counter[str] = Counter()
        for comm, seconds, _, _ in processes:
            by[comm] += seconds
        top = ", ".join(f"{c} {100 * s / cpu:.0f}%" for c, s in by.most_common(3))
        errors = sum(r["verdict"] == "error" for r in records)
        print(f"{app:<26}{len(records):>6}{errors:>7}{wall:>9.0f}{cpu:>8.1f}{cpu / max(len(records), 1):>9.2f}   {top}")

    records = [r for run in runs for r in run[3]]
    processes = [p for run in runs for p in run[4]]
    tests, total = len(records), sum(run[2] for run in runs)
    by_program: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for comm, seconds, _, _ in processes:
        by_program[comm] += seconds
        count[comm] += 1
    print(f"\nall {tests} tests: {total:.0f} CPU-s, {total / tests:.2f} per test; by program (process accounting; "
          f"{len(processes)} processes)")
    print(f"{'program':<18}{'processes':>10}{'CPU-s':>9}{'per test':>10}{'share':>8}")
    listed = by_program.most_common(args.top)
    for comm, seconds in listed:
        print(f"{comm:<18}{count[comm]:>10}{seconds:>9.1f}{seconds / tests:>10.3f}{100 * seconds / total:>7.1f}%")
    rest = total - sum(s for _, s in listed)
    n = sum(count.values()) - sum(count[c] for c, _ in listed)
    # accounting counts whole ticks (10 ms): thousands of processes that ran for less show here, with the others
    print(f"{'the others':<18}{n:>10}{rest:>9.1f}{rest / tests:>10.3f}{100 * rest / total:>7.1f}%"
          "   (and short-lived processes below the accounting's 10 ms tick)")

    stage_cpu: defaultdict[str, float] = defaultdict(float)
    stage_wall: defaultdict[str, float] = defaultdict(float)
    for r in records:
        for stage, seconds in (r.get("cpu") or {}).items():
            stage_cpu[stage] += seconds
        for stage, seconds in (r.get("timings") or {}).items():
            stage_wall[stage] += seconds
    in_tests = stage_cpu.pop("total", 0.0)
    workers = sum(s for comm, s, _, _ in processes if comm.startswith("python"))
    print(f"\nthe pytest processes' own CPU ({workers:.1f} s): by stage of a test, and outside the tests; next to it "
          f"the stage's wall time per test (a test's total: {stage_wall.pop('total', 0.0) / tests:.1f} s)")
    print(f"{'stage':<18}{'CPU-s':>9}{'per test':>10}{'share':>8}{'wall/test':>11}")
    for stage in [*STAGES, *sorted((set(stage_cpu) | set(stage_wall)) - set(STAGES))]:
        if stage in stage_cpu or stage in stage_wall:
            seconds = stage_cpu.get(stage, 0.0)
            print(f"{stage:<18}{seconds:>9.1f}{seconds / tests:>10.3f}{100 * seconds / total:>7.1f}%"
                  f"{stage_wall.get(stage, 0.0) / tests:>11.2f}")
    outside = workers - in_tests
    print(f"{'outside the tests':<18}{outside:>9.1f}{outside / tests:>10.3f}{100 * outside / total:>7.1f}%"
          "   (start-up, imports, collection, xdist, fixtures, the records and their images)")


if __name__ == "__main__":
    main()
