"""pytest-retrace: every recovery case is a pytest test. All hooks live here (syrupy style); the
state of a run lives in ``config.stash``; xdist results reach the controller inside the test reports."""

from __future__ import annotations

import atexit
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("pytest_retrace.plugin.suite")

from pytest_retrace.agents import (  # noqa: E402
    STRATEGY_NAMES,
    AgentConfigError,
    ModelConfig,
    create_agent,
    create_chat,
    load_model_config,
)
from pytest_retrace.envs.config import EnvConfig, EnvConfigError, load_env_config  # noqa: E402
from pytest_retrace.replay.cases import CaseError, RecoveryCase, load_case  # noqa: E402
from pytest_retrace.replay.sample import pick  # noqa: E402
from pytest_retrace.results.baseline import baseline_path, summary_block  # noqa: E402
from pytest_retrace.results.baseline import save as save_baseline  # noqa: E402
from pytest_retrace.results.baseline import verdicts as baseline_verdicts  # noqa: E402
from pytest_retrace.results.gate import CaseFileError, Gate, GateResult, format_gate  # noqa: E402
from pytest_retrace.results import rundir  # noqa: E402
from pytest_retrace.results.records import Failure, Record, RecordError  # noqa: E402
from pytest_retrace.results.session import RetraceSession, new_run_name, save_artifacts  # noqa: E402
from pytest_retrace.screen.settle import MODES as SETTLE_MODES  # noqa: E402
from pytest_retrace.screen.settle import SIGNALS as SETTLE_SIGNALS
from pytest_retrace.screen.settle import SettleConfig  # noqa: E402

# option name -> (ini type, default, help). Every --retrace-X has an ini twin retrace_X. "args" options take
# comma-separated values and may be repeated.
OPTIONS: dict[str, tuple[str, Any, str]] = {
    "model": ("args", [], "model(s) under test: agents/NAME.yaml; comma-separated or repeated (enables the suite)"),
    "strategy": ("args", [], "recovery strategies, comma-separated, one test each: " + " | ".join(STRATEGY_NAMES)
                 + " (default: each model config's)"),
    "cases": ("paths", [], "case directories or files (default: cases/)"),
    "agents": ("paths", [], "directories holding model configs NAME.yaml (default: agents/)"),
    "env": ("string", "xvfb", "environment: a provider (xvfb, or one a package registers), a config envs/NAME.yaml "
            "(provider + options) or the path of one"),
    "env-option": ("args", [], "an option of the environment provider, KEY=VALUE (repeatable; overrides the config's)"),
    "network": ("string", "none", "network of tasks whose case does not ask for it (task.network: true): none | host"),
    "budget": ("args", ["10"], "r: actions the agent may take; comma-separated values run one test each"),
    "sample": ("string", None, "K: run only the first K cases (by id) of every app x kind of the collected cases, "
               "a stratified sample (1: 26 of the built-in suite's 251)"),
    "runs": ("string", "1", "K: run every test K times (the run index is in the test id); the summary adds "
             "success@k and the mean and sd of the rate across runs"),
    "contextualizer": ("string", "contextualizer", "model config summarising the target for explicit-context"),
    "verifier": ("string", None, "model config of an LLM state verifier for states that cannot match pixel for pixel"),
    "settle": ("string", "10", "max seconds to wait for a stable screen after an action (the paper's window)"),
    "settle-quiet": ("string", "0.3", "seconds the screen must stay unchanged to count as settled"),
    "settle-react": ("string", "1.0", "adaptive settling: seconds to wait for an action's effect to start showing"),
    "settle-mode": ("string", "adaptive", "adaptive (wait for the effect, then for quiet) | fixed (sleep "
                    "--retrace-settle seconds after every action, the paper's 10 s window)"),
    "settle-signal": ("string", "damage", "adaptive settling: damage (grab a screenshot only after the display "
                      "reports drawing, where the environment can: xvfb) | poll (grab one every 30 ms)"),
    "ssim-threshold": ("string", "0.99", "R_O threshold on SSIM(recovered, target)"),
    "attempts": ("string", "3", "tries to reconstruct the target/error state before an infra error"),
    "verify-tolerance": ("string", "0", "differing pixels allowed when verifying a reconstructed state"),
    "screen": ("string", "1280x800", "desktop size WxH"),
    "report-dir": ("string", "reports", "where run directories are written"),
    "run": ("string", None, "run name (default: timestamp + models)"),
    "fail-under": ("string", None, "CI gate: every model x strategy x budget must recover at least this share "
                   "(0..1); with a gate option set, the gate decides the exit status"),
    "max-errors": ("string", None, "CI gate: at most this many infrastructure errors in the run"),
    "baseline": ("string", None, "CI gate: compare with this saved run (a name in REPORT_DIR/baselines, or a "
                 "path): a statistically supported drop on the shared cases fails the gate"),
    "max-drop": ("string", "0", "CI gate with --retrace-baseline: drops up to this many points pass"),
    "save-baseline": ("string", None, "save this run's verdicts as baseline NAME (REPORT_DIR/baselines/NAME.json)"),
    "resume": ("string", None, "continue run RUN (its name or directory): tests with a finished verdict are kept and "
               "not run again; unfinished ones and infrastructure errors run"),
}


