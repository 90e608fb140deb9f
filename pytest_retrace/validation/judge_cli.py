"""``retrace judge RUN... --model MODEL``: the LLM judge over finished runs (validation/judge.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_judge_command(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser("judge", help="ask an LLM judge whether each finished test of a run recovered; its verdicts "
                                       "go to <run>/judge/<model>.jsonl, beside the oracle's (never replacing them)")
    cmd.add_argument("runs", nargs="+", metavar="RUN", help="a run directory (reports/<run>) or its results.jsonl")
    cmd.add_argument("--model", default="judge", metavar="NAME",
                     help="the judge's model config, agents/NAME.yaml (a chat model; default judge: GPT-5.4)")
    cmd.add_argument("--workers", type=int, default=4, metavar="N", help="samples asked at once (default 4)")
    cmd.add_argument("--dry-run", action="store_true", help="print how many calls it would make; call nothing")
    cmd.add_argument("--agents", action="append", default=[], metavar="DIR",
                     help="directories of model configs (default agents/)")
    cmd.set_defaults(func=_cmd_judge)


def _cmd_judge(args: argparse.Namespace, extra: list[str]) -> int:
    from pytest_retrace.agents import AgentConfigError, load_model_config
    from pytest_retrace.validation.files import judge_file
    from pytest_retrace.validation.judge import (
        JudgeFileError,
        calls_needed,
        create_judge,
        judge_run,
        pending,
        read_verdicts,
    )
    from pytest_retrace.validation.samples import SampleError, load_samples

    if args.workers < 1:
        print(f"retrace judge: --workers {args.workers}: must be at least 1", file=sys.stderr)
        return 2
    dirs = [Path(d) for d in args.agents] or [Path("agents")]
    try:
        config = load_model_config(args.model, dirs)
        runs = [(r, load_samples(r)) for r in (_run_dir(Path(p)) for p in args.runs)]
        if args.dry_run:  # no client made: a dry run needs no key
            total = 0
            for run, samples in runs:
                done = read_verdicts(judge_file(run, config.name))
                calls, blind = calls_needed(samples, done), sum(1 for s in samples if s.recovered is None)
                total += calls
                print(f"{run}: {len(samples)} sample(s), {len(samples) - len(pending(samples, done))} judged "
                      f"already; would make {calls} call(s) to {config.name}"
                      + (f" ({blind} without a recovered screen: no verdict, no call)" if blind else ""))
            print(f"retrace judge --dry-run: {total} call(s) in all, none made")
            return 0
        judge = create_judge(config)
    except (AgentConfigError, SampleError, JudgeFileError, ValueError) as exc:
        print(f"retrace judge: {exc}", file=sys.stderr)
        return 2
    api = 0
    try:
        for run, samples in runs:
            tally = judge_run(run, samples, config.name, judge, workers=args.workers)
            api += tally.errors.get("api", 0)
            print(tally.line())
    finally:
        judge.close()
    if api:
        print(f"retrace judge: {api} sample(s) have no verdict because the API failed; run again to ask them "
              "(the others are kept)", file=sys.stderr)
        return 1
    return 0


def _run_dir(path: Path) -> Path:
    return path.parent if path.name == "results.jsonl" else path

