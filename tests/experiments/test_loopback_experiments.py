"""Ideal recovery and end-to-end recovery with the shipped model configs through their official SDKs, pointed at
the loopback provider servers (pytest_retrace.testing): what the servers received (a continuation's resumed
history, the note after a recovery, the detectors' requests), what the records say (verdicts, usage), and that
no API key reaches any file of the run. The responders are stateless: each answers from the request alone
(which conversation it is, how many turns it has had), so the order tests run in does not matter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_retrace.cli import main
from pytest_retrace.testing import LoopbackServer
from pytest_retrace.testing.anthropic import anthropic_message, claude_computer, text_block
from pytest_retrace.testing.openai import computer_call, message_item, openai_response
from pytest_retrace.testing.openai_compat import chat_completion
from pytest_retrace.testing.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, Reply, Request

pytest_plugins = ["pytester"]

TASK = "mousepad-hello-world"  # "Hello world" into ~/notes.txt, saved
RESUMED = "The steps taken so far (1, oldest first)"
NOTE = "The environment has been restored to the state after step 1"  # endtoend.NOTE


def _texts(value: object) -> str:
    """Every text a request's messages carry, joined (its images left out)."""
    if isinstance(value, dict):
        return "\n".join(_texts(v) for k, v in value.items() if k not in ("source", "image_url"))
    if isinstance(value, list):
        return "\n".join(_texts(v) for v in value)
    return value if isinstance(value, str) else ""


def _leaks(root: Path, *keys: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and any(k.encode() in p.read_bytes() for k in keys)]


def _claude(request: Request) -> Reply:
    """Claude finishing the task from wherever it is: types "world", saves, says it is done. From the state
    after "Hello " that solves the task; from the start it saves "world" alone."""
    turns = sum(m["role"] == "assistant" for m in request.body["messages"])
    steps = [claude_computer("type", text="world"), claude_computer("key", text="ctrl+s")]
    if turns < len(steps):
        return Reply(anthropic_message([text_block(f"Step {turns + 1} of finishing the text."), steps[turns]]))
    return Reply(anthropic_message([text_block("The file is saved.")]))


