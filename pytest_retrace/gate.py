"""The CI gate: with any gate option set, a run's exit status says whether the agent may be released, not
whether single recoveries failed (every benchmark run has failed recoveries; that is what it measures).

Checked on the summary only, so ``retrace summary`` of the same records would decide the same way:
- ``fail_under``: every model × strategy × budget group must recover at least this share of its cases;
- ``max_errors``: at most this many infrastructure errors in the run — past it, the rates rest on too few cases;
- a case file that could not be loaded fails the gate: a release must not pass on a suite that silently shrank.
A regression test against a saved baseline (paired, on the cases both runs share) is the next gate option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Gate:
    fail_under: float | None = None  # a rate in [0, 1]
    max_errors: int | None = None

    @property
    def active(self) -> bool:
        return self.fail_under is not None or self.max_errors is not None

    def problems(self, summary: dict[str, Any], collection_errors: int) -> list[str]:
        """Why the run fails the gate; empty when it passes."""
        out = []
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
