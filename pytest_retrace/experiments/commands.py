"""``retrace plan``: the ideal-recovery experiment's run plan (plan.py) for a forward run's episodes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_experiment_commands(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser("plan", help="annotate a forward run's failed episodes (first wrong step E, the step to "
                                       "return to per condition) into a plan file reused by every rerun")
    plan.add_argument("trajectories", help="a forward run's trajectories/ (or any directory of its episodes)")
    plan.add_argument("--error-detector", required=True, metavar="NAME",
                      help="model config of the error-step detector (agents/NAME.yaml: a chat model, or scripted-error)")
    plan.add_argument("--recovery-detector", required=True, metavar="NAME",
                      help="model config of the recovery-step detector (a chat model, or scripted-recovery)")
    plan.add_argument("--seed", type=int, default=0, help="seed of the E-random condition (default 0)")
    plan.add_argument("--out", help="the plan file (default: plan.json beside the trajectories directory); an "
                                    "existing one is continued")
    plan.add_argument("--agents", action="append", default=[], metavar="DIR",
                      help="directories of model configs (default agents/)")
    plan.set_defaults(func=_cmd_plan)


def _cmd_plan(args: argparse.Namespace, extra: list[str]) -> int:
    from pytest_retrace.agents import AgentConfigError, AgentInfraError, load_model_config
    from pytest_retrace.experiments.detectors import create_detector
    from pytest_retrace.experiments.plan import Plan, PlanError, make_plan

    root = Path(args.trajectories)
    if not root.is_dir():
        print(f"retrace plan: {root} is not a directory", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else root.parent / "plan.json"
    dirs = [Path(d) for d in args.agents] or [Path("agents")]
    try:
        errors = create_detector("error", load_model_config(args.error_detector, dirs))
        recoveries = create_detector("recovery", load_model_config(args.recovery_detector, dirs))
        previous = Plan.read(out) if out.is_file() else None
        plan = make_plan(root, errors, recoveries, seed=args.seed, previous=previous, save=out)
    except (AgentConfigError, PlanError) as exc:
        print(f"retrace plan: {exc}", file=sys.stderr)
        return 2
    except AgentInfraError as exc:  # the model's API down after retries: what is annotated so far is kept
        print(f"retrace plan: a detector could not be asked ({exc}); the plan so far is in {out}: run again "
              f"to continue", file=sys.stderr)
        return 1
    print(f"{out}: {len(plan.annotated)} failed episode(s) annotated, {len(plan.excluded)} excluded, "
          f"{plan.solved} solved (no annotation needed)")
    for item in plan.excluded:
        print(f"  excluded {item.episode}: {item.reason}")
    return 0
