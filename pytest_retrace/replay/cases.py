"""Recovery cases: a task, its ground-truth trajectory, a target step and the perturbation that left it.

A case file is YAML (schema in docs/cases.md).  Loading validates everything that can be checked without
a desktop — field types, actions against the whitelist, t_seed range, evaluator spec, screenshot files and
sizes — and turns any problem into a :class:`CaseError` naming the file and the field, so one broken
file becomes one collection error while every other case still runs.
"""

from __future__ import annotations

import functools
import json
import math
import os
import struct
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pytest_retrace.actions import POINTER_KINDS, Action, ActionError, parse_action
from pytest_retrace.envs.steps import FileStep, SetupStep, Text
from pytest_retrace.envs.steps import one_line as _one_line
from pytest_retrace.envs.steps import text as _text
from pytest_retrace.evaluators import EvaluatorError, validate_evaluator
from pytest_retrace.evaluators.plan import compile_block
from pytest_retrace.replay import casecache
from pytest_retrace.replay.casefiles import local_files, outside_case, png_size
from pytest_retrace.replay.caseyaml import CaseError, parse_yaml, read_case_bytes
from pytest_retrace.replay.osworld_task import OSWorldTask
from pytest_retrace.replay.probes import Probe
from pytest_retrace.screen.frames import DEFAULT_SCREEN, Rect
from pytest_retrace.text import show as _show

# Case files are input, not trusted code: these bound what loading one may cost or accept (the YAML's own
# limits are in caseyaml.py).
MAX_METADATA_BYTES = 64 * 1024  # metadata serialised as JSON; it is copied into every result record
MAX_SCREEN = 8192  # pixels per screen side
MAX_JSON_INT = 2**63  # metadata integers must fit the 64-bit range other JSON readers assume
# the kinds of mistake a case may declare or measure, from the most to the least visible (reports keep this order)
KINDS = ("visible", "subtle", "hidden-state", "visual-only")


# --- field types ------------------------------------------------------------------------------------
# The models are strict: YAML `true` is not 1, "0" is not 0, 1 is not "1". Constraints live on the types.


def _slug(value: str) -> str:
    # `retrace build` uses the domain as a directory name
    allowed = all(c.isascii() and (c.isalnum() or c in "._-") for c in value)
    if not allowed or not value[0].isalnum():
        raise ValueError(f"must be a name of ASCII letters, digits, '.', '_' and '-', got {_show(value)}")
    return value


def _as_tuple(value: Any) -> Any:
    """YAML has no tuples; strict mode would refuse the list it gives where the model says tuple."""
    return tuple(value) if isinstance(value, list) else value


Name = Annotated[str, Field(max_length=200), AfterValidator(_text), AfterValidator(_one_line)]
Slug = Annotated[str, Field(max_length=100), AfterValidator(_text), AfterValidator(_slug)]
ScreenSide = Annotated[int, Field(ge=1, le=MAX_SCREEN)]
ScreenSize = Annotated[tuple[ScreenSide, ScreenSide], BeforeValidator(_as_tuple)]
MaskRect = Annotated[Rect, BeforeValidator(_as_tuple)]  # YAML gives a list


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, arbitrary_types_allowed=True)




