"""Baselines for the CI gate: a run's verdicts saved under a name, and the paired comparison of a new run with it.

Both runs are compared on the cases they share (same case, model, strategy, budget and run index, both with a
verdict), per model × strategy × budget. On those pairs McNemar's exact test asks whether the discordant ones
— recovered before but not now (b), recovered now but not before (c) — lean one way more than chance allows:
two-sided p = min(1, 2 · P(X ≤ min(b, c))) for X ~ Binomial(b + c, 1/2). It is exact, so it holds for the
handful of discordant cases a benchmark cell has, where the chi-square approximation does not. A group
*regresses* when its shared-case rate dropped by more than ``max_drop`` points and p < ``ALPHA``.

The test has a floor: on n shared pairs the smallest p it can give is 2 · 2⁻ⁿ (every pair lost), so
below 6 shared cases no drop, not even 100 % → 0 %, reaches p < 0.05. Such a group is *underpowered*: the
gate says so, and its strict mode fails on it rather than pass on a test that could not have failed.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pytest_retrace.results import rundir
from pytest_retrace.results.records import Record

ALPHA = 0.05  # two-sided significance level of the regression test
BASELINE_VERSION = 1

Key = tuple[str | None, str, str, int, int]  # case, model, strategy, budget, run index
Group = tuple[str, str, int]  # model, strategy, budget


def verdicts(records: list[Record]) -> dict[Key, bool]:
    """Recovered or not, per test, for records with a verdict (errors measured nothing); a test's first
    verdict is final, as in the summary."""
    out: dict[Key, bool] = {}
    for r in records:
        if not r.is_error:
            out.setdefault((r.case, r.model, r.strategy, r.budget, r.run_index), r.verdict == "recovered")
    return out


def errored(records: list[Record]) -> set[Key]:
    """Tests whose only records are infrastructure errors: in the run, but without a verdict."""
    failed = {(r.case, r.model, r.strategy, r.budget, r.run_index) for r in records if r.is_error}
    return failed - set(verdicts(records))


def save(path: Path, run: str, records: list[Record]) -> None:
    rows = [{"case": k[0], "model": k[1], "strategy": k[2], "budget": k[3], "run_index": k[4], "recovered": v}
            for k, v in sorted(verdicts(records).items(), key=lambda kv: tuple(str(x) for x in kv[0]))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema_version": BASELINE_VERSION, "run": run, "verdicts": rows}, indent=1) + "\n")


def load(path: Path) -> dict[Key, bool]:
    try:
        data = json.loads(path.read_text())
        if data.get("schema_version") != BASELINE_VERSION:
            raise ValueError(f"schema_version {data.get('schema_version')!r}, expected {BASELINE_VERSION}")
        return {(r["case"], r["model"], r["strategy"], int(r["budget"]), int(r["run_index"])): bool(r["recovered"])
                for r in data["verdicts"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"baseline {path}: {exc}") from None


@cache
def mcnemar_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b and c discordant pairs: the exact binomial test of b successes
    in b + c trials at 1/2 (scipy's; its two-sided p is 2 · P(X <= min(b, c)) here, the null being
    symmetric)."""
    from scipy.stats import binomtest  # scipy comes with scikit-image; imported only when a gate compares

    if b + c == 0:
        return 1.0
    return min(1.0, float(binomtest(b, b + c, 0.5).pvalue))


def smallest_p(shared: int) -> float:
    """The smallest p the test can give on this many pairs: every one of them discordant the same way."""
    return mcnemar_p(shared, 0)


def min_shared(alpha: float = ALPHA) -> int:
    """The fewest shared cases on which a drop can reach p < alpha at all (6 at 0.05)."""
    n = 1
    while smallest_p(n) >= alpha:
        n += 1
    return n


