"""What a worker pays per process it starts and per garbage collection, next to how it paid before (issue 26).

Two costs that grow with a worker's heap (pytest, numpy, scipy, the SDK, a few screenshots), side by side in one run:

- **Starting a task process** (``env.run``: a probe, an evaluator's command, an app's launch; about a dozen per
  test). The old way gave ``subprocess`` a ``preexec_fn`` (die with the worker, join the task's cgroup), so it
  forked the whole worker: page tables copied, then torn down by the child's exec. Now the command line does both
  (``setpriv --pdeathsig KILL``, a shell line writing its pid into the group) and ``subprocess`` uses vfork.
  Measured on a real desktop: the same ``env.run("true")`` through each way, CPU of the worker and its children.
- **The task's runner** (envs/xvfb/runner.py): the chain (setpriv, a shell joining the group, nsenter, prlimit,
  setpriv, env) paid once per task by a process inside it, which starts each command with one vfork and exec.
- **A full collection** (pytest makes several at a worker's end; allocations trigger others): in a process
  forked from one that imported the worker's modules, with the fork server's ``gc.freeze()`` and without.

    .venv/bin/python benchmarks/bench_spawn.py            # root: the task's sandbox
    .venv/bin/python benchmarks/bench_spawn.py --runs 200
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from pytest_retrace.envs.xvfb import sandbox as sandbox_module
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.envs.xvfb.runner import Commands
from pytest_retrace.forkserver import COMMON, SDKS
from pytest_retrace.replay.cases import Task

REPO = Path(__file__).resolve().parent.parent


# an empty desktop: the task processes are the commands timed
TASK = Task.model_validate({"id": "bench-spawn", "instruction": "-", "domain": "terminal", "evaluator": {
    "func": "exact_match", "result": {"type": "vm_command_line", "command": "true"},
    "expected": {"type": "rule", "rules": "x"}}})


def cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def old_popen(self: sandbox_module.Sandbox, argv: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
    """Sandbox.popen as it was: a preexec_fn (die_with_parent and the group's join) between fork and exec."""
    proc = subprocess.Popen(self.argv(argv), cwd=self.home, preexec_fn=self._preexec, **kwargs)  # noqa: PLW1509
    self._children.append(proc)
    return proc


def spawns(env: XvfbEnvironment, runs: int, runner: bool) -> tuple[float, float, float]:
    """(worker ms, children ms, wall ms) per env.run('true'), through the task's runner or the chain. The runner's
    own start and end are in the time: its CPU (and its commands') is the worker's children's once it has ended."""
    assert env.sandbox is not None
    env.sandbox.commands = Commands(env.sandbox.popen, env.sandbox.root / "logs" / "runner.log", runner=runner)
    env.run("true")
    env.sandbox.commands.stop()
    (me0, kids0), start = cpu(), time.monotonic()
    for _ in range(runs):
        assert env.run("true").returncode == 0
    assert (env.sandbox.commands.runner is not None) == runner
    env.sandbox.commands.stop()
    (me1, kids1), wall = cpu(), time.monotonic() - start
    return (me1 - me0) * 1000 / runs, (kids1 - kids0) * 1000 / runs, wall * 1000 / runs


def collection(freeze: bool) -> float:
    """CPU-ms of one gc.collect() in a child forked from this process (frozen first, or not)."""
    read, write = os.pipe()
    if freeze:
        gc.freeze()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        start = time.process_time()
        gc.collect()
        os.write(write, f"{(time.process_time() - start) * 1000:.3f}".encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as fh:
        value = float(fh.read())
    if freeze:
        gc.unfreeze()
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100, help="env.run calls per way")
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds (the median is printed)")
    args = parser.parse_args()
    import importlib

    for name in (*COMMON, *SDKS["anthropic"], *SDKS["openai"]):
        importlib.import_module(name)
    held = [np.zeros((800, 1280, 3), np.uint8) + i for i in range(8)]  # a test's screenshots  # noqa: F841
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    env = XvfbEnvironment()
    env.start()
    try:
        env.reset(TASK, REPO)
        ways = (("preexec_fn (fork)", old_popen, False), ("setpriv (vfork)", sandbox_module.Sandbox.popen, False),
                ("the task's runner", sandbox_module.Sandbox.popen, True))
        rows: dict[str, list[tuple[float, float, float]]] = {way: [] for way, _, _ in ways}
        new_popen = sandbox_module.Sandbox.popen
        for _ in range(args.repeat):
            for way, popen, runner in ways:
                sandbox_module.Sandbox.popen = popen  # type: ignore[method-assign]
                rows[way].append(spawns(env, args.runs, runner))
        sandbox_module.Sandbox.popen = new_popen  # type: ignore[method-assign]
    finally:
        env.close()
    gcs = {"not frozen": sorted(collection(False) for _ in range(args.repeat)),
           "frozen (fork server)": sorted(collection(True) for _ in range(args.repeat))}

    print(f"a worker-sized process: {rss:.0f} MB resident; {args.runs} env.run('true') per way, median of "
          f"{args.repeat} alternating rounds")
    print(f"{'start a task process':24} {'worker ms':>10} {'children ms':>12} {'CPU ms':>8} {'wall ms':>8}")
    totals = {}
    for way, samples in rows.items():
        me, kids, wall = (sorted(s[i] for s in samples)[len(samples) // 2] for i in range(3))
        totals[way] = me + kids
        print(f"{way:24} {me:10.2f} {kids:12.2f} {me + kids:8.2f} {wall:8.2f}")
    old, chain, runner = totals.values()
    print(f"preexec_fn / setpriv: {old / chain:.2f}x CPU per task process; setpriv chain / runner: "
          f"{chain / runner:.2f}x")
    print(f"\n{'gc.collect() in a fork':24} {'CPU ms':>8}")
    for way, samples in gcs.items():
        print(f"{way:24} {samples[len(samples) // 2]:8.2f}")
    slow, fast = (s[len(s) // 2] for s in gcs.values())
    print(f"not frozen / frozen: {slow / max(fast, 0.001):.0f}x")


if __name__ == "__main__":
    main()
