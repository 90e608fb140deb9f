"""pytest-retrace: every recovery case is a pytest test. All hooks live here (syrupy style); the
state of a run lives in ``config.stash``; xdist results reach the controller inside the test reports."""

from __future__ import annotations

import atexit
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("pytest_retrace.suite")

from .agents import STRATEGIES, AgentConfigError, ModelConfig, create_agent, load_model_config  # noqa: E402
from .cases import CaseError, RecoveryCase, load_case  # noqa: E402
from .session import RetraceSession, make_record, new_run_name, save_artifacts  # noqa: E402

# option name -> (ini type, default, help). Every --retrace-X has an ini twin retrace_X.
OPTIONS: dict[str, tuple[str, Any, str]] = {
    "model": ("args", [], "model(s) under test: agents/NAME.yaml; comma-separated or repeated (enables the suite)"),
    "strategy": ("string", None, "recovery strategy: implicit | explicit (default: the model config's)"),
    "cases": ("paths", [], "case directories or files (default: cases/)"),
    "agents": ("paths", [], "directories holding model configs NAME.yaml (default: agents/)"),
    "env": ("string", "xvfb", "environment provider"),
    "budget": ("string", "10", "r: max agent turns per case"),
    "settle": ("string", "10", "max seconds to wait for a stable screen after an action (the paper's window)"),
    "settle-quiet": ("string", "0.3", "seconds the screen must stay unchanged to count as settled"),
    "ssim-threshold": ("string", "0.99", "R_O threshold on SSIM(recovered, target)"),
    "attempts": ("string", "3", "tries to reconstruct the target/error state before an infra error"),
    "verify-tolerance": ("string", "0", "differing pixels allowed when verifying a reconstructed state"),
    "screen": ("string", "1280x800", "desktop size WxH"),
    "report-dir": ("string", "reports", "where run directories are written"),
    "run": ("string", None, "run name (default: timestamp + models)"),
}


@dataclass(frozen=True)
class Settings:
    models: tuple[ModelConfig, ...]
    strategy: str | None
    case_roots: tuple[Path, ...]
    env: str
    budget: int
    settle: float
    settle_quiet: float
    ssim_threshold: float
    attempts: int
    verify_tolerance: int
    screen: tuple[int, int]
    report_dir: Path


settings_key = pytest.StashKey[Settings]()
session_key = pytest.StashKey[RetraceSession]()
case_key = pytest.StashKey[RecoveryCase]()
record_key = pytest.StashKey[dict[str, Any]]()


@dataclass(frozen=True)
class CaseRun:
    """The parameter of one test: a case under one model and strategy."""

    case: RecoveryCase
    model: ModelConfig
    strategy: str

    @property
    def id(self) -> str:
        return f"{self.case.id}-{self.model.name}-{self.strategy}"


# -- options -----------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("retrace", "recovery benchmark for computer-use agents")
    for name, (kind, default, help_) in OPTIONS.items():
        dest = "retrace_" + name.replace("-", "_")
        if kind == "args" or kind == "paths":
            group.addoption(f"--retrace-{name}", dest=dest, action="append", default=None, help=help_)
            parser.addini(dest, help_, type=kind if kind == "paths" else "args", default=default)
        else:
            group.addoption(f"--retrace-{name}", dest=dest, default=None, help=f"{help_} (default: {default})")
            parser.addini(dest, help_, default=default)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def _opt(config: pytest.Config, name: str) -> Any:
    dest = "retrace_" + name.replace("-", "_")
    value = config.getoption(dest)
    return value if value is not None else config.getini(dest)


def _number(config: pytest.Config, name: str, kind: type, minimum: float) -> Any:
    raw = _opt(config, name)
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"--retrace-{name}: {raw!r} is not a valid {kind.__name__}") from None
    if value < minimum:
        raise pytest.UsageError(f"--retrace-{name}: must be >= {minimum}, got {raw!r}")
    return value


def _paths(config: pytest.Config, name: str, default: str) -> tuple[Path, ...]:
    cli = config.getoption("retrace_" + name)
    if cli:
        return tuple(Path(p).resolve() for item in cli for p in item.split(","))
    ini = config.getini("retrace_" + name)
    return tuple(Path(p).resolve() for p in ini) or (config.rootpath / default,)