@dataclass(frozen=True)
class Settings:
    models: tuple[ModelConfig, ...]
    strategies: tuple[str, ...]  # empty: each model's own
    case_roots: tuple[Path, ...]
    env: EnvConfig
    budgets: tuple[int, ...]
    contextualizer: ModelConfig | None  # only when an explicit-context test will run
    verifier: ModelConfig | None
    dry_run: bool
    settle: SettleConfig
    ssim_threshold: float
    attempts: int
    verify_tolerance: int
    screen: tuple[int, int]
    report_dir: Path
    runs: int
    sample: int | None  # --retrace-sample K: cases per app x kind, None: all
    gate: Gate
    network: str
    hide: tuple[Path, ...]  # the harness's own files: invisible inside the task sandbox


settings_key = pytest.StashKey[Settings]()
session_key = pytest.StashKey[RetraceSession]()
finished_key = pytest.StashKey[frozenset[str]]()  # --retrace-resume: nodeids that already have a verdict
case_key = pytest.StashKey[RecoveryCase]()
record_key = pytest.StashKey[Record]()


@dataclass(frozen=True)
class CaseRun:
    """The parameter of one test: a case under one model, strategy and budget."""

    case: RecoveryCase
    model: ModelConfig
    strategy: str
    budget: int
    run_index: int = 0  # of --retrace-runs K: 0..K-1
    runs: int = 1

    @property
    def id(self) -> str:
        return self.case.id + self.id_suffix(self.model.name, self.strategy, self.budget, self.run_index, self.runs)

    @staticmethod
    def id_suffix(model: str, strategy: str, budget: int, run_index: int, runs: int) -> str:
        # repeated runs are distinct tests (never retries of one): the run index is part of the id
        run = f"-run{run_index + 1}" if runs > 1 else ""
        return f"-{model}-{strategy}-r{budget}{run}"


# -- options -----------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("retrace", "recovery benchmark for computer-use agents")
    group.addoption("--retrace-dry-run", dest="retrace_dry_run", action="store_true", default=False,
                    help="list the tests and the most model calls they can make; run and call nothing")
    group.addoption("--retrace-progress", dest="retrace_progress", action="store_true", default=None,
                    help="a line per test saying what it measured instead of pytest's per-test output, and on a "
                         "terminal a live line: case, model, stage, turn (`retrace run` does this by default)")
    parser.addini("retrace_progress", "as --retrace-progress", type="bool", default=False)
    group.addoption("--retrace-gate-strict", dest="retrace_gate_strict", action="store_true", default=None,
                    help="CI gate with --retrace-baseline: also fail on a group with too few shared cases "
                         "for McNemar's exact test to ever reach p < 0.05 (fewer than 6), or not in the baseline")
    parser.addini("retrace_gate_strict", "as --retrace-gate-strict", type="bool", default=False)
    for name, (kind, default, help_) in OPTIONS.items():
        dest = "retrace_" + name.replace("-", "_")
        if kind == "args" or kind == "paths":
            group.addoption(f"--retrace-{name}", dest=dest, action="append", default=None, help=help_)
            parser.addini(dest, help_, type=kind if kind == "paths" else "args", default=default)
        else:
            group.addoption(f"--retrace-{name}", dest=dest, default=None, help=f"{help_} (default: {default})")
            parser.addini(dest, help_, default=default)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_retrace.plugin import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def _opt(config: pytest.Config, name: str) -> Any:
    dest = "retrace_" + name.replace("-", "_")
    value = config.getoption(dest)
    return value if value is not None else config.getini(dest)


