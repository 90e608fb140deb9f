"""Tests for case files: loading, validation messages (file + field + value), and how the plugin turns
broken case files into collection errors while the valid ones still run. No desktop needed."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_retrace.actions import Action
from pytest_retrace.envs.steps import FileStep, LaunchStep
from pytest_retrace.replay import caseyaml
from pytest_retrace.replay.cases import CaseError, load_case
from tests.helpers import REPO, SCREEN, VALID, write_case
from tests.helpers import png as _png

pytest_plugins = ["pytester"]

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
    root = REPO / "cases"
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
    ("t_seed-string", _set("t_seed", value="one"), "t_seed", ["valid integer", "got 'one' (str)"]),
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
    # --- case files are input: paths are confined --------------------------------------------------------
    ("file-path-absolute-outside-home", _set("task", "setup", 0, "path", value="/etc/passwd"),
     "task.setup[0].path", ["'/etc/passwd' is outside the home"]),
    ("file-path-dotdot-out-of-home", _set("task", "setup", 0, "path", value="~/../root/.bashrc"),
     "task.setup[0].path", ["'~/../root/.bashrc' is outside the home"]),
    ("file-path-relative-dotdot", _set("task", "setup", 0, "path", value="docs/../../x"), "task.setup[0].path",
     ["outside the home"]),
    ("file-path-other-users-home", _set("task", "setup", 0, "path", value="~root/x"), "task.setup[0].path",
     ["outside the home"]),
    ("file-path-the-home-itself", _set("task", "setup", 0, "path", value="/home/user/."), "task.setup[0].path",
     ["outside the home"]),
    ("file-src-outside-case-dir",
     _set("task", "setup", 0, value={"type": "file", "path": "~/a", "src": "../a.txt"}),
     "task.setup[0].src", ["'../a.txt' is outside the case directory"]),
    ("screenshot-outside-case-dir", _set("screenshots", "target", value="../typo/target.png"),
     "screenshots.target", ["'../typo/target.png' is outside the case directory"]),
    ("screenshot-absolute", _set("screenshots", "error", value="/tmp/error.png"), "screenshots.error",
     ["'/tmp/error.png' is outside the case directory"]),
    # --- values are checked: types (no coercion) and ranges ---------------------------------------------
    ("t_seed-bool", _set("t_seed", value=True), "t_seed", ["valid integer", "got True (bool)"]),
    ("t_seed-numeric-string", _set("t_seed", value="0"), "t_seed", ["valid integer", "got '0' (str)"]),
    ("d-bool", _set("d", value=True), "d", ["valid integer", "got True (bool)"]),
    ("d-float", _set("d", value=1.0), "d", ["valid integer", "got 1.0 (float)"]),
    ("task-id-int", _set("task", "id", value=1), "task.id", ["valid string", "got 1 (int)"]),
    ("task-id-empty", _set("task", "id", value=" "), "task.id", ["must not be empty"]),
    ("case-id-two-lines", _set("id", value="a\nb"), "id", ["one line"]),
    ("domain-a-path", _set("task", "domain", value="../up"), "task.domain", ["'../up'", "letters, digits"]),
    ("network-int", _set("task", "network", value=1), "task.network", ["valid boolean", "got 1 (int)"]),
    ("network-string", _set("task", "network", value="true"), "task.network", ["valid boolean", "got 'true'"]),
    ("launch-timeout-zero", _set("task", "setup", 1, "timeout", value=0), "task.setup[1].timeout",
     ["greater than 0", "got 0"]),
    ("launch-timeout-negative", _set("task", "setup", 1, "timeout", value=-5), "task.setup[1].timeout",
     ["greater than 0", "got -5"]),
    ("launch-timeout-infinite", _set("task", "setup", 1, "timeout", value=float("inf")), "task.setup[1].timeout",
     ["finite number", "got inf"]),
    ("launch-timeout-nan", _set("task", "setup", 1, "timeout", value=float("nan")), "task.setup[1].timeout",
     ["finite number", "got nan"]),
    ("launch-timeout-too-long", _set("task", "setup", 1, "timeout", value=601), "task.setup[1].timeout",
     ["less than or equal to 600", "got 601"]),
    ("launch-timeout-bool", _set("task", "setup", 1, "timeout", value=True), "task.setup[1].timeout",
     ["valid number", "got True (bool)"]),
    ("launch-timeout-string", _set("task", "setup", 1, "timeout", value="30"), "task.setup[1].timeout",
     ["valid number", "got '30' (str)"]),
    ("command-timeout-null",
     _set("task", "setup", 1, value={"type": "command", "command": "true", "timeout": None}),
     "task.setup[1].timeout", ["valid number", "got None"]),
    ("command-empty", _set("task", "setup", 1, value={"type": "command", "command": ""}), "task.setup[1].command",
     ["must not be empty"]),
    ("launch-command-empty-list", _set("task", "setup", 1, "command", value=[]), "task.setup[1].command",
     ["names no program"]),
    ("launch-command-blank-string", _set("task", "setup", 1, "command", value="  "), "task.setup[1].command",
     ["names no program"]),
    ("launch-command-empty-argument", _set("task", "setup", 1, "command", value=["mousepad", ""]),
     "task.setup[1].command", ["argument 1 must be a non-empty string"]),
    ("launch-command-not-a-string", _set("task", "setup", 1, "command", value=["mousepad", 1]),
     "task.setup[1].command", ["argument 1", "got 1"]),
    ("launch-command-unbalanced-quote", _set("task", "setup", 1, "command", value="mousepad 'a"),
     "task.setup[1].command", ["cannot be split", "No closing quotation"]),
    ("launch-command-number", _set("task", "setup", 1, "command", value=5), "task.setup[1].command",
     ["list of arguments or a string, got 5"]),
    ("evaluator-command-timeout", _set("task", "evaluator", "result",
                                       value={"type": "vm_command_line", "command": "true", "timeout": 0}),
     "task.evaluator.result.timeout", ["(0, 600]", "got 0"]),
    ("screen-zero", _set("screen", value=[0, 48]), "screen[0]", ["greater than or equal to 1", "got 0"]),
    ("screen-huge", _set("screen", value=[64, 100000]), "screen[1]", ["less than or equal to 8192"]),
    ("screen-bool", _set("screen", value=[64, True]), "screen[1]", ["valid integer", "got True (bool)"]),
    ("screen-three-sides", _set("screen", value=[64, 48, 3]), "screen", ["at most 2 items"]),
    ("mask-bool", _set("masks", value=[[0, 0, 5, True]]), "masks[0][3]", ["valid integer", "got True (bool)"]),
    ("click-outside-screen", _set("trajectory", 0, value={"action": "click", "x": 64, "y": 0}), "trajectory[0]",
     ["click at (64, 0) is outside the 64x48 screen"]),
    ("action-clicks-bool", _set("trajectory", 0, value={"action": "click", "clicks": True}), "trajectory[0]",
     ["clicks must be an integer, got True"]),
    ("action-wait-seconds-null", _set("trajectory", 0, value={"action": "wait", "seconds": None}), "trajectory[0]",
     ["seconds must be a number, got None"]),
    ("action-keys-number", _set("trajectory", 0, value={"action": "key", "keys": 5}), "trajectory[0]",
     ["keys must be a key name or a list of key names, got 5"]),
    ("metadata-nan", _set("metadata", "score", value=float("nan")), "metadata.score",
     ["nan is not a finite number"]),
    ("metadata-nested-inf", _set("metadata", "runs", value=[{"t": float("inf")}]), "metadata.runs[0].t",
     ["inf is not a finite number"]),
    ("metadata-int-key", _set("metadata", "map", value={1: "a"}), "metadata.map", ["keys must be strings, got 1"]),
    ("metadata-too-big", _set("metadata", "blob", value="x" * 70_000), "metadata",
     ["more than the limit of 65536"]),
    ("metadata-bad-horizon", _set("metadata", "horizon", value="medium"), "metadata.horizon",
     ["'short' or 'long'", "'medium'"]),
    ("metadata-bad-kind", _set("metadata", "kind", value="invisible"), "metadata.kind", ["'invisible'"]),
    # --- YAML that a hand-written case never needs ------------------------------------------------------
    ("yaml-duplicate-key", yaml.safe_dump(VALID, sort_keys=False) + "t_seed: 2\n", "line 43, column 1",
     ["invalid YAML", "found duplicate key 't_seed'"]),
    ("yaml-duplicate-nested-key", "task:\n  id: a\n  domain: b\n  id: c\n", "line 4, column 3",
     ["found duplicate key 'id'"]),
    ("yaml-alias-bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi")),
     "line 1, column 23", ["more than 10000 values once aliases are expanded"]),
    ("yaml-too-many-values", "a: [" + "1, " * 20_000 + "1]\n", "line 1, column 29996", ["more than 10000 values"]),
    ("yaml-recursive-alias", "a: &a [*a]\n", "line 1, column 4", ["nested deeper than 50 levels"]),
    ("yaml-deep-nesting", "a: " + "[" * 900 + "]" * 900 + "\n", "line 1, column 53",
     ["nested deeper than 50 levels"]),
    ("yaml-huge-integer", "t_seed: " + "9" * 5000 + "\n", "line 1, column 9", ["integer too large"]),
    ("yaml-python-tag", "t_seed: !!python/object/apply:os.system [id]\n", "line 1, column 9",
     ["could not determine a constructor"]),
    ("file-too-big", "# " + "x" * (1 << 20) + "\n", "", ["larger than 1048576 bytes"]),
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


@pytest.mark.parametrize("loader", [caseyaml.CaseLoader, caseyaml.LOADER])
def test_very_deep_nesting_is_refused_by_either_loader(loader: type) -> None:
    # libyaml refuses 1000 levels itself, before our composer counts 51: either way a clear error, no recursion
    with pytest.raises(yaml.YAMLError) as info:
        yaml.load("a: " + "[" * 10_000 + "]" * 10_000 + "\n", Loader=loader)
    assert getattr(info.value, "problem", "") in ("nested deeper than 50 levels", "exceeded maximum nesting depth")


def test_the_libyaml_loader_reads_every_shipped_case_as_the_python_one_does() -> None:
    files = sorted((REPO / "cases").rglob("*.yaml")) + sorted((REPO / "cases-osworld").rglob("*.yaml"))
    assert len(files) > 300
    for path in files:
        text = path.read_text()
        assert yaml.load(text, Loader=caseyaml.LOADER) == yaml.load(text, Loader=caseyaml.CaseLoader), path


def test_several_problems_are_counted(tmp_path: Path) -> None:
    data = copy.deepcopy(VALID)
    del data["task"]
    data["t_seed"] = "x"
    with pytest.raises(CaseError, match=r"\(and 1 more problem\(s\)\)"):
        load_case(write_case(tmp_path, "two", data))


def test_network_is_off_unless_the_task_asks(tmp_path: Path) -> None:
    assert load_case(write_case(tmp_path, "offline", VALID)).task.network is False
    data = copy.deepcopy(VALID)
    data["task"]["network"] = True
    assert load_case(write_case(tmp_path, "online", data)).task.network is True


@pytest.mark.parametrize("field", ["screenshots.target", "task.setup[0].src", "task.evaluator.expected.path"])
def test_symlink_out_of_the_case_directory_is_rejected(tmp_path: Path, field: str) -> None:
    """`..`-free paths still escape through a symlink; they are resolved before they are accepted."""
    outside = tmp_path / "outside"
    _png(outside / "target.png")
    (outside / "secret.txt").write_text("secret")
    case_dir = tmp_path / "case"
    write_case(case_dir, "seed", VALID)  # the screenshots
    (case_dir / "link").symlink_to(outside, target_is_directory=True)
    data = copy.deepcopy(VALID)
    if field == "screenshots.target":
        data["screenshots"]["target"] = "link/target.png"
    elif field == "task.setup[0].src":
        data["task"]["setup"][0] = {"type": "file", "path": "~/notes.txt", "src": "link/secret.txt"}
    else:
        data["task"]["evaluator"]["func"] = "exact_match"
        data["task"]["evaluator"]["expected"] = {"type": "local_file", "path": "link/secret.txt"}
    path = write_case(case_dir, "escape", data)
    with pytest.raises(CaseError) as info:
        load_case(path, check_screenshots=False)  # confined even when the recorder is about to write them
    assert (info.value.path, info.value.field) == (path, field)
    assert "is outside the case directory" in str(info.value)
    # the same paths inside the directory are fine
    (case_dir / "inside").mkdir()
    (case_dir / "inside" / "secret.txt").write_text("ok")
    _png(case_dir / "inside" / "target.png")
    path.write_text(path.read_text().replace("link/", "inside/"))
    load_case(path)


def test_a_case_file_that_is_not_a_regular_file_is_rejected(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # opening it would block: it is never opened
    with pytest.raises(CaseError, match=r"pipe\.yaml: not a regular file"):
        load_case(fifo)
    with pytest.raises(CaseError, match=r"gone\.yaml: file not found"):
        load_case(tmp_path / "gone.yaml")


def test_validate_reports_every_file_even_after_a_loader_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_retrace import cli
    from pytest_retrace.replay import cases

    write_case(tmp_path, "a-crash", VALID)
    write_case(tmp_path, "b-good", VALID)
    write_case(tmp_path, "c-bad", {**VALID, "t_seed": "1"})
    real = cases.load_case

    def crashing(path: Path, **kwargs: Any) -> Any:
        if path.name == "a-crash.yaml":
            raise TypeError("loader bug")
        return real(path, **kwargs)

    monkeypatch.setattr(cases, "load_case", crashing)
    assert cli.main(["validate", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"ERROR {tmp_path / 'a-crash.yaml'}: unexpected TypeError: loader bug",
        f"ok    {tmp_path / 'b-good.yaml'}: text-editor, t_seed=1/3, d=1",
        f"ERROR {tmp_path / 'c-bad.yaml'}: t_seed: Input should be a valid integer, got '1' (str)",
        "1 valid, 2 invalid",
    ]


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


def collect_good_case(pytester: pytest.Pytester, suite: tuple[Path, Path], *options: str) -> pytest.RunResult:
    """Collect only good.yaml of the suite (the broken files are no case root, so they are not collected)."""
    cases, agents = suite
    result = pytester.runpytest_subprocess(
        "--collect-only", "-q", *options, f"--retrace-cases={cases / 'app' / 'good.yaml'}",
        f"--retrace-agents={agents}", *RETRACE, str(cases),
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    return result


def test_plugin_parametrizes_over_models_and_strategy(pytester: pytest.Pytester, suite: tuple[Path, Path]) -> None:
    result = collect_good_case(pytester, suite, "--retrace-model=noop,undo",
                               "--retrace-strategy=explicit-0R,explicit-none")
    lines = result.stdout.lines
    for model in ("noop", "undo"):
        for strategy in ("explicit-0R", "explicit-none"):
            assert f"my-cases/app/good.yaml::test_recovery[good-{model}-{strategy}-r10]" in lines
    result.stdout.fnmatch_lines(["4 tests collected in *"])


def test_repeated_runs_are_distinct_tests(pytester: pytest.Pytester, suite: tuple[Path, Path]) -> None:
    result = collect_good_case(pytester, suite, "--retrace-model=noop", "--retrace-runs=3")
    ids = [line.split("[")[1] for line in result.stdout.lines if "::test_recovery[" in line]
    assert ids == [f"good-noop-implicit-r10-run{i}]" for i in (1, 2, 3)]  # never retries of one test


def test_unknown_model_is_a_usage_error(pytester: pytest.Pytester, suite: tuple[Path, Path]) -> None:
    cases, agents = suite
    result = pytester.runpytest_subprocess(
        "--collect-only", "-q", "--retrace-model=gpt-9", f"--retrace-cases={cases}", f"--retrace-agents={agents}",
        *RETRACE, str(cases),
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # 4
    result.stderr.fnmatch_lines(["*--retrace-model: model 'gpt-9': no gpt-9.yaml in*; available: noop, undo*"])


def test_unknown_network_mode_is_a_usage_error(pytester: pytest.Pytester, suite: tuple[Path, Path]) -> None:
    cases, agents = suite
    result = pytester.runpytest_subprocess(
        "--collect-only", "-q", "--retrace-model=noop", "--retrace-network=wifi", f"--retrace-cases={cases}",
        f"--retrace-agents={agents}", *RETRACE, str(cases),
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--retrace-network: 'wifi' is not one of none, host*"])


def test_without_model_case_files_are_not_collected(pytester: pytest.Pytester, suite: tuple[Path, Path]) -> None:
    cases, agents = suite
    result = pytester.runpytest_subprocess(
        "--collect-only", "-q", f"--retrace-cases={cases}", f"--retrace-agents={agents}", *RETRACE, str(cases),
    )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED  # 5
    assert "test_recovery" not in result.stdout.str()
    assert "error" not in result.stdout.str().lower()
