"""Recovery cases: a task, its ground-truth trajectory, a target step and the perturbation that left it.

A case file is YAML (schema in docs/cases.md).  Loading validates everything that can be checked without
a desktop — field types, actions against the whitelist, t_seed range, evaluator spec, screenshot files and
sizes — and turns any problem into a :class:`CaseError` naming the file and the field, so one broken
file becomes one collection error while every other case still runs.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .actions import Action, ActionError, parse_action
from .evaluators import EvaluatorError, validate_evaluator

DEFAULT_SCREEN = (1280, 800)


class CaseError(Exception):
    """A case file that cannot be used; str() names the file and the field."""

    def __init__(self, path: Path | str, field: str, message: str) -> None:
        self.path, self.field, self.message = Path(path), field, message
        super().__init__(f"{path}: {field}: {message}" if field else f"{path}: {message}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class LaunchStep(_Model):
    """Start an application; wait until a window matching `window` (WM_CLASS or title regex) is visible."""

    type: Literal["launch"]
    command: list[str] | str
    window: str | None = None
    timeout: float = 30.0


class FileStep(_Model):
    """Write a file into the environment, from inline `content` or a `src` path relative to the YAML."""

    type: Literal["file"]
    path: str
    content: str | None = None
    src: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> FileStep:
        if (self.content is None) == (self.src is None):
            raise ValueError("give exactly one of 'content' or 'src'")
        return self


class CommandStep(_Model):
    """Run a shell command inside the environment (must exit 0)."""

    type: Literal["command"]
    command: str
    timeout: float = 30.0


SetupStep = Annotated[LaunchStep | FileStep | CommandStep, Field(discriminator="type")]


class Task(_Model):
    id: str
    instruction: str
    domain: str
    setup: list[SetupStep] = []
    evaluator: dict[str, Any]

    @field_validator("evaluator")
    @classmethod
    def _check_evaluator(cls, spec: dict[str, Any]) -> dict[str, Any]:
        try:
            validate_evaluator(spec, where="evaluator")
        except EvaluatorError as exc:
            raise ValueError(str(exc)) from None
        return spec


def _actions(value: Any) -> list[Action]:
    if not isinstance(value, list):
        raise ValueError("must be a list of actions")
    out: list[Action] = []
    for i, item in enumerate(value):
        try:
            parsed = parse_action(item)
        except ActionError as exc:
            raise ValueError(f"[{i}]: {exc}") from None
        if len(parsed) != 1:
            # The paper drops multi-action steps: one step must be one action so t_seed is unambiguous.
            raise ValueError(f"[{i}]: a step must hold exactly one action, got {len(parsed)}")
        out.append(parsed[0])
    return out


class Screenshots(_Model):
    target: str
    error: str


class RecoveryCase(_Model):
    id: str
    task: Task
    trajectory: list[Action]
    t_seed: int
    perturbation: list[Action]
    d: int = Field(ge=1, description="recovery distance: the perturbation's step budget")
    screenshots: Screenshots
    screen: tuple[int, int] = DEFAULT_SCREEN
    masks: list[tuple[int, int, int, int]] = []
    metadata: dict[str, Any] = {}
    path: Path = Path("<memory>")

    _coerce_actions = field_validator("trajectory", "perturbation", mode="before")(
        classmethod(lambda cls, v: _actions(v))
    )

    @model_validator(mode="after")
    def _ranges(self) -> RecoveryCase:
        if not 0 <= self.t_seed <= len(self.trajectory):
            raise ValueError(f"t_seed: {self.t_seed} is out of range 0..{len(self.trajectory)} (len(trajectory))")
        if not 1 <= len(self.perturbation) <= self.d:
            raise ValueError(f"perturbation: needs 1..d={self.d} actions, got {len(self.perturbation)}")
        w, h = self.screen
        for i, (x, y, mw, mh) in enumerate(self.masks):
            if mw <= 0 or mh <= 0 or x < 0 or y < 0 or x + mw > w or y + mh > h:
                raise ValueError(f"masks[{i}]: rectangle {[x, y, mw, mh]} is empty or outside the {w}x{h} screen")
        return self

    # -- derived -----------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.path.parent

    @property
    def prefix(self) -> list[Action]:
        """gt[0:t_seed]: replayed to reach s_target."""
        return self.trajectory[: self.t_seed]

    @property
    def suffix(self) -> list[Action]:
        """gt[t_seed:]: replayed from the recovered state for R_TC."""
        return self.trajectory[self.t_seed :]

    @property
    def target_png(self) -> Path:
        return self.dir / self.screenshots.target

    @property
    def error_png(self) -> Path:
        return self.dir / self.screenshots.error

    @property
    def horizon(self) -> str:
        return str(self.metadata.get("horizon", "short" if self.d == 1 else "long"))


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header, without decoding the image (collection must stay fast)."""
    with path.open("rb") as fh:
        head = fh.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError("is not a PNG file")
    return struct.unpack(">II", head[16:24])


def _field_of(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("launch", "file", "command") and out.endswith("]"):
            continue  # pydantic's discriminator tag adds noise to the path
        else:
            out += ("." if out else "") + str(part)
    return out


def load_case(path: Path | str, *, check_screenshots: bool = True) -> RecoveryCase:
    """Load and validate one case file; raise CaseError naming the file and the field.

    ``check_screenshots=False`` is for the recorder, which is about to write them."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise CaseError(path, where, f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseError(path, "", f"cannot read: {exc}") from None
    if not isinstance(raw, dict):
        raise CaseError(path, "", f"top level must be a mapping, got {type(raw).__name__}")
    raw.setdefault("id", path.stem)
    try:
        case = RecoveryCase.model_validate({**raw, "path": path})
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        field = _field_of(err["loc"])
        if msg.startswith("["):  # our action validators name the index: fold it into the field path
            index, _, msg = msg.partition(": ")
            field += index
        elif (not field or (field == "task.evaluator" and msg.startswith("evaluator"))) and ": " in msg:
            # the cross-field checks (t_seed, perturbation, masks) and the evaluator validator name their field
            sub, _, msg = msg.partition(": ")
            field = f"task.{sub}" if field else sub
        more = f" (and {len(exc.errors()) - 1} more problem(s))" if len(exc.errors()) > 1 else ""
        raise CaseError(path, field or "", msg + more) from None
    if not check_screenshots:
        return case
    for field, png in (("screenshots.target", case.target_png), ("screenshots.error", case.error_png)):
        if not png.is_file():
            raise CaseError(path, field, f"file not found: {png}")
        try:
            size = _png_size(png)
        except (OSError, ValueError, struct.error) as exc:
            raise CaseError(path, field, f"{png.name}: {exc}") from None
        if tuple(size) != tuple(case.screen):
            raise CaseError(path, field, f"{png.name} is {size[0]}x{size[1]}, case screen is {case.screen[0]}x{case.screen[1]}")
    return case


@functools.lru_cache(maxsize=None)
def load_png(path: Path) -> Any:
    """A recorded screenshot as an RGB uint8 array (cached: every model run of a case reuses it)."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        arr = np.asarray(im.convert("RGB"))
    arr.setflags(write=False)
    return arr


def find_case_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.yaml") if p.is_file())
