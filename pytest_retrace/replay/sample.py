"""``--retrace-sample K``: a stratified sample of the collected cases, the first K (by id) of every app × kind.

A first run, or a quick check of a change, should see every app and every kind of mistake without running the
whole suite: on the built-in suite K = 1 is 26 of 251 cases (every app × kind present), the sample CI replays
three times (tests/test_suite.py). The choice depends on the case files only, never on timing or chance, so two
runs of the same sample measure the same cases.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pytest_retrace.replay.cases import RecoveryCase


def app(case: RecoveryCase) -> str:
    """The application a case's task opens: its first launch step's program (LibreOffice's one binary counts
    as its apps: ``soffice --calc``, ``soffice --writer``); an OSWorld task's domain, which OSWorld names by app
    (``libreoffice_calc``, ``gimp``, ``multi_apps``), since its config opens its apps; ``-`` for a task that
    launches nothing."""
    if case.task.osworld is not None:
        return case.task.domain
    launch = next((s for s in case.task.setup if s.type == "launch"), None)
    if launch is None:
        return "-"
    command = launch.command.split() if isinstance(launch.command, str) else list(launch.command)
    program = Path(command[0]).name
    if program == "soffice":
        return " ".join([program, *(a for a in command[1:] if a in ("--calc", "--writer", "--impress"))][:2])
    return program


def stratum(case: RecoveryCase) -> tuple[str, str]:
    return app(case), str(case.metadata.get("kind") or "-")


def pick(cases: Iterable[RecoveryCase], per_stratum: int) -> set[str]:
    """Ids of the first ``per_stratum`` cases, by id, of every app × kind."""
    taken: dict[tuple[str, str], int] = {}
    chosen: set[str] = set()
    for case in sorted({c.id: c for c in cases}.values(), key=lambda c: c.id):
        key = stratum(case)
        if taken.get(key, 0) < per_stratum:
            taken[key] = taken.get(key, 0) + 1
            chosen.add(case.id)
    return chosen
