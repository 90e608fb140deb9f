"""Tests for case files: loading, validation messages (file + field + value), and how the plugin turns
broken case files into collection errors while the valid ones still run. No desktop needed."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

from pytest_retrace.actions import Action
from pytest_retrace.cases import CaseError, FileStep, LaunchStep, load_case

pytest_plugins = ["pytester"]

SCREEN = (64, 48)  # small screenshots keep the tests fast; the format allows any `screen`

# The structure of cases/mousepad/typo-short.yaml, with a small screen.
VALID: dict[str, Any] = {
    "task": {
        "id": "mousepad-hello-world",
        "instruction": 'Write "Hello world" into notes.txt in the open text editor and save the file.',
        "domain": "text-editor",
        "setup": [
            {"type": "file", "path": "~/notes.txt", "content": ""},
            {"type": "launch", "command": ["mousepad", "~/notes.txt"], "window": "Mousepad"},
        ],
        "evaluator": {
            "func": "compare_text_file",
            "result": {"type": "vm_file", "path": "~/notes.txt"},
            "expected": {"type": "rule", "rules": {"text": "Hello world"}},
        },
    },
    "trajectory": ["pyautogui.write('Hello ')", "pyautogui.write('world')", "pyautogui.hotkey('ctrl', 's')"],
    "t_seed": 1,
    "perturbation": ["pyautogui.write('xyz')"],
    "d": 1,
    "screenshots": {"target": "typo/target.png", "error": "typo/error.png"},
    "screen": list(SCREEN),
    "metadata": {"source_model": "scripted", "horizon": "short", "kind": "visible", "mistake": "wrong keystrokes"},
}


def _png(path: Path, size: tuple[int, int] = SCREEN) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (255, 255, 255)).save(path)


def write_case(directory: Path, name: str, data: dict[str, Any] | str, pngs: bool = True) -> Path:
    """Write ``name.yaml`` (a mapping dumped as YAML, or raw text) and, by default, VALID's two screenshots
    (typo/target.png, typo/error.png) at SCREEN size unless they exist already."""
    path = directory / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    if pngs:
        for rel in VALID["screenshots"].values():
            if not (path.parent / rel).exists():
                _png(path.parent / rel)
    return path


# --- a valid case -------------------------------------------------------------------------------------


def test_valid_case_loads(tmp_path: Path) -> None:
    path = write_case(tmp_path, "typo-short", VALID)
    case = load_case(path)
    assert case.id == "typo-short"  # default: the file stem
    assert case.task.id == "mousepad-hello-world"
    assert case.task.domain == "text-editor"
    assert isinstance(case.task.setup[0], FileStep) and case.task.setup[0].content == ""
    assert isinstance(case.task.setup[1], LaunchStep) and case.task.setup[1].timeout == 30.0
    assert case.trajectory == [Action("type", text="Hello "), Action("type", text="world"),
                               Action("hotkey", keys=("ctrl", "s"))]
    assert case.prefix == [Action("type", text="Hello ")]  # gt[0:t_seed]
    assert case.suffix == case.trajectory[1:]  # gt[t_seed:]
    assert case.perturbation == [Action("type", text="xyz")]
    assert case.horizon == "short"
    assert case.screen == SCREEN
    assert case.target_png == tmp_path / "typo" / "target.png"
    assert case.error_png == tmp_path / "typo" / "error.png"
    assert case.path == path


def test_explicit_id_mapping_actions_and_defaults(tmp_path: Path) -> None:
    data = copy.deepcopy(VALID)
    data["id"] = "custom"
    data["trajectory"] = [{"action": "click", "x": 10, "y": 20}, {"action": "type", "text": "7\n"},
                          {"action": "hotkey", "keys": ["ctrl", "s"]}]
    data["t_seed"] = 3  # t_seed == len(trajectory) is allowed: the target is the finished state
    data["perturbation"] = [{"action": "key", "keys": "delete"}, "pyautogui.press('backspace')"]
    data["d"] = 2
    del data["metadata"]  # horizon falls back to d: 1 -> short, more -> long
    data["masks"] = [[0, 0, 64, 10]]
    case = load_case(write_case(tmp_path, "x", data))
    assert case.id == "custom"
    assert case.trajectory[0] == Action("click", 10, 20)
    assert case.prefix == case.trajectory and case.suffix == []
    assert case.perturbation == [Action("key", keys=("delete",)), Action("key", keys=("backspace",))]
    assert case.horizon == "long"
    assert case.masks == [(0, 0, 64, 10)]


def test_default_screen_is_1280x800(tmp_path: Path) -> None:
    data = copy.deepcopy(VALID)
    del data["screen"]  # screenshots must then be 1280x800
    _png(tmp_path / "typo" / "target.png", (1280, 800))
    _png(tmp_path / "typo" / "error.png", (1280, 800))
    assert load_case(write_case(tmp_path, "big", data)).screen == (1280, 800)


def test_check_screenshots_false_skips_missing_pngs(tmp_path: Path) -> None:
    """The recorder loads a case before its screenshots exist."""
    path = write_case(tmp_path, "new", VALID, pngs=False)
    with pytest.raises(CaseError):
        load_case(path)
    assert load_case(path, check_screenshots=False).t_seed == 1


def test_repository_cases_are_valid() -> None:
    root = Path(__file__).resolve().parents[1] / "cases"
    files = sorted(root.rglob("*.yaml"))
    assert files
    for path in files:
        case = load_case(path)
        assert case.screen == (1280, 800)
        assert case.metadata.get("horizon") in ("short", "long")


# --- malformed case files -----------------------------------------------------------------------------

Mutate = Callable[[dict[str, Any]], Any]


def _set(*keys: Any, value: Any) -> Mutate:
    def mutate(data: dict[str, Any]) -> None:
        node = data
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return mutate


def _delete(*keys: str) -> Mutate:
    def mutate(data: dict[str, Any]) -> None:
        node = data
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]

    return mutate


def _bad_png(kind: str) -> Mutate:
    """Point screenshots.error at a file written later by the test (see BAD_FILES)."""
    return _set("screenshots", "error", value=f"typo/{kind}.png")


# (id, mutation of VALID or raw YAML text, field CaseError.field must equal, fragments the message must hold)
MALFORMED: list[tuple[str, Mutate | str, str, list[str]]] = [
    ("yaml-syntax", "task:\n  id: [unclosed\nt_seed: 1\n", "line 3, column 7", ["invalid YAML"]),
    ("top-level-list", "- a\n- b\n", "", ["top level must be a mapping, got list"]),
    ("empty-file", "", "", ["top level must be a mapping"]),
    ("missing-task", _delete("task"), "task", ["Field required"]),
    ("missing-instruction", _delete("task", "instruction"), "task.instruction", ["Field required"]),
    ("t_seed-string", _set("t_seed", value="one"), "t_seed", ["valid integer", "string"]),
    ("t_seed-negative", _set("t_seed", value=-1), "t_seed", ["-1", "out of range 0..3"]),
    ("t_seed-too-big", _set("t_seed", value=4), "t_seed", ["4", "out of range 0..3"]),
    ("unknown-action-kind", _set("trajectory", 1, value={"action": "clik"}), "trajectory[1]",
     ["unknown action 'clik'", "click"]),
    ("action-bad-field", _set("trajectory", 0, value={"action": "click", "x": 5}), "trajectory[0]",
     ["give both x and y"]),
    ("disallowed-code", _set("perturbation", 0, value="os.system('x')"), "perturbation[0]",
     ["os.system", "not allowed"]),
    ("multi-action-step", _set("perturbation", 0, value="pyautogui.write('a'); pyautogui.press('enter')"),
     "perturbation[0]", ["exactly one action, got 2"]),
    ("perturbation-longer-than-d", _set("perturbation", value=["pyautogui.write('a')"] * 2), "perturbation",
     ["1..d=1", "got 2"]),
    ("perturbation-empty", _set("perturbation", value=[]), "perturbation", ["1..d=1", "got 0"]),
    ("d-zero", _set("d", value=0), "d", ["greater than or equal to 1"]),
    ("unknown-top-level-field", _set("colour", value="red"), "colour", ["Extra inputs are not permitted"]),
    ("unknown-setup-type", _set("task", "setup", 1, value={"type": "download", "url": "x"}), "task.setup[1]",
     ["'download'", "launch", "file", "command"]),
    ("file-step-content-and-src", _set("task", "setup", 0, value={"type": "file", "path": "~/a", "content": "",
                                                                   "src": "a.txt"}),
     "task.setup[0]", ["exactly one of 'content' or 'src'"]),
    ("launch-step-typo", _set("task", "setup", 1, value={"type": "launch", "command": "x", "windw": "X"}),
     "task.setup[1].windw", ["Extra inputs"]),
    ("evaluator-unknown-func", _set("task", "evaluator", "func", value="compare_txt"), "task.evaluator.func",
     ["unknown metric 'compare_txt'", "compare_text_file"]),
    ("evaluator-unknown-getter", _set("task", "evaluator", "result", value={"type": "vm_fil", "path": "~/a"}),
     "task.evaluator.result.type", ["unknown getter type 'vm_fil'"]),
    ("evaluator-bad-rule", _set("task", "evaluator", "expected", value={"type": "rule", "rules": 5}),
     "task.evaluator.func (compare_text_file)", ["expected must be a string"]),
    ("missing-target-png", _set("screenshots", "target", value="typo/nope.png"), "screenshots.target",
     ["file not found", "nope.png"]),
    ("png-wrong-size", _bad_png("small"), "screenshots.error", ["small.png is 32x48", "64x48"]),
    ("not-a-png", _bad_png("fake"), "screenshots.error", ["fake.png", "not a PNG"]),
    ("mask-outside-screen", _set("masks", value=[[60, 0, 10, 10]]), "masks[0]", ["[60, 0, 10, 10]", "64x48"]),
    ("screen-not-a-pair", _set("screen", value="big"), "screen", ["tuple"]),
]


@pytest.mark.parametrize(("source", "field", "fragments"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_case(tmp_path: Path, source: Mutate | str, field: str, fragments: list[str]) -> None:
    if isinstance(source, str):
        data: dict[str, Any] | str = source
    else:
        data = copy.deepcopy(VALID)
        source(data)
    _png(tmp_path / "typo" / "small.png", (32, 48))
    (tmp_path / "typo" / "fake.png").write_text("GIF89a, not a png")
    path = write_case(tmp_path, "broken-case", data)
    with pytest.raises(CaseError) as info:
        load_case(path)
    err, text = info.value, str(info.value)
    assert err.path == path
    assert err.field == field
    assert text.startswith(f"{path}: {field + ': ' if field else ''}"), text
    assert "broken-case.yaml" in text
    for fragment in fragments:
        assert fragment in text, text


def test_several_problems_are_counted(tmp_path: Path) -> None:
    data = copy.deepcopy(VALID)
    del data["task"]
    data["t_seed"] = "x"
    with pytest.raises(CaseError, match=r"\(and 1 more problem\(s\)\)"):
        load_case(write_case(tmp_path, "two", data))


# --- collection by the plugin (pytester; no desktop: only collection runs) ----------------------------

RETRACE = ("-p", "no:cacheprovider")


@pytest.fixture
def suite(pytester: pytest.Pytester) -> tuple[Path, Path]:
    """A cases dir with one valid and two broken files, and an agents dir with noop.yaml."""
    cases = pytester.path / "my-cases"
    write_case(cases / "app", "good", VALID)
    broken_t_seed = copy.deepcopy(VALID)
    broken_t_seed["t_seed"] = 9
    write_case(cases / "app", "bad-tseed", broken_t_seed)
    broken_action = copy.deepcopy(VALID)
    broken_action["trajectory"][1] = {"action": "clik"}
    write_case(cases / "app", "bad-action", broken_action)
    agents = pytester.path / "my-agents"
    agents.mkdir()
    (agents / "noop.yaml").write_text("provider: noop\n")
    (agents / "undo.yaml").write_text("provider: undo\nstrategy: explicit-none\n")
    return cases, agents


def test_plugin_collects_valid_case_and_reports_broken_ones(
    pytester: pytest.Pytester, suite: tuple[Path, Path]
) -> None:
    cases, agents = suite
    result = pytester.runpytest_subprocess(
        "--collect-only", "-q", "--retrace-model=noop", f"--retrace-cases={cases}", f"--retrace-agents={agents}",
        *RETRACE, str(cases),
    )
    out = result.stdout.str()
    # continue_on_collection_errors: collection errors still make the exit code TESTS_FAILED (1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    lines = result.stdout.lines
    assert "my-cases/app/good.yaml::test_recovery[good-noop-implicit-r10]" in lines  # the valid case still runs
    # each broken file is one collection error whose text is str(CaseError): file path, field, problem
    assert any("ERROR collecting my-cases/app/bad-action.yaml" in line for line in lines), out
    assert f"{cases / 'app' / 'bad-action.yaml'}: trajectory[1]: unknown action 'clik'" in out
    assert any("ERROR collecting my-cases/app/bad-tseed.yaml" in line for line in lines), out
    assert f"{cases / 'app' / 'bad-tseed.yaml'}: t_seed: 9 is out of range 0..3 (len(trajectory))" in lines
    result.stdout.fnmatch_lines(["1 test collected, 2 errors in *"])
    assert "Traceback" not in out  # a CaseError is shown as its message only


def test_plugin_parametrizes_over_models_and_strategy(pytester: pytest.Pytester, suite: tuple[Path, Path]) -> None:
    cases, agents = suite
    result = pytester.runpytest_subprocess(
        "--collect-only", "-q", "--retrace-model=noop,undo", "--retrace-strategy=explicit-0R,explicit-none",
        f"--retrace-cases={cases / 'app' / 'good.yaml'}", f"--retrace-agents={agents}", *RETRACE, str(cases),
    )
    # only good.yaml is a case root: the broken files are not collected at all
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    lines = result.stdout.lines
    for model in ("noop", "undo"):
        for strategy in ("explicit-0R", "explicit-none"):
            assert f"my-cases/app/good.yaml::test_recovery[good-{model}-{strategy}-r10]" in lines
    result.stdout.fnmatch_lines(["4 tests collected in *"])


def test_unknown_model_is_a_usage_error(pytester: pytest.Pytester, suite: tuple[Path, Path]) -> None:
    cases, agents = suite
    result = pytester.runpytest_subprocess(
        "--collect-only", "-q", "--retrace-model=gpt-9", f"--retrace-cases={cases}", f"--retrace-agents={agents}",
        *RETRACE, str(cases),
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # 4
    result.stderr.fnmatch_lines(["*--retrace-model: model 'gpt-9': no gpt-9.yaml in*; available: noop, undo*"])


def test_without_model_case_files_are_not_collected(pytester: pytest.Pytester, suite: tuple[Path, Path]) -> None:
    cases, agents = suite
    result = pytester.runpytest_subprocess(
        "--collect-only", "-q", f"--retrace-cases={cases}", f"--retrace-agents={agents}", *RETRACE, str(cases),
    )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED  # 5
    assert "test_recovery" not in result.stdout.str()
    assert "error" not in result.stdout.str().lower()
