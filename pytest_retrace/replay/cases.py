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
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
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
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

from pytest_retrace.actions import POINTER_KINDS, Action, ActionError, parse_action
from pytest_retrace.envs.steps import FileStep, SetupStep, Text
from pytest_retrace.envs.steps import one_line as _one_line
from pytest_retrace.envs.steps import show as _show
from pytest_retrace.envs.steps import text as _text
from pytest_retrace.evaluators import EvaluatorError, validate_evaluator
from pytest_retrace.evaluators.plan import Check, Group, compile_block
from pytest_retrace.replay.probes import Probe

DEFAULT_SCREEN = (1280, 800)

# Case files are input, not trusted code: these bound what loading one may cost or accept.
MAX_FILE_BYTES = 1 << 20  # real cases are a few KiB
# Values in the document, also once aliases are expanded (a few lines of anchors can describe 10^9): real
# cases hold under 200, and PyYAML's pure-Python composer takes about 30 µs per value.
MAX_YAML_NODES = 10_000
MAX_YAML_DEPTH = 50  # nesting levels; real cases need fewer than 10, and PyYAML's composer recurses
MAX_METADATA_BYTES = 64 * 1024  # metadata serialised as JSON; it is copied into every result record
MAX_SCREEN = 8192  # pixels per screen side
MAX_JSON_INT = 2**63  # metadata integers must fit the 64-bit range other JSON readers assume
KINDS = ("visible", "subtle", "hidden-state", "visual-only")


class CaseError(Exception):
    """A case file that cannot be used; str() names the file and the field."""

    def __init__(self, path: Path | str, field: str, message: str) -> None:
        self.path, self.field, self.message = Path(path), field, message
        super().__init__(f"{path}: {field}: {message}" if field else f"{path}: {message}")


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
Rect = Annotated[tuple[int, int, int, int], BeforeValidator(_as_tuple)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, arbitrary_types_allowed=True)




class Task(_Model):
    id: Name
    instruction: Text
    domain: Slug
    setup: list[SetupStep] = []
    evaluator: dict[str, Any]
    network: bool = Field(False, description="the task needs the network; without it tasks have none")
    # An app that redraws on its own idle timers after the screen went quiet needs a longer quiet window than
    # the run's, or a screen is recorded (and replayed) before the app has finished: LibreOffice updates its
    # toolbar buttons ~0.5 s after a keystroke, past the default 0.3 s.
    settle_quiet: float | None = Field(None, ge=0, le=10, description="seconds the screen must stay unchanged "
                                       "after each action of this task, when longer than the run's")

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
    masks: list[Rect] = []
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
        """Every file the case names must lie inside its directory, after `..` and symlinks are resolved:
        the recorder writes the screenshots, and setup and the evaluator read the others."""
        named = [("screenshots.target", self.screenshots.target),
                 ("screenshots.error", self.screenshots.error)]
        named += [(f"task.setup[{i}].src", step.src) for i, step in enumerate(self.task.setup)
                  if isinstance(step, FileStep) and step.src is not None]
        named += _local_files(compile_block(self.task.evaluator, "task.evaluator"))
        for field, rel in named:
            problem = outside_dir(self.dir, rel)
            if problem:
                raise ValueError(f"{field}: {problem}")

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


def outside_dir(base: Path, rel: str) -> str | None:
    """Why `rel` (relative to `base`) leaves `base` once `..` and symlinks are resolved, or None."""
    try:
        root = base.resolve()
        target = (root / rel).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL byte
        return f"{_show(rel)} cannot be resolved: {exc}"
    if target != root and root in target.parents:
        return None
    return f"{_show(rel)} is outside the case directory {base}"


def _local_files(plan: Group | Check) -> Iterator[tuple[str, str]]:
    """(field, path) of every local_file getter in a compiled evaluator."""
    if isinstance(plan, Group):
        for item in plan.items:
            yield from _local_files(item)
        return
    for block, where in ((plan.result, plan.result_where), (plan.expected, plan.expected_where)):
        if block is not None and block.get("type") == "local_file":
            yield f"{where}.path", block["path"]


