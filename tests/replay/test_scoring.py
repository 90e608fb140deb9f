"""Scoring a real agent fairly, end to end on real desktops (pytester sessions over the test cases):
the agent's own failures are failed recoveries that keep their n, the budget counts actions, strategies
and budgets are test parameters, an implicit agent is never told where the target was, and a dry run
calls nothing."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.helpers import REPO, groups, records, summary

pytest_plugins = ["pytester"]

# An agent that records the context it was given (as JSON) and then does nothing.
PROBE = '''
import json, os
from pytest_retrace.actions import Action
from pytest_retrace.agents import AgentTurn, register_agent

class Probe:
    name = "probe"
    privileged = False
    calls_per_turn = 0

    def __init__(self, config):
        pass

    def start(self, context):
        with open(os.environ["PROBE_OUT"], "a") as fh:
            fh.write(json.dumps({
                "strategy": context.strategy, "mode": context.mode, "budget": context.budget,
                "history": len(context.history), "target": context.target_screenshot is not None,
                "summary": context.summary, "fields": sorted(vars(context)),
            }) + "\\n")

    def act(self, observation):
        return AgentTurn([Action("done")])

    def close(self):
        pass

class Crashy(Probe):
    def start(self, context):
        pass

    def act(self, observation):
        raise KeyError("a bug in the agent")

register_agent("probe", Probe)
register_agent("crashy", Crashy)
'''


def agent(p: pytest.Pytester, name: str, provider: str = "script", **options: object) -> None:
    (p.path / "agents" / f"{name}.yaml").write_text(yaml.safe_dump({"provider": provider, "options": options}))


@pytest.mark.desktop
def test_the_agents_own_failures_are_failed_recoveries_that_keep_their_n(project: pytest.Pytester) -> None:
    """A reply over the caps (scroll(100000) once hit xdotool's 60 s timeout and became an infrastructure
    error) and an action the desktop refuses are the agent's failures. An exception from agent code is a
    bug, never a measurement: an error of kind agent-bug."""
    project.makeconftest(PROBE)
    agent(project, "hostile-scroll", actions=["pyautogui.scroll(100000)"])
    agent(project, "offscreen", actions=["pyautogui.click(5000, 10)"])
    agent(project, "sleepy", actions=["time.sleep(60)\ntime.sleep(60)\ntime.sleep(60)"])  # 3 min in one turn
    (project.path / "agents" / "crashy.yaml").write_text("provider: crashy\n")
    res = project.runpytest_subprocess("--retrace-model=hostile-scroll,offscreen,sleepy,crashy", "-k", "typo-short",
                                       "--retrace-run=own", "-p", "no:cacheprovider")
    res.assert_outcomes(failed=3, errors=1)
    by_model = {r["model"]: r for r in records(project, "own")}
    scroll, off, crash = by_model["hostile-scroll"], by_model["offscreen"], by_model["crashy"]
    assert scroll["verdict"] == "not_recovered" and scroll["invalid_steps"] == 1 and scroll["actions_used"] == 1
    [step] = [a for a in scroll["actions"] if a["stage"] == "recover" and a["action"] == "invalid"]
    assert "dy must be an integer in -100..100" in step["error"]
    assert off["verdict"] == "not_recovered" and off["failed_actions"] == 1
    assert "outside the 1280x800 screen" in next(a["error"] for a in off["actions"] if a.get("error"))
    sleepy = by_model["sleepy"]
    assert sleepy["verdict"] == "not_recovered" and sleepy["invalid_steps"] == 1
    assert any("waits or holds keys 180 s in total (limit 120 s)" in (a.get("error") or "") for a in sleepy["actions"])
    assert crash["verdict"] == "error" and crash["error"]["kind"] == "agent-bug"
    assert "act raised KeyError: 'a bug in the agent' at conftest.py:" in crash["error"]["message"]
    g = groups(summary(project, "own"))
    assert [(g[m]["n"], g[m]["errors"], g[m]["recovered"]) for m in ("hostile-scroll", "offscreen", "crashy")] == [
        (1, 0, 0), (1, 0, 0), (0, 1, 0)]
    res.stdout.fnmatch_lines(["*infrastructure error (agent-bug) at stage agent*KeyError*",
                              "*1 invalid repl(ies)*", "*1 action(s) the desktop could not complete*"])


@pytest.mark.desktop
def test_budgets_are_test_parameters_and_count_actions_not_turns(project: pytest.Pytester) -> None:
    # one turn of three key presses: at r=1 two are cut, at r=2 one, at r=3 none
    agent(project, "triple", actions=["pyautogui.press('a')\npyautogui.press('b')\npyautogui.press('c')"])
    res = project.runpytest_subprocess("--retrace-model=triple", "--retrace-budget", "1,2,3", "-k", "typo-short",
                                       "--retrace-run=budgets", "-p", "no:cacheprovider", "-v")
    res.assert_outcomes(failed=3)
    for r in (1, 2, 3):
        assert f"test_recovery[typo-short-triple-implicit-r{r}] FAILED" in res.stdout.str()
    got = {r["budget"]: (r["actions_used"], r["cut_actions"]) for r in records(project, "budgets")}
    assert got == {1: (1, 2), 2: (2, 1), 3: (3, 0)}
    assert [g["budget"] for g in summary(project, "budgets")["groups"]] == [1, 2, 3]


def add_builtin_case(p: pytest.Pytester, domain: str, case: str) -> None:
    """A case of the first built-in suite, kept as test data (tests/data/v1-cases)."""
    src = REPO / "tests" / "data" / "v1-cases" / domain
    shutil.copy(src / f"{case}.yaml", p.path / "cases" / "mousepad")
    shutil.copytree(src / case, p.path / "cases" / "mousepad" / case)


@pytest.mark.desktop
def test_strategies_are_test_parameters_and_one_undo_recovers(project: pytest.Pytester) -> None:
    add_builtin_case(project, "text-editor", "append-line-t1-stray-keys")  # one ctrl+z undoes its stray "zq"
    agent(project, "undo-once", actions=["pyautogui.hotkey('ctrl', 'z')"])
    res = project.runpytest_subprocess("--retrace-model=undo-once", "--retrace-strategy=implicit,explicit-none",
                                       "--retrace-budget=1,3", "-k", "stray-keys", "--retrace-run=strat",
                                       "-p", "no:cacheprovider", "-n", "2")
    res.assert_outcomes(passed=4)
    ids = sorted(r["nodeid"].split("[")[1] for r in records(project, "strat"))
    case = "append-line-t1-stray-keys-undo-once"
    assert ids == [f"{case}-explicit-none-r1]", f"{case}-explicit-none-r3]", f"{case}-implicit-r1]",
                   f"{case}-implicit-r3]"]


@pytest.mark.desktop
def test_each_strategy_gets_its_context_and_no_agent_learns_where_the_target_was(
        project: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    project.makeconftest(PROBE)
    (project.path / "agents" / "probe.yaml").write_text("provider: probe\n")
    out = tmp_path_factory.mktemp("probe") / "contexts.jsonl"
    monkeypatch.setenv("PROBE_OUT", str(out))
    res = project.runpytest_subprocess(
        "--retrace-model=probe", "--retrace-strategy=implicit,explicit-0E,explicit-0R,explicit-none",
        "-k", "overwrite-long", "-p", "no:cacheprovider")
    res.assert_outcomes(failed=4)
    case = yaml.safe_load((project.path / "cases" / "mousepad" / "overwrite-long.yaml").read_text())
    t_seed, d = case["t_seed"], len(case["perturbation"])
    seen = {c["strategy"]: c for c in map(json.loads, out.read_text().splitlines())}
    assert {s: (c["mode"], c["history"], c["target"]) for s, c in seen.items()} == {
        "implicit": ("forward", t_seed + d, False),  # 0-E, the forward prompt, no target
        "explicit-0E": ("recovery", t_seed + d, True),
        "explicit-0R": ("recovery", t_seed, True),
        "explicit-none": ("recovery", 0, True),
    }
    for context in seen.values():
        assert not any("seed" in f or "target_step" in f for f in context["fields"]), context["fields"]


def test_dry_run_lists_tests_and_their_model_calls_and_calls_nothing(project: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    res = project.runpytest_subprocess("--retrace-model=claude,noop", "--retrace-budget=1,3",
                                       "--retrace-strategy=implicit,explicit-context", "--retrace-dry-run",
                                       "-p", "no:cacheprovider")
    assert res.ret == 0
    # claude: 2 calls per turn (a reply and a re-ask) x (2r + 2) turns, + 1 for the contextualizer
    res.stdout.fnmatch_lines([line.replace("[", "[[]") for line in [
        "*retrace dry run: nothing was run and no model was called*",
        "*typo-short.yaml::test_recovery[typo-short-claude-sonnet-4.6-implicit-r1]  (at most 8 model calls)",
        "*typo-short.yaml::test_recovery[typo-short-claude-sonnet-4.6-explicit-context-r3]  (at most 17 model calls)",
        "*typo-short.yaml::test_recovery[typo-short-noop-implicit-r3]  (at most 0 model calls)",
        "48 test(s); at most 312 model calls in all",  # noop: only the contextualizer
    ]])
    assert not (project.path / "reports").exists()
    # without --retrace-dry-run a missing key is a usage error naming the variable, before any desktop starts
    res = project.runpytest_subprocess("--retrace-model=claude", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*claude-sonnet-4.6.yaml: options.api_key_env: the environment variable "
                              "ANTHROPIC_API_KEY is not set*"])
