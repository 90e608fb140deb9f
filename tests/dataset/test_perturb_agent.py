"""The perturbation agent's budget in `retrace build` (paper A.1, docs/paper.md row 9): under `--protocol paper`
a look spends a step and a model config's `perturbation.extra_steps` adds to d (GPT-5.4: 1, for the screenshot
it takes first); under the default protocol a look is free. A GPT-5.4-like model speaks through the official
OpenAI SDK to the loopback server, on a real desktop."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from pytest_retrace.agents import AgentConfigError, load_model_config
from pytest_retrace.dataset.perturb_agent import step_budget
from pytest_retrace.dataset.pipeline import BuildConfig, Builder
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import load_case
from pytest_retrace.testing import (
    LoopbackServer,
    Reply,
    Request,
    computer_call,
    message_item,
    openai_response,
)
from tests.helpers import REPO

TASK = {
    "id": "mini-files", "instruction": "Create ~/out/x.txt containing 'x'.", "domain": "files",
    "setup": [{"type": "launch", "command": ["xterm", "-fa", "DejaVu Sans Mono", "-fs", "11", "-bg", "white",
                                             "-fg", "black"], "window": "XTerm"}],
    "evaluator": {"func": "compare_text_file", "result": {"type": "vm_file", "path": "~/out/x.txt"},
                  "expected": {"type": "rule", "rules": {"text": "x\n"}}},
}
TRAJECTORY = ["pyautogui.write('mkdir -p ~/out && cd ~/out && clear\\n')",
              "pyautogui.write('echo x > x.txt && clear\\n')", "pyautogui.write('cat x.txt && clear\\n')"]
MISTAKE = "cd /tmp && clear\n"  # hidden state: only R_TC sees it (the remaining `echo x > x.txt` misses ~/out)


def gpt54_like(request: Request) -> Reply:
    """GPT-5.4 as A.1 describes it: a screenshot first, whatever it was told, then a real action, then done.
    Where it is in its episode is read from the request: one computer_call_output per answered call."""
    answered = sum(item.get("type") == "computer_call_output" for item in request.body["input"])
    if answered == 0:
        return Reply(openai_response([computer_call(actions=[{"type": "screenshot"}])]))
    if answered == 1:
        return Reply(openai_response([message_item("Change to the wrong directory."),
                                      computer_call(actions=[{"type": "type", "text": MISTAKE}])]))
    return Reply(openai_response([message_item("I changed to /tmp instead of ~/out.")]))


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    """The shipped GPT-5.4 config (its rule: extra_steps 1), the same without the rule, and a script with the
    rule that spends its extra step on a second action."""
    out = tmp_path / "agents"
    shutil.copytree(REPO / "agents" / "prompts", out / "prompts")  # a config reads its prompts beside it
    shipped = yaml.safe_load((REPO / "agents" / "gpt-5.4.yaml").read_text())
    assert shipped["perturbation"] == {"extra_steps": 1}
    (out / "gpt54.yaml").write_text(yaml.safe_dump({**shipped, "name": "gpt54"}))
    (out / "gpt54-norule.yaml").write_text(yaml.safe_dump(
        {k: v for k, v in shipped.items() if k != "perturbation"} | {"name": "gpt54-norule"}))
    (out / "twice.yaml").write_text(yaml.safe_dump({"provider": "script", "perturbation": {"extra_steps": 1},
                                                    "options": {"actions": [f"pyautogui.write({MISTAKE!r})",
                                                                            "pyautogui.press('shift')"]}}))
    return out


@pytest.mark.desktop
def test_the_paper_protocol_counts_the_look_and_gpt54s_rule_pays_for_it(
        env: XvfbEnvironment, tmp_path: Path, agents: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    (rollouts / "mini.yaml").write_text(yaml.safe_dump({"task": TASK, "trajectory": TRAJECTORY}, sort_keys=False))
    catalogue = tmp_path / "catalogue.yaml"  # no entry for the task's domain: only the agents make mistakes
    catalogue.write_text("- {name: other, domains: [text-editor], horizon: short, intent: visible, mistake: m,\n"
                         "   actions: [\"pyautogui.write('zz')\"]}\n")
    cfg = BuildConfig(work=tmp_path / "work", out=tmp_path / "cases", scripted=[rollouts], replays=2,
                      seeds_per_trajectory=1, seed=1, catalogue=catalogue, agent_dirs=[agents],
                      perturb_agents=["gpt54", "gpt54-norule", "twice"], protocol="paper")
    log: list[str] = []
    with LoopbackServer(gpt54_like) as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        Builder(cfg, [env], log=log.append).run()
        paper_requests = list(server.requests)
        # per target, short (d = 1) and long (d = 5): with the rule the look and the action fit in 1 + 1 steps;
        # without it the look spends the short budget; the script's extra step went to a second action (> d)
        text = "\n".join(log)
        assert ("[perturb] kept 4; excluded perturbation agent took more than d actions: 1, "
                "perturbation budget spent on looks: 1") in text, text
        assert ("agent-gpt54-norule-short: perturbation budget spent on looks (paper protocol: 1 step(s) = d 1 "
                "+ extra_steps 0, a look spends one: 1 turn(s), 0 action(s)), excluded") in text
        assert ("agent-twice-short: perturbation agent took more than d actions (paper protocol: 2 step(s) = d 1 "
                "+ extra_steps 1, a look spends one: 2 turn(s), 2 action(s)), excluded") in text
        # gpt54: short 2 calls (look, act), long 3 (look, act, done); norule: short 1 (look), long 3
        assert len(paper_requests) == 9 and all(r.error is None for r in paper_requests)
        [case] = [load_case(p) for p in cfg.out.rglob("*.yaml")]  # the others are the same mistake: duplicates
        assert case.metadata["perturbation"] == "agent-gpt54-short" and case.d == 1
        assert [a.text for a in case.perturbation] == [MISTAKE]
        assert case.metadata["kind"] == "hidden-state"
        assert case.metadata["perturbation_agent"] == {
            "model": "gpt54", "protocol": "paper", "rule": {"extra_steps": 1}, "budget": 2, "turns": 2,
            "steps_used": 2, "actions": 1}

        # the default protocol: a look is free, so the rule is not applied and d actions are left after it
        log.clear()
        # (the config keeps its rule: the record says so, and that the budget was d actions all the same)
        default = replace(cfg, protocol="default", perturb_agents=["gpt54"])
        Builder(default, [env], log=log.append).run(start="perturb")
        text = "\n".join(log)
        assert "[perturb] kept 2\n" in text + "\n", text
        assert len(server.requests) - len(paper_requests) == 5  # short 2 (look, act), long 3 (look, act, done)
    cases = [load_case(p) for p in cfg.out.rglob("*.yaml")]
    [case] = [c for c in cases if c.metadata["perturbation"] == "agent-gpt54-short"]
    assert case.d == 1 and [a.text for a in case.perturbation] == [MISTAKE]
    assert case.metadata["perturbation_agent"] == {
        "model": "gpt54", "protocol": "default", "rule": {"extra_steps": 1}, "budget": 1, "turns": 2,
        "steps_used": 1, "actions": 1}


def test_the_budget_per_protocol_and_the_shipped_rules() -> None:
    gpt = load_model_config("gpt", [REPO / "agents"])  # the alias resolves to gpt-5.4.yaml and its rule
    assert (gpt.name, gpt.perturbation.extra_steps) == ("gpt-5.4", 1)
    paper = step_budget("paper", 1, gpt)
    assert (paper.steps, paper.count_looks, paper.extra_steps) == (2, True, 1)
    default = step_budget("default", 5, gpt)
    assert (default.steps, default.count_looks, default.extra_steps) == (5, False, 0)
    for name in ("claude", "ui-tars", "qwen", "evocua"):  # only GPT-5.4 has the rule (A.1)
        config = load_model_config(name, [REPO / "agents"])
        assert step_budget("paper", 1, config).steps == 1, name
    with pytest.raises(ValueError, match="protocol: 'papers' is not one of default, paper"):
        step_budget("papers", 1, gpt)


@pytest.mark.parametrize(("value", "message"), [
    ("2", r"perturbation: must be a mapping \(e\.g\. \{extra_steps: 1\}\), got 2"),
    ("{extra_steps: -1}", r"perturbation\.extra_steps: Input should be greater than or equal to 0, got -1"),
    ("{extra_steps: 6}", r"perturbation\.extra_steps: Input should be less than or equal to 5, got 6"),
    ("{extra_steps: one}", r"perturbation\.extra_steps: Input should be a valid integer, got 'one'"),
    ("{extra_steps: true}", r"perturbation\.extra_steps: Input should be a valid integer, got True"),
    ("{extra_step: 1}", r"perturbation\.extra_step: Extra inputs are not permitted, got 1"),
])
def test_a_bad_perturbation_rule_names_the_file_and_the_field(tmp_path: Path, value: str, message: str) -> None:
    (tmp_path / "m.yaml").write_text(f"provider: openai\nperturbation: {value}\n")
    with pytest.raises(AgentConfigError, match=rf"m\.yaml: {message}$"):
        load_model_config("m", [tmp_path])


def test_an_alias_file_cannot_carry_a_rule(tmp_path: Path) -> None:
    """The rule belongs to the config the alias names: one place, whichever name the build is given."""
    (tmp_path / "a.yaml").write_text("alias: b\nperturbation: {extra_steps: 1}\n")
    with pytest.raises(AgentConfigError, match=r"a\.yaml: an alias file holds only `alias: NAME`"):
        load_model_config("a", [tmp_path])