def _settle(config: pytest.Config) -> SettleConfig:
    mode = str(_opt(config, "settle-mode"))
    if mode not in SETTLE_MODES:
        raise pytest.UsageError(f"--retrace-settle-mode: {mode!r} is not one of {', '.join(SETTLE_MODES)}")
    signal = str(_opt(config, "settle-signal"))
    if signal not in SETTLE_SIGNALS:
        raise pytest.UsageError(f"--retrace-settle-signal: {signal!r} is not one of {', '.join(SETTLE_SIGNALS)}")
    return SettleConfig(timeout=_number(config, "settle", float, 0.1), quiet=_number(config, "settle-quiet", float, 0.0),
                        react=_number(config, "settle-react", float, 0.0), mode=mode,  # type: ignore[arg-type]
                        signal=signal)  # type: ignore[arg-type]


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


def _list(config: pytest.Config, name: str) -> list[str]:
    return [v.strip() for item in _opt(config, name) or [] for v in str(item).split(",") if v.strip()]


def _settings(config: pytest.Config) -> Settings | None:
    names = _list(config, "model")
    if not names:
        return None
    agent_dirs = list(_paths(config, "agents", "agents"))
    try:
        models = tuple(load_model_config(n, agent_dirs) for n in dict.fromkeys(names))
    except AgentConfigError as exc:
        raise pytest.UsageError(f"--retrace-model: {exc}") from None
    strategies = tuple(dict.fromkeys(_list(config, "strategy")))
    for strategy in strategies:
        if strategy not in STRATEGY_NAMES:
            raise pytest.UsageError(f"--retrace-strategy: {strategy!r} is not one of {', '.join(STRATEGY_NAMES)}")
    budgets = []
    for raw in _list(config, "budget"):
        if not raw.isdigit() or int(raw) < 1:
            raise pytest.UsageError(f"--retrace-budget: {raw!r} is not a positive integer")
        budgets.append(int(raw))
    screen = str(_opt(config, "screen"))
    try:
        w, h = (int(v) for v in screen.lower().split("x"))
    except ValueError:
        raise pytest.UsageError(f"--retrace-screen: {screen!r} is not WxH") from None
    threshold = _number(config, "ssim-threshold", float, 0.0)
    if threshold > 1:
        raise pytest.UsageError(f"--retrace-ssim-threshold: must be <= 1, got {threshold}")
    network = str(_opt(config, "network"))
    if network not in ("none", "host"):
        raise pytest.UsageError(f"--retrace-network: {network!r} is not one of none, host")
    case_roots = _paths(config, "cases", "cases")
    try:
        env = load_env_config(str(_opt(config, "env")), [config.rootpath / "envs"],
                              [str(v) for v in _opt(config, "env-option") or []])
    except EnvConfigError as exc:
        raise pytest.UsageError(f"--retrace-env: {exc}") from None
    summarised = "explicit-context" in (strategies or {s for m in models for s in m.strategies})
    report_dir = Path(_opt(config, "report-dir"))
    report_dir = report_dir if report_dir.is_absolute() else config.rootpath / report_dir
    return Settings(
        models=models, strategies=strategies, case_roots=case_roots, env=env,
        budgets=tuple(dict.fromkeys(budgets or [10])),
        contextualizer=_helper(config, "contextualizer", agent_dirs) if summarised else None,
        verifier=_helper(config, "verifier", agent_dirs), dry_run=bool(config.getoption("retrace_dry_run")),
        settle=_settle(config),
        ssim_threshold=threshold, attempts=_number(config, "attempts", int, 1),
        verify_tolerance=_number(config, "verify-tolerance", int, 0), screen=(w, h),
        report_dir=report_dir, runs=_number(config, "runs", int, 1),
        sample=None if _opt(config, "sample") is None else _number(config, "sample", int, 1),
        gate=_gate(config, report_dir), network=network,
        hide=(config.rootpath, *case_roots, *agent_dirs, report_dir, Path(sys.prefix),
              *_allure_dir(config)),
    )


def _allure_dir(config: pytest.Config) -> list[Path]:
    """Allure's results hold every case's target screenshot: a task must not see them either."""
    path = getattr(config.option, "allure_report_dir", None)
    return [Path(path).resolve()] if path else []


