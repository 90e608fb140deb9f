"""The CI gate: with any gate option set, a run's exit status says whether the agent may be released, not
whether single recoveries failed (every benchmark run has failed recoveries; that is what it measures).

Checked on the summary only, so ``retrace summary`` of the same records would decide the same way:
- ``fail_under``: every model × strategy × budget group must recover at least this share of its cases;
- ``max_errors``: at most this many infrastructure errors in the run — past it, the rates rest on too few cases;
- ``baseline``: no model × strategy × budget may regress against a saved run: a drop of more than
  ``max_drop`` points on the cases both runs share that McNemar's exact test supports (p < 0.05, baseline.py);
  a drop within noise passes;
- a case file that could not be loaded fails the gate: a release must not pass on a suite that silently shrank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import baseline as _baseline

if TYPE_CHECKING:
    from .records import Record


@dataclass(frozen=True)
class Gate:
    fail_under: float | None = None  # a rate in [0, 1]
    max_errors: int | None = None
    baseline: Path | None = None
    max_drop: float = 0.0  # points

    @property
    def active(self) -> bool:
        return self.fail_under is not None or self.max_errors is not None or self.baseline is not None

    def compare(self, records: list[Record]) -> list[_baseline.Comparison]:
        assert self.baseline is not None
        return _baseline.compare(_baseline.load(self.baseline), _baseline.verdicts(records))

    def problems(self, summary: dict[str, Any], collection_errors: int,
                 comparisons: Sequence[_baseline.Comparison] = ()) -> list[str]:
        """Why the run fails the gate; empty when it passes."""
        out = [f"regression: {c.describe()}" for c in comparisons if c.regressed(self.max_drop)]
        if collection_errors:
            out.append(f"{collection_errors} case file(s) could not be loaded")
        if self.max_errors is not None and summary["n_errors"] > self.max_errors:
            out.append(f"{summary['n_errors']} infrastructure error(s) > --retrace-max-errors {self.max_errors} "
                       f"({', '.join(f'{k}: {v}' for k, v in summary['error_kinds'].items())})")
        if self.fail_under is not None:
            for g in summary["groups"]:
                if g["rate"] is None or g["rate"] < self.fail_under:
                    rate = "no finished case" if g["rate"] is None else f"{100 * g['rate']:.1f}%"
                    out.append(f"{g['model']} {g['strategy']} r={g['budget']}: recovery rate {rate} "
                               f"< --retrace-fail-under {100 * self.fail_under:.1f}% (n={g['n']})")
        return out
