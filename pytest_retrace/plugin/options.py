"""The plugin's options (every ``--retrace-X`` and its ini twin ``retrace_X``) and the :class:`Settings` a run
reads from them once, at configure time; a bad value is a usage error naming the option."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.agents import (
    STRATEGY_NAMES,
    AgentConfigError,
    ModelConfig,
    create_agent,
    create_chat,
    load_model_config,
)
from pytest_retrace.envs.config import EnvConfig, EnvConfigError, load_env_config
from pytest_retrace.experiments.plan import CONDITIONS
from pytest_retrace.results.baseline import baseline_path
from pytest_retrace.results.gate import Gate
from pytest_retrace.screen.frames import DEFAULT_SCREEN
from pytest_retrace.screen.settle import MODES as SETTLE_MODES
from pytest_retrace.screen.settle import SIGNALS as SETTLE_SIGNALS
from pytest_retrace.screen.settle import SettleConfig

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
    "experiment": ("string", "recovery", "what each test runs: recovery (a case's recovery, the benchmark) | forward "
                   "(an agent solves each task of the cases from its initial state; one test per task x model) | "
                   "ideal-recovery (K continuations from each step R of a run plan's episodes: Success@K) | "
                   "end-to-end (forward episodes with an error detector and recoveries)"),
    "protocol": ("string", "default", "default | paper: the paper's choices where they differ from the defaults, at "
                 "once (docs/paper.md: its case selection, full history, looks counted as steps, one shared subset "
                 "across strategies, the fixed 10 s settle window)"),
    "plan": ("string", None, "ideal-recovery: the run plan file (retrace plan TRAJECTORIES writes it)"),
    "recovery-mode": ("args", [], "end-to-end: how a detected error is recovered, comma-separated, one test each: "
                      "none | ideal | a recovery strategy (default: none, ideal and the model's strategies)"),
    "max-recoveries": ("args", ["1"], "end-to-end: the most recoveries an episode may make; several values run "
                       "one test each (the recovery agent's budget per attempt is --retrace-budget's first)"),
    "error-detector": ("string", "error-detector", "end-to-end: the error-step detector's model config"),
    "recovery-detector": ("string", "recovery-detector", "end-to-end: the recovery-step detector's model config"),
    "recovery-agent": ("string", None, "end-to-end: the recovery agent's model config (default: the model under "
                       "test's, a fresh instance: the same backbone with the recovery prompts)"),
    "k": ("string", "5", "ideal-recovery: continuations per episode and condition (Success@1..K)"),
    "recovery-steps": ("args", [], "ideal-recovery: the conditions to run, comma-separated: reset, E-1, E-random, "
                       "R_LLM (default: all)"),
    "max-steps": ("string", "50", "forward runs: the most actions an agent may take on a task"),
    "osworld-cache": ("string", None, "forward runs of OSWorld task files: OSWorld's cache directory "
                      "(<task id>/<file>), where the files its tasks download are found (there is no network)"),
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
    "restore": ("string", "replay", "how a test reaches s_error: replay (reset, prefix, perturbation, every test) | "
                "checkpoint (the first test of a case on a desktop replays and checkpoints the whole desktop with "
                "CRIU; later ones restore it, checked the same way; xvfb only; docs/checkpoints.md)"),
    "workers": ("string", "fork", "how xdist (-n) starts its workers: fork (from one process that imported pytest, "
                "numpy, scipy and the models' SDKs once: a fraction of the CPU of a start; README, Speed) | exec "
                "(each starts an interpreter of its own, xdist's way)"),
    "screen": ("string", "{}x{}".format(*DEFAULT_SCREEN), "desktop size WxH"),
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

RESTORES = ("replay", "checkpoint")
WORKER_STARTS = ("fork", "exec")


@dataclass(frozen=True)
class Settings:
    """What a run reads from its options, once (in the controller and in every xdist worker)."""

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
    experiment: str = "recovery"  # recovery | forward | ideal-recovery
    max_steps: int = 50  # forward runs (and the continuations of ideal recovery)
    osworld_cache: Path | None = None  # forward runs of OSWorld task files
    plan: Path | None = None  # ideal-recovery: the run plan file
    samples: int = 5  # ideal-recovery: K
    conditions: tuple[str, ...] = CONDITIONS  # ideal-recovery: the recovery steps to run
    recovery_modes: tuple[str, ...] = ()  # end-to-end: none / ideal / strategies; () = none, ideal + the model's
    max_recoveries: tuple[int, ...] = (1,)  # end-to-end
    error_detector: ModelConfig | None = None  # end-to-end, when a mode other than none runs
    recovery_detector: ModelConfig | None = None
    recovery_agent: ModelConfig | None = None  # None: the model under test's config
    protocol: str = "default"  # default | paper (plugin.experiments.with_protocol)
    restore: str = "replay"  # how s_error is reached: RESTORES (replay/reconstruct.py)
    workers: str = "fork"  # how xdist starts workers: WORKER_STARTS (pytest_retrace/forkserver)
    keep_screens: bool = False  # the recovered screen of every finished test, for the judge and people (validation)


settings_key = pytest.StashKey[Settings]()
EXPERIMENTS = ("recovery", "forward", "ideal-recovery", "end-to-end")
FORWARD_LIKE = ("forward", "ideal-recovery", "end-to-end")  # experiments whose tests are episodes (test_forward)


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
    group.addoption("--retrace-keep-screens", dest="retrace_keep_screens", action="store_true", default=None,
                    help="keep the recovered screen (and its diff) of every finished test, not only of a failed "
                         "one: what `retrace judge` and `retrace annotate` show")
    parser.addini("retrace_keep_screens", "as --retrace-keep-screens", type="bool", default=False)
    for name, (kind, default, help_) in OPTIONS.items():
        dest = "retrace_" + name.replace("-", "_")
        if kind == "args" or kind == "paths":
            group.addoption(f"--retrace-{name}", dest=dest, action="append", default=None, help=help_)
            parser.addini(dest, help_, type=kind if kind == "paths" else "args", default=default)
        else:
            group.addoption(f"--retrace-{name}", dest=dest, default=None, help=f"{help_} (default: {default})")
            parser.addini(dest, help_, default=default)


def option(config: pytest.Config, name: str) -> Any:
    """The value of ``--retrace-NAME``, else of its ini twin (else the default)."""
    dest = "retrace_" + name.replace("-", "_")
    value = config.getoption(dest)
    return value if value is not None else config.getini(dest)


def _settle(config: pytest.Config) -> SettleConfig:
    mode = str(option(config, "settle-mode"))
    if mode not in SETTLE_MODES:
        raise pytest.UsageError(f"--retrace-settle-mode: {mode!r} is not one of {', '.join(SETTLE_MODES)}")
    signal = str(option(config, "settle-signal"))
    if signal not in SETTLE_SIGNALS:
        raise pytest.UsageError(f"--retrace-settle-signal: {signal!r} is not one of {', '.join(SETTLE_SIGNALS)}")
    return SettleConfig(timeout=_number(config, "settle", float, 0.1), quiet=_number(config, "settle-quiet", float, 0.0),
                        react=_number(config, "settle-react", float, 0.0), mode=mode,  # type: ignore[arg-type]
                        signal=signal)  # type: ignore[arg-type]


def _number(config: pytest.Config, name: str, kind: type, minimum: float) -> Any:
    raw = option(config, name)
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"--retrace-{name}: {raw!r} is not a valid {kind.__name__}") from None
    if value < minimum:
        raise pytest.UsageError(f"--retrace-{name}: must be >= {minimum}, got {raw!r}")
    return value


def paths_option(config: pytest.Config, name: str, default: str) -> tuple[Path, ...]:
    cli = config.getoption("retrace_" + name)
    if cli:
        return tuple(Path(p).resolve() for item in cli for p in item.split(","))
    ini = config.getini("retrace_" + name)
    return tuple(Path(p).resolve() for p in ini) or (config.rootpath / default,)


def listed(config: pytest.Config, name: str) -> list[str]:
    """A comma-separated, repeatable option's values, in order."""
    return [v.strip() for item in option(config, name) or [] for v in str(item).split(",") if v.strip()]


