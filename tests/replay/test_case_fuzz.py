"""Case files and action mappings are untrusted input: fuzz them.

`load_case` on any mutation of a valid case either returns a case whose values lie in the documented
ranges, or raises CaseError; `parse_action` on any value returns valid Actions or raises ActionError.
Nothing else may escape: a stray TypeError would crash collection or `retrace validate`. No desktop."""

from __future__ import annotations

import copy
import json
import math
import posixpath
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_retrace.actions import Action, ActionError, parse_action
from pytest_retrace.envs.steps import GUEST_HOME, MAX_TIMEOUT, FileStep, LaunchStep
from pytest_retrace.replay import caseyaml
from pytest_retrace.replay.cases import MAX_METADATA_BYTES, MAX_SCREEN, CaseError, RecoveryCase, load_case
from tests.helpers import VALID, write_case

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# JSON-like values, plus what YAML and Python add at the edges: NaN, infinities, huge integers; and the
# boundary values a validator is most likely to get wrong.
EDGES = [None, True, False, 0, 1, -1, 2, 600, 601, 8192, 8193, 10**30, 0.0, 1.5, float("nan"), float("inf"),
         "", " ", "0", "1", "true", "x", "~", "~/x", "../x", "x/../../y", "/etc/x", "a 'b",
         [], {}, [1, 2], ["", "x"]]
scalars = (st.sampled_from(EDGES) | st.none() | st.booleans() | st.integers() | st.floats()
           | st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4), max_leaves=12)