@dataclass(frozen=True)
class Comparison:
    """One model × strategy × budget of the baseline, of the run, or of both."""

    group: Group
    shared: int  # pairs with a verdict in both runs
    old_rate: float | None  # on the shared pairs; None without any
    new_rate: float | None
    lost: int  # recovered in the baseline, not now (b)
    gained: int  # recovered now, not in the baseline (c)
    p_value: float
    baseline_n: int = 0  # verdicts of this group in the baseline
    run_n: int = 0  # verdicts of this group in the run
    missing_errors: int = 0  # baseline cases that are infrastructure errors in the run (part of ``missing``)

    @property
    def missing(self) -> int:
        """Baseline verdicts of this group without a verdict in the run: not run, or an infrastructure error."""
        return self.baseline_n - self.shared

    @property
    def smallest_p(self) -> float:
        return smallest_p(self.shared)

    @property
    def underpowered(self) -> bool:
        """Too few shared cases for any drop to reach p < ALPHA: the test could not fail this group."""
        return self.smallest_p >= ALPHA

    @property
    def drop_points(self) -> float:
        if self.old_rate is None or self.new_rate is None:
            return 0.0
        return 100 * (self.old_rate - self.new_rate)

    def regressed(self, max_drop: float) -> bool:
        return self.drop_points > max_drop and self.p_value < ALPHA

    @property
    def name(self) -> str:
        model, strategy, budget = self.group
        return f"{model} {strategy} r={budget}"

    def describe(self) -> str:
        old = "-" if self.old_rate is None else f"{100 * self.old_rate:.1f}%"
        new = "-" if self.new_rate is None else f"{100 * self.new_rate:.1f}%"
        return (f"{self.name}: {old} -> {new} on {self.shared} shared case(s) "
                f"(lost {self.lost}, gained {self.gained}; McNemar exact p = {self.p_value:.4f})")

    def describe_missing(self) -> str:
        """``3 of 8 baseline case(s) missing from the run (1 infrastructure error, 2 not run)``."""
        not_run = self.missing - self.missing_errors
        why = [f"{self.missing_errors} infrastructure error(s)"] * bool(self.missing_errors) \
            + [f"{not_run} not run"] * bool(not_run)
        return f"{self.missing} of {self.baseline_n} baseline case(s) missing from the run ({', '.join(why)})"

    def describe_power(self) -> str:
        return (f"{self.shared} shared case(s) cannot show a regression: McNemar's exact p is at least "
                f"{self.smallest_p:.4f} on {self.shared} pair(s), not below alpha {ALPHA} "
                f"(that takes {min_shared()} shared cases)")


def compare(old: dict[Key, bool], new: dict[Key, bool], errors: set[Key] | frozenset[Key] = frozenset()
            ) -> list[Comparison]:
    """Every group of either run (``errors``: the run's tests without a verdict, to say why a baseline case
    is missing), compared on the tests both have a verdict for."""
    def group(key: Key) -> Group:
        return key[1], key[2], key[3]

    pairs: dict[Group, list[tuple[bool, bool]]] = {}
    for key, now in new.items():
        if key in old:
            pairs.setdefault(group(key), []).append((old[key], now))
    in_old, in_new = Counter(map(group, old)), Counter(map(group, new))
    missing_errors = Counter(group(k) for k in old if k in errors and k not in new)
    out = []
    for g in sorted(in_old.keys() | in_new.keys()):
        shared = pairs.get(g, [])
        lost = sum(o and not n for o, n in shared)
        gained = sum(n and not o for o, n in shared)
        old_rate = sum(o for o, _ in shared) / len(shared) if shared else None
        new_rate = sum(n for _, n in shared) / len(shared) if shared else None
        out.append(Comparison(g, len(shared), old_rate, new_rate, lost, gained, mcnemar_p(lost, gained),
                              baseline_n=in_old[g], run_n=in_new[g], missing_errors=missing_errors[g]))
    return out


def baseline_path(name_or_path: str, report_dir: Path) -> Path:
    """A name is reports/baselines/NAME.json; anything with a slash or a .json suffix is a path."""
    if "/" in name_or_path or name_or_path.endswith(".json"):
        return Path(name_or_path)
    return rundir.baseline_file(report_dir, name_or_path)


def summary_block(comparisons: list[Comparison], max_drop: float) -> dict[str, Any]:
    return {"alpha": ALPHA, "max_drop": max_drop, "min_shared": min_shared(), "groups": [
        {"model": c.group[0], "strategy": c.group[1], "budget": c.group[2], "shared": c.shared,
         "baseline_n": c.baseline_n, "run_n": c.run_n, "missing": c.missing,
         "missing_errors": c.missing_errors,
         "old_rate": c.old_rate, "new_rate": c.new_rate, "lost": c.lost, "gained": c.gained,
         "p_value": round(c.p_value, 6), "smallest_p": round(c.smallest_p, 6), "underpowered": c.underpowered,
         "regressed": c.regressed(max_drop)} for c in comparisons]}