def read_settings(config: pytest.Config) -> Settings | None:
    """The run's settings; None when no model is named (the plugin then stays out of the way)."""
    names = listed(config, "model")
    if not names:
        return None
    agent_dirs = list(paths_option(config, "agents", "agents"))
    try:
        models = tuple(load_model_config(n, agent_dirs) for n in dict.fromkeys(names))
    except AgentConfigError as exc:
        raise pytest.UsageError(f"--retrace-model: {exc}") from None
    strategies = tuple(dict.fromkeys(listed(config, "strategy")))
    for strategy in strategies:
        if strategy not in STRATEGY_NAMES:
            raise pytest.UsageError(f"--retrace-strategy: {strategy!r} is not one of {', '.join(STRATEGY_NAMES)}")
    budgets = []
    for raw in listed(config, "budget"):
        if not raw.isdigit() or int(raw) < 1:
            raise pytest.UsageError(f"--retrace-budget: {raw!r} is not a positive integer")
        budgets.append(int(raw))
    screen = str(option(config, "screen"))
    try:
        w, h = (int(v) for v in screen.lower().split("x"))
    except ValueError:
        raise pytest.UsageError(f"--retrace-screen: {screen!r} is not WxH") from None
    threshold = _number(config, "ssim-threshold", float, 0.0)
    if threshold > 1:
        raise pytest.UsageError(f"--retrace-ssim-threshold: must be <= 1, got {threshold}")
    restore = str(option(config, "restore"))
    if restore not in RESTORES:
        raise pytest.UsageError(f"--retrace-restore: {restore!r} is not one of {', '.join(RESTORES)}")
    workers = str(option(config, "workers"))
    if workers not in WORKER_STARTS:
        raise pytest.UsageError(f"--retrace-workers: {workers!r} is not one of {', '.join(WORKER_STARTS)}")
    network = str(option(config, "network"))
    if network not in ("none", "host"):
        raise pytest.UsageError(f"--retrace-network: {network!r} is not one of none, host")
    case_roots = paths_option(config, "cases", "cases")
    try:
        env = load_env_config(str(option(config, "env")), [config.rootpath / "envs"],
                              [str(v) for v in option(config, "env-option") or []])
    except EnvConfigError as exc:
        raise pytest.UsageError(f"--retrace-env: {exc}") from None
    experiment = str(option(config, "experiment"))
    if experiment not in EXPERIMENTS:
        raise pytest.UsageError(f"--retrace-experiment: {experiment!r} is not one of {', '.join(EXPERIMENTS)}")
    summarised = experiment in ("recovery", "end-to-end") and "explicit-context" in (
        strategies or {s for m in models for s in m.strategies})
    report_dir = Path(option(config, "report-dir"))
    report_dir = report_dir if report_dir.is_absolute() else config.rootpath / report_dir
    return Settings(
        models=models, strategies=strategies, case_roots=case_roots, env=env,
        budgets=tuple(dict.fromkeys(budgets or [10])),
        contextualizer=model_option(config, "contextualizer", agent_dirs) if summarised else None,
        verifier=model_option(config, "verifier", agent_dirs), dry_run=bool(config.getoption("retrace_dry_run")),
        settle=_settle(config),
        ssim_threshold=threshold, attempts=_number(config, "attempts", int, 1),
        verify_tolerance=_number(config, "verify-tolerance", int, 0), screen=(w, h),
        report_dir=report_dir, runs=_number(config, "runs", int, 1),
        sample=None if option(config, "sample") is None else _number(config, "sample", int, 1),
        gate=_gate(config, report_dir), network=network,
        hide=(config.rootpath, *case_roots, *agent_dirs, report_dir, Path(sys.prefix),
              *_allure_dir(config)),
        experiment=experiment, max_steps=_number(config, "max-steps", int, 1), osworld_cache=_cache(config),
        keep_screens=bool(option(config, "keep-screens")), restore=restore, workers=workers,
    )


