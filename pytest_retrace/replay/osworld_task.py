"""The part of a case that OSWorld's own code runs (desktop-env, pytest_retrace/osworld/): an OSWorld task's
config and evaluator, and the files they take from OSWorld's cache."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from pytest_retrace.envs.steps import Text
from pytest_retrace.envs.steps import one_line as _one_line
from pytest_retrace.envs.steps import text as _text
from pytest_retrace.evaluators import EvaluatorError
from pytest_retrace.text import show as _show


def _cache_name(name: str) -> str:
    # a name in OSWorld's cache directory: one file name, as its getters join it to the directory
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"must be a file name (no directories), got {_show(name)}")
    return name


class OSWorldTask(BaseModel):
    """An OSWorld task's own config and evaluator, run by OSWorld's code (desktop-env, pytest_retrace/osworld/):
    its config steps through desktop-env's SetupController after the harness's own setup, its evaluator (with
    ``postconfig``) through desktop-env's getters and metrics as Φ. Both reach the desktop through the VM-server
    API (`retrace guest`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # OSWorld's task id, as its cache directory is named
    id: Annotated[str, Field(max_length=200), AfterValidator(_text), AfterValidator(_one_line)]
    config: list[dict[str, Any]] = []
    evaluator: dict[str, Any]
    # the files OSWorld's getters and config steps take from its cache instead of downloading them (no network
    # here): the name in the cache -> the case's file, relative to the case like a setup step's `src`
    cache: dict[Annotated[str, AfterValidator(_cache_name)], Text] = {}

    @field_validator("config")
    @classmethod
    def _check_config(cls, config: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from pytest_retrace.osworld.setup import problems_of  # desktop-env is read only for OSWorld cases

        # its downloads come from `cache` (the case's files), so this machine's OSWorld cache is not looked in
        for problem in problems_of(config, "config", None, check_files=False):
            raise ValueError(str(problem.error()))  # pydantic names the field; the message keeps the step
        return config

    @field_validator("evaluator")
    @classmethod
    def _check_evaluator(cls, spec: dict[str, Any]) -> dict[str, Any]:
        from pytest_retrace.osworld.evaluate import validate

        try:
            validate(spec, "evaluator", accessibility=True)  # the Task checks its `accessibility` for the tree
        except EvaluatorError as exc:
            raise ValueError(str(exc)) from None
        return spec
