"""The custom assertions: ``assert retrace_result == recovered`` (and a forward run's ``== solved``).

A small dataclass whose equality is the oracle's verdict, so pytest's assertion rewriting calls
``pytest_assertrepr_compare`` (plugin/__init__.py) and the failure reads as a few lines saying what failed:
R_O (SSIM vs threshold, where the screens differ) and/or R_TC (evaluator, score, actions replayed).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_retrace.experiments.forward import ForwardResult
from pytest_retrace.replay.result import RecoveryResult


@dataclass(frozen=True)
class Recovered:
    """Matches a RecoveryResult whose recovery holds: R_TC ∧ R_O."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecoveryResult):
            return other.error is None and other.recovered
        return NotImplemented

    def __hash__(self) -> int:
        return hash(Recovered)

    def __repr__(self) -> str:
        return "recovered"


recovered = Recovered()


def explain(result: RecoveryResult) -> list[str]:
    """Lines for pytest_assertrepr_compare: the verdict, then each half of the oracle."""
    if result.error is not None:
        return [f"infrastructure error at stage {result.error.stage}: {result.error.message}"]
    lines = [f"case {result.case_id} not recovered: R_O={result.r_o}, R_TC={result.r_tc}"]
    if result.r_o:
        lines.append(f"R_O ok: SSIM {result.ssim:.4f} >= {result.ssim_threshold}")
    elif result.ssim is None:
        lines.append(f"R_O failed: {result.unobserved or 'not observed'}")
    else:
        where = result.diff.describe() if result.diff else "unknown"
        lines.append(f"R_O failed: SSIM {result.ssim:.4f} < {result.ssim_threshold}; {where}")
    ev = result.evaluation
    head = "R_TC ok" if result.r_tc else "R_TC failed"
    score = f"score {ev.score:g}" if ev else "not evaluated"
    lines.append(f"{head}: evaluator {score} after replaying the remaining {result.suffix_len} gt action(s)")
    if ev and not result.r_tc:
        lines += [f"  {d}" for d in ev.details[:4]]
    taken = [s.action for s in result.steps if s.stage == "recover"]
    used = f"{result.actions_used}/{result.budget} action(s) of the budget"
    lines.append(f"agent: {result.agent_turns} turn(s), {used}, actions {taken[:6]}{' ...' if len(taken) > 6 else ''}")
    trouble = [f"{n} {what}" for n, what in ((result.invalid_steps, "invalid repl(ies)"),
                                             (result.failed_actions, "action(s) the desktop could not complete"),
                                             (result.cut_actions, "action(s) cut at the budget")) if n]
    if trouble:
        lines.append("  " + "; ".join(trouble))
    return lines


@dataclass(frozen=True)
class Solved:
    """Matches a ForwardResult whose task the evaluator passed."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ForwardResult):
            return other.solved
        return NotImplemented

    def __hash__(self) -> int:
        return hash(Solved)

    def __repr__(self) -> str:
        return "solved"


solved = Solved()


def explain_forward(result: ForwardResult) -> list[str]:
    if result.error is not None:
        return [f"infrastructure error at stage {result.error.stage}: {result.error.message}"]
    ev, drive = result.evaluation, result.drive
    lines = [f"task {result.task_id} not solved: evaluator score {ev.score:g}" if ev else
             f"task {result.task_id} not solved: not evaluated"]
    if ev:
        lines += [f"  {d}" for d in ev.details[:4]]
    taken = [s.action for s in drive.steps]
    ended = f", ended with {result.last_action}" if result.last_action else ", never said it was done"
    lines.append(f"agent: {drive.agent_turns} turn(s), {drive.actions_used}/{result.max_steps} step(s){ended}, "
                 f"actions {taken[:6]}{' ...' if len(taken) > 6 else ''}")
    return lines