def _gate(config: pytest.Config, report_dir: Path) -> Gate:
    fail_under = None if _opt(config, "fail-under") is None else _number(config, "fail-under", float, 0.0)
    if fail_under is not None and fail_under > 1:
        raise pytest.UsageError(f"--retrace-fail-under: a share in 0..1, got {fail_under:g}")
    max_errors = None if _opt(config, "max-errors") is None else _number(config, "max-errors", int, 0)
    name = _opt(config, "baseline")
    path = None if name is None else baseline_path(str(name), report_dir)
    if path is not None and not path.is_file():
        raise pytest.UsageError(f"--retrace-baseline: no saved baseline at {path} (save one with --retrace-save-baseline)")
    strict = config.getoption("retrace_gate_strict")
    return Gate(fail_under=fail_under, max_errors=max_errors, baseline=path,
                max_drop=_number(config, "max-drop", float, 0.0),
                strict=bool(config.getini("retrace_gate_strict") if strict is None else strict))


def _helper(config: pytest.Config, name: str, agent_dirs: list[Path]) -> ModelConfig | None:
    """The config of a judge model (contextualizer, verifier) the options name, if any."""
    value = _opt(config, name)
    if not value:
        return None
    try:
        return load_model_config(str(value), agent_dirs)
    except AgentConfigError as exc:
        raise pytest.UsageError(f"--retrace-{name}: {exc}") from None


def _check_models(settings: Settings) -> None:
    """Build every model once, before any test: a missing key, a bad option or a missing prompt file is a
    usage error naming the config, not the same setup error repeated in every test."""
    for config, factory in [(m, create_agent) for m in settings.models] + [
            (h, create_chat) for h in (settings.contextualizer, settings.verifier) if h is not None]:
        try:
            factory(config).close()
        except AgentConfigError as exc:
            raise pytest.UsageError(f"retrace: {exc}") from None


def _strategies(settings: Settings, model: ModelConfig) -> tuple[str, ...]:
    return settings.strategies or model.strategies


# -- configuration -----------------------------------------------------------------------------------
PATH_OPTIONS = ("cases", "agents", "report-dir", "env")


def _check_rootdir(config: pytest.Config) -> None:
    """pytest chooses its rootdir and ini file before plugins from entry points add their options, so in
    ``--retrace-cases DIR`` it takes DIR for a test path. Where that moved the rootdir, the project's ini file
    (and every ini option) was lost: say what to write rather than run with the wrong settings."""
    raw = list(config.invocation_params.args)
    spaced = [(raw[i], raw[i + 1]) for i in range(len(raw) - 1) if raw[i] in {f"--retrace-{n}" for n in PATH_OPTIONS}]
    if not spaced:
        return
    from _pytest.config.findpaths import determine_setup

    ns = config.known_args_namespace  # parsed again once this plugin's options were known
    try:
        rootpath, inipath, *_ = determine_setup(
            inifile=ns.inifilename, override_ini=ns.override_ini, args=ns.file_or_dir,
            rootdir_cmd_arg=ns.rootdir or None, invocation_dir=config.invocation_params.dir)
    except TypeError:  # another pytest's signature: nothing to compare with
        return
    if (rootpath, inipath) != (config.rootpath, config.inipath):
        option, value = spaced[0]
        raise pytest.UsageError(
            f"{option} {value}: pytest took {value} for a test path and chose its rootdir from it "
            f"({config.rootpath}; ini file: {config.inipath or 'none'}) before it knew {option}. "
            f"Write {option}={value}, or use `retrace run`, which does.")


