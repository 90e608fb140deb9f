"""What a replay produces and reports as it goes: the result of one case (``RecoveryResult``, its steps), the
options it runs under, the stages observers see, and ``InfraError``, the harness's failures that never count in a
rate. ``timed_stage`` times a stage and tells the observer; ``blame`` decides, after the agent acted, whether a
failure is the harness's (docs/cases.md, "Who is to blame")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pytest_retrace.actions import Action
from pytest_retrace.agents import Usage
from pytest_retrace.envs import Environment, harness_fault
from pytest_retrace.evaluators import Evaluation
from pytest_retrace.replay.strategies import Contextualizer
from pytest_retrace.screen.similarity import ScreenDiff

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
    check did not hold: of the agent's (R_O below threshold, an invalid reply: the agent's failure) or, in a
    reset or verify stage, of a reconstruction attempt that is retried (the harness's) and ``error`` holds the infrastructure error that ended it, if any. A ``verify`` stage whose
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
    # how s_error is reached: "replay" (reset, prefix, perturbation) or "checkpoint" (restored from the case's
    # checkpoint on this desktop after its first replay, reconstruct.py); why checkpoints were asked for and
    # are not to be had here, if so (every record says it)
    restore: str = "replay"
    restore_problem: str | None = None
    count_looks: bool = False  # a turn that only looks (screenshot, zoom) spends a step (--retrace-protocol=paper)
    contextualizer: Contextualizer | None = None  # explicit-context's summariser
    verifier: StateVerifier | None = None  # an LLM judge for states that cannot reproduce pixel for pixel
    observer: ReplayObserver | None = None  # Allure steps, progress: see plugin/fixtures.py

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
    # state -> "pixels" | "verifier: ..."; "restore", "restore_target" -> how it was reached (reconstruct.py)
    reconstruction: dict[str, str] = field(default_factory=dict)
    probes: dict[str, bool | None] = field(default_factory=dict)  # probe -> equals its target value after recovery
    usage: Usage = field(default_factory=Usage)  # the agent's model calls
    context_usage: Usage = field(default_factory=Usage)  # the contextualizer's and verifier's calls
    steps: list[StepLog] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    # the harness's own CPU-seconds per stage: this process and its threads (not the desktop's processes: an X
    # server, the apps, a helper it starts), what benchmarks/bench_cpu.py splits the cost of a test by
    cpu: dict[str, float] = field(default_factory=dict)
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
def timed_stage(result: RecoveryResult, opts: ReplayOptions, name: str, title: str,
                turn: int | None = None) -> Iterator[Stage]:
    """Time a stage into ``result.timings[name]`` (summed over attempts) and tell the observer."""
    stage = Stage(name, title, turn)
    if opts.observer is not None:
        opts.observer.stage_start(stage)
    start, cpu = time.monotonic(), time.process_time()
    try:
        yield stage
    except InfraError as exc:
        stage.error = exc
        raise
    finally:
        stage.seconds = time.monotonic() - start
        if name != "turn":  # turns are part of "recover"
            result.timings[name] = round(result.timings.get(name, 0.0) + stage.seconds, 4)
            result.cpu[name] = round(result.cpu.get(name, 0.0) + time.process_time() - cpu, 4)
        if opts.observer is not None:
            opts.observer.stage_end(stage)


def blame(env: Environment, stage: str, exc: Exception) -> None:
    """After the agent acted: an InfraError if the environment reports a fault of its own, else nothing (the
    failure came from the state the agent left, and the caller scores it)."""
    fault = harness_fault(env)
    if fault is not None:
        message = exc.message if isinstance(exc, InfraError) else str(exc)
        raise InfraError(stage, f"{message}; {fault}", kind=getattr(exc, "kind", "env")) from exc


def count(actions: list[Action], what: str) -> str:
    return f"{len(actions)} {what}{'' if len(actions) == 1 else 's'}"
