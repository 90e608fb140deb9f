"""``retrace summary``: the tables of one or more runs' records, from their results files (a forward run's
forward.jsonl too, and an ideal-recovery run's, whose continuations make Success@K), as the end of a run prints
them, or as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pytest_retrace.results import rundir
from pytest_retrace.results.forward import forward_rows, read_forward
from pytest_retrace.results.records import RecordError
from pytest_retrace.results.session import read_records
from pytest_retrace.results.stats import summarize
from pytest_retrace.results.endtoend import end_to_end_rows
from pytest_retrace.results.success import success_rows
from pytest_retrace.results.tables import format_end_to_end, format_forward, format_success, format_table


def summary(paths: list[str], *, as_json: bool = False) -> int:
    forward_files = [Path(p) for p in paths if Path(p).name == rundir.FORWARD]
    try:
        records = [r for p in paths if Path(p).name != rundir.FORWARD for r in read_records(Path(p))]
        episodes = [r for p in forward_files for r in read_forward(p)]
    except (OSError, RecordError) as exc:
        print(f"retrace summary: {exc}", file=sys.stderr)
        return 2
    forward, success, e2e = forward_rows(episodes), success_rows(episodes), end_to_end_rows(episodes)
    if forward:  # a forward run's forward.jsonl (--retrace-experiment=forward)
        print(json.dumps([r.model_dump() for r in forward], indent=2) if as_json else format_forward(forward))
    if success:  # an ideal-recovery run's (its continuations)
        print(json.dumps([r.model_dump() for r in success], indent=2) if as_json else format_success(success))
    if e2e:  # an end-to-end run's
        print(json.dumps([r.model_dump() for r in e2e], indent=2) if as_json else format_end_to_end(e2e))
    if forward_files and not records:
        return 0
    stats = summarize(records)
    if as_json:
        print(json.dumps(stats.to_dict(), indent=2, sort_keys=True))
    else:
        print(format_table(stats))
        print()
        print(format_table(stats, by_domain=True))
    return 0
