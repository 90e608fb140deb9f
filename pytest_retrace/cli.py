"""``retrace`` — the command line around the pytest plugin.

    retrace run --model noop,undo,oracle [pytest args...]   run the suite (pytest underneath)
    retrace validate [cases/ ...]                           load every case file, report problems
    retrace record cases/x.yaml [...]                       replay on a real desktop, write target/error PNGs
    retrace summary reports/<run>/results.jsonl [...]       recompute a summary from results (merge runs)
    retrace report RUN [RUN ...] [--out DIR] [--json]        runs side by side: mean ± sd across runs, paired
                                                            model comparisons; --out writes report.md + plots
    retrace build [--env NAME] [...]                         build cases from successful trajectories
    retrace guest [--host H --port P --token-env VAR]        the OSWorld-shaped server inside an environment
    retrace osworld check evaluation_examples/examples       per OSWorld task: supported here, or why not
    retrace osworld cache --placeholders DIR TASKS           empty cache files, to measure the check with
    retrace judge RUN... [--model judge] [--dry-run]         an LLM judge's verdicts beside the run (paper Table 1)
    retrace annotate --sample RUN... --annotators a,b --per-alternative N --seed S --out STUDY   a study's samples
    retrace annotate STUDY [--port P]                       a local page where people judge recoveries
    retrace agreement STUDY [--json] [--out DIR]             people vs ReTrace: Tables 1, 11, 12, 13, Cohen's κ
    retrace intention RUN... [--json] [--out DIR]            rationales vs the recovery prompt (Figure 6)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from pytest_retrace.envs.config import EnvConfig
    from pytest_retrace.results.summary import Summary


class _Outcome:
    """The run's summary, received through the plugin's own hook like any third-party writer would."""

    summary: Summary | None = None
    run_dir: str | None = None

    def pytest_retrace_summary(self, summary: Summary, run_dir: str, config: object) -> None:
        self.summary, self.run_dir = summary, run_dir


# pytest's own verbosity and traceback options: given any of them, `retrace run` leaves the output alone
_OUTPUT_OPTIONS = ("-v", "-q", "--verbose", "--quiet", "--tb", "-r", "-l", "--showlocals", "--full-trace")


def _cmd_run(args: argparse.Namespace, extra: list[str]) -> int:
    outcome = _Outcome()
    status = _measure(args, extra, outcome)
    if outcome.run_dir is not None:  # summary.json's exitstatus is the process's, and this decides it
        from pytest_retrace.results.session import write_exitstatus

        write_exitstatus(Path(outcome.run_dir), status)
    return status


def _measure(args: argparse.Namespace, extra: list[str], outcome: _Outcome) -> int:
    """The main job's command. It measures: exit 0 when the run completed, whatever the agents scored (a run
    is made of failed recoveries); 4 for a usage error (a case file that would not load included); with a gate
    option (--retrace-fail-under, --retrace-max-errors), 0 or 1 as the gate decides; pytest's own status for
    an interrupted or broken session. Output: one line per test and the summary table, no tracebacks for
    expected failures (-v, -q, --tb, -r bring pytest's back)."""
    import pytest

    quiet = [] if any(a.startswith(_OUTPUT_OPTIONS) for a in extra) else ["--retrace-progress", "--tb=no", "-rN"]
    argv = [f"--retrace-model={args.model}", *(["-n", args.workers] if args.workers else []), *quiet, *_joined(extra)]
    code = pytest.main(argv, plugins=[outcome])
    summary = outcome.summary
    if summary is None:
        return int(code)  # no summary: a usage error, collect-only, interrupted early
    status = summary.exit_status(code, measuring=True)  # the one place that decides (results/summary.py)
    if status == pytest.ExitCode.USAGE_ERROR != code:
        # the case files that did not load, named here too: --tb=no hides pytest's own report of them
        print(f"retrace run: {summary.run.collection_errors} case file(s) could not be loaded:", file=sys.stderr)
        for error in summary.run.case_file_errors:
            print(f"  {error.file}: {error.error}", file=sys.stderr)
    return status


def _joined(argv: list[str]) -> list[str]:
    """``--retrace-X VALUE`` as ``--retrace-X=VALUE``: pytest picks its rootdir before it knows the plugin's
    options, and would take VALUE for a test path (plugin.options.check_rootdir)."""
    from pytest_retrace.plugin.options import OPTIONS

    valued = {f"--retrace-{name}" for name in OPTIONS}
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in valued and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _case_files(paths: list[str]) -> list[Path]:
    from pytest_retrace.replay.cases import find_case_files

    out: list[Path] = []
    for p in map(Path, paths or ["cases"]):
        out += find_case_files(p) if p.is_dir() else [p]
    return out


def _cmd_validate(args: argparse.Namespace, extra: list[str]) -> int:
    from pytest_retrace.replay.cases import CaseError, load_case

    bad = 0
    files = _case_files(args.paths)
    for path in files:
        try:
            case = load_case(path)
        except CaseError as exc:
            bad += 1
            print(f"ERROR {exc}")
        except Exception as exc:  # noqa: BLE001 - a loader bug must not hide the other files' verdicts
            bad += 1
            print(f"ERROR {path}: unexpected {type(exc).__name__}: {exc}")
        else:
            print(f"ok    {path}: {case.task.domain}, t_seed={case.t_seed}/{len(case.trajectory)}, d={case.d}")
    print(f"{len(files) - bad} valid, {bad} invalid")
    return 1 if bad or not files else 0


def _harness_files(paths: list[str]) -> list[Path]:
    """What a task's sandbox must not see: this project, the given inputs and outputs, the virtualenv."""
    return [Path.cwd(), Path(sys.prefix), *(Path(p) for p in paths)]


def _cmd_record(args: argparse.Namespace, extra: list[str]) -> int:
    from pytest_retrace.dataset.record import RecordingError, record_case
    from pytest_retrace.envs import EnvError, Environment
    from pytest_retrace.replay.cases import CaseError, load_case

    env_config = _env_config(args)
    if env_config is None:
        return 2
    envs: dict[tuple[int, int], Environment] = {}  # one desktop per screen size the cases ask for
    failed = 0
    try:
        for path in _case_files(args.paths):
            try:
                size = load_case(path, check_screenshots=False).screen
                if size not in envs:
                    envs[size] = env_config.create(size=size, hide=_harness_files(args.paths))
                    envs[size].start()
                rec = record_case(path, envs[size], replays=args.replays, threshold=args.ssim_threshold)
            except (RecordingError, CaseError, EnvError) as exc:
                failed += 1
                print(f"FAILED {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - a bug must not cost the other cases their recording
                failed += 1
                print(f"FAILED {path}: unexpected {type(exc).__name__}: {exc}")
                continue
            print(f"recorded {path} ({rec.kind})")
            for line in rec.checks:
                print(f"  - {line}")
    finally:
        for env in envs.values():
            env.close()
    return 1 if failed else 0


def _env_config(args: argparse.Namespace) -> EnvConfig | None:
    """--env / --env-option, as pytest's --retrace-env / --retrace-env-option; None after printing why not."""
    from pytest_retrace.envs.config import EnvConfigError, load_env_config

    try:
        return load_env_config(args.env, [Path.cwd() / "envs"], args.env_option)
    except EnvConfigError as exc:
        print(f"retrace {args.command}: --env: {exc}", file=sys.stderr)
        return None


def _seconds(text: str) -> float:
    """A task's quiet window, as Task.settle_quiet takes it: 0 to 10 seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"must be between 0 and 10 seconds, got {text}")
    return value


def _cmd_build(args: argparse.Namespace, extra: list[str]) -> int:
    from pytest_retrace.dataset.pipeline import BuildConfig, Builder

    cfg = BuildConfig(work=Path(args.work), out=Path(args.out), scripted=[Path(p) for p in args.scripted],
                      osworld=[Path(p) for p in args.osworld],
                      osworld_examples=Path(args.osworld_examples) if args.osworld_examples else None,
                      osworld_cache=Path(args.osworld_cache) if args.osworld_cache else None,
                      osworld_settle_quiet=args.osworld_settle_quiet,
                      replays=args.replays, seeds_per_trajectory=args.seeds, seed=args.seed,
                      per_domain=args.per_domain, near_identical=args.near_identical, agents=args.agent,
                      perturb_agents=args.perturb_agent, protocol=args.protocol,
                      **({"catalogue": Path(args.catalogue)} if args.catalogue else {}))
    env_config = _env_config(args)
    if env_config is None:
        return 2
    # the cache too: OSWorld keeps the evaluators' gold files there
    hidden = _harness_files([args.work, args.out, *args.scripted, *args.osworld,
                             *([args.osworld_cache] if args.osworld_cache else [])])
    envs = [env_config.create(hide=hidden) for _ in range(args.workers)]
    try:
        for env in envs:
            env.start()
        # a build runs for hours, often into a log file: each line is flushed as it comes
        Builder(cfg, envs, log=functools.partial(print, flush=True)).run(start=args.from_stage)
    finally:
        for env in envs:
            env.close()
    return 0


def _cmd_summary(args: argparse.Namespace, extra: list[str]) -> int:
    from pytest_retrace.results.commands import summary

    return summary(args.results, as_json=args.json)


def _cmd_report(args: argparse.Namespace, extra: list[str]) -> int:
    from pytest_retrace.results.merge import ReportError, merge_runs
    from pytest_retrace.results.report import format_report, render_report

    try:
        merged = merge_runs(args.runs, report_dir=Path(args.report_dir))
    except ReportError as exc:
        print(f"retrace report: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(merged.to_dict(), indent=2, sort_keys=True, default=str))
    else:
        print(format_report(merged))
    if args.out:
        from pytest_retrace.results import rundir
        from pytest_retrace.results.plots import write_plots

        out = Path(args.out)
        errors: list[str] = []
        plots = write_plots(merged.summary, rundir.plots_dir(out), errors=errors)
        for error in errors:
            print(f"retrace report: plot not written: {error}", file=sys.stderr)
        report = rundir.report_md(out)
        report.write_text(render_report(merged, plots=[f"{rundir.PLOTS}/{p.name}" for p in plots]), encoding="utf-8")
        print(f"wrote {report} and {len(plots)} plot(s) in {rundir.plots_dir(out)}", file=sys.stderr)
    return 0


_CACHE_HELP = ("OSWorld's cache directory (<task id>/<file>) holding the files its tasks' download / upload_file "
               "steps fetch from URLs: nothing is downloaded here")


def _env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="xvfb", help="environment: a provider, a config envs/NAME.yaml or its "
                        "path (as pytest's --retrace-env; default xvfb)")
    parser.add_argument("--env-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the environment provider (repeatable)")


def _cmd_guest(args: argparse.Namespace, extra: list[str]) -> int:
    """The guest server (pytest_retrace/guest), in the foreground until SIGINT or SIGTERM."""
    from pytest_retrace.guest import GuestConfig, GuestError, serve
    from pytest_retrace.guest.server import read_token

    try:
        token = read_token(args.token_env)
        config = GuestConfig(home=Path(args.home).expanduser() if args.home else Path.home(), token=token,
                             command_timeout=args.command_timeout, display=args.display)
        return serve(config, host=args.host, port=args.port, log_level=args.log_level)
    except GuestError as exc:
        print(f"retrace guest: {exc}", file=sys.stderr)
        return 2


_PYTEST_USAGE_ERROR = 4  # pytest.ExitCode.USAGE_ERROR, without importing pytest for every command


class _Parser(argparse.ArgumentParser):
    """argparse's parser with the exit status of a usage error settable per (sub)command."""

    usage_status = 2  # argparse's own

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(self.usage_status, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="retrace", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the recovery suite (extra arguments go to pytest)")
    # `retrace run` is pytest underneath and a usage error pytest catches exits 4 (pytest.ExitCode.USAGE_ERROR):
    # one it catches itself (a misspelt --model) must not exit 2 (README: Exit status)
    run.usage_status = _PYTEST_USAGE_ERROR
    run.add_argument("--model", required=True, help="model config name(s), comma-separated")
    run.add_argument("-n", "--workers", help="pytest-xdist workers")
    run.set_defaults(func=_cmd_run)
    val = sub.add_parser("validate", help="validate case files")
    val.add_argument("paths", nargs="*")
    val.set_defaults(func=_cmd_validate)
    rec = sub.add_parser("record", help="record a case's target and error screenshots on a real desktop")
    rec.add_argument("paths", nargs="+")
    rec.add_argument("--replays", type=int, default=3, help="runs that must agree (default 3)")
    rec.add_argument("--ssim-threshold", type=float, default=0.99,
                     help="R_O's threshold: a harmless mistake is a case only if its screen is below it")
    _env_arguments(rec)
    rec.set_defaults(func=_cmd_record)
    bld = sub.add_parser("build", help="build recovery cases from successful trajectories (resumable stages)")
    bld.add_argument("--scripted", action="append", default=[], help="dir of scripted rollouts (default rollouts/)")
    bld.add_argument("--agent", action="append", default=[],
                     help="also roll out this model (agents/NAME.yaml) on every scripted task")
    bld.add_argument("--perturb-agent", action="append", default=[],
                     help="also let this model (agents/NAME.yaml) make mistakes from each target (the paper's "
                          "perturbation agent), besides the scripted catalogue")
    bld.add_argument("--protocol", choices=["default", "paper"], default="default",
                     help="how a perturbation agent's budget counts: default, d actions (a look is free); paper, "
                          "d steps, a look spending one, plus the model config's perturbation.extra_steps "
                          "(GPT-5.4: 1, paper A.1)")
    bld.add_argument("--osworld", action="append", default=[], help="an OSWorld results directory")
    bld.add_argument("--osworld-examples", help="OSWorld evaluation_examples/examples (task definitions)")
    bld.add_argument("--osworld-cache", metavar="DIR", help=_CACHE_HELP)
    bld.add_argument("--osworld-settle-quiet", type=_seconds, metavar="SECONDS",
                     help="the imported OSWorld tasks' quiet window after each action (their task files have "
                          "none; 1.0 for LibreOffice, which redraws on idle timers)")
    bld.add_argument("--catalogue", metavar="FILE", help="the mistake catalogue (default: the shipped one, "
                     "pytest_retrace/dataset/perturbations/); entries apply to the domains they name")
    bld.add_argument("--work", default=".retrace-build", help="work directory holding each stage's output")
    bld.add_argument("--out", default="cases", help="where the final case files are written (replaced)")
    bld.add_argument("--replays", type=int, default=3, help="N for transition-consistent filtering")
    bld.add_argument("--workers", type=int, default=2, help="desktops replaying in parallel")
    bld.add_argument("--seeds", type=int, default=2, help="target steps sampled per trajectory")
    bld.add_argument("--seed", type=int, default=0, help="random seed for seed selection and sampling")
    bld.add_argument("--near-identical", type=float, default=0.999,
                     help="drop errors with SSIM(error, target) at or above this, unless hidden-state")
    bld.add_argument("--per-domain", type=int, default=12, help="max cases per domain in the final set")
    bld.add_argument("--from", dest="from_stage", choices=["rollouts", "consistent", "seeds", "perturb", "final"],
                     help="redo this stage and every later one")
    _env_arguments(bld)
    bld.set_defaults(func=_cmd_build)
    from pytest_retrace.dataset.osworld_cli import add_osworld_commands

    add_osworld_commands(sub, _CACHE_HELP)
    from pytest_retrace.experiments.commands import add_experiment_commands

    add_experiment_commands(sub)
    from pytest_retrace.validation.annotate_cli import add_annotate_command
    from pytest_retrace.validation.commands import add_validation_commands
    from pytest_retrace.validation.judge_cli import add_judge_command

    add_judge_command(sub)
    add_annotate_command(sub)
    add_validation_commands(sub)
    summ = sub.add_parser("summary", help="summarize one or more results.jsonl files (a forward run's forward.jsonl)")
    summ.add_argument("results", nargs="+")
    summ.add_argument("--json", action="store_true")
    summ.set_defaults(func=_cmd_summary)
    rep = sub.add_parser("report", help="merge runs: mean ± sd across runs, paired model comparisons, plots")
    rep.add_argument("runs", nargs="+", metavar="RUN",
                     help="a run directory, its results.jsonl, or a run name under --report-dir")
    rep.add_argument("--out", help="write report.md and plots/*.png of the merged runs here")
    rep.add_argument("--json", action="store_true", help="print the merged report as JSON")
    rep.add_argument("--report-dir", default="reports", help="where run names are looked up (default reports)")
    rep.set_defaults(func=_cmd_report)
    gst = sub.add_parser("guest", help="serve OSWorld's VM-server API on this desktop, for the remote environment")
    gst.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1; any other needs --token-env)")
    gst.add_argument("--port", type=int, default=5000, help="port (default 5000, as OSWorld's; 0: any free one)")
    gst.add_argument("--token-env", metavar="VAR",
                     help="require 'Authorization: Bearer TOKEN', the token read from this environment variable")
    gst.add_argument("--home", help="the home: '~' in requests, and with /tmp where files may be read and written "
                     "(default: this user's home)")
    gst.add_argument("--display", help="the X display to serve (default: $DISPLAY)")
    gst.add_argument("--command-timeout", type=float, default=120.0,
                     help="seconds a command of /execute may run (exit status 124 after that; default 120)")
    gst.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    gst.set_defaults(func=_cmd_guest)
    args, extra = parser.parse_known_args(argv)
    if args.command == "build" and not args.scripted and not args.osworld:
        args.scripted = ["rollouts"]
    if extra and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args, extra)
    except BrokenPipeError:  # a reader that stopped early (`| head`): no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
