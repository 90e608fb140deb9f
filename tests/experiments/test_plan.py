"""The detectors and the ideal-recovery run plan: scripted detectors and a chat model behind the loopback
OpenAI-compatible server (its official SDK, its wire format), the plan's conditions against a hand computation,
invalid answers excluded and counted, and the plan reused as it is on a rerun."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_retrace.actions import Action
from pytest_retrace.agents import ModelConfig
from pytest_retrace.cli import main
from pytest_retrace.evaluators import Evaluation
from pytest_retrace.experiments.detectors import create_detector
from pytest_retrace.experiments.forward import ForwardResult
from pytest_retrace.experiments.plan import Plan, PlanError, make_plan, random_step
from pytest_retrace.experiments.trajectory import episode_dir, read_episode, write_episode
from pytest_retrace.replay.cases import load_case
from pytest_retrace.replay.result import RecoveryResult, StepLog
from pytest_retrace.testing.openai_compat import chat_completion
from pytest_retrace.testing.responders import Script
from pytest_retrace.testing.server import LoopbackServer

REPO = Path(__file__).resolve().parents[2]
CASE = load_case(REPO / "tests" / "data" / "cases" / "mousepad" / "typo-short.yaml")


def _episodes(root: Path) -> dict[str, Path]:
    """Three episodes of one task: failed after 3 actions, solved, and failed without acting."""
    out = {}
    for model, score, actions in (("failed", 0.0, 3), ("solved", 1.0, 2), ("idle", 0.0, 0)):
        drive = RecoveryResult("t", 0.0, budget=50)
        drive.steps = [StepLog("recover", Action("type", text=f"x{i}").to_dict(), 0.1, f"typing {i}")
                       for i in range(actions)] + [StepLog("recover", {"action": "done"}, 0.0, "")]
        frames = [np.full((6, 6, 3), i + 1, dtype=np.uint8) for i in range(actions)]
        result = ForwardResult(CASE.task.id, 50, drive, initial=np.zeros((6, 6, 3), np.uint8), frames=frames,
                               evaluation=Evaluation(score, score >= 1, []), last_action="DONE")
        out[model] = write_episode(episode_dir(root, model, CASE.task.domain, CASE.task.id), CASE.task, CASE.dir, result)
    return out


def _scripted(tmp_path: Path, at: int = 2, back: int = 1) -> tuple[object, object]:
    e = create_detector("error", ModelConfig("errs", "scripted-error", options={"at": at}))
    r = create_detector("recovery", ModelConfig("backs", "scripted-recovery", options={"back": back}))
    return e, r


def test_an_episode_reads_back_with_the_screen_before_each_action(tmp_path: Path) -> None:
    paths = _episodes(tmp_path)
    episode = read_episode(paths["failed"])
    assert not isinstance(episode, str)
    assert [s.action.text for s in episode.history] == ["x0", "x1", "x2"] and episode.score == 0.0
    assert [int(s.screenshot[0, 0, 0]) for s in episode.history] == [0, 1, 2]  # before: initial, after 1, after 2
    assert int(episode.final[0, 0, 0]) == 3 and episode.history[1].rationale == "typing 1"


def test_the_plan_fixes_each_condition_once_and_a_rerun_keeps_it(tmp_path: Path) -> None:
    root = tmp_path / "trajectories"
    _episodes(root)
    errors, backs = _scripted(tmp_path)
    plan = make_plan(root, errors, backs, seed=7, save=tmp_path / "plan.json")
    assert (len(plan.annotated), plan.solved) == (1, 1)
    assert [(e.episode.split("/")[-3], e.reason) for e in plan.excluded] == [
        ("idle", "the agent took no action: no step to return to")]
    (item,) = plan.annotated
    assert (item.task, item.model, item.steps, item.error_step) == (CASE.task.id, "failed", 3, 2)
    assert item.recovery_steps == {"reset": 0, "E-1": 1, "E-random": random_step(7, item.episode, 2), "R_LLM": 1}
    assert item.recovery_steps["E-random"] in (0, 1)
    assert {random_step(s, "ep", 5) for s in range(40)} == {0, 1, 2, 3, 4}  # uniform over 0..E-1
    # a rerun: detectors of the same names now answering otherwise change nothing already annotated
    again = make_plan(root, *_scripted(tmp_path, at=3, back=2), seed=7, previous=Plan.read(tmp_path / "plan.json"))
    assert again.annotated == plan.annotated and again.excluded == plan.excluded
    with pytest.raises(PlanError, match="made with error detector errs, recovery detector backs and seed 7"):
        make_plan(root, errors, backs, seed=8, previous=plan)
    (tmp_path / "bad.json").write_text(json.dumps({**plan.model_dump(), "schema_version": 9}))
    with pytest.raises(PlanError, match=r"bad\.json: plan schema_version 9: this version reads 1 only"):
        Plan.read(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text(json.dumps({**plan.model_dump(), "seed": "seven"}))
    with pytest.raises(PlanError, match=r"bad\.json: seed: Input should be a valid integer"):
        Plan.read(tmp_path / "bad.json")


def test_chat_model_detectors_through_the_loopback_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "trajectories"
    _episodes(root)
    replies = [chat_completion("Step 1 typed x0, fine. Step 2 typed the wrong text.\nError step: 2"),
               chat_completion("Steps before 2 are intact.\nRecovery step: 1")]
    with LoopbackServer(Script(replies)) as server:
        monkeypatch.setenv("DETECTOR_KEY", "sk-test")
        options = {"model": "qwen3.6-plus", "base_url": server.openai_url, "api_key_env": "DETECTOR_KEY",
                   "temperature": 0.7, "prompts_dir": str(REPO / "agents" / "prompts")}
        errors = create_detector("error", ModelConfig("qwen-errors", "openai-compat", options=options))
        backs = create_detector("recovery", ModelConfig("qwen-backs", "openai-compat", options=options))
        plan = make_plan(root, errors, backs)
        sent = [r.body for r in server.requests]
    (item,) = plan.annotated
    assert item.error_step == 2 and item.recovery_steps["R_LLM"] == 1
    assert item.error_decision["inputs"] == {"steps": 3, "images": 4, "characters": item.error_decision["inputs"]["characters"]}
    assert "Step 2 typed the wrong text" in item.error_decision["rationale"]
    assert item.recovery_decision["inputs"]["steps"] == 2  # shown the steps up to E only
    assert [b["temperature"] for b in sent] == [0.7, 0.7] and all(b["model"] == "qwen3.6-plus" for b in sent)
    system = sent[0]["messages"][0]["content"]
    assert "first step that was wrong" in system and "3 steps" in system
    images = [p for p in sent[0]["messages"][1]["content"] if p["type"] == "image_url"]
    assert len(images) == 4 and images[0]["image_url"]["url"].startswith("data:image/png;base64,")


def test_an_answer_naming_no_valid_step_is_excluded_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _episodes(tmp_path / "trajectories")
    history = read_episode(paths["failed"]).history  # type: ignore[union-attr]
    with LoopbackServer(Script([chat_completion("Error step: 9"), chat_completion("I am not sure."),
                                chat_completion("All fine.\nError step: none")])) as server:
        monkeypatch.setenv("DETECTOR_KEY", "sk-test")
        options = {"model": "m", "base_url": server.openai_url, "api_key_env": "DETECTOR_KEY",
                   "prompts_dir": str(REPO / "agents" / "prompts")}
        errors = create_detector("error", ModelConfig("e", "openai-compat", options=options))
        answers = [errors.first_error("task", history, None) for _ in range(3)]
    assert [(a.step, a.valid) for a in answers] == [(None, False), (None, False), (None, True)]
    assert answers[0].reply == "Error step: 9"


def test_retrace_plan_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "run" / "trajectories"
    _episodes(root)
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "errs.yaml").write_text("provider: scripted-error\noptions: {at: 3}\n")
    (agents / "backs.yaml").write_text("provider: scripted-recovery\noptions: {back: 3}\n")
    args = [str(root), "--error-detector", "errs", "--recovery-detector", "backs", "--agents", str(agents)]
    assert main(["plan", *args]) == 0
    out = capsys.readouterr().out
    assert "1 failed episode(s) annotated, 1 excluded, 1 solved" in out
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["annotated"][0]["recovery_steps"] == {"reset": 0, "E-1": 2, "E-random": plan["annotated"][0][
        "recovery_steps"]["E-random"], "R_LLM": 0}
    wrong = [str(root), "--error-detector", "backs", "--recovery-detector", "backs", "--agents", str(agents)]
    assert main(["plan", *wrong, "--out", str(tmp_path / "other.json")]) == 2  # a recovery detector for errors
    assert "provider scripted-recovery is not an error-step detector" in capsys.readouterr().err