def vm_files(evaluator: dict[str, Any]) -> list[str]:
    """The task files (``vm_file`` getters) an evaluator reads: what a task's outcome depends on."""
    def walk(plan: Group | Check) -> Iterator[str]:
        if isinstance(plan, Group):
            for item in plan.items:
                yield from walk(item)
            return
        for block in (plan.result, plan.expected):
            if block is not None and block.get("type") == "vm_file":
                yield block["path"]

    return list(dict.fromkeys(walk(compile_block(evaluator, "task.evaluator"))))


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header, without decoding the image (collection must stay fast)."""
    with path.open("rb") as fh:
        head = fh.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError("is not a PNG file")
    return struct.unpack(">II", head[16:24])


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


class _CaseLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, minus what a case file never needs and a hostile one can abuse: duplicate keys
    (PyYAML silently keeps the last), nesting deep enough to exhaust the composer's recursion, aliases
    that expand to millions of values (a "billion laughs"), and integers too long to convert."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        # checked while composing, so that a huge or deep document is abandoned early, not after the fact
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise ComposerError(None, None, f"more than {MAX_YAML_NODES} values", self.peek_event().start_mark)
        if self._depth >= MAX_YAML_DEPTH:
            mark = self.peek_event().start_mark
            raise ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node:
        node = super().compose_document()
        # Walk the document as construction will see it, every alias expanded, and stop at the cap:
        # the walk itself is bounded, also for a recursive alias (`&a [*a]`), which exceeds the depth.
        count, stack = 0, [(node, 1)]
        while stack:
            item, depth = stack.pop()
            count += 1
            if count > MAX_YAML_NODES:
                raise ComposerError(None, None, f"more than {MAX_YAML_NODES} values once aliases are "
                                    "expanded", item.start_mark)
            if depth > MAX_YAML_DEPTH:
                raise ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels once aliases "
                                    "are expanded", item.start_mark)
            if isinstance(item, SequenceNode):
                stack += [(child, depth + 1) for child in item.value]
            elif isinstance(item, MappingNode):
                stack += [(child, depth + 1) for pair in item.value for child in pair]
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` may be overridden by the mapping's own keys
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # unhashable: the base class reports it
            if duplicate:
                raise ConstructorError("while constructing a mapping", node.start_mark,
                                       f"found duplicate key {_show(key)}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Node) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # over Python's int-to-str limit (4300 digits)
            raise ConstructorError(None, None, "integer too large", node.start_mark) from None


_CaseLoader.add_constructor("tag:yaml.org,2002:int", _CaseLoader.construct_yaml_int)


def _read_yaml(path: Path) -> Any:
    """The YAML document of a case file, or CaseError; the file is size-checked before it is parsed."""
    try:
        if not path.is_file():  # a FIFO or a device would block or never end
            raise CaseError(path, "", "not a regular file" if path.exists() else "file not found")
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise CaseError(path, "", f"the file is larger than {MAX_FILE_BYTES} bytes")
        return yaml.load(data.decode("utf-8"), Loader=_CaseLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise CaseError(path, where, f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseError(path, "", f"cannot read: {exc}") from None


def load_case(path: Path | str, *, check_screenshots: bool = True) -> RecoveryCase:
    """Load and validate one case file; raise CaseError naming the file and the field.

    ``check_screenshots=False`` is for the recorder, which is about to write them."""
    path = Path(path)
    raw = _read_yaml(path)
    if not isinstance(raw, dict):
        raise CaseError(path, "", f"top level must be a mapping, got {type(raw).__name__}")
    raw.setdefault("id", path.stem)
    try:
        case = RecoveryCase.model_validate({**raw, "path": path})
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