@pytest.hookimpl(tryfirst=True)  # before xdist's: a dry run must not start workers
def pytest_configure(config: pytest.Config) -> None:
    if _list(config, "model"):
        # before the settings: a moved rootdir also moves the default agents/ and envs/, and the model lookup
        # would then blame the model for what the option's spelling did
        _check_rootdir(config)
    settings = _settings(config)
    if settings is None:
        return
    config.stash[settings_key] = settings
    if not config.known_args_namespace.file_or_dir:
        # No paths on the command line: the suite is the case directories, wherever they are (pytest's own
        # default, testpaths or the current directory, knows nothing of --retrace-cases).
        config.args = [str(p) for p in settings.case_roots]
    # One malformed case file must not stop the others: it stays a collection error, the rest runs.
    config.option.continue_on_collection_errors = True
    if settings.dry_run:
        config.option.collectonly = True  # list the tests, run none, call no model, need no key
        config.pluginmanager.register(_DryRun(settings), "retrace-dry-run")
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        if not config.option.collectonly:
            _check_models(settings)
        session = RetraceSession(_run_dir_of(config, settings))
        try:
            session.load()  # records of an earlier session under this run: the summary covers all of them
        except (OSError, RecordError) as exc:
            raise pytest.UsageError(f"retrace: cannot read the run's results: {exc}") from None
        if _opt(config, "resume"):
            config.stash[finished_key] = session.finished()
        config.stash[session_key] = session
        config.pluginmanager.register(_Controller(config, session), "retrace-controller")
        # the built-in writers are implementations of the plugin's own hooks, like a third party's
        from pytest_retrace.results.writers import Plots, ResultsJsonl, SummaryJson, SummaryMarkdown

        config.pluginmanager.register(ResultsJsonl(session.run_dir), "retrace-results-jsonl")
        config.pluginmanager.register(SummaryJson(), "retrace-summary-json")
        config.pluginmanager.register(Plots(), "retrace-plots")
        config.pluginmanager.register(SummaryMarkdown(), "retrace-summary-md")
        if _progress(config) and not config.option.collectonly:
            from pytest_retrace.results.progress import ProgressReporter

            config.pluginmanager.register(ProgressReporter(config, session.run_dir, settings.runs), "retrace-progress")
    else:
        config.stash[finished_key] = frozenset(workerinput.get("retrace_finished", ()))
        if workerinput.get("retrace_progress"):
            from pytest_retrace.results.progress import StageFile

            config.pluginmanager.register(StageFile(Path(workerinput["retrace_run_dir"]), workerinput["workerid"]),
                                          "retrace-stage-file")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(), "retrace-xdist")
    if getattr(config.option, "allure_report_dir", None):  # allure-pytest's --alluredir, here and on workers
        from pytest_retrace.results.allure import AllureWriter

        config.pluginmanager.register(AllureWriter(Path(config.option.allure_report_dir), settings),
                                      "retrace-allure")


def _progress(config: pytest.Config) -> bool:
    flag = config.getoption("retrace_progress")
    return bool(config.getini("retrace_progress") if flag is None else flag)