def _settings(config: pytest.Config) -> Settings | None:
    names = [m.strip() for item in _opt(config, "model") or [] for m in item.split(",") if m.strip()]
    if not names:
        return None
    agent_dirs = list(_paths(config, "agents", "agents"))
    try:
        models = tuple(load_model_config(n, agent_dirs) for n in dict.fromkeys(names))
    except AgentConfigError as exc:
        raise pytest.UsageError(f"--retrace-model: {exc}") from None
    strategy = _opt(config, "strategy")
    if strategy is not None and strategy not in STRATEGIES:
        raise pytest.UsageError(f"--retrace-strategy: {strategy!r} is not one of {', '.join(STRATEGIES)}")
    screen = str(_opt(config, "screen"))
    try:
        w, h = (int(v) for v in screen.lower().split("x"))
    except ValueError:
        raise pytest.UsageError(f"--retrace-screen: {screen!r} is not WxH") from None
    threshold = _number(config, "ssim-threshold", float, 0.0)
    if threshold > 1:
        raise pytest.UsageError(f"--retrace-ssim-threshold: must be <= 1, got {threshold}")
    return Settings(
        models=models, strategy=strategy, case_roots=_paths(config, "cases", "cases"), env=str(_opt(config, "env")),
        budget=_number(config, "budget", int, 1), settle=_number(config, "settle", float, 0.1),
        settle_quiet=_number(config, "settle-quiet", float, 0.0), ssim_threshold=threshold,
        attempts=_number(config, "attempts", int, 1), verify_tolerance=_number(config, "verify-tolerance", int, 0),
        screen=(w, h),
        report_dir=Path(_opt(config, "report-dir")) if Path(_opt(config, "report-dir")).is_absolute()
        else config.rootpath / _opt(config, "report-dir"),
    )


# -- configuration -----------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    settings = _settings(config)
    if settings is None:
        return
    config.stash[settings_key] = settings
    # One malformed case file must not stop the others: it stays a collection error, the rest runs.
    config.option.continue_on_collection_errors = True
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        run = _opt(config, "run") or new_run_name([m.name for m in settings.models])
        config.stash[session_key] = RetraceSession(settings.report_dir / run)
        config.pluginmanager.register(_Controller(config, config.stash[session_key]), "retrace-controller")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(), "retrace-xdist")


