"""Importing OSWorld results directories (run.py / lib_run_single.py layout) as trajectories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from pytest_retrace.actions import Action
from pytest_retrace.dataset.osworld import import_osworld
from pytest_retrace.dataset.trajectory import Trajectory
from pytest_retrace.osworld.setup import cached

MODEL_DIR = ("pyautogui", "screenshot", "claude-sonnet-4-6")
EVALUATOR = {  # OSWorld's own metric and getters (desktop-env)
    "func": "exact_match",
    "result": {"type": "vm_command_line", "command": "cat ~/a.txt"},
    "expected": {"type": "rule", "rules": {"expected": "x"}},
}
CONFIG = [{"type": "launch", "parameters": {"command": ["mousepad"]}}]
GOOD = ["pyautogui.click(100, 200)", "import pyautogui\npyautogui.write('x')", "WAIT",
        "pyautogui.hotkey('ctrl', 's')"]


def write_run(
    results: Path,
    domain: str,
    task_id: str,
    actions: list[Any],
    *,
    score: str | None = "1.0",
    model: tuple[str, ...] = MODEL_DIR,
    step_nums: list[int] | None = None,
    raw_lines: list[str] | None = None,
    initial: bool = False,
) -> Path:
    """A task directory as OSWorld's lib_run_single.py writes it: traj.jsonl, step PNGs, result.txt."""
    task_dir = results.joinpath(*model, domain, task_id)
    task_dir.mkdir(parents=True)
    lines = []
    for i, action in enumerate(actions):
        num = step_nums[i] if step_nums else i + 1
        stamp = f"20240101@1200{i:02d}"
        shot = f"step_{num}_{stamp}.png"
        Image.new("RGB", (8, 6), (i * 20 % 256, 0, 0)).save(task_dir / shot)
        entry: dict[str, Any] = {
            "step_num": num, "action_timestamp": stamp, "response": f"thinking about step {num}",
            "reward": 0, "done": action == "DONE", "info": {}, "screenshot_file": shot,
        }
        if action is not ...:  # ... = no "action" key at all
            entry["action"] = action
        lines.append(json.dumps(entry))
    if raw_lines is not None:
        lines = raw_lines
    (task_dir / "traj.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    if score is not None:
        (task_dir / "result.txt").write_text(f"{score}\n", encoding="utf-8")
    if initial:
        Image.new("RGB", (8, 6), (0, 0, 255)).save(task_dir / "step_0.png")
    return task_dir


def write_example(examples: Path, domain: str, task_id: str, *, evaluator: Any = EVALUATOR,
                  config: list[Any] = CONFIG, instruction: str = "Write x into a.txt") -> Path:
    path = examples / domain / f"{task_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "id": task_id, "snapshot": domain, "instruction": instruction, "source": "test",
        "config": config, "trajectory": "trajectories/", "related_apps": [domain], "evaluator": evaluator,
    }), encoding="utf-8")
    return path


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    results, examples = tmp_path / "results", tmp_path / "examples"
    results.mkdir()
    examples.mkdir()
    return results, examples


def one_drop(results: Path, examples: Path | None, **kw: Any) -> str:
    kept, dropped = import_osworld(results, examples, **kw)
    assert kept == [] and len(dropped) == 1, (kept, dropped)
    return dropped[0].reason


