"""The ideal-recovery experiment (--retrace-experiment=ideal-recovery, paper §4 and B.1): Success@K's estimator
and rows against hand computations, the scripted agents resumed from a past step, and the whole pipeline on
real desktops: a forward run whose agent goes wrong at step 2, its plan (scripted detectors), and K
continuations per condition, where returning to E - 1 solves every task at K = 1 and a reset never does; a
prefix that does not reproduce its recorded screen is excluded and counted, never scored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pytest_retrace.actions import Action
from pytest_retrace.agents import AgentContext, HistoryStep, ModelConfig, Observation, create_agent
from pytest_retrace.cli import main
from pytest_retrace.results.forward import Continuation, ForwardRecord
from pytest_retrace.results.success import bootstrap_interval, success_at_k, success_rows

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]

GT = [Action("click", x=10, y=20), Action("type", text="abc"), Action("key", keys=("enter",))]
SHOT = np.zeros((8, 8, 3), dtype=np.uint8)
DONE = Action("done").describe()


def test_success_at_k_is_the_unbiased_estimator() -> None:
    # 1 - C(n-c, k) / C(n, k), by hand
    assert success_at_k(5, 1, 1) == pytest.approx(0.2)
    assert success_at_k(5, 1, 2) == pytest.approx(1 - 6 / 10)
    assert success_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)
    assert success_at_k(5, 1, 5) == 1.0 and success_at_k(4, 0, 2) == 0.0 and success_at_k(2, 2, 1) == 1.0
    assert success_at_k(3, 1, 4) is None  # fewer continuations than K: not defined
    with pytest.raises(ValueError, match="needs 0 <= c <= n"):
        success_at_k(2, 3, 1)
    # the mean over k draws without replacement, by enumeration
    from itertools import combinations

    outcomes = [1, 0, 0, 1, 0]
    draws = list(combinations(outcomes, 2))
    assert success_at_k(5, 2, 2) == pytest.approx(sum(any(d) for d in draws) / len(draws))


def test_the_bootstrap_interval_holds_the_mean_and_is_the_same_every_time() -> None:
    values = [0.0, 1.0, 0.5, 1.0, 0.0, 0.2]
    low, high = bootstrap_interval(values)
    assert low < np.mean(values) < high and (low, high) == bootstrap_interval(values)
    assert 0.0 <= low and high <= 1.0
    assert bootstrap_interval([0.4]) == (0.4, 0.4) and bootstrap_interval([1.0, 1.0]) == (1.0, 1.0)


def _continuation(episode: str, condition: str, k: int, verdict: str, *, model: str = "m", step: int = 1,
                  domain: str = "d", samples: int = 3) -> ForwardRecord:
    start = Continuation(episode=episode, forward_model="fw", condition=condition, step=step, error_step=2, sample=k,
                         samples=samples, replays=1 if step else 0)
    return ForwardRecord(nodeid=f"p::test_forward[{episode}-{condition}-k{k}-{model}]", task=episode, domain=domain,
                         source=episode, model=model, max_steps=50, finished_at="now", verdict=verdict,  # type: ignore[arg-type]
                         start=start, error=None if verdict != "error" else {"stage": "reconstruct", "kind": "desync",
                                                                             "message": "off"})


def test_success_rows_match_a_hand_computation() -> None:
    records = [
        # E-1: episode a 3 reached, 1 solved; episode b 2 reached (1 desync), 2 solved; episode c none reached
        _continuation("a", "E-1", 0, "solved"), _continuation("a", "E-1", 1, "unsolved"),
        _continuation("a", "E-1", 2, "unsolved"),
        _continuation("b", "E-1", 0, "solved", domain="e", step=3), _continuation("b", "E-1", 1, "error", domain="e", step=3),
        _continuation("b", "E-1", 2, "solved", domain="e", step=3),
        _continuation("c", "E-1", 0, "error"), _continuation("c", "E-1", 1, "error"), _continuation("c", "E-1", 2, "error"),
        # reset: nothing solved
        *(_continuation(e, "reset", k, "unsolved", step=0) for e in "ab" for k in range(3)),
        _continuation("a", "E-1", 0, "unsolved"),  # a rerun of a finished test: ignored
    ]
    rows = success_rows(records)
    overall = {r.condition: r for r in rows if r.domain is None}
    assert [r.condition for r in rows if r.domain is None] == ["reset", "E-1"]  # the paper's order
    e1 = overall["E-1"]
    assert (e1.instances, e1.excluded, e1.continuations, e1.solved, e1.errors) == (2, 1, 5, 3, 4)
    assert e1.error_kinds == {"reconstruct/desync": 4} and e1.counted == [2, 2, 1]
    # K=1: a 1/3, b 2/2 -> mean 2/3; K=2: a 1 - C(2,2)/C(3,2) = 2/3, b 1 -> 5/6; K=3: only a (b has 2) -> 1
    assert e1.success == [pytest.approx(2 / 3, abs=1e-6), pytest.approx(5 / 6, abs=1e-6), 1.0]
    assert e1.mean_step == pytest.approx((1 + 3 + 1) / 3, abs=1e-3)
    assert overall["reset"].success == [0.0, 0.0, 0.0] and overall["reset"].ci_high == [0.0, 0.0, 0.0]
    by_domain = {(r.condition, r.domain): r for r in rows if r.domain is not None}
    assert by_domain[("E-1", "e")].success == [1.0, 1.0, None] and by_domain[("E-1", "d")].excluded == 1


def _context(history: int = 0) -> AgentContext:
    return AgentContext(instruction="do it", mode="forward", strategy="implicit", budget=50, screen=(8, 8),
                        ground_truth=list(GT), history=[HistoryStep(SHOT, a) for a in GT[:history]])


def _play(agent, context: AgentContext, turns: int = 4) -> list[str]:
    agent.start(context)
    return [a.describe() for _ in range(turns) for a in agent.act(Observation(SHOT, 0, 50)).actions]


def test_scripted_agents_resumed_go_on_from_the_step_after_the_replayed_ones() -> None:
    escape = {"action": "key", "keys": ["escape"]}
    repeat = create_agent(ModelConfig("s", "stall", options={"at": 2, "wrong": escape}))
    once = create_agent(ModelConfig("s1", "stall", options={"at": 2, "wrong": escape, "on_resume": "recover"}))
    wrong = Action("key", keys=("escape",)).describe()
    assert _play(once, _context()) == [GT[0].describe(), wrong, DONE, DONE]  # from the start: goes wrong at 2
    assert _play(once, _context(1)) == [GT[1].describe(), GT[2].describe(), DONE, DONE]  # resumed after step 1
    assert _play(repeat, _context(1)) == [wrong, DONE, DONE, DONE]  # `repeat`: the same mistake again
    oracle = create_agent(ModelConfig("oracle", "oracle"))
    assert _play(oracle, _context(2)) == [GT[2].describe(), DONE, DONE, DONE]
    # random-fail: each continuation (sample) is its own draw, a forward run's (sample 0) the one it always was
    rf = create_agent(ModelConfig("rf", "random-fail", options={"seed": 1, "p": 0.5}))
    plain = [rf.wrong_step(_context()) for _ in range(3)]  # type: ignore[attr-defined]
    draws = {rf.wrong_step(AgentContext(**{**_context().__dict__, "sample": k})) for k in range(30)}  # type: ignore[attr-defined]
    assert len(set(plain)) == 1 and draws == {1, 2, 3, None}
    resumed = {rf.wrong_step(AgentContext(**{**_context(2).__dict__, "sample": k})) for k in range(30)}  # type: ignore[attr-defined]
    assert resumed == {3, None}  # never a step already replayed


def _agents(project: pytest.Pytester) -> None:
    agents = project.path / "agents"
    (agents / "errs.yaml").write_text("provider: scripted-error\noptions: {at: 2}\n")
    (agents / "backs.yaml").write_text("provider: scripted-recovery\noptions: {back: 1}\n")


TASKS = "mousepad-hello-world or gnumeric-update-pear"


def test_an_ideal_recovery_dry_run_counts_each_continuations_calls(project: pytest.Pytester) -> None:
    from pytest_retrace.agents import agent_factory, load_model_config
    from pytest_retrace.experiments.detectors import create_detector
    from pytest_retrace.experiments.plan import make_plan
    from tests.experiments.test_plan import _episodes

    base = ("--retrace-experiment=ideal-recovery", "--retrace-model=claude", "--retrace-dry-run")
    res = project.runpytest_subprocess(*base)
    res.stderr.fnmatch_lines(["*--retrace-experiment=ideal-recovery needs --retrace-plan FILE*"])
    (project.path / "bad.json").write_text('{"schema_version": 1, "seed": 0}')
    res = project.runpytest_subprocess(*base, "--retrace-plan=bad.json")
    res.stderr.fnmatch_lines(["*--retrace-plan: *bad.json: trajectories: Field required*"])
    root = project.path / "run" / "trajectories"
    _episodes(root)  # one failed episode of 3 steps (and a solved one, and one that did nothing)
    errors = create_detector("error", ModelConfig("errs", "scripted-error", options={"at": 3}))
    backs = create_detector("recovery", ModelConfig("backs", "scripted-recovery", options={"back": 2}))
    make_plan(root, errors, backs, save=project.path / "run" / "plan.json")
    res = project.runpytest_subprocess(*base, "--retrace-plan=run/plan.json", "--retrace-recovery-steps=E-2")
    res.stderr.fnmatch_lines(["*--retrace-recovery-steps: E-2 not one of reset, E-1, E-random, R_LLM*"])
    res = project.runpytest_subprocess(*base, "--retrace-plan=run/plan.json", "--retrace-recovery-steps=reset,E-1",
                                       "--retrace-k=3", "--retrace-max-steps=20")
    per_turn = agent_factory(load_model_config("claude", [REPO / "agents"])).calls_per_turn
    # a continuation from step R has 20 - R steps: at most 2 (20 - R) + 2 turns; reset R = 0, E-1 R = 2
    total = 3 * per_turn * (2 * 20 + 2) + 3 * per_turn * (2 * 18 + 2)
    res.stdout.fnmatch_lines([f"*test_forward?mousepad-hello-world-failed-reset-k1-claude*-s20? *(at most "
                              f"{per_turn * 42} model calls)",
                              f"*test_forward?mousepad-hello-world-failed-E-1-k3-claude*-s20? *(at most "
                              f"{per_turn * 38} model calls)", f"6 test(s); at most {total} model calls in all"])


@pytest.mark.desktop
def test_returning_to_e_minus_1_solves_what_a_reset_does_not(project: pytest.Pytester,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _agents(project)
    common = ("-n", "2", "-p", "no:cacheprovider", "-k", TASKS)
    res = project.runpytest_subprocess("--retrace-model=stall-once", "--retrace-experiment=forward",
                                       "--retrace-run=fw", *common)
    res.assert_outcomes(failed=2)
    run = project.path / "reports" / "fw"
    assert main(["plan", str(run / "trajectories"), "--error-detector", "errs", "--recovery-detector", "backs",
                 "--agents", str(project.path / "agents"), "--seed", "3"]) == 0
    plan = json.loads((run / "plan.json").read_text())
    assert plan["trajectories"] == "trajectories" and len(plan["annotated"]) == 2
    assert {a["error_step"] for a in plan["annotated"]} == {2}
    # one episode's recorded screen after step 1 no longer what replaying step 1 shows: its R = 1 starts are
    # excluded and counted, never scored
    spoiled = next(a for a in plan["annotated"] if a["task"] == "gnumeric-update-pear")
    traj = [json.loads(line) for line in (run / "trajectories" / spoiled["episode"] / "traj.jsonl").read_text().splitlines()]
    shot = run / "trajectories" / spoiled["episode"] / traj[0]["screenshot_file"]
    pixels = np.asarray(Image.open(shot).convert("RGB")).copy()
    pixels[300:340, 300:340] = (255, 0, 255)
    Image.fromarray(pixels).save(shot)

    args = ("--retrace-experiment=ideal-recovery", f"--retrace-plan={run / 'plan.json'}", "--retrace-model=stall-once",
            "--retrace-k=2", "--retrace-run=ideal", "--retrace-attempts=1", "-n", "2", "-p", "no:cacheprovider")
    dry = project.runpytest_subprocess(*args, "--retrace-dry-run")
    dry.stdout.fnmatch_lines(["*plan.json::test_forward?mousepad-hello-world-stall-once-E-1-k1-stall-once-s50?*",
                              "16 test(s); at most 0 model calls in all"])
    res = project.runpytest_subprocess(*args)
    ideal = project.path / "reports" / "ideal"
    records = [json.loads(line) for line in (ideal / "forward.jsonl").read_text().splitlines()]
    assert len(records) == 16 and all(r["start"] is not None for r in records)
    by = {(r["task"], r["start"]["condition"], r["start"]["sample"]): r for r in records}
    for k in range(2):
        assert by[("mousepad-hello-world", "reset", k)]["verdict"] == "unsolved"
        assert by[("mousepad-hello-world", "E-1", k)]["verdict"] == "solved"
        assert by[("mousepad-hello-world", "E-1", k)]["start"]["replays"] == 1
        assert by[("gnumeric-update-pear", "reset", k)]["verdict"] == "unsolved"
        spoilt = by[("gnumeric-update-pear", "E-1", k)]
        assert spoilt["verdict"] == "error" and spoilt["error"]["kind"] == "desync", spoilt["error"]
    summary = json.loads((ideal / "summary.json").read_text())
    rows = {r["condition"]: r for r in summary["ideal_recovery"] if r["domain"] is None}
    assert rows["reset"]["success"] == [0.0, 0.0] and rows["reset"]["instances"] == 2
    assert rows["E-1"]["success"] == [1.0, 1.0] and (rows["E-1"]["instances"], rows["E-1"]["excluded"]) == (1, 1)
    assert rows["E-1"]["errors"] == 2 and rows["R_LLM"]["success"] == [1.0, 1.0]  # R_LLM = E - 1 here
    randoms = {a["task"]: a["recovery_steps"]["E-random"] for a in plan["annotated"]}
    hello = 1.0 if randoms["mousepad-hello-world"] == 1 else 0.0  # E-random drew 0 (a reset) or 1
    pear = randoms["gnumeric-update-pear"] == 0  # R = 0 reaches its state; R = 1 is the spoilt screen
    assert rows["E-random"]["success"][0] == pytest.approx((hello + 0.0) / 2 if pear else hello)
    res.stdout.fnmatch_lines(["*retrace ideal-recovery summary (Success@K)*", "model*R*instances*S@1*S@2*",
                              "stall-once*reset*2*0*0.0%*0.0%*", "stall-once*E-1*1*1*1*2*100.0%*100.0%*"])
    md = (ideal / "summary.md").read_text()
    assert "## Success@K per condition" in md and "plots/success_at_k.png" in md
    assert (ideal / "plots" / "success_at_k.png").is_file() and not (ideal / "plots" / "rates.png").exists()
    capsys.readouterr()
    assert main(["summary", str(ideal / "forward.jsonl")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:4] == ["model", "R", "instances", "mean"] and len(printed) == 5
    # resumed: the continuations with a verdict do not run again, the excluded ones do
    again = project.runpytest_subprocess(*args, "--retrace-resume=ideal")
    again.stdout.fnmatch_lines([f"*2 workers [[]{sum(r['verdict'] == 'error' for r in records)} items[]]*"])
