"""The options of the experiments beyond recovery (docs/experiments.md), read into Settings' fields by
:func:`with_experiment`: ideal recovery's run plan, conditions and K; end-to-end recovery's modes, max
recoveries, detectors and recovery agent; and ``--retrace-protocol=paper`` (:func:`with_protocol`, docs/paper.md).
A bad value is a usage error naming the option."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.agents import ModelConfig
from pytest_retrace.experiments.plan import CONDITIONS
from pytest_retrace.plugin.options import Settings, model_option, paths_option, option, strategies_of


def with_experiment(config: pytest.Config, settings: Settings) -> Settings:
    """``settings`` with the fields of the experiment it runs read from their options, and the protocol's."""
    agent_dirs = paths_option(config, "agents", "agents")
    settings = replace(settings, plan=_plan(config, settings.experiment),
                       samples=_positive(config, "k", str(option(config, "k"))), conditions=_conditions(config),
                       **_end_to_end(config, settings.experiment, agent_dirs))
    return with_protocol(config, settings)


# the model adapters that keep a conversation of screenshots (agents.llm's max_screenshots)
CONVERSING = ("anthropic", "openai", "openai-compat")
ALL_SCREENSHOTS = 10**6
NEAR_IDENTICAL = 0.99  # the paper drops error screens this similar to the target


def with_protocol(config: pytest.Config, settings: Settings) -> Settings:
    """--retrace-protocol=paper: the paper's choices (docs/paper.md rows 1-5 and 10) at once. Case selection is
    collection's (:func:`left_out_by_protocol`), looks counted the fixture's, the shared subset the summary's;
    here the models keep every screenshot and settling becomes the fixed 10 s window."""
    protocol = str(option(config, "protocol"))
    if protocol not in ("default", "paper"):
        raise pytest.UsageError(f"--retrace-protocol: {protocol!r} is not one of default, paper")
    if protocol == "default":
        return settings
    models = tuple(replace(m, options={**m.options, "max_screenshots": ALL_SCREENSHOTS}) if m.provider in CONVERSING
                   else m for m in settings.models)
    return replace(settings, protocol=protocol, models=models,
                   settle=replace(settings.settle, mode="fixed", timeout=10.0))


def left_out_by_protocol(settings: Settings, case: Any) -> str | None:
    """Why the paper's case selection leaves this case out (None: it keeps it): the task's evaluator still
    passes on s_error (a visual-only case), or the error screen is near-identical to the target."""
    if settings.protocol != "paper":
        return None
    if case.metadata.get("kind") == "visual-only":
        return "visual-only"
    similar = case.metadata.get("ssim_error_vs_target")
    if similar is not None and float(similar) >= NEAR_IDENTICAL:
        return "near-identical error screen"
    return None


def _plan(config: pytest.Config, experiment: str) -> Path | None:
    """ideal-recovery's run plan: required, and readable (a usage error naming the file and field)."""
    from pytest_retrace.experiments.plan import Plan, PlanError

    raw = option(config, "plan")
    if experiment != "ideal-recovery":
        return None
    if raw is None:
        raise pytest.UsageError("--retrace-experiment=ideal-recovery needs --retrace-plan FILE (retrace plan "
                                "TRAJECTORIES writes it from a forward run)")
    path = Path(raw) if Path(raw).is_absolute() else config.invocation_params.dir / raw
    try:
        Plan.read(path)
    except PlanError as exc:
        raise pytest.UsageError(f"--retrace-plan: {exc}") from None
    return path.resolve()


def _conditions(config: pytest.Config) -> tuple[str, ...]:
    values = [v.strip() for raw in option(config, "recovery-steps") or [] for v in str(raw).split(",") if v.strip()]
    unknown = [v for v in values if v not in CONDITIONS]
    if unknown:
        raise pytest.UsageError(f"--retrace-recovery-steps: {', '.join(unknown)} not one of {', '.join(CONDITIONS)}")
    return tuple(dict.fromkeys(values)) or CONDITIONS


def _end_to_end(config: pytest.Config, experiment: str, agent_dirs: list[Path]) -> dict[str, Any]:
    """End-to-end's settings: the modes, the max recoveries, and the detectors' and recovery agent's configs
    (loaded only when a mode other than none will run: a run of `none` alone needs no detector key)."""
    from pytest_retrace.experiments.endtoend import MODES

    if experiment != "end-to-end":
        return {}
    modes = tuple(dict.fromkeys(v.strip() for raw in option(config, "recovery-mode") or [] for v in str(raw).split(",")
                                if v.strip()))
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise pytest.UsageError(f"--retrace-recovery-mode: {', '.join(unknown)} not one of {', '.join(MODES)}")
    most = tuple(dict.fromkeys(_positive(config, "max-recoveries", v) for raw in option(config, "max-recoveries") or []
                               for v in str(raw).split(",") if v.strip())) or (1,)
    recovering = not modes or any(m != "none" for m in modes)
    return {"recovery_modes": modes, "max_recoveries": most,
            "error_detector": model_option(config, "error-detector", agent_dirs) if recovering else None,
            "recovery_detector": model_option(config, "recovery-detector", agent_dirs) if recovering else None,
            "recovery_agent": model_option(config, "recovery-agent", agent_dirs) if recovering else None}


def _positive(config: pytest.Config, name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise pytest.UsageError(f"--retrace-{name}: {raw!r} is not a whole number") from None
    if value < 1:
        raise pytest.UsageError(f"--retrace-{name}: must be >= 1, got {value}")
    return value


def recovery_modes_of(settings: Settings, model: ModelConfig) -> tuple[str, ...]:
    """End-to-end: the modes a model's tests run: --retrace-recovery-mode's, else none, ideal and its strategies."""
    return settings.recovery_modes or ("none", "ideal", *strategies_of(settings, model))