def _run_dir_of(config: pytest.Config, settings: Settings) -> Path:
    resume = _opt(config, "resume")
    if not resume:
        return settings.report_dir / (_opt(config, "run") or new_run_name([m.name for m in settings.models]))
    path = Path(resume)
    run_dir = path if path.is_absolute() or len(path.parts) > 1 else settings.report_dir / path
    if not rundir.results_file(run_dir).is_file():
        raise pytest.UsageError(f"--retrace-resume: {run_dir} holds no results.jsonl: nothing to resume")
    return run_dir


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--retrace-sample: the tests of cases outside the sample are deselected; --retrace-resume: a test whose
    verdict is already in the run is not run again (it is deselected)."""
    settings = config.stash.get(settings_key, None)
    if settings is not None and settings.sample is not None:
        runs = {item: item.callspec.params["retrace_run"] for item in items
                if isinstance(getattr(item, "callspec", None) and item.callspec.params.get("retrace_run"), CaseRun)}
        chosen = pick((run.case for run in runs.values()), settings.sample)
        left_out = [item for item, run in runs.items() if run.case.id not in chosen]
        if left_out:
            dropped = set(left_out)
            items[:] = [item for item in items if item not in dropped]
            config.hook.pytest_deselected(items=left_out)
    finished = config.stash.get(finished_key, frozenset())
    if not finished:
        return
    done = [item for item in items if item.nodeid in finished]
    if done:
        items[:] = [item for item in items if item.nodeid not in finished]
        config.hook.pytest_deselected(items=done)


class _XdistHooks:
    """Registered only when pytest-xdist is present: tell workers where the run directory is, and which
    tests a resumed run already finished."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        session = node.config.stash.get(session_key, None)
        if session is not None:
            node.workerinput["retrace_run_dir"] = str(session.run_dir)
            node.workerinput["retrace_finished"] = sorted(node.config.stash.get(finished_key, ()))
            node.workerinput["retrace_progress"] = _progress(node.config)


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
    budgets = ",".join(map(str, settings.budgets))
    return [f"retrace: models {models}; env {settings.env.describe()}; budget r={budgets}; "
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
        from pytest_retrace.plugin import suite

        module = types.ModuleType(f"retrace_case_{case.id}")
        module.__file__ = str(self.path)
        module.test_recovery = suite.test_recovery  # type: ignore[attr-defined]
        module.__retrace_case__ = case  # type: ignore[attr-defined]
        return module

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:
        if isinstance(excinfo.value, CaseError):
            return str(excinfo.value)
        # A loader bug, not a broken file: still only this file's collection error, with the traceback.
        exc = excinfo.value
        header = f"{self.path}: unexpected {type(exc).__name__} while loading the case: {exc}"
        return f"{header}\n{super().repr_failure(excinfo)}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "retrace_run" not in metafunc.fixturenames:
        return
    case = getattr(metafunc.module, "__retrace_case__", None)
    settings = metafunc.config.stash.get(settings_key, None)
    if case is None or settings is None:
        return
    runs = [CaseRun(case, m, strategy, budget, i, settings.runs) for m in settings.models
            for strategy in _strategies(settings, m) for budget in settings.budgets for i in range(settings.runs)]
    metafunc.parametrize("retrace_run", runs, ids=[r.id for r in runs], scope="function")


# -- fixtures ----------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def retrace_env(request: pytest.FixtureRequest) -> Any:
    """One real desktop per process (per xdist worker), reset before every case, always torn down."""
    settings = request.config.stash[settings_key]
    env = settings.env.create(size=settings.screen, network=settings.network, hide=settings.hide,
                              settle=settings.settle)
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


@pytest.fixture(scope="session")
def _retrace_judges(request: pytest.FixtureRequest) -> Any:
    """The contextualizer (explicit-context) and the state verifier, when configured: one each per process."""
    from pytest_retrace.agents.prompts import Prompts
    from pytest_retrace.replay.strategies import Contextualizer
    from pytest_retrace.replay.verifier import StateVerifier

    settings: Settings = request.config.stash[settings_key]
    made: list[Any] = []

    def chat(config: ModelConfig | None) -> tuple[Any, Prompts] | None:
        if config is None:
            return None
        made.append(model := create_chat(config))
        base = config.path.parent if config.path else Path.cwd()
        return model, Prompts(base, config.options.get("prompts_dir", "prompts"), config.options.get("prompts"))

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
                         observer=_StageHooks(request.node))
    result = run_case(retrace_env, retrace_run.case, retrace_agent, opts)
    run_dir = _run_dir(request.config)
    artifacts: dict[str, str] = {}
    if run_dir is not None and result.error is None and not result.recovered:
        artifacts = {p.stem: str(p.relative_to(run_dir)) for p in save_artifacts(run_dir, request.node.nodeid, result)}
    record = request.node.stash[record_key] = Record.of_result(
        result, nodeid=request.node.nodeid, case=retrace_run.case, model=retrace_run.model.name,
        strategy=retrace_run.strategy, budget=retrace_run.budget, run_index=retrace_run.run_index,
        privileged=retrace_agent.privileged, artifacts=artifacts)
    request.config.hook.pytest_retrace_result(item=request.node, result=result, record=record)
    if result.error is not None:
        raise result.error
    return result


class _StageHooks:
    """The replay's observer: each stage of a test becomes the plugin's stage hooks, where the Allure writer
    and the progress line (and any third party) pick it up."""

    def __init__(self, item: pytest.Item) -> None:
        self.item = item

    def stage_start(self, stage: Any) -> None:
        self.item.config.hook.pytest_retrace_stage_start(item=self.item, stage=stage)

    def stage_end(self, stage: Any) -> None:
        self.item.config.hook.pytest_retrace_stage_end(item=self.item, stage=stage)


# -- reporting ---------------------------------------------------------------------------------------
@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if not isinstance(item, pytest.Function) or "retrace_run" not in item.fixturenames:
        return report
    record = item.stash.get(record_key, None)
    from pytest_retrace.replay.result import InfraError

    if call.excinfo is not None and isinstance(call.excinfo.value, InfraError):
        # the harness knows exactly what broke: a stack trace through replay.py would only hide it
        err = call.excinfo.value
        report.longrepr = f"retrace infrastructure error ({err.kind}) at stage {err.stage}: {err.message}"
    if call.when == "setup" and report.failed and record is None:
        # the failure happened before the replay (environment start, agent construction)
        run: CaseRun = item.callspec.params["retrace_run"]
        message = str(call.excinfo.value)[:2000] if call.excinfo else "unknown"
        record = Record.of_error(Failure(stage="setup", kind="env", message=message), nodeid=item.nodeid,
                                 case=run.case, model=run.model.name, strategy=run.strategy, budget=run.budget,
                                 run_index=run.run_index)
    if record is not None and ((call.when == "setup" and report.failed) or call.when == "call"):
        # a custom report attribute survives xdist's report serialization to the controller, as plain JSON
        report.retrace_record = record.model_dump(mode="json")
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """pytest-xdist reports a test whose worker died (kill -9, out of memory) as failed at stage "???", and pytest
    would count it among the failed recoveries; it is an infrastructure error (the record's `crash`), so pytest's
    summary counts it as an error, like every other infrastructure error."""
    if (report.when == "???" and report.failed and "::test_recovery[" in report.nodeid
            and settings_key in config.stash):
        return "error", "E", "ERROR"
    return None


