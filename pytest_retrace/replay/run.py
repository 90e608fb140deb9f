"""Goal-oriented action replay of one recovery case (paper section 5.2).

reset → gt[0:t_seed] → verify s_target → perturbation → verify s_error → the agent acts (at most r actions)
→ recovered screenshot → R_O → gt[t_seed:] → Φ → R_TC.

Who is to blame decides how a problem counts, and an agent must never be able to change its own n:
- the harness, the environment, a ground-truth replay that desyncs, the model's API down after retries:
  :class:`InfraError`, reported as a pytest *error* and left out of every rate;
- everything the model does — a reply that does not parse (after one re-ask), an action the desktop
  cannot complete — is recorded and scored as the agent's failure. The adapters turn any reply into
  actions or an invalid step, so a model cannot raise; an exception escaping an agent's ``start`` or
  ``act`` is a bug in agent code and an error of kind ``agent-bug``: it must never pass for a measurement;
- once the agent has acted, whatever goes wrong in observing, in the probes, the suffix or the evaluation
  comes from the state it left (a screen it keeps changing, a server grab, a process that swallows the
  suffix's keys), since from s_target itself the suffix never fails (the calibration replays it from the
  oracle's restored state every time): R_O or R_TC is false, with the reason. Only the harness's own fault,
  which the environment itself reports (``harness_fault``: its X server dead, the container gone, the guest
  not answering), is an error there (docs/cases.md, "Who is to blame").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pytest_retrace.actions import Action, ActionError, check_turn
from pytest_retrace.agents import Agent, AgentContext, AgentInfraError, HistoryStep, Observation, Usage
from pytest_retrace.agents.secrets import redact
from pytest_retrace.envs import ActionFailed, EnvError, Environment, harness_fault
from pytest_retrace.evaluators import LATE_WRITES, Evaluation, evaluate
from pytest_retrace.replay.cases import RecoveryCase, load_png
from pytest_retrace.replay.probes import poll
from pytest_retrace.replay.strategies import Contextualizer, build_context
from pytest_retrace.screen.settle import Settled
from pytest_retrace.screen.similarity import ScreenDiff, differing_pixels, screen_diff, ssim

if TYPE_CHECKING:
    from pytest_retrace.replay.verifier import StateVerifier


class InfraError(Exception):
    """An infrastructure failure at `stage`: reported as a pytest error, excluded from rates."""

    def __init__(self, stage: str, message: str, kind: str = "env") -> None:
        self.stage, self.kind, self.message = stage, kind, message
        super().__init__(f"[{stage}] {message}")


@dataclass
class Stage:
    """One stage of a replay as it happens, for observers (Allure steps, the live progress line).

    ``name`` is the machine name (reset, prefix, verify, perturb, context, recover, turn, observe, suffix,
    evaluate), ``title`` what a reader sees. When the stage ends, ``seconds`` is set, ``failed`` says which
    check of the agent's did not hold (R_O below threshold, an invalid reply: the agent's failure, not the
    harness's) and ``error`` holds the infrastructure error that ended it, if any. A ``verify`` stage whose
    state did not reproduce keeps the screen it got in ``screenshot``, to be compared with the recorded one."""

    name: str
    title: str
    turn: int | None = None
    seconds: float | None = None
    failed: str | None = None
    error: InfraError | None = None
    screenshot: np.ndarray | None = field(default=None, repr=False)


class ReplayObserver(Protocol):
    """Told when each stage starts and ends; must not raise (an observer's bug is not the case's)."""

    def stage_start(self, stage: Stage) -> None: ...

    def stage_end(self, stage: Stage) -> None: ...


@dataclass(frozen=True)
class ReplayOptions:
    budget: int = 10  # r: actions the agent may take
    strategy: str = "implicit"
    ssim_threshold: float = 0.99
    attempts: int = 3  # tries to reconstruct s_target and s_error before declaring an infra error
    verify_tolerance: int = 0  # differing pixels allowed when checking a reconstructed state
    verify_wait: float = 5.0  # seconds a reconstructed state may take to reach its recorded pixels
    contextualizer: Contextualizer | None = None  # explicit-context's summariser
    verifier: StateVerifier | None = None  # an LLM judge for states that cannot reproduce pixel for pixel
    observer: ReplayObserver | None = None  # Allure steps, progress: see plugin._StageHooks

    @property
    def max_turns(self) -> int:
        """Model turns per case. Turns that only look (a screenshot or zoom request) use no budget, so the
        budget alone would not bound the calls; 2r + 2 leaves room to look before most actions."""
        return 2 * self.budget + 2


@dataclass
class StepLog:
    stage: str
    action: dict[str, Any]
    settle: float
    rationale: str = ""
    error: str | None = None  # why this action failed (an invalid reply, an action the desktop refused)
    settled: bool = True  # the screen was stable before the settle cap ran out


@dataclass
class RecoveryResult:
    case_id: str
    ssim_threshold: float
    budget: int = 0
    ssim: float | None = None
    r_o: bool | None = None
    r_tc: bool | None = None
    evaluation: Evaluation | None = None
    diff: ScreenDiff | None = None
    suffix_len: int = 0
    attempts: int = 0
    agent_turns: int = 0
    actions_used: int = 0  # of the budget: executed actions, failed actions and invalid replies
    invalid_steps: int = 0  # replies that did not parse even after a re-ask
    failed_actions: int = 0  # actions the desktop could not complete
    cut_actions: int = 0  # actions of a turn dropped because the budget ran out
    reconstruction: dict[str, str] = field(default_factory=dict)  # state -> "pixels" | "verifier: ..."
    probes: dict[str, bool | None] = field(default_factory=dict)  # probe -> equals its target value after recovery
    usage: Usage = field(default_factory=Usage)  # the agent's model calls
    context_usage: Usage = field(default_factory=Usage)  # the contextualizer's and verifier's calls
    steps: list[StepLog] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    unobserved: str | None = None  # why the recovered screen could not be read (the agent's doing: R_O false)
    recovered_screenshot: np.ndarray | None = field(default=None, repr=False)
    target_screenshot: np.ndarray | None = field(default=None, repr=False)
    error: InfraError | None = None

    def __repr__(self) -> str:  # pytest prints fixture values in tracebacks: keep it to one short line
        return (f"RecoveryResult(case={self.case_id!r}, verdict={self.verdict!r}, ssim={self.ssim}, "
                f"r_o={self.r_o}, r_tc={self.r_tc})")

    @property
    def recovered(self) -> bool:
        """R = R_TC ∧ R_O."""
        return bool(self.r_o and self.r_tc)

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return "error"
        return "recovered" if self.recovered else "not_recovered"


@contextmanager
def _stage(result: RecoveryResult, opts: ReplayOptions, name: str, title: str,
           turn: int | None = None) -> Iterator[Stage]:
    """Time a stage into ``result.timings[name]`` (summed over attempts) and tell the observer."""
    stage = Stage(name, title, turn)
    if opts.observer is not None:
        opts.observer.stage_start(stage)
    start = time.monotonic()
    try:
        yield stage
    except InfraError as exc:
        stage.error = exc
        raise
    finally:
        stage.seconds = time.monotonic() - start
        if name != "turn":  # turns are part of "recover"
            result.timings[name] = round(result.timings.get(name, 0.0) + stage.seconds, 4)
        if opts.observer is not None:
            opts.observer.stage_end(stage)


def _run_actions(env: Environment, actions: list[Action], stage: str, result: RecoveryResult,
                 history: list[HistoryStep] | None = None) -> None:
    """Replay ground-truth actions: any failure here is the harness's (a desync), never the agent's."""
    for action in actions:
        before = env.screenshot() if history is not None else None
        try:
            settled = env.execute(action)
        except EnvError as exc:
            raise InfraError(stage, f"{action.describe()}: {exc}", kind="desync" if isinstance(exc, ActionFailed)
                             else "env") from exc
        result.steps.append(StepLog(stage, action.to_dict(), round(settled.seconds, 4), settled=settled.stable))
        if not settled.stable:
            # the next action, or the state check, would act on a screen still changing: not a replay
            raise InfraError(stage, f"{action.describe()}: the screen was still changing after "
                                    f"{settled.seconds:.1f} s (the settle cap)", kind="unsettled")
        if history is not None:
            history.append(HistoryStep(before, action))


def _matches(env: Environment, expected: np.ndarray, case: RecoveryCase, opts: ReplayOptions,
             result: RecoveryResult, state: str) -> tuple[bool, str, np.ndarray]:
    """Is the reconstructed `state` the recorded one? Pixel for pixel, or else by the LLM verifier if one is
    configured (for environments that cannot reproduce a screen exactly). Returns the screen it judged.

    The screen is polled for up to ``opts.verify_wait`` seconds until it matches: an app finishes some redraws
    on idle timers after the screen was quiet for a moment (LibreOffice's toolbar states, rulers and status
    fields), and under load (-n 16 on 2 cores) those come seconds late. Waiting for the recorded screen, not
    for any quiet screen, is what makes that safe: a state that never reaches the recording still fails."""
    deadline = time.monotonic() + opts.verify_wait
    while True:
        shot = env.screenshot()
        off = differing_pixels(shot, expected, case.masks)
        if off <= opts.verify_tolerance:
            result.reconstruction[state] = "pixels"
            return True, "", shot
        if time.monotonic() >= deadline:
            break
        time.sleep(VERIFY_POLL)
    diff = screen_diff(shot, expected, case.masks)  # where it differs tells a dialog from a shifted layout
    problem = f"{state} state off: {diff.describe()} (SSIM {ssim(shot, expected, case.masks):.4f})"
    if opts.verifier is None:
        return False, problem, shot
    try:
        same, reason, usage = opts.verifier.same_state(expected, shot, state)
    except AgentInfraError as exc:
        raise InfraError("verify", f"state verifier: {exc}", kind=exc.kind) from exc
    result.context_usage.add(usage)
    if same:
        result.reconstruction[state] = f"verifier ({off} px differ): {reason}"
        return True, "", shot
    return False, f"{problem}; the verifier says different: {reason}", shot


VERIFY_POLL = 0.1


PROBE_WAIT = 3.0  # seconds an app may take to write what the perturbation changed (GSettings, autosave)


def _probes_differ(env: Environment, case: RecoveryCase) -> tuple[bool, str]:
    """Did the perturbation take effect off screen? Every probe must leave its target value."""
    targets = [p.target for p in case.probes]
    try:
        values = poll(env, [p.get for p in case.probes], lambda vs: all(map(str.__ne__, vs, targets)), PROBE_WAIT)
    except EnvError as exc:
        raise InfraError("verify", f"probe: {exc}") from exc
    pending = [p for p, v in zip(case.probes, values) if v == p.target]
    if pending:
        return False, "error state not reached: " + "; ".join(
            f"probe {p.describe()} still has its target value after the perturbation" for p in pending)
    return True, ""


def _probes_restored(env: Environment, case: RecoveryCase) -> dict[str, bool]:
    """Which probes are back at their target values after the recovery. An app writes some state on its own
    timer (mousepad's window state, seconds after start), so each gets the same grace as after the
    perturbation: polled for up to PROBE_WAIT + 1 s until every probe is back."""
    targets = [p.target for p in case.probes]
    values = poll(env, [p.get for p in case.probes], lambda vs: vs == targets, PROBE_WAIT + 1.0, interval=0.25)
    return {p.describe(): v == p.target for p, v in zip(case.probes, values)}


def reconstruct(env: Environment, case: RecoveryCase, opts: ReplayOptions, result: RecoveryResult,
                history: list[HistoryStep] | None = None, with_error: bool = True) -> None:
    """Drive a fresh environment to s_target (and on to s_error), verified; retried up to `attempts` times."""
    target, error = load_png(case.target_png), load_png(case.error_png)
    problems: list[str] = []
    for attempt in range(1, opts.attempts + 1):
        result.attempts = attempt
        if history is not None:
            history.clear()
        with _stage(result, opts, "reset", f"reset (attempt {attempt})" if attempt > 1 else "reset"):
            try:
                env.reset(case.task, case.dir, masks=case.masks)
            except EnvError as exc:
                raise InfraError("reset", str(exc)) from exc
        with _stage(result, opts, "prefix", f"prefix: {_count(case.prefix, 'ground-truth action')}"):
            _run_actions(env, case.prefix, "prefix", result, history)
        with _stage(result, opts, "verify", "verify s_target") as stage:
            ok, problem, shot = _matches(env, target, case, opts, result, "target")
            stage.failed, stage.screenshot = (None, None) if ok else (problem, shot)
        if not ok:
            problems.append(f"attempt {attempt}: {problem}")
            continue
        if not with_error:
            return
        with _stage(result, opts, "perturb", f"perturbation: {_count(case.perturbation, 'action')}"):
            _run_actions(env, case.perturbation, "perturb", result, history)
        with _stage(result, opts, "verify", "verify s_error") as stage:
            ok, problem, shot = _matches(env, error, case, opts, result, "error")
            stage.screenshot = None if ok else shot
            if ok and case.probes:
                ok, problem = _probes_differ(env, case)
            stage.failed = problem or None
        if ok:
            return
        problems.append(f"attempt {attempt}: {problem}")
    raise InfraError(
        "reconstruct",
        f"could not reproduce the recorded states (tolerance {opts.verify_tolerance} px): " + "; ".join(problems),
        kind="desync",
    )


def run_case(env: Environment, case: RecoveryCase, agent: Agent, opts: ReplayOptions) -> RecoveryResult:
    """Run one case end to end. Never raises for infra failures: they land in ``result.error``."""
    result = RecoveryResult(case.id, opts.ssim_threshold, budget=opts.budget)
    start = time.monotonic()
    try:
        _run(env, case, agent, opts, result)
    except InfraError as exc:
        result.error = exc
    finally:
        result.timings["total"] = round(time.monotonic() - start, 4)
    return result


def _run(env: Environment, case: RecoveryCase, agent: Agent, opts: ReplayOptions, result: RecoveryResult) -> None:
    if tuple(env.size) != tuple(case.screen):
        raise InfraError("setup", f"environment screen {env.size} != case screen {case.screen}", kind="config")
    history: list[HistoryStep] = []
    reconstruct(env, case, opts, result, history)
    target = load_png(case.target_png)
    result.target_screenshot = target

    with _stage(result, opts, "context", f"context: {opts.strategy}"):
        try:
            context, usage = build_context(opts.strategy, instruction=case.task.instruction, budget=opts.budget,
                                           screen=tuple(env.size), history=history, t_seed=case.t_seed,
                                           target=target, contextualizer=opts.contextualizer)
        except AgentInfraError as exc:
            raise InfraError("context", f"contextualizer: {exc}", kind=exc.kind) from exc
        result.context_usage.add(usage)
    if agent.privileged:
        # the oracle's "ideal recovery": the very replay used to build s_target, verified the same way
        context.restore_target = lambda: reconstruct(env, case, opts, result, with_error=False)
    with _stage(result, opts, "recover", f"recovery: {agent.name}, budget {opts.budget}") as stage:
        _recover(env, agent, context, opts, result)
        stage.title += f" ({result.actions_used} used)"
    _score(env, case, target, opts, result)


def _score(env: Environment, case: RecoveryCase, target: np.ndarray, opts: ReplayOptions,
           result: RecoveryResult) -> None:
    """R_O, the probes, the suffix and R_TC, from the state the agent left. A failure of any of them is the
    agent's (its reason recorded) unless the environment reports a fault of its own (``_blame``)."""
    with _stage(result, opts, "observe", "R_O: SSIM(recovered, target)") as stage:
        try:
            settled = env.settle()
        except EnvError as exc:
            _blame(env, "observe", exc)
            result.r_o, result.unobserved = False, f"the screen could not be read: {exc}"
            stage.title, stage.failed = "R_O: the screen could not be read", result.unobserved
        else:
            _similarity(settled, target, case, opts, result, stage)
    if case.probes:
        with _stage(result, opts, "probe", "error-state probes after the recovery") as stage:
            try:
                result.probes = _probes_restored(env, case)
            except EnvError as exc:
                _blame(env, "probe", exc)
                result.probes = {p.describe(): False for p in case.probes}
                stage.failed = f"the probes could not be read: {exc}"
            else:
                off = [name for name, restored in result.probes.items() if not restored]
                stage.failed = ("not restored: " + ", ".join(off)) if off else None
    with _stage(result, opts, "suffix", f"suffix: {_count(case.suffix, 'remaining ground-truth action')}") as stage:
        try:
            _run_actions(env, case.suffix, "suffix", result)
        except InfraError as exc:
            _blame(env, "suffix", exc)
            # the rest of the task cannot be carried out from the state the agent left: it is not completed
            why = f"the remaining ground-truth actions could not be replayed from the state the agent left: {exc.message}"
            result.evaluation = Evaluation(0.0, False, [why])
            result.r_tc, stage.failed = False, exc.message
            return
        result.suffix_len = len(case.suffix)
    with _stage(result, opts, "evaluate", "R_TC: the task's evaluator") as stage:
        try:
            result.evaluation = evaluate(case.task.evaluator, env, case.dir, wait=LATE_WRITES)
        except EnvError as exc:
            _blame(env, "evaluate", exc)
            result.evaluation = Evaluation(0.0, False, [f"the evaluator could not read the state the agent left: {exc}"])
        except OSError as exc:  # the case's own files (its expected outputs): the harness's
            raise InfraError("evaluate", str(exc)) from exc
        stage.title = f"R_TC: evaluator score {result.evaluation.score:g}"
        stage.failed = None if result.evaluation.passed else "; ".join(result.evaluation.details[:4]) or "failed"
    result.r_tc = result.evaluation.passed


def _blame(env: Environment, stage: str, exc: Exception) -> None:
    """After the agent acted: an InfraError if the environment reports a fault of its own, else nothing (the
    failure came from the state the agent left, and the caller scores it)."""
    fault = harness_fault(env)
    if fault is not None:
        message = exc.message if isinstance(exc, InfraError) else str(exc)
        raise InfraError(stage, f"{message}; {fault}", kind=getattr(exc, "kind", "env")) from exc


def _similarity(settled: Settled, target: np.ndarray, case: RecoveryCase, opts: ReplayOptions,
                result: RecoveryResult, stage: Stage) -> None:
    recovered = settled.frame
    result.recovered_screenshot = recovered
    result.ssim = round(ssim(recovered, target, case.masks), 6)
    # the target was a settled screen: one the agent left changing for the whole cap is not it
    result.r_o = result.ssim >= opts.ssim_threshold and settled.stable
    result.diff = screen_diff(recovered, target, case.masks)
    relation = ">=" if result.ssim >= opts.ssim_threshold else "<"
    stage.title = f"R_O: SSIM {result.ssim:.4f} {relation} {opts.ssim_threshold}"
    if not settled.stable:
        stage.title += f", but the screen never settled ({settled.seconds:.1f} s)"
    stage.failed = None if result.r_o else f"{stage.title}; {result.diff.describe()}"


def _count(actions: list[Action], what: str) -> str:
    return f"{len(actions)} {what}{'' if len(actions) == 1 else 's'}"


def _brief(exc: BaseException) -> str:
    import traceback

    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" at {Path(frame.filename).name}:{frame.lineno}" if frame else ""
    return redact(f"{type(exc).__name__}: {exc}{where}")


def drive(env: Environment, agent: Agent, context: AgentContext, budget: int) -> RecoveryResult:
    """Let an agent act from the environment's current state under the same rules as a recovery (the
    dataset pipeline's perturbation agent uses it); ``steps`` holds what it did."""
    result = RecoveryResult("", 0.0, budget=budget)
    _recover(env, agent, context, ReplayOptions(budget=budget), result)
    return result


def _recover(env: Environment, agent: Agent, context: AgentContext, opts: ReplayOptions,
             result: RecoveryResult) -> None:
    """Let the agent act. The budget counts actions (the paper's steps): executed ones, ones the desktop
    refused and invalid replies; a turn that would exceed it is cut, and the result says how much."""
    try:
        agent.start(context)
    except AgentInfraError as exc:
        raise InfraError("agent", str(exc), kind=exc.kind) from exc
    except InfraError:
        raise  # a privileged baseline's own replay (the oracle's restore) desynced: the harness's, as it says
    except Exception as exc:
        raise InfraError("agent", f"start raised {_brief(exc)}", kind="agent-bug") from exc
    executed: int | None = None
    failure: str | None = None
    for turn_no in range(opts.max_turns):
        if result.actions_used >= opts.budget:
            return
        with _stage(result, opts, "turn", f"turn {turn_no + 1}", turn=turn_no + 1) as stage:
            before = len(result.steps)
            executed, failure, done = _turn(env, agent, opts, result, turn_no, executed, failure)
            stage.failed = failure
            mine = [s for s in result.steps[before:] if s.stage == "recover"]  # not the oracle's own replay
            if mine:
                stage.title += ": " + ", ".join(_short(s.action) for s in mine)
        if done:
            return


def _short(action: dict[str, Any]) -> str:
    args = ", ".join(f"{v!r}" if isinstance(v, str) else str(v) for k, v in action.items() if k != "action")
    text = f"{action['action']}({args})"
    return text if len(text) <= 60 else text[:57] + "..."


def _turn(env: Environment, agent: Agent, opts: ReplayOptions, result: RecoveryResult, turn_no: int,
          executed: int | None, failure: str | None) -> tuple[int, str | None, bool]:
    """One model turn: observe, ask, execute. Returns (actions executed, what failed, whether the agent is
    done: it said so or the budget ran out)."""
    try:
        cursor = env.cursor_position()
    except EnvError:
        cursor = None  # nice to have for the model, never worth failing a case
    try:
        screen = env.screenshot()
    except EnvError as exc:
        _blame(env, "recover", exc)  # the desktop is fine: the agent's own actions made it unreadable
        result.steps.append(StepLog("recover", {"action": "observe"}, 0.0, "", f"the screen could not be read: {exc}"))
        return 0, f"the screen could not be read: {exc}", True
    observation = Observation(screen, turn_no, opts.budget - result.actions_used, cursor, executed, failure)
    try:
        turn = agent.act(observation)
    except AgentInfraError as exc:
        raise InfraError("agent", f"turn {turn_no}: {exc}", kind=exc.kind) from exc
    except InfraError:
        raise  # as in _recover: the oracle's restore replays ground truth, and a desync there is not a bug
    except Exception as exc:
        raise InfraError("agent", f"turn {turn_no}: act raised {_brief(exc)}", kind="agent-bug") from exc
    result.agent_turns = turn_no + 1
    result.usage.add(turn.usage)
    # any agent's words, not only the built-in adapters' (which redact already): no key reaches a record
    turn = replace(turn, rationale=redact(turn.rationale), invalid=None if turn.invalid is None else redact(turn.invalid))
    executed = 0
    invalid = turn.invalid
    if invalid is None:
        try:
            check_turn(turn.actions)  # per-turn caps, whatever dialect the actions came from
        except ActionError as exc:
            invalid = str(exc)
    if invalid is not None:
        result.actions_used += 1
        result.invalid_steps += 1
        result.steps.append(StepLog("recover", {"action": "invalid"}, 0.0, turn.rationale, invalid))
        return 0, f"invalid reply: {invalid}", False
    for i, action in enumerate(turn.actions):
        if action.terminal:
            result.steps.append(StepLog("recover", action.to_dict(), 0.0, turn.rationale))
            return executed, None, True
        if result.actions_used >= opts.budget:
            result.cut_actions += sum(not a.terminal for a in turn.actions[i:])
            return executed, None, True
        result.actions_used += 1
        try:
            settled = env.execute(action)
        except ActionFailed as exc:  # the desktop is fine; what the agent asked could not be done
            result.failed_actions += 1
            result.steps.append(StepLog("recover", action.to_dict(), 0.0, turn.rationale, str(exc)))
            return executed, f"{action.describe()} failed: {exc}", False
        except EnvError as exc:
            _blame(env, "recover", exc)
            # the desktop stopped answering because of what the agent did (a grab): nothing more can be done
            result.failed_actions += 1
            result.steps.append(StepLog("recover", action.to_dict(), 0.0, turn.rationale, str(exc)))
            return executed, f"{action.describe()} failed: {exc}", True
        executed += 1
        # a screen the agent leaves changing is its own doing: recorded, and R_O waits for a settled screen
        result.steps.append(StepLog("recover", action.to_dict(), round(settled.seconds, 4), turn.rationale,
                                    settled=settled.stable))
    return executed, None, False