class _XdistHooks:
    """Registered only when pytest-xdist is present: tell workers where the run directory is."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        session = node.config.stash.get(session_key, None)
        if session is not None:
            node.workerinput["retrace_run_dir"] = str(session.run_dir)


def _run_dir(config: pytest.Config) -> Path | None:
    if session_key in config.stash:
        return config.stash[session_key].run_dir
    path = getattr(config, "workerinput", {}).get("retrace_run_dir")
    return Path(path) if path else None


def pytest_report_header(config: pytest.Config) -> list[str]:
    settings = config.stash.get(settings_key, None)
    if settings is None:
        return []
    models = ", ".join(f"{m.name} ({m.provider})" for m in settings.models)
    return [f"retrace: models {models}; env {settings.env}; budget r={settings.budget}; "
            f"SSIM >= {settings.ssim_threshold}; cases {', '.join(str(p) for p in settings.case_roots)}"]


# -- collection --------------------------------------------------------------------------------------
def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    settings = parent.config.stash.get(settings_key, None)
    if settings is None or file_path.suffix not in (".yaml", ".yml"):
        return None
    if any(file_path == root or root in file_path.parents for root in settings.case_roots):
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.Module):
    """A case YAML collected like a test module holding one test, ``test_recovery``."""

    def _getobj(self) -> types.ModuleType:
        case = load_case(self.path)  # CaseError -> a collection error naming the file and field
        self.stash[case_key] = case
        from . import suite

        module = types.ModuleType(f"retrace_case_{case.id}")
        module.__file__ = str(self.path)
        module.test_recovery = suite.test_recovery  # type: ignore[attr-defined]
        module.__retrace_case__ = case  # type: ignore[attr-defined]
        return module

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, CaseError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "retrace_run" not in metafunc.fixturenames:
        return
    case = getattr(metafunc.module, "__retrace_case__", None)
    settings = metafunc.config.stash.get(settings_key, None)
    if case is None or settings is None:
        return
    runs = [CaseRun(case, m, settings.strategy or m.strategy) for m in settings.models]
    metafunc.parametrize("retrace_run", runs, ids=[r.id for r in runs], scope="function")


# -- fixtures ----------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def retrace_env(request: pytest.FixtureRequest) -> Any:
    """One real desktop per process (per xdist worker), reset before every case, always torn down."""
    from .envs import create_environment
    from .settle import SettleConfig

    settings = request.config.stash[settings_key]
    env = create_environment(settings.env, size=settings.screen,
                             settle=SettleConfig(timeout=settings.settle, quiet=settings.settle_quiet))
    atexit.register(env.close)  # belt and braces: also on paths that skip fixture teardown
    try:
        env.start()
        yield env
    finally:
        env.close()
        atexit.unregister(env.close)


@pytest.fixture
def retrace_case(retrace_run: CaseRun) -> RecoveryCase:
    return retrace_run.case


@pytest.fixture(scope="session")
def _retrace_agents() -> Any:
    agents: dict[str, Any] = {}
    yield agents
    for agent in agents.values():
        agent.close()


@pytest.fixture
def retrace_agent(retrace_run: CaseRun, _retrace_agents: dict[str, Any]) -> Any:
    """The agent under test, created once per model and process and reused across cases."""
    key = retrace_run.model.name
    if key not in _retrace_agents:
        _retrace_agents[key] = create_agent(retrace_run.model)
    return _retrace_agents[key]


@pytest.fixture
def retrace_result(request: pytest.FixtureRequest, retrace_run: CaseRun, retrace_env: Any, retrace_agent: Any) -> Any:
    """Replay the case and run the agent (during setup: infra failures become errors, not failures)."""
    from .replay import ReplayOptions, run_case

    settings = request.config.stash[settings_key]
    opts = ReplayOptions(budget=settings.budget, ssim_threshold=settings.ssim_threshold,
                         attempts=settings.attempts, verify_tolerance=settings.verify_tolerance,
                         strategy=retrace_run.strategy)  # type: ignore[arg-type]
    result = run_case(retrace_env, retrace_run.case, retrace_agent, opts)
    request.node.stash[record_key] = make_record(
        nodeid=request.node.nodeid, case=retrace_run.case, model=retrace_run.model.name,
        strategy=retrace_run.strategy, budget=settings.budget, result=result, privileged=retrace_agent.privileged)
    run_dir = _run_dir(request.config)
    if run_dir is not None and result.error is None and not result.recovered:
        save_artifacts(run_dir, request.node.nodeid, result)
    if result.error is not None:
        raise result.error
    return result


# -- reporting ---------------------------------------------------------------------------------------
@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if not isinstance(item, pytest.Function) or "retrace_run" not in item.fixturenames:
        return report
    record = item.stash.get(record_key, None)
    from .replay import InfraError

    if call.excinfo is not None and isinstance(call.excinfo.value, InfraError):
        # the harness knows exactly what broke: a stack trace through replay.py would only hide it
        err = call.excinfo.value
        report.longrepr = f"retrace infrastructure error ({err.kind}) at stage {err.stage}: {err.message}"
    if call.when == "setup" and report.failed and record is None:
        # the failure happened before the replay (environment start, agent construction)
        run: CaseRun = item.callspec.params["retrace_run"]
        record = make_record(nodeid=item.nodeid, case=run.case, model=run.model.name, strategy=run.strategy,
                             budget=item.config.stash[settings_key].budget,
                             error={"stage": "setup", "kind": "env", "message": str(call.excinfo.value)[:2000]
                                    if call.excinfo else "unknown"})
    if record is not None and ((call.when == "setup" and report.failed) or call.when == "call"):
        # a custom report attribute survives xdist's report serialization to the controller
        report.retrace_record = record
    return report


class _Controller:
    """Registered on the controller (or the only process) of a retrace run: collects every record,
    writes results.jsonl as tests finish, and the summary at the end."""

    def __init__(self, config: pytest.Config, session: RetraceSession) -> None:
        self.config, self.session = config, session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, "retrace_record", None)
        if record is not None:
            self.session.add(record)
            self.config.hook.pytest_retrace_record(record=record, config=self.config)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.config.option.collectonly:
            return  # nothing ran: no run directory, no summary
        settings = self.config.stash[settings_key]
        summary = self.session.finish({
            "models": [m.name for m in settings.models], "env": settings.env, "budget": settings.budget,
            "ssim_threshold": settings.ssim_threshold, "exitstatus": int(exitstatus),
        })
        self.config.hook.pytest_retrace_summary(summary=summary, run_dir=str(self.session.run_dir), config=self.config)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from .stats import format_table

        summary, tr = self.session.summary, terminalreporter
        if summary is None:
            return
        tr.write_sep("=", "retrace recovery summary")
        tr.write_line(format_table(summary))
        if len({d["domain"] for d in summary.get("domains", [])}) > 1:
            tr.write_line("")
            tr.write_line(format_table(summary, by_domain=True))
        if summary.get("n_errors"):
            tr.write_line(f"infrastructure errors (excluded from rates): {summary['error_kinds']}")
        tr.write_line(f"results: {self.session.results_path}")


def pytest_assertrepr_compare(config: pytest.Config, op: str, left: Any, right: Any) -> list[str] | None:
    from .assertion import Recovered, explain
    from .replay import RecoveryResult

    if op == "==" and isinstance(left, RecoveryResult) and isinstance(right, Recovered):
        return explain(left)
    return None