class _Controller:
    """Registered on the controller (or the only process) of a retrace run: collects every record,
    writes results.jsonl as tests finish, and the summary at the end."""

    def __init__(self, config: pytest.Config, session: RetraceSession) -> None:
        self.config, self.session = config, session
        self.case_file_errors: dict[str, CaseFileError] = {}  # by file: under xdist every worker collects
        self.gate: GateResult | None = None  # None: no gate option set
        self.saved_baseline: Path | None = None

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # a case file that could not be loaded (reported by the worker that collected it)
            file = report.nodeid.split("::")[0] or report.nodeid
            error = _case_file_error(file, report.longreprtext, self.config.rootpath)
            self.case_file_errors.setdefault(file, error)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, "retrace_record", None)
        if data is not None:
            record = Record.from_dict(data)
        elif report.when == "???" and report.failed:  # pytest-xdist: the worker running this test died
            record = self._crash_record(report)
            if record is None:
                return
        else:
            return
        self.session.add(record)
        self.config.hook.pytest_retrace_record(record=record, config=self.config)

    def _crash_record(self, report: pytest.TestReport) -> Record | None:
        """A test whose worker crashed (kill -9, out of memory) is an infrastructure error of that test, never
        dropped: its model, strategy, budget and run are read back from the test id, its case from the file."""
        settings = self.config.stash[settings_key]
        path, _, rest = report.nodeid.partition("::test_recovery[")
        param = rest.removesuffix("]")
        runs = [(m, strategy, budget, index) for m in settings.models for strategy in _strategies(settings, m)
                for budget in settings.budgets for index in range(settings.runs)]
        for model, strategy, budget, index in runs:
            suffix = CaseRun.id_suffix(model.name, strategy, budget, index, settings.runs)
            if param.endswith(suffix) and len(param) > len(suffix):
                try:
                    case: RecoveryCase | None = load_case(self.config.rootpath / path)
                except Exception:  # noqa: BLE001 - the record matters more than the case's details
                    case = None
                failure = Failure(stage="worker", kind="crash", message=str(report.longrepr)[:2000])
                return Record.of_error(failure, nodeid=report.nodeid, case=case, model=model.name, strategy=strategy,
                                       budget=budget, run_index=index)
        return None

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.config.option.collectonly:
            return  # nothing ran: no run directory, no summary
        settings = self.config.stash[settings_key]
        summary = self.session.finish({
            "models": [m.name for m in settings.models], "env": settings.env.describe(), "budgets": list(settings.budgets),
            "ssim_threshold": settings.ssim_threshold, "exitstatus": int(exitstatus),
            "sample": settings.sample,  # --retrace-sample K: the first K cases of every app x kind only
            "collection_errors": len(self.case_file_errors),
            "case_file_errors": [{"file": e.file, "error": e.error} for e in self.case_file_errors.values()],
        }, root=self.config.rootpath, models=[*settings.models, *filter(None, (settings.contextualizer, settings.verifier))])
        self.pytest_session = session  # its exitstatus, final at pytest_unconfigure, goes into summary.json
        if settings.gate.active and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            # the gate, not single recovery failures, decides (an interrupted or broken session keeps its status)
            gate = self.gate = settings.gate.evaluate(summary, self.session.records,
                                                      list(self.case_file_errors.values()))
            summary["gate"] = {"passed": gate.passed, "problems": gate.problems, "notes": gate.notes,
                               "strict": settings.gate.strict}
            if settings.gate.baseline:
                summary["gate"]["baseline"] = {"path": str(settings.gate.baseline),
                                               **summary_block(gate.comparisons, settings.gate.max_drop)}
            session.exitstatus = pytest.ExitCode.OK if gate.passed else pytest.ExitCode.TESTS_FAILED
        name = _opt(self.config, "save-baseline")
        if name and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            self.saved_baseline = baseline_path(str(name), settings.report_dir)
            save_baseline(self.saved_baseline, self.session.run_dir.name, self.session.records)
            summary["run"]["saved_baseline"] = str(self.saved_baseline)
        summary["run"]["exitstatus"] = int(session.exitstatus)  # as the gate left it
        self.config.hook.pytest_retrace_summary(summary=summary, run_dir=str(self.session.run_dir), config=self.config)

    def pytest_unconfigure(self) -> None:
        if self.session.summary is not None and hasattr(self, "pytest_session"):
            self.session.set_exitstatus(int(self.pytest_session.exitstatus))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from pytest_retrace.results.tables import format_table

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
        if summary.get("n_ignored_reruns"):
            tr.write_line(f"{summary['n_ignored_reruns']} rerun(s) of tests that already had a verdict in this run "
                          f"were ignored: a finished verdict is final (a new measurement needs a new --retrace-run)")
        if self.case_file_errors:  # pytest's own report of them is hidden under `retrace run` (--tb=no)
            tr.write_line(f"{len(self.case_file_errors)} case file(s) could not be loaded (not in any rate):",
                          red=True)
            for error in self.case_file_errors.values():
                tr.write_line(f"  {error}")
        tr.write_line(f"results: {self.session.results_path}")
        if self.saved_baseline is not None:
            n = len(baseline_verdicts(self.session.records))
            tr.write_line(f"baseline saved: {self.saved_baseline} "
                          f"({n} verdict(s) of run {self.session.run_dir.name})")
        if self.gate is not None:
            tr.write_sep("=", "retrace gate: " + ("passed" if self.gate.passed else "FAILED"))
            for line in format_gate(self.gate, self.config.stash[settings_key].gate):
                tr.write_line(line)


