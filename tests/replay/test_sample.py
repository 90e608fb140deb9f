"""``--retrace-sample K``: the first K cases (by id) of every app x kind, what the README's first command runs."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

from pytest_retrace.replay.cases import load_case
from pytest_retrace.replay.sample import pick, stratum
from tests.helpers import REPO

SUITE = {c.id: c for c in (load_case(p) for p in sorted((REPO / "cases").rglob("*.yaml"))
                           if p.name != "calibration.json")}


def collected(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "--retrace-model=oracle", *args], check=False, cwd=REPO, capture_output=True, text=True, timeout=300)


def case_ids(out: str) -> list[str]:
    return re.findall(r"::test_recovery\[(.+)-oracle-explicit-none-r10\]", out)


def test_a_sample_of_one_has_every_app_and_kind_of_the_suite_once() -> None:
    res = collected("--retrace-sample=1")
    assert res.returncode == 0, res.stdout + res.stderr
    ids = case_ids(res.stdout)
    strata = Counter(stratum(SUITE[i]) for i in ids)
    assert set(strata) == {stratum(c) for c in SUITE.values()}
    assert set(strata.values()) == {1}
    assert len(ids) == len(strata) < len(SUITE)
    assert f"{len(ids)}/{len(SUITE)} tests collected ({len(SUITE) - len(ids)} deselected)" in res.stdout
    # the first by id in each stratum: the same cases every time, whatever the machine
    assert set(ids) == pick(SUITE.values(), 1)


def test_a_larger_sample_takes_up_to_k_cases_of_each_stratum() -> None:
    chosen = pick(SUITE.values(), 3)
    per = Counter(stratum(SUITE[i]) for i in chosen)
    everywhere = Counter(stratum(c) for c in SUITE.values())
    assert all(per[s] == min(3, n) for s, n in everywhere.items())
    assert pick(SUITE.values(), 1) < chosen


def test_a_sample_that_is_not_a_positive_count_is_a_usage_error() -> None:
    res = collected("--retrace-sample=0")
    assert res.returncode == 4
    assert "--retrace-sample" in res.stderr
