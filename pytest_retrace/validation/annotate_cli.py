"""``retrace annotate``: serve a study's annotation page (annotate.py), or make a study's plan: the paper's sample
(validation/sampling.py) or every sample of some runs.

    retrace annotate STUDY [--port P] [--host H] [--token-env VAR]
    retrace annotate --sample RUN [RUN ...] --annotators a,b,c,d --per-alternative N [--seed S] [--judge NAME] --out STUDY
    retrace annotate --all RUN [RUN ...] --annotators a,b --out STUDY
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from pathlib import Path

from pytest_retrace.validation.files import Plan, PlannedSample, check_name
from pytest_retrace.validation.samples import SampleError, load_samples

DEFAULT_PORT = 8765


def plan_all(runs: list[Path], annotators: list[str]) -> Plan:
    """Every finished test of `runs`, each seen by every annotator (alternative "all")."""
    samples = [PlannedSample(sample=s.id, run=str(run.resolve()), nodeid=s.nodeid, alternative="all",
                             annotators=list(annotators))
               for run in runs for s in load_samples(run)]
    return Plan(seed=0, per_alternative=None, runs=[str(r.resolve()) for r in runs], annotators=annotators,
                samples=samples)


def add_annotate_command(sub: argparse._SubParsersAction) -> None:
    ann = sub.add_parser("annotate", help="a local web page where people judge recoveries (paper B.3), or "
                                          "--all: a plan of every sample of some runs")
    ann.add_argument("study", nargs="?", help="the study directory (its plan.json; answers go to annotations/)")
    ann.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1; any other requires a token)")
    ann.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    ann.add_argument("--token-env", metavar="VAR", help="the token, from this environment variable (default for a "
                     "non-loopback host: a new random one, printed once in the page's URL)")
    ann.add_argument("--sample", nargs="+", metavar="RUN", help="write the paper's sample of these runs to --out: "
                     "per alternative (R_TC alone, R_O alone, each --judge) N of the tests where it and ReTrace "
                     "disagree, seeded, split between the annotator pairs; then exit")
    ann.add_argument("--all", nargs="+", metavar="RUN", help="write a plan of every finished test of these runs "
                     "to --out (each seen by every annotator), then exit")
    ann.add_argument("--annotators", help="with --sample (an even number: pairs in order) or --all: comma-separated")
    ann.add_argument("--per-alternative", type=int, metavar="N", help="with --sample: samples per alternative")
    ann.add_argument("--seed", type=int, default=0, help="with --sample: the draw's seed (default 0)")
    ann.add_argument("--judge", action="append", default=[], metavar="NAME",
                     help="with --sample: also an alternative, the judge's verdicts in <run>/judge/NAME.jsonl")
    ann.add_argument("--out", help="with --sample or --all: the study directory to write plan.json into")
    ann.set_defaults(func=_cmd_annotate)


def _cmd_annotate(args: argparse.Namespace, extra: list[str]) -> int:
    if args.all or args.sample:
        return _make_plan(args)
    if not args.study:
        print("retrace annotate: give a STUDY directory to serve, or --sample / --all RUN... --annotators ... "
              "--out STUDY", file=sys.stderr)
        return 2
    from pytest_retrace.validation.annotate import StudyError

    try:
        return serve(Path(args.study), host=args.host, port=args.port, token=_token(args))
    except (StudyError, OSError, ValueError) as exc:
        print(f"retrace annotate: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"retrace annotate: {exc.name} is not installed: pip install 'pytest-retrace[validation]'",
              file=sys.stderr)
        return 2


def _make_plan(args: argparse.Namespace) -> int:
    how = "--sample" if args.sample else "--all"
    if args.sample and args.all:
        print("retrace annotate: --sample or --all, not both", file=sys.stderr)
        return 2
    if not args.out or not args.annotators or (args.sample and args.per_alternative is None):
        need = " --per-alternative N" if args.sample else ""
        print(f"retrace annotate: {how} needs --annotators a,b{need} and --out STUDY", file=sys.stderr)
        return 2
    out = Path(args.out)
    if (out / "plan.json").exists():  # before anything is read: a study's answers refer to its plan's samples
        print(f"retrace annotate: {out / 'plan.json'} exists; a plan is fixed once made (remove it to redo)",
              file=sys.stderr)
        return 2
    try:
        names = [check_name(a.strip(), "annotator") for a in args.annotators.split(",") if a.strip()]
        if not names:
            raise ValueError("--annotators: no names given")
        if args.sample:
            from pytest_retrace.validation.sampling import draw_plan

            plan = draw_plan([Path(r) for r in args.sample], names, args.per_alternative, args.seed, args.judge)
        else:
            plan = plan_all([Path(r) for r in args.all], names)
    except (SampleError, ValueError) as exc:  # SamplingError, VerdictError too
        print(f"retrace annotate: {exc}", file=sys.stderr)
        return 2
    path = plan.write(out)
    for alternative, available in plan.available.items():
        drawn = sum(alternative in (p.alternative, *p.also_for) for p in plan.samples)
        print(f"{alternative}: {drawn} drawn of {available} disagreeing with ReTrace")
    teams = list(dict.fromkeys(tuple(p.annotators) for p in plan.samples))
    for team in teams:
        print(f"{' & '.join(team)}: {sum(tuple(p.annotators) == team for p in plan.samples)} samples")
    print(f"wrote {path}: {len(plan.samples)} samples for {', '.join(names)}")
    return 0


def _token(args: argparse.Namespace) -> str | None:
    """The token for a non-loopback host: from --token-env (taken out of this process's environment), else a
    new one. It lives in this process only: never in the study's files."""
    from pytest_retrace.guest.config import is_loopback

    if args.token_env:
        token = os.environ.pop(args.token_env, "").strip()
        if not token:
            raise ValueError(f"--token-env: the environment variable {args.token_env} is not set or empty")
        return token
    return None if is_loopback(args.host) else secrets.token_urlsafe(24)


def serve(study: Path, host: str = "127.0.0.1", port: int = DEFAULT_PORT, token: str | None = None) -> int:
    """Serve the page until SIGINT / SIGTERM; prints its URL first (the token in it, when one is set), flushed."""
    import uvicorn

    from pytest_retrace.guest.config import is_loopback
    from pytest_retrace.validation.annotate import Study, create_app

    if not is_loopback(host) and not token:
        raise ValueError(f"refusing to listen on {host} (not a loopback address) without a token")
    loaded = Study(study)
    app = create_app(loaded, token)
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart after a kill gets its port back
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)  # before the URL is printed: a browser may connect at once
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}/" + (f"?token={token}" if token else "")
    done = sum(len(v) for v in loaded.answered.values())
    print(f"retrace annotate: {url} ({len(loaded.plan.samples)} samples, annotators "
          f"{', '.join(loaded.plan.annotators)}; {done} answers so far)", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", server_header=False))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
