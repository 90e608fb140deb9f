"""Replay against checkpoint restore (``--retrace-restore``) on the same tests, side by side in one run.

    .venv/bin/python benchmarks/bench_checkpoint.py [--sample 1] [--runs 3] [--models oracle,noop,undo] [-n 8]

Runs the built-in suite's fixed sample (``--retrace-sample``: the first case of every app x kind) with the
scripted baselines, K runs each, once with ``--retrace-restore=replay`` and once with ``=checkpoint`` (both with
``--dist loadfile``, so the two runs schedule alike), as a user's machine would (userrun.py). Prints:

- wall time, CPU seconds of everything each run started, tests, errors;
- per app, the time to a verified s_error: replay (reset + prefix + verify + perturbation + verify, from the
  replaying tests' records) against restore (restore + verify, from the restored ones), with the prefix lengths;
  and the price the first test of a case pays for taking the checkpoints;
- how each checkpoint-run test reached s_error, and every reason a test replayed;
- whether every test's verdict, R_O and R_TC is identical between the two runs.
No thresholds: it reports.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import userrun

REPO = Path(__file__).resolve().parent.parent


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(mode: str, args: argparse.Namespace, out: Path) -> tuple[float, float, list[dict]]:
    argv = [*userrun.PYTEST, f"--retrace-model={args.models}", f"--retrace-sample={args.sample}",
            f"--retrace-runs={args.runs}", f"--retrace-restore={mode}", "-n", str(args.n), "--dist", "loadfile",
            f"--retrace-report-dir={out}", f"--retrace-run={mode}", "-q"]
    start, cpu = time.monotonic(), cpu_of_children()
    subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, check=False, env=userrun.environment())
    wall, used = time.monotonic() - start, cpu_of_children() - cpu
    results = out / mode / "results.jsonl"
    records = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    return wall, used, records


def test_key(record: dict) -> str:
    return record["nodeid"].split("::", 1)[1]


def app(record: dict) -> str:
    return record["nodeid"].split("/")[1]


def to_error(record: dict) -> float | None:
    """Seconds to a verified s_error: the restore and its check, or the first reconstruction's stages. (A
    replaying oracle's timings also hold its ideal recovery's second reconstruction: left out, and so the
    replay side takes the noop and undo tests only.)"""
    t = record["timings"]
    if record["reconstruction"].get("restore") == "checkpoint" and "reset" not in t:
        return t.get("restore", 0) + t.get("verify", 0)
    if record["model"] == "oracle" or "checkpoint" in t:
        return None
    return sum(t.get(k, 0) for k in ("reset", "prefix", "verify", "perturb"))


def prefix_lengths() -> dict[str, int]:
    import yaml

    found = {}
    for path in (REPO / "cases").glob("*/*.yaml"):
        data = yaml.safe_load(path.read_text())
        found[data["id"]] = int(data["t_seed"])  # the prefix is gt[0:t_seed]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default="oracle,noop,undo")
    parser.add_argument("-n", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        runs = {}
        for mode in ("replay", "checkpoint"):
            runs[mode] = run(mode, args, Path(tmp))
            print(f"{mode}: done, load average {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\n{'mode':<11} {'wall s':>7} {'CPU s':>7} {'tests':>6} {'errors':>6}")
    for mode, (wall, cpu, recs) in runs.items():
        errors = sum(r["verdict"] == "error" for r in recs)
        print(f"{mode:<11} {wall:7.0f} {cpu:7.0f} {len(recs):6d} {errors:6d}")
    (rw, rc, replay), (cw, cc, checkpoint) = runs["replay"], runs["checkpoint"]
    print(f"checkpoint / replay: wall {cw / rw:.2f}x, CPU {cc / rc:.2f}x")

    prefixes = prefix_lengths()
    print("\nper app: time to a verified s_error (median s; replay from noop/undo tests, restore from restored tests)")
    print(f"{'app':<20} {'prefix':>9} {'replay':>7} {'restore':>8} {'ratio':>6} {'take (1st test)':>16}")
    apps = sorted({app(r) for r in replay})
    for name in apps:
        reps = [x for r in replay if app(r) == name if (x := to_error(r)) is not None]
        rest = [x for r in checkpoint if app(r) == name if (x := to_error(r)) is not None]
        takes = [r["timings"]["checkpoint"] for r in checkpoint if app(r) == name and "checkpoint" in r["timings"]]
        lengths = sorted({prefixes.get(r["case"], 0) for r in replay if app(r) == name})
        rep, res = (statistics.median(reps) if reps else None), (statistics.median(rest) if rest else None)
        ratio = f"{res / rep:.3f}" if rep and res else "-"
        take = f"{statistics.median(takes):.2f}" if takes else "-"
        print(f"{name:<20} {','.join(map(str, lengths)):>9} {rep or 0:7.2f} {res or 0:8.2f} {ratio:>6} {take:>16}")

    how = collections.Counter(re.sub(r"pid \d+", "pid N", r["reconstruction"].get("restore", "-"))
                              for r in checkpoint)
    print("\nhow the checkpoint run's tests reached s_error:")
    for text, n in how.most_common():
        print(f"  {n:4d}  {text[:150]}")

    a = {test_key(r): r for r in replay}
    b = {test_key(r): r for r in checkpoint}
    shared = sorted(set(a) & set(b))
    differ = [k for k in shared if (a[k]["verdict"], a[k].get("r_o"), a[k].get("r_tc"))
              != (b[k]["verdict"], b[k].get("r_o"), b[k].get("r_tc"))]
    print(f"\nverdict, R_O, R_TC identical on {len(shared) - len(differ)} of {len(shared)} tests "
          f"({len(set(a) ^ set(b))} in one run only)")
    for k in differ:
        print(f"  differs: {k}: replay {a[k]['verdict']} (R_O {a[k].get('r_o')}, R_TC {a[k].get('r_tc')}), "
              f"checkpoint {b[k]['verdict']} (R_O {b[k].get('r_o')}, R_TC {b[k].get('r_tc')})")


if __name__ == "__main__":
    main()
