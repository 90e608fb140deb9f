"""End-to-end recovery (--retrace-experiment=end-to-end, paper §6 and B.2): the rows against a hand computation,
the collection and the dry run's call counts, and real episodes on real desktops with scripted agents and
detectors: an agent that goes wrong at step 2 is rescued by an ideal recovery (and by its own re-start) and not
without one; a detector that fires too early, with a recovery agent that restores nothing, derails an agent that
would have solved the task."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_retrace.cli import main
from pytest_retrace.results.endtoend import end_to_end_rows
from pytest_retrace.results.forward import EndToEnd, ForwardRecord, RecoveryAttempt

pytest_plugins = ["pytester"]

TASKS = "mousepad-hello-world or gnumeric-update-pear"
REPO = Path(__file__).resolve().parents[2]


def _episode(task: str, mode: str, verdict: str, *, run: int = 0, most: int = 1, reached: list[bool] = ()) -> ForwardRecord:
    attempts = [RecoveryAttempt(at=2, error_step=2, step=1, reached=r, ssim=1.0 if r else 0.9, actions=0) for r in reached]
    e2e = EndToEnd(mode=mode, max_recoveries=0 if mode == "none" else most, recoveries=attempts)
    return ForwardRecord(nodeid=f"x::test_forward[{task}-{mode}-m{most}-run{run}]", task=task, domain="d", source=task,
                         model="m", max_steps=50, run_index=run, finished_at="now", verdict=verdict,  # type: ignore[arg-type]
                         end_to_end=e2e, error=None if verdict != "error" else {"stage": "detector", "kind": "api",
                                                                                 "message": "down"})


def test_end_to_end_rows_match_a_hand_computation() -> None:
    records = [
        _episode("a", "none", "unsolved"), _episode("b", "none", "solved"), _episode("c", "none", "unsolved"),
        _episode("d", "none", "error"),
        _episode("a", "ideal", "solved", reached=[True]), _episode("b", "ideal", "solved"),
        _episode("c", "ideal", "unsolved", reached=[True, True]), _episode("d", "ideal", "solved", reached=[True]),
        _episode("a", "explicit-none", "solved", reached=[False]), _episode("b", "explicit-none", "unsolved",
                                                                           reached=[True]),
        _episode("c", "explicit-none", "error"),
    ]
    none, ideal, strategy = end_to_end_rows(records)
    assert (none.mode, none.n, none.solved, none.errors, none.delta) == ("none", 3, 1, 1, None)
    # ideal: 4 episodes, 3 solved; paired with none on a, b, c (d errored there): none 1/3, ideal 2/3 -> +1/3
    assert (ideal.n, ideal.solved, ideal.paired, ideal.rescued, ideal.derailed) == (4, 3, 3, 1, 0)
    assert ideal.delta == pytest.approx(1 / 3, abs=1e-6)
    assert (ideal.recoveries, ideal.reached, ideal.episodes_recovered) == (4, 4, 3)
    # explicit-none: a rescued, b derailed (none solved it, this did not), c an error: excluded and counted
    assert (strategy.n, strategy.paired, strategy.rescued, strategy.derailed, strategy.errors) == (2, 2, 1, 1, 1)
    assert strategy.delta == 0.0 and (strategy.recoveries, strategy.reached) == (2, 1)
    assert strategy.error_kinds == {"detector/api": 1}


def test_a_restore_that_leaves_a_probe_changed_is_not_counted_as_reaching_s_r() -> None:
    def attempt(r_o: bool | None, probes: dict[str, bool] | None, reached: bool) -> RecoveryAttempt:
        return RecoveryAttempt(at=3, error_step=3, step=2, reached=reached, ssim=1.0 if r_o else 0.8, r_o=r_o,
                               probes=probes, actions=3)

    # what endtoend records: reached = R_O and every probe matches; r_o None is a record from before probes
    attempts = [attempt(True, {"file ~/notes.txt": True}, True), attempt(True, {"file ~/notes.txt": False}, False),
                attempt(False, {"file ~/notes.txt": True}, False), attempt(True, None, True),
                attempt(None, None, True)]
    record = _episode("a", "explicit-none", "solved")
    record = record.model_copy(update={"end_to_end": record.end_to_end.model_copy(update={"recoveries": attempts})})
    back = ForwardRecord.from_json(record.to_json())  # the optional fields survive the file
    assert [a.probes for a in back.end_to_end.recoveries][:2] == [{"file ~/notes.txt": True}, {"file ~/notes.txt": False}]
    (row,) = end_to_end_rows([back])
    # 5 attempts: reached by the stricter rule 1st, 4th, 5th; the screen alone matched all but the 3rd
    assert (row.recoveries, row.reached, row.reached_screen) == (5, 3, 4)


def _agents(project: pytest.Pytester) -> None:
    agents = project.path / "agents"
    (agents / "errs.yaml").write_text("provider: scripted-error\noptions: {at: 2}\n")
    (agents / "early.yaml").write_text("provider: scripted-error\noptions: {at: 1}\n")
    (agents / "backs.yaml").write_text("provider: scripted-recovery\noptions: {back: 1}\n")


def test_end_to_end_collects_a_test_per_mode_and_max_recoveries_and_counts_calls(project: pytest.Pytester) -> None:
    _agents(project)
    res = project.runpytest_subprocess(
        "--retrace-experiment=end-to-end", "--retrace-model=stall-once", "--retrace-recovery-mode=none,ideal,explicit-0R",
        "--retrace-max-recoveries=1,3", "--retrace-error-detector=errs", "--retrace-recovery-detector=backs",
        "--retrace-dry-run", "-k", "mousepad-hello-world", "-p", "no:cacheprovider")
    tests = [line.split()[0] for line in res.stdout.lines if "::test_forward[" in line and "model calls" in line]
    assert [t.split("[")[1] for t in tests] == [
        "mousepad-hello-world-stall-once-s50-none]", "mousepad-hello-world-stall-once-s50-ideal-m1]",
        "mousepad-hello-world-stall-once-s50-ideal-m3]", "mousepad-hello-world-stall-once-s50-explicit-0R-m1]",
        "mousepad-hello-world-stall-once-s50-explicit-0R-m3]"]
    res.stdout.fnmatch_lines(["5 test(s); at most 0 model calls in all"])
    # a model, LLM detectors: every forward turn may ask the error detector and the recovery-step detector, each
    # recovery adds a forward segment and the recovery agent's turns
    res = project.runpytest_subprocess(
        "--retrace-experiment=end-to-end", "--retrace-model=claude", "--retrace-recovery-mode=none,explicit-0R",
        "--retrace-max-steps=10", "--retrace-budget=4", "--retrace-dry-run", "-k", "mousepad-hello-world",
        "-p", "no:cacheprovider")
    from pytest_retrace.agents import agent_factory, load_model_config

    per_turn = agent_factory(load_model_config("claude", [project.path / "agents"])).calls_per_turn
    res.stdout.fnmatch_lines([f"*-s10-none? *(at most {22 * per_turn} model calls)",  # 2 x 10 + 2 turns
                              # 2 forward segments of 22 turns, 2 detector calls a turn, the recovery's 2 x 4 + 2 turns
                              f"*-s10-explicit-0R-m1? *(at most {2 * 22 * per_turn + 2 * 44 + 10 * per_turn} "
                              f"model calls)"])
    res = project.runpytest_subprocess("--retrace-experiment=end-to-end", "--retrace-model=oracle",
                                       "--retrace-recovery-mode=undo", "--retrace-dry-run")
    res.stderr.fnmatch_lines(["*--retrace-recovery-mode: undo not one of none, ideal, implicit, explicit-0E*"])


@pytest.mark.desktop
def test_a_recovery_rescues_an_agent_that_went_wrong_and_a_false_alarm_derails_one_that_did_not(
        project: pytest.Pytester) -> None:
    _agents(project)
    common = ("--retrace-experiment=end-to-end", "--retrace-recovery-detector=backs", "-n", "2",
              "-p", "no:cacheprovider")
    res = project.runpytest_subprocess(*common, "--retrace-model=stall-once", "--retrace-error-detector=errs",
                                       "--retrace-recovery-mode=none,ideal,explicit-none", "--retrace-run=rescue",
                                       "-k", TASKS)
    res.assert_outcomes(passed=4, failed=2)
    run = project.path / "reports" / "rescue"
    records = {(r["task"], r["end_to_end"]["mode"]): r for r in
               (json.loads(line) for line in (run / "forward.jsonl").read_text().splitlines())}
    for task in ("mousepad-hello-world", "gnumeric-update-pear"):
        assert records[(task, "none")]["verdict"] == "unsolved" and records[(task, "none")]["end_to_end"]["recoveries"] == []
        ideal = records[(task, "ideal")]
        (attempt,) = ideal["end_to_end"]["recoveries"]
        assert ideal["verdict"] == "solved" and (attempt["error_step"], attempt["step"], attempt["reached"]) == (2, 1, True)
        # the error detector after steps 1 and 2, the recovery-step detector once; then frozen for 5 steps, and
        # the resumed agent needs only 2 more
        assert ideal["end_to_end"]["detector_calls"] == 3
        # the recovery agent (stall-once, scripted) knows no way back: it ends the attempt; the restart rescues
        plain = records[(task, "explicit-none")]
        assert plain["verdict"] == "solved" and plain["end_to_end"]["recoveries"][0]["actions"] == 0
    rows = {r["mode"]: r for r in json.loads((run / "summary.json").read_text())["end_to_end"]}
    assert (rows["none"]["solved"], rows["ideal"]["solved"], rows["ideal"]["rescued"], rows["ideal"]["delta"]) == (0, 2, 2, 1.0)
    res.stdout.fnmatch_lines(["*retrace end-to-end recovery summary*", "model*recovery*max*n*solved*rate*Δ vs none*",
                              "stall-once*none*-*2*0*0.0%*", "stall-once*ideal*1*2*2*100.0%*+100.0 (2)*2*0*2*2/2*0*"])

    # a detector that fires at step 1 (a false alarm: the oracle makes no mistake), R = 0, and a recovery agent
    # that restores nothing: the oracle, told it is back at the start, types its first step again
    res = project.runpytest_subprocess(*common, "--retrace-model=oracle", "--retrace-error-detector=early",
                                       "--retrace-recovery-agent=noop", "--retrace-recovery-mode=none,ideal,explicit-none",
                                       "--retrace-run=derail", "-k", "mousepad-hello-world")
    run = project.path / "reports" / "derail"
    rows = {r["mode"]: r for r in json.loads((run / "summary.json").read_text())["end_to_end"]}
    assert rows["none"]["solved"] == 1 and rows["ideal"]["solved"] == 1  # the exact restore: no harm
    assert (rows["explicit-none"]["solved"], rows["explicit-none"]["derailed"], rows["explicit-none"]["delta"]) == (0, 1, -1.0)
    assert main(["summary", str(run / "forward.jsonl")]) == 0


@pytest.mark.desktop
def test_a_restore_that_matches_the_screen_but_leaves_a_file_changed_did_not_reach_s_r(
        project: pytest.Pytester) -> None:
    """mousepad-hello-world with a case that probes ~/notes.txt: the oracle types "Hello " and "world"; the
    detector fires after step 2 (E = 2, R = 1: "Hello " typed, the file still empty). One recovery agent deletes
    "world": the screen and the file are those of step 1 again, reached. The other deletes it too, but saves, then
    types a letter and deletes it: the screen is step 1's again (the unsaved-changes star is back), the file now
    holds "Hello ": R_O holds, the probe does not, not reached."""
    built = REPO / "cases" / "text-editor"
    (project.path / "cases" / "text-editor").mkdir()
    shutil.copy(built / "hello-world-t1-unicode-bom.yaml", project.path / "cases" / "text-editor")
    shutil.copytree(built / "hello-world-t1-unicode-bom", project.path / "cases" / "text-editor" / "hello-world-t1-unicode-bom")
    _agents(project)
    script = "provider: script\nstrategy: implicit\noptions:\n  actions:\n    - \"pyautogui.press('backspace', presses=5)\"\n"
    (project.path / "agents" / "deleter.yaml").write_text(script)
    (project.path / "agents" / "saver.yaml").write_text(
        script + "    - \"pyautogui.hotkey('ctrl', 's')\"\n    - \"pyautogui.write('x')\"\n    - \"pyautogui.press('backspace')\"\n")
    attempts = {}
    for agent in ("deleter", "saver"):
        res = project.runpytest_subprocess(
            "--retrace-experiment=end-to-end", "--retrace-model=oracle", "--retrace-recovery-mode=explicit-none",
            "--retrace-error-detector=errs", "--retrace-recovery-detector=backs", f"--retrace-recovery-agent={agent}",
            f"--retrace-run={agent}", "-k", "mousepad-hello-world", "-p", "no:cacheprovider")
        res.assert_outcomes(passed=1)  # the oracle, resumed at step 1, types "world" and saves: solved either way
        run = project.path / "reports" / agent
        (record,) = [json.loads(line) for line in (run / "forward.jsonl").read_text().splitlines()]
        (attempts[agent],) = record["end_to_end"]["recoveries"]
        assert record["timings"]["probe_reads"] > 0  # the cost: the file read after each forward step
        row = json.loads((run / "summary.json").read_text())["end_to_end"][0]
        assert (row["recoveries"], row["reached"], row["reached_screen"]) == (1, int(agent == "deleter"), 1)
    deleter, saver = attempts["deleter"], attempts["saver"]
    assert (deleter["error_step"], deleter["step"], deleter["actions"], saver["actions"]) == (2, 1, 1, 4)
    assert deleter["r_o"] is True and deleter["probes"] == {"file ~/notes.txt": True} and deleter["reached"] is True
    assert saver["r_o"] is True and saver["ssim"] >= 0.99, saver
    assert saver["probes"] == {"file ~/notes.txt": False} and saver["reached"] is False