def _cache(config: pytest.Config) -> Path | None:
    raw = option(config, "osworld-cache")
    if raw is None:
        return None
    path = Path(raw) if Path(raw).is_absolute() else config.invocation_params.dir / raw
    if not path.is_dir():
        raise pytest.UsageError(f"--retrace-osworld-cache: {path} is not a directory")
    return path.resolve()


def _allure_dir(config: pytest.Config) -> list[Path]:
    """Allure's results hold every case's target screenshot: a task must not see them either."""
    path = getattr(config.option, "allure_report_dir", None)
    return [Path(path).resolve()] if path else []


def _gate(config: pytest.Config, report_dir: Path) -> Gate:
    fail_under = None if option(config, "fail-under") is None else _number(config, "fail-under", float, 0.0)
    if fail_under is not None and fail_under > 1:
        raise pytest.UsageError(f"--retrace-fail-under: a share in 0..1, got {fail_under:g}")
    max_errors = None if option(config, "max-errors") is None else _number(config, "max-errors", int, 0)
    name = option(config, "baseline")
    path = None if name is None else baseline_path(str(name), report_dir)
    if path is not None and not path.is_file():
        raise pytest.UsageError(f"--retrace-baseline: no saved baseline at {path} (save one with --retrace-save-baseline)")
    strict = config.getoption("retrace_gate_strict")
    return Gate(fail_under=fail_under, max_errors=max_errors, baseline=path,
                max_drop=_number(config, "max-drop", float, 0.0),
                strict=bool(config.getini("retrace_gate_strict") if strict is None else strict))