class Task(_Model):
    id: Name
    instruction: Text
    domain: Slug
    setup: list[SetupStep] = []
    # Φ: the harness's own evaluator, or OSWorld's (``osworld``); a task has exactly one
    evaluator: dict[str, Any] | None = None
    osworld: OSWorldTask | None = None
    network: bool = Field(False, description="the task needs the network; without it tasks have none")
    # OSWorld's judges that read the AT-SPI tree (osworld/evaluate.py): a session bus and the accessibility
    # bridges in the task, which every other task runs without (their screens and timings must not change)
    accessibility: bool = Field(False, description="the task's apps run with AT-SPI on, for a judge that "
                                "reads the desktop's accessibility tree")
    # An app that redraws on its own idle timers after the screen went quiet needs a longer quiet window than
    # the run's, or a screen is recorded (and replayed) before the app has finished: LibreOffice updates its
    # toolbar buttons ~0.5 s after a keystroke, past the default 0.3 s.
    settle_quiet: float | None = Field(None, ge=0, le=10, description="seconds the screen must stay unchanged "
                                       "after each action of this task, when longer than the run's")

    @field_validator("evaluator")
    @classmethod
    def _check_evaluator(cls, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        if spec is None:
            return None
        try:
            validate_evaluator(spec, where="evaluator")
        except EvaluatorError as exc:
            raise ValueError(str(exc)) from None
        return spec

    @model_validator(mode="after")
    def _one_judge(self) -> Task:
        if (self.evaluator is None) == (self.osworld is None):
            raise ValueError("evaluator: a task needs exactly one of `evaluator` (the harness's) and `osworld` "
                             f"(OSWorld's), got {'both' if self.osworld else 'neither'}")
        if self.osworld is not None and not self.accessibility:
            from pytest_retrace.osworld.evaluate import needs_accessibility  # desktop-env, for OSWorld cases only

            if needs_accessibility(self.osworld.evaluator):
                raise ValueError("osworld.evaluator: needs the accessibility tree (a getter reads the desktop's "
                                 "AT-SPI tree): set `accessibility: true` on the task")
        return self


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


def _json_data(value: Any, where: str = "") -> None:
    """Raise ValueError("<where>: ...") unless `value` is plain JSON data: results and reports copy it."""
    at = f"{where}: " if where else ""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{at}keys must be strings, got {_show(key)}")
            _json_data(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _json_data(item, f"{where}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{at}{value} is not a finite number")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_JSON_INT:
        raise ValueError(f"{at}the integer is out of the 64-bit range")
    elif value is not None and not isinstance(value, (str, int, float)):
        raise ValueError(f"{at}a {type(value).__name__} is not plain data (use strings, numbers, booleans, "
                         "null, lists and mappings)")


def _metadata(value: dict[Any, Any]) -> dict[str, Any]:
    _json_data(value)
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"is {size} bytes as JSON, more than the limit of {MAX_METADATA_BYTES}")
    # the keys the project reads (docs/cases.md)
    if "horizon" in value and value["horizon"] not in ("short", "long"):
        raise ValueError(f".horizon: must be 'short' or 'long', got {_show(value['horizon'])}")
    for key in ("kind", "intended_kind"):
        if value.get(key) is not None and value[key] not in KINDS:
            raise ValueError(f".{key}: must be one of {', '.join(KINDS)}, got {_show(value[key])}")
    return value


class Screenshots(_Model):
    target: Text
    error: Text


class RecoveryCase(_Model):
    id: Name
    task: Task
    trajectory: list[Action]
    t_seed: int
    perturbation: list[Action]
    d: int = Field(ge=1, description="recovery distance: the perturbation's step budget")
    screenshots: Screenshots
    screen: ScreenSize = DEFAULT_SCREEN
    masks: list[MaskRect] = []
    probes: list[Probe] = []  # checks of s_error beyond its pixels (probes.py)
    # Declared by a hand-written hidden-state case whose error state nothing can observe (a shell alias lives
    # only in the shell's memory): `retrace record` accepts it without a probe, on its recorded determinism
    # alone (the remaining gt actions failed from the error state on every replay), and says so.
    verified_by: Literal["determinism"] | None = None
    metadata: Annotated[dict[Any, Any], AfterValidator(_metadata)] = {}  # keys checked by _metadata
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
        for name in ("trajectory", "perturbation"):
            for i, action in enumerate(getattr(self, name)):
                if action.kind not in POINTER_KINDS:
                    continue
                for (cx, cy) in ((action.x, action.y), (action.x2, action.y2)):
                    if cx is not None and cy is not None and not (cx < w and cy < h):
                        raise ValueError(f"{name}[{i}]: {action.kind} at ({cx}, {cy}) is outside the {w}x{h} "
                                         "screen")
        if self.verified_by == "determinism":
            if self.probes:
                raise ValueError(f"verified_by: 'determinism' declares that nothing can observe the error state, "
                                 f"but the case has {len(self.probes)} probe(s), which replay checks: keep the "
                                 "probes and drop verified_by")
            kind = self.metadata.get("kind")
            if kind not in (None, "hidden-state"):
                raise ValueError(f"verified_by: 'determinism' is for hidden-state cases (an error screen equal "
                                 f"to the target), but metadata.kind is {_show(kind)}: its screen verifies it")
        self._check_paths()
        return self

    def _check_paths(self) -> None:
        """Every file the case names must lie inside its directory or, for a screenshot or a setup file, inside
        the suite's shared folder, after `..` and symlinks are resolved: the recorder writes the screenshots,
        and setup and the evaluator read the others."""
        for field, rel in self.references():
            # the evaluator confines local_file to the case directory where it reads the file
            problem = outside_case(self.dir, rel, shared=not field.startswith("task.evaluator"))
            if problem:
                raise ValueError(f"{field}: {problem}")

    def references(self) -> list[tuple[str, str]]:
        """(field, path relative to the case directory) of every file the case names: its screenshots, the
        files its setup copies in, the evaluator's local files. A case's YAML says everything it uses."""
        named = [("screenshots.target", self.screenshots.target),
                 ("screenshots.error", self.screenshots.error)]
        named += [(f"task.setup[{i}].src", step.src) for i, step in enumerate(self.task.setup)
                  if isinstance(step, FileStep) and step.src is not None]
        if self.task.osworld is not None:
            return named + [(f"task.osworld.cache.{name}", rel) for name, rel in self.task.osworld.cache.items()]
        assert self.task.evaluator is not None  # Task._one_judge
        return named + list(local_files(compile_block(self.task.evaluator, "task.evaluator")))

    def files(self) -> dict[str, Path]:
        """Field -> the file it names, as a normalised path (``..`` folded: ``cases/shared/x``, not
        ``cases/browser/../shared/x``)."""
        return {field: Path(os.path.normpath(self.dir / rel)) for field, rel in self.references()}

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
    def error_state_verified_by(self) -> str:
        """What confirms, on every replay, that the perturbation reached s_error: `probes` (replay checks them
        besides the pixels), `determinism` (declared: nothing at replay can tell s_error from s_target; only
        `retrace record`'s replays showed the remaining gt actions failing from it), or `screen` (the pixel
        check alone, which suffices when the error screen differs from the target's)."""
        if self.probes:
            return "probes"
        return "determinism" if self.verified_by == "determinism" else "screen"

    @property
    def horizon(self) -> str:
        return str(self.metadata.get("horizon", "short" if self.d == 1 else "long"))


def _field_of(loc: tuple[Any, ...]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i >= 2 and loc[i - 2] == "setup" and isinstance(loc[i - 1], int):
            continue  # pydantic's discriminator tag (launch, file, command) after a step's index is noise
        elif i >= 3 and loc[i - 1] == "get" and loc[i - 3] == "probes":
            continue  # and so is a probe getter's (file, command, process)
        else:
            out += ("." if out else "") + str(part)
    return out


def load_case(path: Path | str, *, check_screenshots: bool = True) -> RecoveryCase:
    """Load and validate one case file; raise CaseError naming the file and the field.

    The validated case is kept for the next process that reads the same bytes (casecache.py); what lies
    outside the file (the files it names, the screenshots' sizes) is checked on every load.
    ``check_screenshots=False`` is for the recorder, which is about to write them."""
    path = Path(path)
    data = read_case_bytes(path)
    entry = casecache.key(path, data)
    case = casecache.get(entry)
    if not isinstance(case, RecoveryCase):
        case = _validated(path, data)
        casecache.put(entry, case)
    for field, file in case.files().items():
        if not field.startswith("screenshots.") and not file.is_file():
            raise CaseError(path, field, f"file not found: {file}")
    if not check_screenshots:
        return case
    for field, png in (("screenshots.target", case.target_png), ("screenshots.error", case.error_png)):
        if not png.is_file():
            raise CaseError(path, field, f"file not found: {png}")
        try:
            size = png_size(png)
        except (OSError, ValueError, struct.error) as exc:
            raise CaseError(path, field, f"{png.name}: {exc}") from None
        if tuple(size) != tuple(case.screen):
            raise CaseError(path, field, f"{png.name} is {size[0]}x{size[1]}, case screen is {case.screen[0]}x{case.screen[1]}")
    return case


def _validated(path: Path, data: bytes) -> RecoveryCase:
    """The case the file's bytes describe, validated; CaseError naming the field otherwise."""
    raw = parse_yaml(path, data)
    if not isinstance(raw, dict):
        raise CaseError(path, "", f"top level must be a mapping, got {type(raw).__name__}")
    raw.setdefault("id", path.stem)
    try:
        return RecoveryCase.model_validate({**raw, "path": path})
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] not in ("value_error", "missing"):  # pydantic's own messages do not say what was found
            msg += f", got {_show(err['input'])} ({type(err['input']).__name__})"
        field = _field_of(err["loc"])
        if msg.startswith(("[", ".")):  # our validators name the sub-field (an index, a key): fold it in
            sub, _, msg = msg.partition(": ")
            field += sub
        elif (not field or (field == "task.evaluator" and msg.startswith("evaluator"))) and ": " in msg:
            # the cross-field checks (t_seed, perturbation, masks) and the evaluator validator name their field
            sub, _, msg = msg.partition(": ")
            field = f"task.{sub}" if field else sub
        more = f" (and {len(exc.errors()) - 1} more problem(s))" if len(exc.errors()) > 1 else ""
        raise CaseError(path, field or "", msg + more) from None


@functools.cache
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
