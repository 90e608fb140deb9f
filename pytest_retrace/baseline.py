"""Baselines for the CI gate: a run's verdicts saved under a name, and the paired comparison of a new run with it.

Both runs are compared on the cases they share (same case, model, strategy, budget and run index, both with a
verdict), per model × strategy × budget. On those pairs McNemar's exact test asks whether the discordant ones
— recovered before but not now (b), recovered now but not before (c) — lean one way more than chance allows:
two-sided p = min(1, 2 · P(X ≤ min(b, c))) for X ~ Binomial(b + c, 1/2). It is exact, so it holds for the
handful of discordant cases a benchmark cell has, where the chi-square approximation does not. A group
*regresses* when its shared-case rate dropped by more than ``max_drop`` points and p < ``ALPHA``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .records import Record

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


def mcnemar_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b and c discordant pairs."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class Comparison:
    group: Group
    shared: int  # pairs with a verdict in both runs
    old_rate: float | None
    new_rate: float | None
    lost: int  # recovered in the baseline, not now (b)
    gained: int  # recovered now, not in the baseline (c)
    p_value: float

    @property
    def drop_points(self) -> float:
        if self.old_rate is None or self.new_rate is None:
            return 0.0
        return 100 * (self.old_rate - self.new_rate)

    def regressed(self, max_drop: float) -> bool:
        return self.drop_points > max_drop and self.p_value < ALPHA

    def describe(self) -> str:
        model, strategy, budget = self.group
        old = "-" if self.old_rate is None else f"{100 * self.old_rate:.1f}%"
        new = "-" if self.new_rate is None else f"{100 * self.new_rate:.1f}%"
        return (f"{model} {strategy} r={budget}: {old} -> {new} on {self.shared} shared case(s) "
                f"(lost {self.lost}, gained {self.gained}; McNemar exact p = {self.p_value:.4f})")


def compare(old: dict[Key, bool], new: dict[Key, bool]) -> list[Comparison]:
    groups: dict[Group, list[tuple[bool, bool]]] = {}
    for key, now in new.items():
        if key in old:
            groups.setdefault((key[1], key[2], key[3]), []).append((old[key], now))
    out = []
    for group, pairs in sorted(groups.items()):
        lost = sum(o and not n for o, n in pairs)
        gained = sum(n and not o for o, n in pairs)
        out.append(Comparison(group, len(pairs), sum(o for o, _ in pairs) / len(pairs),
                              sum(n for _, n in pairs) / len(pairs), lost, gained, mcnemar_p(lost, gained)))
    return out


def baseline_path(name_or_path: str, report_dir: Path) -> Path:
    """A name is reports/baselines/NAME.json; anything with a slash or a .json suffix is a path."""
    if "/" in name_or_path or name_or_path.endswith(".json"):
        return Path(name_or_path)
    return report_dir / "baselines" / f"{name_or_path}.json"


def summary_block(comparisons: list[Comparison], max_drop: float) -> dict[str, Any]:
    return {"alpha": ALPHA, "max_drop": max_drop, "groups": [
        {"model": c.group[0], "strategy": c.group[1], "budget": c.group[2], "shared": c.shared,
         "old_rate": c.old_rate, "new_rate": c.new_rate, "lost": c.lost, "gained": c.gained,
         "p_value": round(c.p_value, 6), "regressed": c.regressed(max_drop)} for c in comparisons]}