def _case_file_error(file: str, text: str, rootpath: Path) -> CaseFileError:
    """The error's first line (a CaseError's whole message; a loader bug's header, not its traceback), without
    the file's own path when it starts with it."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "no error text")
    for prefix in (f"{rootpath / file}: ", f"{file}: "):
        first = first.removeprefix(prefix)
    return CaseFileError(file, first)


class _DryRun:
    """``--retrace-dry-run``: after collection, the most model calls each test could make, and the total.
    A turn makes at most ``calls_per_turn`` calls (a reply and its re-ask), a case at most 2r + 2 turns;
    explicit-context adds the contextualizer's call, a verifier up to two per reconstruction attempt."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lines: list[str] = []
        self.total = 0

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # session.items: what is left once every plugin's pytest_collection_modifyitems (-k, -m, --deselect,
        # --lf, --retrace-resume) has deselected its share; counting in that hook saw the whole suite
        from pytest_retrace.agents import agent_factory
        from pytest_retrace.replay.result import ReplayOptions

        per_turn: dict[str, int] = {}
        for item in session.items:
            run = getattr(item, "callspec", None) and item.callspec.params.get("retrace_run")
            if not isinstance(run, CaseRun):
                continue
            if run.model.name not in per_turn:
                try:
                    per_turn[run.model.name] = agent_factory(run.model).calls_per_turn
                except AgentConfigError as exc:
                    raise pytest.UsageError(f"retrace: {exc}") from None
            calls = per_turn[run.model.name] * ReplayOptions(budget=run.budget).max_turns
            calls += run.strategy == "explicit-context"
            calls += 2 * self.settings.attempts if self.settings.verifier is not None else 0
            self.total += calls
            self.lines.append(f"{item.nodeid}  (at most {calls} model calls)")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.write_sep("=", "retrace dry run: nothing was run and no model was called")
        for line in self.lines:
            tr.write_line(line)
        tr.write_line(f"{len(self.lines)} test(s); at most {self.total} model calls in all")


def pytest_assertrepr_compare(config: pytest.Config, op: str, left: Any, right: Any) -> list[str] | None:
    from pytest_retrace.plugin.assertion import Recovered, explain
    from pytest_retrace.replay.result import RecoveryResult

    if op == "==" and isinstance(left, RecoveryResult) and isinstance(right, Recovered):
        return explain(left)
    return None
