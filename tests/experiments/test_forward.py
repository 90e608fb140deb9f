"""Forward runs (--retrace-experiment=forward): the scripted forward agents, the record's rows against a hand
computation, an episode written in OSWorld's results layout and read back by retrace build's importer, the
collection (one test per task x model), and real runs on real desktops."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_retrace.actions import Action
from pytest_retrace.agents import AgentConfigError, AgentContext, ModelConfig, Observation, create_agent
from pytest_retrace.dataset.osworld import import_osworld
from pytest_retrace.evaluators import Evaluation
from pytest_retrace.experiments.forward import ForwardResult
from pytest_retrace.experiments.trajectory import episode_dir, write_episode
from pytest_retrace.replay.cases import load_case
from pytest_retrace.replay.result import RecoveryResult, StepLog
from pytest_retrace.results.forward import ForwardRecord, forward_rows

REPO = Path(__file__).resolve().parents[2]

pytest_plugins = ["pytester"]

GT = [Action("click", x=10, y=20), Action("type", text="abc"), Action("key", keys=("enter",))]
SHOT = np.zeros((8, 8, 3), dtype=np.uint8)


def _context(instruction: str = "do it") -> AgentContext:
    return AgentContext(instruction=instruction, mode="forward", strategy="implicit", budget=50, screen=(8, 8),
                        ground_truth=list(GT))


def _play(agent, context: AgentContext, turns: int = 6) -> list[str]:
    agent.start(context)
    return [a.describe() for _ in range(turns) for a in agent.act(Observation(SHOT, 0, 50)).actions]


def _agent(provider: str, **options) -> object:
    return create_agent(ModelConfig(provider, provider, options=options))


def test_the_oracle_plays_the_ground_truth_and_the_stall_agent_goes_wrong_at_its_step() -> None:
    done = Action("done").describe()
    assert _play(_agent("oracle"), _context()) == [a.describe() for a in GT] + [done] * 3
    assert _play(_agent("stall", at=2), _context()) == [GT[0].describe(), done, done, done, done, done]
    wrong = _play(_agent("stall", at=2, wrong={"action": "key", "keys": ["escape"]}), _context())
    assert wrong[:3] == [GT[0].describe(), Action("key", keys=("escape",)).describe(), done]
    assert _play(_agent("stall", at=9), _context())[:4] == [a.describe() for a in GT] + [done]


def test_random_fail_draws_the_same_step_for_a_task_and_seed_every_time() -> None:
    agent = _agent("random-fail", seed=3, p=0.5)
    steps = [agent.wrong_step(_context(f"task {i}")) for i in range(40)]  # type: ignore[attr-defined]
    again = _agent("random-fail", seed=3, p=0.5)
    assert steps == [again.wrong_step(_context(f"task {i}")) for i in range(40)]  # type: ignore[attr-defined]
    assert set(steps) == {1, 2, 3, None}  # each step, and getting through, for some task
    other = _agent("random-fail", seed=4, p=0.5)
    assert steps != [other.wrong_step(_context(f"task {i}")) for i in range(40)]  # type: ignore[attr-defined]
    assert {_agent("random-fail", p=0.0).wrong_step(_context(f"t{i}")) for i in range(10)} == {None}  # type: ignore[attr-defined]


def test_forward_agents_refuse_bad_options_by_field_and_a_recovery_context() -> None:
    with pytest.raises(AgentConfigError, match=r"options\.at: Value error, must be >= 1"):
        _agent("stall", at=0)
    with pytest.raises(AgentConfigError, match=r"options\.wrong: Value error, not an action"):
        _agent("stall", wrong="os.system('rm -rf ~')")
    with pytest.raises(AgentConfigError, match=r"options\.p: Value error, a probability in 0\.\.1"):
        _agent("random-fail", p=1.5)
    forward = AgentContext(instruction="x", mode="forward", strategy="implicit", budget=5, screen=(8, 8))
    with pytest.raises(RuntimeError, match="needs the task's ground truth"):
        _agent("stall").start(forward)  # type: ignore[attr-defined]
    # asked to recover (end-to-end's recovery agent), a scripted forward agent knows no way back: done at once
    recovery = AgentContext(instruction="x", mode="recovery", strategy="explicit-none", budget=5, screen=(8, 8))
    assert _play(_agent("stall"), recovery, turns=1) == [Action("done").describe()]


def _record(model: str, task: str, verdict: str, run: int = 0, steps: int = 3) -> ForwardRecord:
    return ForwardRecord(nodeid=f"x::test_forward[{task}-{model}-run{run}]", task=task, domain="d", source=task,
                         model=model, max_steps=50, run_index=run, finished_at="now", verdict=verdict,  # type: ignore[arg-type]
                         steps_used=steps)


def test_forward_rows_match_a_hand_computation() -> None:
    records = [_record("a", "t1", "solved", steps=2), _record("a", "t2", "solved", steps=4), _record("a", "t3", "unsolved"),
               _record("a", "t4", "error"), _record("b", "t1", "unsolved"), _record("b", "t1", "solved", run=1, steps=5),
               _record("a", "t1", "unsolved", steps=2)]  # a rerun of a finished episode: ignored
    a, b = forward_rows(records)
    assert (a.model, a.n, a.solved, a.errors, a.tasks, a.mean_steps, a.runs) == ("a", 3, 2, 1, 4, 3.0, 1)
    assert a.rate == round(2 / 3, 6) and a.error_kinds == {}
    # Wilson 95 %: p = 2/3, n = 3, z = 1.96
    z, n, p = 1.959964, 3, 2 / 3
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    assert a.ci_low == pytest.approx(centre - half, abs=1e-5) and a.ci_high == pytest.approx(centre + half, abs=1e-5)
    assert (b.n, b.solved, b.runs, b.rate) == (2, 1, 2, 0.5)
    assert b.rate_sd == pytest.approx(np.std([0.0, 1.0], ddof=1), abs=1e-6)


def _episode(score: float, steps: list[StepLog], frames: int) -> ForwardResult:
    drive = RecoveryResult("t", 0.0, budget=50)
    drive.steps = steps
    drive.actions_used = sum(s.action["action"] not in ("done", "fail") for s in steps)
    return ForwardResult("t", 50, drive, initial=SHOT, frames=[SHOT + i for i in range(frames)],
                         evaluation=Evaluation(score, score >= 1.0, []), last_action="DONE")


def test_an_episode_written_in_osworlds_layout_is_read_back_by_retrace_builds_importer(tmp_path: Path) -> None:
    case = load_case(REPO / "tests" / "data" / "cases" / "mousepad" / "typo-short.yaml")
    drag = Action("drag", x=1, y=2, x2=30, y2=40)  # two pyautogui calls: written as its mapping
    steps = [StepLog("recover", a.to_dict(), 0.1, f"step {i}") for i, a in enumerate([*case.trajectory, drag])]
    steps.insert(1, StepLog("recover", {"action": "invalid"}, 0.0, "", "no action in the reply"))
    steps.append(StepLog("recover", {"action": "done"}, 0.0, "finished"))
    root = tmp_path / "trajectories"
    good = episode_dir(root, "oracle", case.task.domain, case.task.id)
    write_episode(good, case.task, case.dir, _episode(1.0, steps, len(case.trajectory) + 1))
    bad = episode_dir(root, "stall", case.task.domain, case.task.id)
    write_episode(bad, case.task, case.dir, _episode(0.0, steps[:2], 1))

    lines = [json.loads(line) for line in (good / "traj.jsonl").read_text().splitlines()]
    assert [line["step_num"] for line in lines] == [*range(1, len(case.trajectory) + 2), len(lines)]
    assert lines[-1]["action"] == "DONE" and isinstance(lines[0]["action"], str)  # pyautogui code, as OSWorld's
    assert lines[-2]["action"] == drag.to_dict()
    assert all((good / line["screenshot_file"]).is_file() for line in lines[:-1]) and (good / "step_0.png").is_file()
    assert (good / "result.txt").read_text().strip() == "1.0"

    kept, dropped = import_osworld(root)
    assert [t.id for t in kept] == [f"osworld-{case.task.domain}-{case.task.id}"]
    traj = kept[0]
    assert traj.actions == [*case.trajectory, drag] and traj.task == case.task and traj.base_dir == case.dir
    assert traj.steps[0].screenshot == str((good / "step_0.png").resolve()) and traj.steps[0].rationale == "step 0"
    assert [d.source for d in dropped] == [f"osworld:{bad}"] and "score" in dropped[0].reason


def test_a_forward_dry_run_lists_one_test_per_task_and_model(project: pytest.Pytester) -> None:
    cases = project.path / "cases" / "mousepad"
    # a second case of an existing task: the task is still run once
    text = (cases / "typo-short.yaml").read_text().replace("id: typo-short", "id: typo-short-again", 1)
    (cases / "typo-short-again.yaml").write_text(text)
    res = project.runpytest_subprocess("--retrace-model=oracle,stall", "--retrace-experiment=forward",
                                       "--retrace-max-steps=7", "--retrace-dry-run", "-p", "no:cacheprovider")
    out = res.stdout.str()
    tests = [line.split()[0] for line in out.splitlines() if "::test_forward[" in line and "model calls" in line]
    assert len(tests) == 12, out  # 6 tasks x 2 models
    assert "cases/mousepad/typo-short.yaml::test_forward[mousepad-hello-world-oracle-s7]" in tests
    assert not any("typo-short-again" in t for t in tests)
    res = project.runpytest_subprocess("--retrace-model=oracle", "--retrace-experiment=forward", "--retrace-dry-run",
                                       "-k", "gnumeric-total", "-p", "no:cacheprovider")
    res.stdout.fnmatch_lines(["*test_forward?gnumeric-total-oracle-s50?*", "1 test(s); at most 0 model calls in all"])
    res = project.runpytest_subprocess("--retrace-model=oracle", "--retrace-experiment=sideways", "--retrace-dry-run")
    res.stderr.fnmatch_lines(["*--retrace-experiment: 'sideways' is not one of recovery, forward*"])


@pytest.mark.desktop
def test_forward_runs_on_real_desktops_solve_with_the_oracle_and_never_with_the_stalling_agent(
        project: pytest.Pytester) -> None:
    args = ("--retrace-model=oracle,stall", "--retrace-experiment=forward", "--retrace-run=fw", "-n", "2",
            "-p", "no:cacheprovider")
    res = project.runpytest_subprocess(*args)
    res.assert_outcomes(passed=6, failed=6)
    res.stdout.fnmatch_lines(["*retrace forward summary*", "model*max steps*tasks*n*solved*rate*",
                              "oracle*50*6*6*6*100.0%*", "stall*50*6*6*0*0.0%*"])
    run = project.path / "reports" / "fw"
    summary = json.loads((run / "summary.json").read_text())
    assert [(r["model"], r["n"], r["solved"], r["errors"]) for r in summary["forward"]] == [
        ("oracle", 6, 6, 0), ("stall", 6, 0, 0)] or [(r["model"], r["n"], r["solved"], r["errors"]) for r in
                                                     summary["forward"]] == [("stall", 6, 0, 0), ("oracle", 6, 6, 0)]
    assert summary["run"]["experiment"] == "forward" and summary["groups"] == []
    records = [json.loads(line) for line in (run / "forward.jsonl").read_text().splitlines()]
    assert len(records) == 12 and all(r["record"] == "forward" for r in records)
    by = {(r["model"], r["task"]): r for r in records}
    typo = by[("oracle", "mousepad-hello-world")]
    assert typo["verdict"] == "solved" and typo["score"] == 1.0 and typo["last_action"] == "DONE"
    stalled = by[("stall", "mousepad-hello-world")]
    assert stalled["verdict"] == "unsolved" and stalled["steps_used"] == 0
    # the oracle's episodes are rollouts retrace build reads; the stalling agent's are dropped as unsuccessful
    kept, dropped = import_osworld(run / "trajectories")
    assert len(kept) == 6 and len(dropped) == 6
    case = load_case(project.path / "cases" / "mousepad" / "typo-short.yaml")
    traj = next(t for t in kept if t.task.id == "mousepad-hello-world")
    assert traj.actions == case.trajectory and all(s.screenshot for s in traj.steps)
    # resumed: every episode has its verdict, nothing runs again
    res = project.runpytest_subprocess(*args[:2], "--retrace-resume=fw", "-p", "no:cacheprovider")
    res.stdout.fnmatch_lines(["*12 deselected*"])


def _osworld_task(root: Path, task_id: str, **extra) -> Path:
    """A task file in OSWorld's schema (written here, never one of OSWorld's own): a terminal, and a file the
    agent must write."""
    path = root / "os" / f"{task_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    task = {"id": task_id, "snapshot": "os", "instruction": "Write hi into ~/out.txt.", "source": "pytest-retrace",
            "config": [{"type": "launch", "parameters": {"command": ["xterm"]}}],
            "related_apps": ["os"],
            "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line", "command": "cat ~/out.txt",
                                                            "shell": True},
                          "expected": {"type": "rule", "rules": {"expected": "hi\n"}}}, **extra}
    path.write_text(json.dumps(task), encoding="utf-8")
    return path


@pytest.mark.desktop
def test_osworld_task_files_run_forward_judged_by_osworlds_code(project: pytest.Pytester) -> None:
    tasks = project.path / "osworld-tasks"
    _osworld_task(tasks, "write-hi")
    needs_file = _osworld_task(tasks, "needs-a-download", config=[{"type": "download", "parameters": {"files": [
        {"url": "https://example.org/x/notes.txt", "path": "/home/user/notes.txt"}]}}])
    (tasks / "test_all.json").write_text(json.dumps({"os": ["write-hi"]}))  # OSWorld's task list: not a task
    (project.path / "agents" / "echo-hi.yaml").write_text(
        "provider: script\nstrategy: implicit\noptions:\n  actions:\n"
        "    - {action: type, text: \"echo hi > ~/out.txt\\n\"}\n")
    res = project.runpytest_subprocess("--retrace-model=echo-hi,noop", "--retrace-experiment=forward",
                                       f"--retrace-cases={tasks}", "--retrace-run=ow", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=1, errors=1)  # the download without a cache: its file's error
    res.stdout.fnmatch_lines([f"*{needs_file.name}*cache*"])
    records = {r["model"]: r for r in map(json.loads, (project.path / "reports" / "ow" / "forward.jsonl").read_text().splitlines())}
    assert records["echo-hi"]["verdict"] == "solved" and records["echo-hi"]["score"] == 1.0
    assert records["noop"]["verdict"] == "unsolved" and records["noop"]["steps_used"] == 0
    assert records["echo-hi"]["source"].endswith("os/write-hi.json") and records["echo-hi"]["domain"] == "os"


@pytest.mark.desktop
def test_a_model_runs_forward_through_its_official_sdk_and_no_key_reaches_the_run(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped Claude config in a forward run, its SDK pointed at the loopback server by ANTHROPIC_BASE_URL:
    the forward system prompt and the task (nothing about recovery, no ground truth), its turns scored like a
    recovery's, usage counted, and the key in no file the run writes."""
    from pytest_retrace.testing import LoopbackServer, UndoingClaude

    key = "sk-ant-api03-" + "FORWARD-do-not-leak-41c2" * 2
    with LoopbackServer(UndoingClaude()) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", key)
        res = project.runpytest_subprocess("--retrace-model=claude", "--retrace-experiment=forward", "-k",
                                           "mousepad-hello-world", "--retrace-run=fw-claude", "-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)  # ctrl+z, then done: the task is not solved
    (record,) = [json.loads(line) for line in (project.path / "reports" / "fw-claude" / "forward.jsonl").read_text().splitlines()]
    assert (record["verdict"], record["model"], record["privileged"]) == ("unsolved", "claude-sonnet-4.6", False)
    assert record["usage"]["calls"] == 2 and record["steps_used"] == 1 and record["last_action"] == "DONE"
    first = server.requests[0].body
    system = json.dumps(first["system"])
    instruction = load_case(project.path / "cases" / "mousepad" / "typo-short.yaml").task.instruction
    assert "recovery agent" not in system and json.dumps(instruction)[1:-1] in json.dumps(first["messages"][0])
    files = [p for p in project.path.rglob("*") if p.is_file()]
    assert any(p.name == "traj.jsonl" for p in files)
    assert [str(p) for p in files if key.encode() in p.read_bytes()] == []
