"""The fixtures of a recovery test, on the process that runs it (an xdist worker): one desktop per process, the
agents and judges, and ``retrace_result``, which replays the case during set-up (so an infrastructure failure
is a pytest *error*, never a failure); then the test's record, onto its report for the controller."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.agents import ModelConfig, create_agent, create_chat
from pytest_retrace.plugin.collection import task_getters_key
from pytest_retrace.plugin.controller import session_key
from pytest_retrace.plugin.options import Settings, settings_key
from pytest_retrace.replay.cases import RecoveryCase
from pytest_retrace.results.caserun import CaseRun, ForwardRun, case_run_of, forward_run_of
from pytest_retrace.results.forward import ForwardRecord
from pytest_retrace.results.records import Failure, Record
from pytest_retrace.results.session import save_artifacts

record_key = pytest.StashKey[Record]()
forward_key = pytest.StashKey[ForwardRecord]()


@pytest.fixture(scope="session")
def retrace_env(request: pytest.FixtureRequest) -> Any:
    """One real desktop per process (per xdist worker), reset before every case, always torn down."""
    settings = request.config.stash[settings_key]
    env = settings.env.create(size=settings.screen, network=settings.network, hide=settings.hide,
                              settle=settings.settle)
    if settings.restore == "checkpoint":
        request.config.stash[restore_problem_key] = _enable_checkpoints(env)
    atexit.register(env.close)  # belt and braces: also on paths that skip fixture teardown
    try:
        env.start()
        yield env
    finally:
        env.close()
        atexit.unregister(env.close)


restore_problem_key = pytest.StashKey["str | None"]()


def _enable_checkpoints(env: Any) -> str | None:
    """Checkpoints on for `env`, or why they cannot be (said once here, and in every record)."""
    from pytest_retrace.envs import EnvError

    enable = getattr(env, "enable_checkpoints", None)
    try:
        if enable is None:
            raise EnvError(f"the {env.name} environment cannot take checkpoints")
        enable()
    except EnvError as exc:
        import warnings

        warnings.warn(f"--retrace-restore=checkpoint: {exc}; every test replays", RuntimeWarning, stacklevel=2)
        return str(exc)
    return None


@pytest.fixture
def retrace_case(retrace_run: CaseRun) -> RecoveryCase:
    return retrace_run.case


@pytest.fixture(scope="session")
def _retrace_agents() -> Any:
    agents: dict[str, Any] = {}
    yield agents
    for agent in agents.values():
        getattr(agent, "close", lambda: None)()  # (detectors, where end-to-end made some)


@pytest.fixture
def retrace_agent(retrace_run: CaseRun, _retrace_agents: dict[str, Any]) -> Any:
    """The agent under test, created once per model and process and reused across cases."""
    key = retrace_run.model.name
    if key not in _retrace_agents:
        _retrace_agents[key] = create_agent(retrace_run.model)
    return _retrace_agents[key]


@pytest.fixture(scope="session")
def _retrace_judges(request: pytest.FixtureRequest) -> Any:
    """The contextualizer (explicit-context) and the state verifier, when configured: one each per process."""
    from pytest_retrace.agents.prompts import Prompts, config_prompts
    from pytest_retrace.replay.strategies import Contextualizer
    from pytest_retrace.replay.verifier import StateVerifier

    settings: Settings = request.config.stash[settings_key]
    made: list[Any] = []

    def chat(config: ModelConfig | None) -> tuple[Any, Prompts] | None:
        if config is None:
            return None
        made.append(model := create_chat(config))
        return model, config_prompts(config)

    ctx, ver = chat(settings.contextualizer), chat(settings.verifier)
    yield (Contextualizer(*ctx) if ctx else None, StateVerifier(*ver) if ver else None)
    for model in made:
        model.close()


@pytest.fixture
def retrace_result(request: pytest.FixtureRequest, retrace_run: CaseRun, retrace_env: Any, retrace_agent: Any,
                   _retrace_judges: Any) -> Any:
    """Replay the case and run the agent (during setup: infra failures become errors, not failures)."""
    from pytest_retrace.replay.result import ReplayOptions
    from pytest_retrace.replay.run import run_case

    settings = request.config.stash[settings_key]
    contextualizer, verifier = _retrace_judges
    opts = ReplayOptions(budget=retrace_run.budget, strategy=retrace_run.strategy,
                         ssim_threshold=settings.ssim_threshold, attempts=settings.attempts,
                         verify_tolerance=settings.verify_tolerance, contextualizer=contextualizer, verifier=verifier,
                         observer=_StageHooks(request.node), count_looks=settings.protocol == "paper",
                         restore=settings.restore, restore_problem=request.config.stash.get(restore_problem_key, None))
    result = run_case(retrace_env, retrace_run.case, retrace_agent, opts)
    run_dir = run_dir_of(request.config)
    artifacts: dict[str, str] = {}
    if run_dir is not None and result.error is None and (settings.keep_screens or not result.recovered):
        artifacts = {p.stem: str(p.relative_to(run_dir)) for p in save_artifacts(run_dir, request.node.nodeid, result)}
    record = request.node.stash[record_key] = Record.of_result(
        retrace_run, result, nodeid=request.node.nodeid, privileged=retrace_agent.privileged, artifacts=artifacts)
    request.config.hook.pytest_retrace_result(item=request.node, result=result, record=record)
    if result.error is not None:
        raise result.error
    return result


@pytest.fixture
def retrace_forward_result(request: pytest.FixtureRequest, retrace_forward_run: ForwardRun, retrace_env: Any,
                           _retrace_agents: dict[str, Any], _retrace_judges: Any) -> Any:
    """A forward episode (during setup, as a replay: infrastructure failures become errors), its trajectory
    written in OSWorld's results layout under the run directory, and its record."""
    from pytest_retrace.experiments.forward import run_forward
    from pytest_retrace.experiments.trajectory import episode_dir, write_episode
    from pytest_retrace.results import rundir

    run = retrace_forward_run
    if run.model.name not in _retrace_agents:
        _retrace_agents[run.model.name] = create_agent(run.model)
    agent = _retrace_agents[run.model.name]
    gt = None if run.ground_truth is None else list(run.ground_truth)
    settings = request.config.stash[settings_key]
    if run.recovery is not None:  # end-to-end: the forward episode with its detector and recoveries
        from pytest_retrace.experiments.endtoend import run_end_to_end

        getters = request.config.stash.get(task_getters_key, {}).get(run.task.id, ())
        recovery = _recovery(run, settings, _retrace_agents, _retrace_judges[0], getters)
        result = run_end_to_end(retrace_env, run.task, run.task_dir, agent, recovery, max_steps=run.max_steps,
                                ground_truth=gt, observer=_StageHooks(request.node))
    else:
        resume = None if run.start is None else run.start.resume()  # an ideal-recovery continuation's start
        result = run_forward(retrace_env, run.task, run.task_dir, agent, max_steps=run.max_steps, ground_truth=gt,
                             observer=_StageHooks(request.node), resume=resume, attempts=settings.attempts)
    run_dir = run_dir_of(request.config)
    trajectory = None
    if run_dir is not None and result.error is None and run.start is None and run.recovery is None:
        # (a continuation is not an episode from the task's start: its record keeps its actions)
        out = episode_dir(rundir.trajectories_dir(run_dir), run.model.name, run.task.domain, run.task.id,
                          run.run_index, run.runs)
        given = gt if agent.privileged else None
        trajectory = str(write_episode(out, run.task, run.task_dir, result, given).relative_to(run_dir))
    record = request.node.stash[forward_key] = ForwardRecord.of_result(
        run, result, nodeid=request.node.nodeid, privileged=agent.privileged, trajectory=trajectory)
    request.config.hook.pytest_retrace_forward_result(item=request.node, result=result, record=record)
    if result.error is not None:
        raise result.error
    return result


