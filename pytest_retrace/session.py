"""Per-run state on the controller: the run directory, results.jsonl written as tests finish, the
summary computed from records only (so -n 0, -n 2 and a merged or resumed run give the same numbers)."""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .replay import RecoveryResult
from .stats import summarize


def new_run_name(models: list[str]) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{'+'.join(models)}"[:120]


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("_")[:150]


def make_record(*, nodeid: str, case: Any, model: str, strategy: str, budget: int,
                result: RecoveryResult | None = None, error: dict[str, str] | None = None,
                privileged: bool = False) -> dict[str, Any]:
    """One line of results.jsonl: everything needed to recompute a summary or audit a verdict."""
    rec: dict[str, Any] = {
        "nodeid": nodeid,
        "case": case.id if case is not None else None,
        "task": case.task.id if case is not None else None,
        "domain": case.task.domain if case is not None else None,
        "horizon": case.horizon if case is not None else None,
        "kind": case.metadata.get("kind") if case is not None else None,
        "model": model,
        "strategy": strategy,
        "budget": budget,
        "privileged": privileged,
        "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if result is None:
        rec.update(verdict="error", recovered=None, r_o=None, r_tc=None, ssim=None, evaluator_score=None,
                   error=error, timings={}, actions=[])
        return rec
    ev = result.evaluation
    rec.update(
        verdict=result.verdict,
        recovered=None if result.error else result.recovered,
        r_o=result.r_o,
        r_tc=result.r_tc,
        ssim=result.ssim,
        ssim_threshold=result.ssim_threshold,
        evaluator_score=ev.score if ev else None,
        evaluator_details=ev.details if ev else [],
        screen_diff=(result.diff.describe() if result.diff else None),
        error=({"stage": result.error.stage, "kind": result.error.kind, "message": result.error.message}
               if result.error else None),
        attempts=result.attempts,
        reconstruction=result.reconstruction,
        agent_turns=result.agent_turns,
        actions_used=result.actions_used,
        invalid_steps=result.invalid_steps,
        failed_actions=result.failed_actions,
        cut_actions=result.cut_actions,
        usage=result.usage.to_dict(),
        context_usage=result.context_usage.to_dict(),
        timings=result.timings,
        actions=[{"stage": s.stage, **s.action, "settle": s.settle, **({"rationale": s.rationale} if s.rationale else {}),
                  **({"error": s.error} if s.error else {})} for s in result.steps],
    )
    return rec


def save_artifacts(run_dir: Path, nodeid: str, result: RecoveryResult) -> list[Path]:
    """Recovered screenshot and a diff against the target, for a verdict a human wants to check."""
    from PIL import Image

    from .oracle import diff_image

    if result.recovered_screenshot is None or result.target_screenshot is None:
        return []
    out = run_dir / "artifacts" / safe_name(nodeid.split("::")[-1])
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "recovered.png", out / "diff.png"]
    Image.fromarray(result.recovered_screenshot).save(paths[0])
    Image.fromarray(diff_image(result.target_screenshot, result.recovered_screenshot)).save(paths[1])
    return paths


@dataclass
class RetraceSession:
    run_dir: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.results_path = self.run_dir / "results.jsonl"

    def add(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # append + flush per record: an interrupted or crashed run keeps every finished result
        with self.results_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True, default=str) + "\n")

    def finish(self, meta: dict[str, Any]) -> dict[str, Any]:
        self.summary = {**summarize(self.records), "run": meta}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "summary.json").write_text(json.dumps(self.summary, indent=2, sort_keys=True) + "\n")
        return self.summary


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records of a results.jsonl; a torn last line (killed mid-write) is skipped, not fatal."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