# VALID with every optional field present, so that each one gets mutated too.
SEED = copy.deepcopy(VALID)
SEED["id"] = "fuzz"
SEED["task"]["network"] = False
SEED["task"]["setup"][1]["timeout"] = 30
SEED["task"]["setup"].append({"type": "command", "command": "true", "timeout": 5})
SEED["task"]["evaluator"]["result"] = {"type": "vm_command_line", "command": "cat ~/notes.txt", "timeout": 5}
SEED["trajectory"][0] = {"action": "click", "x": 10, "y": 20, "button": "left", "clicks": 2}
SEED["trajectory"].insert(1, {"action": "key", "keys": ["ctrl", "a"], "presses": 1})
SEED["trajectory"].insert(1, {"action": "wait", "seconds": 0.5})
SEED["t_seed"] = 3
SEED["masks"] = [[0, 0, 10, 10]]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key/index path in a document, the root's children first."""
    out: list[tuple[Any, ...]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in items:
        out.append((*prefix, key))
        out += _paths(child, (*prefix, key))
    return out


@st.composite
def mutated_documents(draw: st.DrawFn) -> str:
    """SEED with a field replaced (mostly by an edge value), dropped or added, dumped as YAML; sometimes a
    second mutation, sometimes a line duplicated (a duplicate key) or replaced by random text."""
    data = copy.deepcopy(SEED)
    for _ in range(draw(st.sampled_from([1, 1, 1, 2]))):
        path = draw(st.sampled_from(_paths(data) or [("task",)]))
        parent: Any = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            op = draw(st.sampled_from(["replace"] * 4 + ["drop", "add"]))
            if op == "replace":
                parent[path[-1]] = draw(st.sampled_from(EDGES) | values)
            elif op == "drop":
                del parent[path[-1]]
            elif isinstance(parent, dict):
                key = draw(st.sampled_from(["timeout", "network", "window", "src", "x"]) | st.text(max_size=8))
                parent[key] = draw(values)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation changed the shape under this path
    lines = yaml.safe_dump(data, sort_keys=False).splitlines()
    edit = draw(st.sampled_from(["none"] * 6 + ["duplicate", "random"]))
    i = draw(st.integers(0, len(lines) - 1))
    if edit == "duplicate":
        lines.insert(i, lines[i])
    elif edit == "random":
        lines[i] = draw(st.text(max_size=40))
    return "\n".join(lines) + "\n"


def assert_in_documented_ranges(case: RecoveryCase) -> None:
    """What docs/cases.md promises about a case that loaded."""
    assert isinstance(case.id, str) and case.id.strip()
    for value in (case.t_seed, case.d, *case.screen, *(v for m in case.masks for v in m)):
        assert type(value) is int
    assert 0 <= case.t_seed <= len(case.trajectory)
    assert 1 <= len(case.perturbation) <= case.d
    w, h = case.screen
    assert 1 <= w <= MAX_SCREEN and 1 <= h <= MAX_SCREEN
    for x, y, mw, mh in case.masks:
        assert mw > 0 and mh > 0 and x >= 0 and y >= 0 and x + mw <= w and y + mh <= h
    for action in (*case.trajectory, *case.perturbation):
        assert isinstance(action, Action)
        assert all(c is None or 0 <= c < lim for c, lim in
                   ((action.x, w), (action.y, h), (action.x2, w), (action.y2, h)))
    task = case.task
    assert type(task.network) is bool
    for step in task.setup:
        if hasattr(step, "timeout"):
            assert type(step.timeout) is float and math.isfinite(step.timeout) and 0 < step.timeout <= MAX_TIMEOUT
        if isinstance(step, LaunchStep):
            assert step.command and (isinstance(step.command, str) or all(a for a in step.command))
        if isinstance(step, FileStep):
            full = step.path.replace("~", GUEST_HOME, 1) if step.path.startswith("~/") else step.path
            assert posixpath.normpath(posixpath.join(GUEST_HOME, full)).startswith(GUEST_HOME + "/")
    dumped = json.dumps(case.metadata, allow_nan=False)  # plain JSON data, finite numbers
    assert len(dumped.encode()) <= MAX_METADATA_BYTES


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("fuzz")
    load_case(write_case(directory, "seed", SEED))  # also writes the screenshots every mutation points at
    return directory


@FAST
@given(text=mutated_documents())
def test_load_case_returns_a_valid_case_or_raises_case_error(case_dir: Path, text: str) -> None:
    path = case_dir / "fuzzed.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        case = load_case(path)
    except CaseError as exc:
        assert exc.path == path and str(exc).startswith(f"{path}: ")
        return
    assert_in_documented_ranges(case)


@FAST
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_load_case_on_random_text(case_dir: Path, text: str) -> None:
    path = case_dir / "random.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        assert_in_documented_ranges(load_case(path))
    except CaseError:
        pass


def load_text(text: str, loader: type) -> tuple[str, Any]:
    try:
        return "ok", yaml.load(text, Loader=loader)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        return "refused", type(exc).__name__ if isinstance(exc, yaml.YAMLError) else "value"


@FAST
@given(text=mutated_documents() | st.text(max_size=200))
@example(text="0\t")  # found by Hypothesis in fresh runs: libyaml reads them, PyYAML's own scanner refuses the tab
@example(text="0\t0")
@example(text="!")  # and this one both read, as '' (libyaml) and None: the tag is refused
def test_the_libyaml_loader_accepts_and_refuses_what_the_python_one_does(text: str) -> None:
    # read_yaml parses on libyaml's events for speed; the checks and the result must not change with it
    def load(loader: type) -> tuple[str, Any]:
        return load_text(text, loader)
    fast, python = load(caseyaml.LOADER), load(caseyaml.CaseLoader)
    if python[0] == "ok":
        assert fast == python
    elif "\t" not in text:
        # libyaml reads a tab where YAML allows one, after a token ("0\t") or inside a plain scalar ("0\t0"),
        # where PyYAML's own scanner refuses it; nothing else may differ
        assert fast[0] == "refused"


ACTION_FIELDS = ["action", "x", "y", "x2", "y2", "button", "clicks", "dx", "dy", "text", "keys", "presses",
                 "seconds", "hold"]
KINDS = st.sampled_from(["click", "move", "drag", "mouse_down", "mouse_up", "scroll", "type", "key", "hotkey",
                         "key_down", "key_up", "wait", "done", "fail"])
action_mappings = st.fixed_dictionaries(
    {"action": KINDS | values},
    optional={name: values | st.integers(-5, 2000) | st.sampled_from(["ctrl", "enter", "a", ["ctrl", "s"]])
              for name in ACTION_FIELDS[1:]},
) | st.dictionaries(st.sampled_from(ACTION_FIELDS) | st.text(max_size=5) | st.integers(), values, max_size=5)


@FAST
@given(value=action_mappings | values)
def test_parse_action_returns_valid_actions_or_raises_action_error(value: Any) -> None:
    try:
        actions = parse_action(value)
    except ActionError:
        return
    assert all(isinstance(a, Action) for a in actions)
    if isinstance(value, dict):
        (action,) = actions
        assert Action.from_dict(action.to_dict()) == action  # the mapping form round-trips