def test_successful_run_is_imported(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    task_dir = write_run(results, "os", "t1", GOOD + ["DONE"])
    write_example(examples, "os", "t1")
    kept, dropped = import_osworld(results, examples)
    assert dropped == []
    [traj] = kept
    assert traj.id == "osworld-os-t1"
    assert traj.source == f"osworld:{task_dir.absolute()}"
    assert traj.base_dir == task_dir.absolute()
    assert traj.success
    assert traj.actions == [
        Action("click", 100, 200), Action("type", text="x"), Action("wait", seconds=1.0),
        Action("hotkey", keys=("ctrl", "s")),
    ]
    assert traj.task.id == "t1" and traj.task.domain == "os" and traj.task.instruction == "Write x into a.txt"
    # OSWorld's config and evaluator, verbatim, for desktop-env to run; none of the harness's own steps
    assert traj.task.evaluator is None and traj.task.setup == []
    assert traj.task.osworld is not None and traj.task.osworld.id == "t1"
    assert traj.task.osworld.config == CONFIG and traj.task.osworld.evaluator == EVALUATOR
    assert traj.task.osworld.cache == {}
    assert traj.steps[0].rationale == "thinking about step 1"
    meta = traj.metadata
    assert meta["model"] == "claude-sonnet-4-6" and meta["observation_type"] == "screenshot"
    assert meta["action_space"] == "pyautogui" and meta["domain"] == "os" and meta["task_id"] == "t1"
    assert meta["score"] == 1.0 and meta["n_steps"] == 4
    assert meta["osworld_task"]["instruction"] == "Write x into a.txt"
    # round trip through the pipeline's JSON form
    assert Trajectory.from_json(json.loads(json.dumps(traj.to_json()))).actions == traj.actions


def test_screenshots_are_shifted_to_the_observation_before_each_action(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    task_dir = write_run(results, "os", "t1", GOOD + ["DONE"])
    write_example(examples, "os", "t1")
    [traj], _ = import_osworld(results, examples)
    shots = [s.screenshot for s in traj.steps]
    assert shots[0] is None  # no initial screenshot kept: none invented
    for i in range(1, 4):  # step i sees what OSWorld saved after action i (1-based step_num i)
        assert shots[i] == str((task_dir / f"step_{i}_20240101@1200{i - 1:02d}.png").resolve())
        assert Path(shots[i]).is_absolute() and Path(shots[i]).is_file()
    assert traj.metadata["final_screenshot"] == str((task_dir / "step_4_20240101@120003.png").resolve())


def test_initial_screenshot_is_used_when_the_runner_kept_one(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    task_dir = write_run(results, "os", "t1", GOOD, initial=True)
    write_example(examples, "os", "t1")
    [traj], _ = import_osworld(results, examples)
    assert traj.steps[0].screenshot == str((task_dir / "step_0.png").resolve())


def test_missing_screenshot_file_gives_none(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    task_dir = write_run(results, "os", "t1", GOOD)
    (task_dir / "step_1_20240101@120000.png").unlink()
    write_example(examples, "os", "t1")
    [traj], _ = import_osworld(results, examples)
    assert traj.steps[1].screenshot is None and traj.steps[2].screenshot is not None


def test_trailing_done_is_stripped_but_wait_kept(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", ["WAIT", "pyautogui.press('enter')", "DONE", "DONE"])
    write_example(examples, "os", "t1")
    [traj], _ = import_osworld(results, examples)
    assert [a.kind for a in traj.actions] == ["wait", "key"]
    assert traj.metadata["n_steps"] == 2


def test_only_done_is_dropped(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", ["DONE"])
    write_example(examples, "os", "t1")
    assert "no actions to replay" in one_drop(results, examples)


def test_done_in_the_middle_is_dropped(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", ["pyautogui.click(1, 2)", "DONE", "pyautogui.click(3, 4)"])
    write_example(examples, "os", "t1")
    reason = one_drop(results, examples)
    assert reason == "traj.jsonl line 2 (step_num 2): DONE before the end of the trajectory"


@pytest.mark.parametrize("score, reason", [
    ("0.0", "unsuccessful (score 0.0)"),
    ("0.5", "unsuccessful (score 0.5)"),
    ("nope", "unparsable score in result.txt: 'nope'"),
    (None, "no result.txt (the run did not finish)"),
])
def test_unsuccessful_or_unfinished_runs_are_dropped(dirs: tuple[Path, Path], score: str | None,
                                                     reason: str) -> None:
    results, examples = dirs
    task_dir = write_run(results, "os", "t1", GOOD, score=score)
    write_example(examples, "os", "t1")
    kept, dropped = import_osworld(results, examples)
    assert kept == []
    assert [(d.source, d.reason) for d in dropped] == [(f"osworld:{task_dir.absolute()}", reason)]


def test_multi_action_code_in_one_step_is_dropped(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", ["pyautogui.click(1, 2)", "pyautogui.click(1,2); pyautogui.write('a')"])
    write_example(examples, "os", "t1")
    assert one_drop(results, examples) == "traj.jsonl line 2 (step_num 2): 2 actions in one step"


def test_multi_line_code_with_several_calls_is_dropped(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    code = "import pyautogui\npyautogui.click(10, 20)\npyautogui.write('hello')\npyautogui.press('enter')"
    write_run(results, "os", "t1", [code])
    write_example(examples, "os", "t1")
    assert one_drop(results, examples).endswith(": 3 actions in one step")


def test_several_traj_lines_of_one_prediction_are_a_multi_action_step(dirs: tuple[Path, Path]) -> None:
    # lib_run_single.py writes one line per action of a prediction, all with the same step_num
    results, examples = dirs
    actions = ["pyautogui.click(1, 2)", "pyautogui.write('a')", "pyautogui.press('enter')"]
    write_run(results, "os", "t1", actions, step_nums=[1, 2, 2])
    write_example(examples, "os", "t1")
    assert one_drop(results, examples) == "traj.jsonl lines 2-3 (step_num 2): 2 actions in one step"


def test_step_num_going_back_is_dropped(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    actions = ["pyautogui.click(1, 2)", "pyautogui.click(3, 4)", "pyautogui.click(5, 6)"]
    write_run(results, "os", "t1", actions, step_nums=[1, 2, 1])
    write_example(examples, "os", "t1")
    assert "more than one run" in one_drop(results, examples)


@pytest.mark.parametrize("action", [..., None, "", "   ", "import pyautogui"])
def test_missing_action_is_dropped(dirs: tuple[Path, Path], action: Any) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", ["pyautogui.click(1, 2)", action])
    write_example(examples, "os", "t1")
    reason = one_drop(results, examples)
    assert reason.startswith("traj.jsonl line 2 (step_num 2): missing action"), reason


def test_disallowed_code_is_dropped_with_the_parser_message(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", ["import os; os.system('x')"])
    write_example(examples, "os", "t1")
    reason = one_drop(results, examples)
    assert reason == ("traj.jsonl line 1 (step_num 1): line 1: import os is not allowed "
                      "(only pyautogui and time)")


def test_computer_13_actions_are_dropped_with_a_clear_reason(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", [{"action_type": "CLICK", "parameters": {"x": 1, "y": 2}}])
    write_example(examples, "os", "t1")
    assert "computer_13 action" in one_drop(results, examples)


def test_corrupt_json_line_is_dropped_naming_the_line(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    good = json.dumps({"step_num": 1, "action": "pyautogui.click(1, 2)"})
    write_run(results, "os", "t1", [], raw_lines=[good, "", good.replace("1,", "2,"), '{"step_num": 3, "act'])
    write_example(examples, "os", "t1")
    reason = one_drop(results, examples)
    assert reason.startswith("traj.jsonl line 4: corrupt JSON"), reason


def test_empty_traj_is_dropped(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", [], raw_lines=["", "  "])
    write_example(examples, "os", "t1")
    assert one_drop(results, examples) == "empty traj.jsonl"


def test_fail_is_dropped(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", ["pyautogui.click(1, 2)", "FAIL"])
    trivial = {"func": "exact_match", "result": {"type": "rule", "rules": 1},
               "expected": {"type": "rule", "rules": 1}}
    write_example(examples, "os", "t1", evaluator=trivial)
    assert one_drop(results, examples) == "traj.jsonl line 2 (step_num 2): the agent declared FAIL"


OSWORLD_EVALUATOR = {
    "func": "compare_table",
    "result": {"type": "vm_file", "path": "/home/user/a.xlsx", "dest": "a.xlsx"},
    "expected": {"type": "cloud_file", "path": "https://example.invalid/a.xlsx", "dest": "a_gold.xlsx"},
}


def test_unsupported_evaluator_is_dropped(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "libreoffice_calc", "t1", GOOD)
    write_example(examples, "libreoffice_calc", "t1", evaluator={**EVALUATOR, "func": "compare_tables"})
    assert one_drop(results, examples) == "not supported here: unknown metric: compare_tables"
    write_example(examples, "libreoffice_calc", "t1", evaluator=OSWORLD_EVALUATOR)
    reason = one_drop(results, examples)  # its gold file is not in any cache
    assert reason == "not supported here: cloud file not in cache: a_gold.xlsx", reason


def test_a_task_with_its_cache_becomes_an_osworld_case_task(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    """A results dir as OSWorld writes it, its task downloading a file and judged against a cloud file: the
    trajectory's task holds OSWorld's config and evaluator as they are, and the cache's files by their names."""
    results, examples = dirs
    url = "https://example.invalid/start/a.xlsx"
    config = [{"type": "download", "parameters": {"files": [{"url": url, "path": "/home/user/a.xlsx"}]}},
              {"type": "open", "parameters": {"path": "/home/user/a.xlsx"}}]
    post = [{"type": "activate_window", "parameters": {"window_name": "a.xlsx - LibreOffice Calc", "strict": True}}]
    evaluator = {**OSWORLD_EVALUATOR, "postconfig": post}
    write_run(results, "libreoffice_calc", "t1", GOOD)
    write_example(examples, "libreoffice_calc", "t1", config=config, evaluator=evaluator)
    cache = tmp_path / "cache"
    (cache / "t1").mkdir(parents=True)
    (cache / "t1" / "a_gold.xlsx").write_bytes(b"gold")
    assert one_drop(results, examples, cache_dir=cache) == f"not supported here: cloud file not in cache: {url}"
    start = cached(cache / "t1", url, "/home/user/a.xlsx")  # where SetupController looks before downloading
    start.write_bytes(b"start")
    [traj], dropped = import_osworld(results, examples, cache_dir=cache)
    assert dropped == []
    osworld = traj.task.osworld
    assert osworld is not None and osworld.config == config and osworld.evaluator == evaluator
    assert osworld.cache == {start.name: str(start.absolute()), "a_gold.xlsx": str(cache / "t1" / "a_gold.xlsx")}
    assert {Path(f).read_bytes() for f in osworld.cache.values()} == {b"start", b"gold"}
    assert traj.metadata["osworld_task"]["evaluator"] == evaluator
    # the pipeline's JSON form keeps it
    assert Trajectory.from_json(json.loads(json.dumps(traj.to_json()))).task.osworld == osworld


def test_postconfig_runs_now_and_a_google_account_or_a_host_file_is_refused(dirs: tuple[Path, Path],
                                                                           tmp_path: Path) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", GOOD)
    post = {**EVALUATOR, "postconfig": [{"type": "activate_window", "parameters": {"window_name": "a.txt"}}]}
    write_example(examples, "os", "t1", evaluator=post)
    [traj], _ = import_osworld(results, examples)  # desktop-env's SetupController runs it before the metric
    assert traj.task.osworld is not None and traj.task.osworld.evaluator == post
    write_example(examples, "os", "t1", config=[{"type": "login", "parameters": {}}, *CONFIG])
    assert one_drop(results, examples) == "not supported here: needs a Google account: login"
    local = tmp_path / "notes.txt"
    local.write_text("notes")
    upload = {"type": "upload_file", "parameters": {"files": [{"local_path": str(local), "path": "~/n.txt"}]}}
    write_example(examples, "os", "t1", config=[upload])
    assert one_drop(results, examples) == (f"not supported here: upload_file reads {local} from this machine, and "
                                           "a built case carries its own files")


def test_missing_task_definition_is_dropped(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", GOOD)
    assert one_drop(results, None) == "task definition not found (pass the examples dir)"
    reason = one_drop(results, examples)
    assert reason == f"task definition not found: {examples / 'os' / 't1.json'}"


def test_sibling_task_json_is_used_without_examples_dir(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    task_dir = write_run(results, "os", "t1", GOOD)
    write_example(examples, "os", "t1", instruction="from the sibling").rename(task_dir / "task.json")
    [traj], dropped = import_osworld(results)
    assert dropped == [] and traj.task.instruction == "from the sibling"


def test_invalid_task_definition_is_dropped(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", GOOD)
    write_example(examples, "os", "t1").write_text("{not json", encoding="utf-8")
    assert one_drop(results, examples).startswith("invalid task definition")
    write_example(examples / "x", "os", "t1", instruction="")  # no instruction
    assert one_drop(results, examples / "x") == "task definition has no instruction"


def test_ordering_is_deterministic_and_any_depth(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    for domain, task_id in [("vlc", "b"), ("os", "z"), ("gimp", "a"), ("os", "c")]:
        write_run(results, domain, task_id, GOOD)
        write_example(examples, domain, task_id)
    for task_id in ("q", "d"):
        write_run(results, "os", task_id, GOOD, score="0.0")
    write_run(results / "deeper" / "still", "chrome", "e", GOOD, model=())  # nested at another depth
    write_example(examples, "chrome", "e")
    kept, dropped = import_osworld(results, examples)
    assert [t.id for t in kept] == ["osworld-chrome-e", "osworld-gimp-a", "osworld-os-c", "osworld-os-z",
                                    "osworld-vlc-b"]
    assert [d.source.rsplit("/", 1)[1] for d in dropped] == ["d", "q"]
    assert [d.source for d in dropped] == sorted(d.source for d in dropped)
    again = import_osworld(results, examples)
    assert [t.to_json() for t in again[0]] == [t.to_json() for t in kept] and again[1] == dropped
    chrome = kept[0]
    assert chrome.metadata["model"] == "still" and chrome.metadata["domain"] == "chrome"


def test_runs_of_one_task_by_several_models_get_distinct_ids(dirs: tuple[Path, Path]) -> None:
    results, examples = dirs
    write_run(results, "os", "t1", GOOD, model=("pyautogui", "screenshot", "model-a"))
    write_run(results, "os", "t1", GOOD, model=("pyautogui", "screenshot", "model-b"))
    write_run(results, "os", "t1", GOOD, model=("pyautogui", "a11y_tree", "model-b"))
    write_example(examples, "os", "t1")
    kept, _ = import_osworld(results, examples)
    ids = [t.id for t in kept]
    assert len(set(ids)) == 3 and "osworld-os-t1-model-a" in ids
    assert all(i.startswith("osworld-os-t1-model-") for i in ids)


def test_missing_results_dir_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        import_osworld(tmp_path / "nope")
