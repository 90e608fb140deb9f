"""The files of a validation, typed and versioned, each written and read only through these models:

    <run>/judge/<judge>.jsonl        a judge's verdicts on a run's samples (`retrace judge`), one line each
    <study>/plan.json                which samples people see, and who sees each (`retrace annotate --sample`)
    <study>/annotations/<who>.jsonl  one annotator's answers, a line each, appended as they are given

A judge's verdict never changes the oracle's: it lives beside the run, not in results.jsonl. ``verdict`` None is
"no verdict" (a reply that could not be read, an API down after retries): counted, never guessed.
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SCHEMA_VERSION = 1
JUDGE_DIR = "judge"
PLAN = "plan.json"
ANNOTATIONS = "annotations"
Verdict = Literal["recovered", "not_recovered"]
# what a sample was drawn for: ReTrace disagreed with R_TC alone, R_O alone, or a judge ("judge:<name>");
# "all" for a plan of every sample
Alternative = str
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_name(value: str, what: str = "name") -> str:
    """An annotator's or a judge's name: it becomes a file name, so letters, digits, '_', '.', '-' only."""
    if not _NAME.match(value):
        raise ValueError(f"{what} {value!r}: use 1-64 letters, digits, '_', '.' or '-' (it names a file)")
    return value


class JudgeVerdict(_Frozen):
    """One line of <run>/judge/<judge>.jsonl."""

    schema_version: int = SCHEMA_VERSION
    sample: str  # validation.samples.Sample.id
    nodeid: str
    judge: str  # the model config's name
    verdict: Verdict | None  # None: no verdict (``error`` says why)
    rationale: str = ""
    error: str | None = None  # "unreadable reply: ...", "api: ..."
    usage: dict[str, float | int | None] = {}  # calls, tokens, cost (agents.transport's usage)
    finished_at: str = Field(default_factory=now)


class PlannedSample(_Frozen):
    sample: str  # Sample.id
    run: str  # the run directory (as given to --sample, made absolute)
    nodeid: str
    alternative: Alternative
    annotators: list[str]  # the pair (or more) that sees it
    # the other alternatives whose seeded draw also picked it: shown once, counted for each (validation.sampling)
    also_for: list[Alternative] = []


class Plan(_Frozen):
    """<study>/plan.json: fixed once drawn (seeded), reused by every session of the page."""

    schema_version: int = SCHEMA_VERSION
    seed: int
    per_alternative: int | None  # N per alternative; None: every sample ("all")
    runs: list[str]
    annotators: list[str]
    samples: list[PlannedSample]
    available: dict[Alternative, int] = {}  # per alternative, the samples it could be drawn from

    @field_validator("annotators")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        return [check_name(a, "annotator") for a in v]

    def for_annotator(self, who: str) -> list[PlannedSample]:
        return [s for s in self.samples if who in s.annotators]

    def write(self, study: Path) -> Path:
        study.mkdir(parents=True, exist_ok=True)
        path = study / PLAN
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)  # atomic: a plan is whole or absent
        return path

    @classmethod
    def read(cls, study: Path) -> Plan:
        path = study / PLAN if study.is_dir() else study
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None


class Annotation(_Frozen):
    """One line of <study>/annotations/<annotator>.jsonl: a person's answer to the paper's two questions."""

    schema_version: int = SCHEMA_VERSION
    sample: str
    annotator: str
    recovered: bool  # is the recovered state the target state?
    environmental_only: bool | None = None  # is every visible difference only environmental noise? (None: none seen)
    note: str = Field(default="", max_length=2000)
    at: str = Field(default_factory=now)


def judge_file(run_dir: Path, judge: str) -> Path:
    return run_dir / JUDGE_DIR / f"{check_name(judge, 'judge')}.jsonl"


def annotations_file(study: Path, annotator: str) -> Path:
    return study / ANNOTATIONS / f"{check_name(annotator, 'annotator')}.jsonl"


M = TypeVar("M", bound=BaseModel)


def read_jsonl(path: Path, model: type[M], error: type[ValueError] = ValueError) -> list[tuple[int, M]]:
    """(line number, line) for every non-blank line of a judge's or an annotator's file. A last line without its
    newline is one a killed writer left half written: skipped (its sample is asked again). Any other line that
    is not one raises ``error`` naming the file and the line: a person's answer or a paid verdict is never
    dropped silently."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: {exc.strerror or exc}") from None
    lines = text.split("\n")
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((number, model.model_validate_json(line)))
        except ValidationError as exc:
            if number == len(lines):  # not followed by "\n": the write a kill interrupted
                continue
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise error(f"{path}:{number}: {where + ': ' if where else ''}{first['msg']}") from None
    return out
