"""``retrace osworld ...``: the subcommands on OSWorld's task files (cli.py adds them to its parser).

    retrace osworld check PATHS [--osworld-cache DIR] [--provider xvfb|docker|remote] [--json]
    retrace osworld cache --placeholders DIR PATHS      empty stand-ins for the cache files, to measure
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

PATHS_HELP = ("task definition files, directories of them (evaluation_examples/examples), or task lists "
              "({domain: [id, ...]}, as test_all.json)")
EXAMPLES_HELP = "where a task list's task files are (<domain>/<id>.json; default: <list's dir>/examples)"


def add_osworld_commands(sub: Any, cache_help: str) -> None:
    """``osworld check`` and ``osworld cache`` on the subparsers ``sub`` of the ``retrace`` parser."""
    from pytest_retrace.dataset.osworld_apps import PROVIDERS

    osw = sub.add_parser("osworld", help="OSWorld compatibility")
    osw_sub = osw.add_subparsers(dest="osworld_command", required=True)
    chk = osw_sub.add_parser("check", help="per OSWorld task JSON: supported here, or exactly why not")
    chk.add_argument("paths", nargs="+", help=PATHS_HELP)
    chk.add_argument("--examples", metavar="DIR", help=EXAMPLES_HELP)
    chk.add_argument("--json", action="store_true", help="one JSON object per task per line")
    chk.add_argument("--verbose", "-v", action="store_true",
                     help="also name the skipped files and list desktop-env's metrics and getters")
    chk.add_argument("--osworld-cache", metavar="DIR", help=cache_help)
    chk.add_argument("--provider", choices=PROVIDERS, default="xvfb",
                     help="the environment provider whose apps a supported task is checked against (default xvfb)")
    chk.set_defaults(func=cmd_check)
    cch = osw_sub.add_parser("cache", help="write OSWorld cache files for task definitions (a measuring aid)")
    cch.add_argument("--placeholders", metavar="DIR", required=True,
                     help="write an EMPTY file under every cache name the tasks need (DIR/<task id>/<name>) that "
                          "is not there yet: `osworld check --osworld-cache DIR` then shows what the missing "
                          "cache hid. They are not the files: a case built from them would not pass")
    cch.add_argument("paths", nargs="+", help=PATHS_HELP)
    cch.add_argument("--examples", metavar="DIR", help=EXAMPLES_HELP)
    cch.set_defaults(func=cmd_cache)


def cmd_check(args: argparse.Namespace, extra: list[str]) -> int:
    """Every OSWorld task under the paths: supported, or every reason why not. Exit 0 when all are."""
    from pytest_retrace.dataset.osworld_check import report

    status = report([Path(p) for p in args.paths], sys.stdout,
                    examples=Path(args.examples) if args.examples else None,
                    cache_dir=Path(args.osworld_cache) if args.osworld_cache else None,
                    as_json=args.json, verbose=args.verbose, provider=args.provider)
    if status == 2:
        print(f"retrace osworld check: no task definition in {' '.join(args.paths)}", file=sys.stderr)
    return status


def cmd_cache(args: argparse.Namespace, extra: list[str]) -> int:
    """Placeholders for the cache files of every task found; 2 when no task was found."""
    from pytest_retrace.dataset.osworld_cache import write_placeholders
    from pytest_retrace.dataset.osworld_check import collect, read_task

    found = collect([Path(p) for p in args.paths], Path(args.examples) if args.examples else None)
    tasks = [task for file, _domain, _id in found.tasks if isinstance(task := read_task(file), dict)]
    if not tasks:
        print(f"retrace osworld cache: no task definition in {' '.join(args.paths)}", file=sys.stderr)
        return 2
    written, present = write_placeholders(Path(args.placeholders), tasks)
    print(f"wrote {written} empty placeholder file(s) in {args.placeholders} for {len(tasks)} task(s)"
          f" ({present} already there, left as they were); placeholders are not the files: measure with them, "
          "never build cases from them")
    return 0


__all__ = ["add_osworld_commands", "cmd_cache", "cmd_check"]
