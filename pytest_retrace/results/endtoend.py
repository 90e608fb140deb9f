"""End-to-end recovery's rows (paper §6: Tables 2-3, Figure 8), from its episodes' records (ForwardRecord with
``end_to_end``): summary.json's ``end_to_end``, one row per (model, recovery mode, max recoveries).

Each row's success rate is over its episodes with a verdict (infrastructure errors excluded and counted), with
its 95 % Wilson interval and, with several runs, the sd of the per-run rates. Against the same model's ``none``
episodes, paired on (task, run): Δ, the rate difference over the pairs where both have a verdict; ``rescued``,
the pairs this mode solved and ``none`` did not; ``derailed``, the pairs ``none`` solved and this mode did not
(with a deterministic agent, a recovery changed the outcome; otherwise read them as rates). Per attempt: how
many recoveries ran, how many reached s_R (R_O against the recorded screen of step R and, where the task's cases
carry probes, every probe's value equal to the one read after step R), and how many matched the screen alone.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from pytest_retrace.results.forward import ForwardRecord, error_kinds
from pytest_retrace.results.intervals import wilson_interval
from pytest_retrace.results.records import dedupe


class EndToEndRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    mode: str  # none | ideal | a recovery strategy
    max_recoveries: int  # 0 for none
    n: int  # episodes with a verdict
    solved: int
    rate: float | None
    ci_low: float | None
    ci_high: float | None
    errors: int
    runs: int
    rate_sd: float | None = None
    paired: int = 0  # (task, run) pairs with a verdict here and under none
    delta: float | None = None  # rate here - rate under none, over the pairs
    rescued: int = 0
    derailed: int = 0
    recoveries: int = 0  # attempts, over the episodes with a verdict
    reached: int = 0  # attempts whose restore reached s_R: R_O and every probe matches
    reached_screen: int = 0  # attempts whose restore matched the recorded screen of step R (R_O alone)
    episodes_recovered: int = 0  # episodes with at least one recovery
    error_kinds: dict[str, int] = Field(default_factory=dict)


def end_to_end_rows(records: Iterable[ForwardRecord]) -> list[EndToEndRow]:
    kept, _ = dedupe(r for r in records if r.end_to_end is not None)
    groups: dict[tuple[str, str, int], list[ForwardRecord]] = defaultdict(list)
    for r in kept:
        assert r.end_to_end is not None
        groups[(r.model, r.end_to_end.mode, r.end_to_end.max_recoveries)].append(r)
    order = {"none": 0, "ideal": 1}
    models = list(dict.fromkeys(r.model for r in kept))
    rows = []
    for key in sorted(groups, key=lambda k: (models.index(k[0]), order.get(k[1], 2), k[1], k[2])):
        baseline = {(r.task, r.run_index): r.verdict == "solved"
                    for r in groups.get((key[0], "none", 0), []) if not r.is_error}
        rows.append(_row(key, groups[key], baseline))
    return rows


def _row(key: tuple[str, str, int], group: list[ForwardRecord], baseline: dict[tuple[str, int], bool]) -> EndToEndRow:
    model, mode, most = key
    counted = [r for r in group if not r.is_error]
    solved = [r for r in counted if r.verdict == "solved"]
    low, high = wilson_interval(len(solved), len(counted)) if counted else (None, None)
    by_run: dict[int, list[bool]] = defaultdict(list)
    for r in counted:
        by_run[r.run_index].append(r.verdict == "solved")
    rates = [sum(v) / len(v) for v in by_run.values()]
    pairs = [(baseline[(r.task, r.run_index)], r.verdict == "solved") for r in counted
             if (r.task, r.run_index) in baseline]
    attempts = [a for r in counted for a in (r.end_to_end.recoveries if r.end_to_end else [])]
    return EndToEndRow(
        model=model, mode=mode, max_recoveries=most, n=len(counted), solved=len(solved),
        rate=round(len(solved) / len(counted), 6) if counted else None,
        ci_low=None if low is None else round(low, 6), ci_high=None if high is None else round(high, 6),
        errors=len(group) - len(counted), runs=len(by_run),
        rate_sd=round(statistics.stdev(rates), 6) if len(rates) > 1 else None,
        paired=len(pairs) if mode != "none" else 0,
        delta=round(sum(b - a for a, b in pairs) / len(pairs), 6) if pairs and mode != "none" else None,
        rescued=sum(b and not a for a, b in pairs) if mode != "none" else 0,
        derailed=sum(a and not b for a, b in pairs) if mode != "none" else 0,
        recoveries=len(attempts), reached=sum(bool(a.reached) for a in attempts),
        # a record written before r_o was recorded: its reached was R_O alone
        reached_screen=sum(bool(a.reached if a.r_o is None else a.r_o) for a in attempts),
        episodes_recovered=sum(bool(r.end_to_end and r.end_to_end.recoveries) for r in counted),
        error_kinds=error_kinds(group))