def model_option(config: pytest.Config, name: str, agent_dirs: list[Path]) -> ModelConfig | None:
    """The config of a helper model (contextualizer, verifier, detector, recovery agent) an option names, if any."""
    value = option(config, name)
    if not value:
        return None
    try:
        return load_model_config(str(value), agent_dirs)
    except AgentConfigError as exc:
        raise pytest.UsageError(f"--retrace-{name}: {exc}") from None


def check_models(settings: Settings) -> None:
    """Build every model once, before any test: a missing key, a bad option or a missing prompt file is a
    usage error naming the config, not the same setup error repeated in every test."""
    from pytest_retrace.experiments.detectors import create_detector

    for config, factory in [(m, create_agent) for m in settings.models] + [
            (h, create_chat) for h in (settings.contextualizer, settings.verifier) if h is not None] + [
            (c, f) for c, f in ((settings.recovery_agent, create_agent),
                                (settings.error_detector, lambda c: create_detector("error", c)),
                                (settings.recovery_detector, lambda c: create_detector("recovery", c))) if c is not None]:
        try:
            made = factory(config)
        except AgentConfigError as exc:
            raise pytest.UsageError(f"retrace: {exc}") from None
        getattr(made, "close", lambda: None)()


def strategies_of(settings: Settings, model: ModelConfig) -> tuple[str, ...]:
    """The strategies a model's tests run: --retrace-strategy's, else the model config's own."""
    return settings.strategies or model.strategies


PATH_OPTIONS = ("cases", "agents", "report-dir", "env", "osworld-cache", "plan")


def check_rootdir(config: pytest.Config) -> None:
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


def progress_enabled(config: pytest.Config) -> bool:
    """--retrace-progress (or its ini twin): the per-test lines and the live line of progress.py."""
    flag = config.getoption("retrace_progress")
    return bool(config.getini("retrace_progress") if flag is None else flag)