@pytest.mark.desktop
def test_ideal_recovery_with_claude_through_its_sdk_resumes_from_the_saved_steps(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    agents = project.path / "agents"
    (agents / "errs.yaml").write_text("provider: scripted-error\noptions: {at: 2}\n")
    (agents / "backs.yaml").write_text("provider: scripted-recovery\noptions: {back: 1}\n")
    # the forward episode: stall-once types "Hello ", then presses Escape and stops (E = 2, R = E - 1 = 1)
    res = project.runpytest_subprocess("--retrace-model=stall-once", "--retrace-experiment=forward", "-k", TASK,
                                       "--retrace-run=fw", "-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    run = project.path / "reports" / "fw"
    assert main(["plan", str(run / "trajectories"), "--error-detector", "errs", "--recovery-detector", "backs",
                 "--agents", str(agents)]) == 0

    key = "sk-ant-api03-" + "IDEAL-do-not-leak-7d1e" * 2
    with LoopbackServer(_claude) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", key)
        res = project.runpytest_subprocess(
            "--retrace-experiment=ideal-recovery", f"--retrace-plan={run / 'plan.json'}", "--retrace-model=claude",
            "--retrace-k=1", "--retrace-recovery-steps=reset,E-1", "--retrace-run=ideal", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=1)
    assert server.errors == [] and all(r.error is None for r in server.requests), [r.error for r in server.requests]
    assert {r.provider for r in server.requests} == {ANTHROPIC} and len(server.requests) == 6  # 3 a continuation
    firsts = [r for r in server.requests if len(r.body["messages"]) == 1]
    resumed = [r for r in firsts if RESUMED in _texts(r.body["messages"])]
    assert len(firsts) == 2 and len(resumed) == 1
    # the E-1 continuation's first request: the task, the saved step (its screen before, its action and the
    # forward agent's rationale), then the current screen; the reset's: the task and the screen only
    opening = _texts(resumed[0].body["messages"])
    assert "Step 1:\npyautogui.write('Hello ')\nRationale: ground-truth step 1 of 3" in opening
    assert "Step 2:" not in opening and "press('escape')" not in opening.lower()
    assert "recovery agent" not in json.dumps(resumed[0].body["system"])
    fresh = next(r for r in firsts if r is not resumed[0])
    assert (len(resumed[0].images), len(fresh.images)) == (2, 1)

    records = {r["start"]["condition"]: r for r in
               (json.loads(line) for line in (project.path / "reports" / "ideal" / "forward.jsonl").read_text().splitlines())}
    assert (records["reset"]["verdict"], records["E-1"]["verdict"]) == ("unsolved", "solved")
    assert (records["reset"]["start"]["replays"], records["E-1"]["start"]["replays"]) == (0, 1)
    for record in records.values():
        assert record["model"] == "claude-sonnet-4.6" and record["steps_used"] == 2 and record["last_action"] == "DONE"
        assert (record["usage"]["calls"], record["usage"]["input_tokens"], record["usage"]["output_tokens"]) == (3, 300, 60)
    rows = {r["condition"]: r for r in json.loads((project.path / "reports" / "ideal" / "summary.json").read_text())
            ["ideal_recovery"] if r["domain"] is None}
    assert (rows["reset"]["success"], rows["E-1"]["success"]) == ([0.0], [1.0])
    assert _leaks(project.path, key) == []


class _GPT:
    """GPT-5.4 (Responses, the GA computer tool) as the forward agent and, with the recovery prompts, as the
    recovery agent; Qwen (chat completions) as both detectors. Forward from the start: "Hello ", then "xyz"
    (the mistake), then a save; resumed after a recovery: "world", a save. Recovery: three BackSpaces. The
    error detector names step 2 once it sees 2 steps; the recovery-step detector answers 1."""

    def __call__(self, request: Request) -> Reply:
        body = request.body
        if request.provider == OPENAI_CHAT:
            system = body["messages"][0]["content"]
            if "first step that was wrong" in system:
                found = "Error step: 2" if "its 2 steps" in system else "Error step: none"
                return Reply(chat_completion(f"Step 2 typed xyz, which the task does not ask for.\n{found}"))
            return Reply(chat_completion("Step 1 typed Hello, which was right.\nRecovery step: 1"))
        turn = sum(item.get("type") == "computer_call" for item in body["input"])
        if "You are a recovery agent" in body["instructions"]:
            steps = [[{"type": "keypress", "keys": ["BackSpace"]}] * 3]
        elif RESUMED in _texts(body["input"][0]):
            steps = [[{"type": "type", "text": "world"}], [{"type": "keypress", "keys": ["ctrl", "s"]}]]
        else:
            steps = [[{"type": "type", "text": "Hello "}], [{"type": "type", "text": "xyz"}],
                     [{"type": "keypress", "keys": ["ctrl", "s"]}]]
        if turn < len(steps):
            return Reply(openai_response([message_item(f"Turn {turn + 1}."), computer_call(actions=steps[turn])]))
        return Reply(openai_response([message_item("Done.")]))


@pytest.mark.desktop
def test_end_to_end_with_gpt_and_chat_detectors_through_their_sdks(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    openai_key, qwen_key = "sk-proj-" + "E2E-do-not-leak-90ab" * 2, "sk-" + "QWEN-do-not-leak-31cd" * 2
    with LoopbackServer(_GPT()) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", openai_key)
        monkeypatch.setenv("QWEN_PLUS_BASE_URL", server.openai_url)  # the shipped detectors' endpoint variable
        monkeypatch.setenv("DASHSCOPE_API_KEY", qwen_key)
        res = project.runpytest_subprocess(
            "--retrace-experiment=end-to-end", "--retrace-model=gpt", "--retrace-recovery-mode=none,explicit-none",
            "--retrace-run=e2e", "-k", TASK, "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=1)
    assert server.errors == [] and all(r.error is None for r in server.requests), [r.error for r in server.requests]
    chats = server.requests_for(OPENAI_CHAT)
    # the error detector after steps 1 and 2, the recovery-step detector once; then frozen for 5 steps
    assert len(chats) == 3 and all(c.body["model"] == "qwen3.6-plus" and c.body["temperature"] == 0.7 for c in chats)
    assert all(c.headers["authorization"] == f"Bearer {qwen_key}" for c in chats)
    assert [len(c.images) for c in chats] == [2, 3, 2]  # each step's screen before it (+ the screen now)
    responses = server.requests_for(OPENAI_RESPONSES)
    assert all(r.headers["authorization"] == f"Bearer {openai_key}" for r in responses)
    recovering = [r for r in responses if "You are a recovery agent" in r.body["instructions"]]
    assert len(recovering) == 2 and all(r.body["tools"] == [{"type": "computer"}] for r in recovering)
    # the forward agent after the recovery: its history cut at step 1 ("xyz" is not in it), then the note
    after = [r for r in responses if RESUMED in _texts(r.body["input"][0])]
    assert len(after) == 3
    opening = _texts(after[0].body["input"][0])
    assert "Step 1:\npyautogui.write('Hello ')\nRationale: Turn 1." in opening
    assert NOTE in opening and "Step 2:" not in opening and "xyz" not in opening
    assert opening.index(RESUMED) < opening.index(NOTE)

    records = {r["end_to_end"]["mode"]: r for r in
               (json.loads(line) for line in (project.path / "reports" / "e2e" / "forward.jsonl").read_text().splitlines())}
    none, recovered = records["none"], records["explicit-none"]
    assert (none["verdict"], none["end_to_end"]["detector_calls"], none["usage"]["calls"]) == ("unsolved", 0, 4)
    assert recovered["verdict"] == "solved" and recovered["model"] == "gpt-5.4"
    assert recovered["usage"]["calls"] == 5  # 2 turns before the detection, 3 after (world, save, done)
    e2e = recovered["end_to_end"]
    assert (e2e["detector_calls"], e2e["detector_usage"]["calls"], e2e["detector_usage"]["input_tokens"]) == (3, 3, 300)
    (attempt,) = e2e["recoveries"]
    assert (attempt["error_step"], attempt["step"], attempt["actions"], attempt["reached"]) == (2, 1, 3, True)
    assert attempt["usage"]["calls"] == 2 and "xyz" in attempt["error_rationale"]
    row = {r["mode"]: r for r in json.loads((project.path / "reports" / "e2e" / "summary.json").read_text())
           ["end_to_end"]}["explicit-none"]
    assert (row["solved"], row["rescued"], row["delta"], row["reached"]) == (1, 1, 1.0, 1)
    assert _leaks(project.path, openai_key, qwen_key) == []