def _recovery(run: ForwardRun, settings: Settings, made: dict[str, Any], contextualizer: Any,
              getters: tuple[Any, ...]) -> Any:
    """End-to-end's recovery setting for one test; the detectors and the recovery agent made once per process
    (the recovery agent a separate instance from the forward agent: its conversation is its own)."""
    from pytest_retrace.experiments.detectors import create_detector
    from pytest_retrace.experiments.endtoend import Recovery

    if run.recovery == "none":
        return Recovery("none")
    assert settings.error_detector is not None and settings.recovery_detector is not None
    config = settings.recovery_agent or run.model
    for key, build in ((f"detector:error:{settings.error_detector.name}",
                        lambda: create_detector("error", settings.error_detector)),
                       (f"detector:recovery:{settings.recovery_detector.name}",
                        lambda: create_detector("recovery", settings.recovery_detector)),
                       (f"recovery-agent:{config.name}", lambda: create_agent(config))):
        if key not in made:
            made[key] = build()
    return Recovery(run.recovery, run.max_recoveries, made[f"detector:error:{settings.error_detector.name}"],
                    made[f"detector:recovery:{settings.recovery_detector.name}"], made[f"recovery-agent:{config.name}"],
                    budget=settings.budgets[0], contextualizer=contextualizer, ssim_threshold=settings.ssim_threshold,
                    attempts=settings.attempts, getters=getters)


class _StageHooks:
    """The replay's observer: each stage of a test becomes the plugin's stage hooks, where the Allure writer
    and the progress line (and any third party) pick it up."""

    def __init__(self, item: pytest.Item) -> None:
        self.item = item

    def stage_start(self, stage: Any) -> None:
        self.item.config.hook.pytest_retrace_stage_start(item=self.item, stage=stage)

    def stage_end(self, stage: Any) -> None:
        self.item.config.hook.pytest_retrace_stage_end(item=self.item, stage=stage)


# -- the record of a test, onto its report -----------------------------------------------------------
@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    forward, run = forward_run_of(item), case_run_of(item)
    if forward is not None:
        record: Any = item.stash.get(forward_key, None)
        broken = ForwardRecord.of_error if record is None else None
        attribute, what = "retrace_forward", forward
    elif run is not None:
        record = item.stash.get(record_key, None)
        broken = Record.of_error if record is None else None
        attribute, what = "retrace_record", run
    else:
        return report
    from pytest_retrace.replay.result import InfraError

    if call.excinfo is not None and isinstance(call.excinfo.value, InfraError):
        # the harness knows exactly what broke: a stack trace through the replay would only hide it
        err = call.excinfo.value
        report.longrepr = f"retrace infrastructure error ({err.kind}) at stage {err.stage}: {err.message}"
    if call.when == "setup" and report.failed and broken is not None:
        # the failure happened before the replay (environment start, agent construction)
        message = str(call.excinfo.value)[:2000] if call.excinfo else "unknown"
        record = broken(what, Failure(stage="setup", kind="env", message=message), nodeid=item.nodeid)
    if record is not None and ((call.when == "setup" and report.failed) or call.when == "call"):
        # a custom report attribute survives xdist's report serialization to the controller, as plain JSON
        setattr(report, attribute, record.model_dump(mode="json"))
    return report


def run_dir_of(config: pytest.Config) -> Path | None:
    """The run directory, on the controller (its session) and on an xdist worker (told by the controller)."""
    if session_key in config.stash:
        return config.stash[session_key].run_dir
    path = getattr(config, "workerinput", {}).get("retrace_run_dir")
    return Path(path) if path else None
