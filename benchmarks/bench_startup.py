"""What a pytest process costs before its first test, split by what it loads: the fixed price of every xdist worker.

An API-bound run at ``-n 16`` on 2 cores is CPU-bound on start-up long before the tests: 17 processes (the
controller and 16 workers) each start Python, pytest and its plugins, import this plugin, collect the cases and
import the provider's SDK, and the controller ends with the summary's figures and the intention measure. This
prints each part in CPU-seconds (user + system of the process, from getrusage; the median of --repeat runs), who
pays it, and what it costs a run at each --workers count, side by side:

    .venv/bin/python benchmarks/bench_startup.py                 # --workers 2 16, 3 repeats
    .venv/bin/python benchmarks/bench_startup.py --repeat 5 --workers 1 4 16

Every command runs as a user's machine runs it (benchmarks/userrun.py: bytecode kept, Hypothesis's plugin out).
bench_cpu.py has the whole run's split (by program, by stage); this one is the part before the first test.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import userrun

REPO = Path(__file__).resolve().parent.parent


def cpu_of(cmd: list[str], cwd: Path, env: dict[str, str], repeat: int) -> float:
    """Median CPU-seconds (user + system, the process and its children) of ``cmd``; it must exit 0 or 5."""
    samples = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode not in (0, 5):
            sys.exit(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        samples.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 16])
    args = parser.parse_args()
    env = userrun.environment(ANTHROPIC_API_KEY="sk-bench")
    py = [sys.executable]
    pytest = userrun.PYTEST
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        empty = Path(tmp)
        (empty / "test_one.py").write_text("def test_one():\n    pass\n")
        run = lambda cmd, cwd=REPO: cpu_of(cmd, cwd, env, args.repeat)
        python = run([*py, "-c", "pass"])
        bare = run([*pytest, "-q", "-p", "no:retrace", "-p", "no:xdist", "--co"], empty)
        plugin = run([*pytest, "-q", "-p", "no:xdist", "--co"], empty)
        collecting = [*pytest, "-q", "-p", "no:xdist", "--co", "--retrace-model=oracle",
                      f"--retrace-report-dir={empty / 'reports'}"]
        parsing = cpu_of(collecting, REPO, {**env, "RETRACE_CASE_CACHE": "0"}, args.repeat)
        collect = run(collecting)  # the first of them fills the case cache (replay/casecache.py)
        sdks = {name: run([*py, "-c", f"import {name}"]) - python for name in ("anthropic", "openai")}
        summary = {name: run([*py, "-c", f"import {module}"]) - python for name, module in (
            ("matplotlib (the figures)", "matplotlib.figure"),
            ("scikit-learn (the intention measure)", "sklearn.feature_extraction.text"))}
        # an xdist worker on top of a process that collects: -k matching nothing, so no test and no desktop
        runs = {n: run([*pytest, "-q", "--retrace-model=oracle", "-k", "no_such_test_zz", "-n", str(n),
                        f"--retrace-report-dir={empty / 'reports'}"]) for n in sorted({1, *args.workers})}
    per_worker = (runs[max(runs)] - runs[1]) / (max(runs) - 1) if max(runs) > 1 else float("nan")
    n_cases = len(list((REPO / "cases").glob("*/*.yaml")))
    rows = [
        ("Python itself", python, "every process"),
        ("pytest and its other plugins (xdist, allure, anyio ...)", bare - python, "every process"),
        ("this plugin: import and configure", plugin - bare, "every process"),
        (f"collecting the built-in suite ({n_cases} cases), each parsed", parsing - plugin, "(RETRACE_CASE_CACHE=0)"),
        (f"collecting the built-in suite ({n_cases} cases)", collect - plugin, "every process that collects"),
        *((f"import {name} (its SDK)", cpu, "every process that calls the model") for name, cpu in sdks.items()),
        *((f"import {name}", cpu, "the controller, at the end") for name, cpu in summary.items()),
        ("an xdist worker (start-up, collection, reporting)", per_worker, "each worker"),
    ]
    print(f"\nCPU-seconds before the first test (median of {args.repeat}), {os.cpu_count()} cores")
    print(f"{'part':<58}{'CPU-s':>8}  paid by")
    for name, cpu, who in rows:
        print(f"{name:<58}{cpu:>8.2f}  {who}")
    print(f"\n{'workers':>8}{'start-up CPU-s, no SDK':>24}{'with the Claude SDK':>22}{'on 2 cores, at least':>24}")
    for n, cpu in runs.items():
        sdk = sdks["anthropic"] * (n + 1 if n > 1 else 1)  # workers and the controller each import it
        print(f"{n:>8}{cpu:>24.1f}{cpu + sdk:>22.1f}{(cpu + sdk) / 2:>22.1f} s")


if __name__ == "__main__":
    main()
