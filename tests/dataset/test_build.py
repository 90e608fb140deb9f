"""`retrace build` on a real desktop, end to end on a small input: drops with reasons, transition-
consistent filtering, measured kinds, written cases that load, and resumable stages."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pytest_retrace.agents.baselines import ScriptAgent
from pytest_retrace.dataset.catalogue import load_catalogue
from pytest_retrace.dataset.pipeline import BuildConfig, Builder
from pytest_retrace.dataset.trajectory import Dropped, load_scripted, rollout_agent
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import Task, load_case

XTERM = {"type": "launch", "command": ["xterm", "-fa", "DejaVu Sans Mono", "-fs", "11", "-bg", "white",
                                       "-fg", "black"], "window": "XTerm"}
TASK = {
    "id": "mini-files", "instruction": "Create ~/out/x.txt containing 'x'.", "domain": "files",
    "setup": [XTERM],
    "evaluator": {"func": "compare_text_file", "result": {"type": "vm_file", "path": "~/out/x.txt"},
                  "expected": {"type": "rule", "rules": {"text": "x\n"}}},
}
GOOD = ["pyautogui.write('mkdir -p ~/out && cd ~/out && clear\\n')", "pyautogui.write('echo x > x.txt && clear\\n')"]
CATALOGUE = """
- {name: wrong-directory, domains: [files], horizon: short, intent: hidden-state, mistake: cd elsewhere,
   actions: ["pyautogui.write('cd /tmp && clear\\\\n')"]}
- {name: listing-left, domains: [files], horizon: short, intent: visual-only, mistake: output left,
   actions: ["pyautogui.write('help | head -40\\\\n')"]}
- {name: stray-keys, domains: [files], horizon: short, intent: visible, mistake: typo, actions: ["pyautogui.write('zz')"]}
"""



def write_rollout(root: Path, name: str, trajectory: list, task: dict = TASK) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"task": task, "trajectory": trajectory}, sort_keys=False))
    return path


def test_scripted_rollouts_are_normalised_or_dropped_with_a_reason(tmp_path: Path) -> None:
    good = load_scripted(write_rollout(tmp_path, "good", GOOD))
    assert not isinstance(good, Dropped) and len(good.steps) == 2
    multi = load_scripted(write_rollout(tmp_path, "multi", ["pyautogui.write('a'); pyautogui.write('b')"]))
    assert isinstance(multi, Dropped) and "2 actions in one step" in multi.reason
    missing = load_scripted(write_rollout(tmp_path, "missing", [GOOD[0], None]))
    assert isinstance(missing, Dropped) and "step 1: missing action" in missing.reason
    evil = load_scripted(write_rollout(tmp_path, "evil", ["import os; os.system('touch /tmp/x')"]))
    assert isinstance(evil, Dropped) and "not allowed" in evil.reason


@pytest.mark.desktop
def test_agent_rollout_through_the_agent_protocol(env: XvfbEnvironment, tmp_path: Path) -> None:
    task = Task.model_validate(TASK)
    traj = rollout_agent(env, task, ScriptAgent.of(GOOD), tmp_path, shots_dir=tmp_path / "shots")
    assert not isinstance(traj, Dropped), traj
    assert [s.action.text for s in traj.steps] == ["mkdir -p ~/out && cd ~/out && clear\n", "echo x > x.txt && clear\n"]
    assert all(Path(s.screenshot).is_file() for s in traj.steps)
    failed = rollout_agent(env, task, ScriptAgent.of(GOOD[:1]), tmp_path)
    assert isinstance(failed, Dropped) and "unsuccessful rollout" in failed.reason


@pytest.mark.desktop
def test_pipeline_builds_verified_cases_and_resumes(env: XvfbEnvironment, tmp_path: Path) -> None:
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    write_rollout(rollouts, "mini", GOOD + ["pyautogui.write('cat x.txt && clear\\n')"])
    write_rollout(rollouts, "broken", ["pyautogui.write('a'); pyautogui.write('b')"])
    # succeeds as written, but its evaluator can never pass: dropped by transition-consistent filtering
    write_rollout(rollouts, "wrong", GOOD[:1], task={**TASK, "id": "never"})
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text(CATALOGUE)
    assert len(load_catalogue(catalogue)) == 3
    log: list[str] = []
    cfg = BuildConfig(work=tmp_path / "work", out=tmp_path / "cases", scripted=[rollouts], replays=2,
                      seeds_per_trajectory=1, seed=1, catalogue=catalogue)
    Builder(cfg, [env], log=log.append).run()
    text = "\n".join(log)
    assert "[rollouts] kept 2; excluded dropped: 1" in text
    assert "[consistent] kept 1; excluded inconsistent: 1" in text
    assert "Table 6" in text and "Table 7" in text
    cases = [load_case(p) for p in sorted((tmp_path / "cases").rglob("*.yaml"))]
    kinds = {c.metadata["perturbation"]: c.metadata["kind"] for c in cases}
    # the typo shows on screen but SSIM stays above 0.99: near-identical and not hidden-state -> dropped
    assert kinds == {"wrong-directory": "hidden-state", "listing-left": "visual-only"}
    for case in cases:
        assert case.task.id == "mini-files" and case.d == 1 and case.metadata["ground_truth"]
        assert case.target_png.is_file() and case.error_png.is_file()
    # written in the new form: the target both cases have (one trajectory, one t_seed) is kept once, in shared/
    files = [p for p in (tmp_path / "cases").rglob("*") if p.is_file()]
    assert len({p.read_bytes() for p in files}) == len(files)
    assert {c.screenshots.target for c in cases} == {cases[0].screenshots.target}
    assert cases[0].target_png.resolve().parent == tmp_path / "cases" / "shared"

    log.clear()
    Builder(cfg, [env], log=log.append).run()  # everything is done: nothing replays again
    assert sum("done already" in line for line in log) == 5
    log.clear()
    Builder(cfg, [env], log=log.append).run(start="final")
    assert sum("done already" in line for line in log) == 4
    assert len(list((tmp_path / "cases").rglob("*.yaml"))) == 2

    # the perturb stage stopped after its first candidate (Ctrl-C): the next run replays only the other two
    stopped, calls = Builder(cfg, [env], log=log.append), []
    real = stopped._perturb

    def first_then_interrupt(e, job):
        if calls:
            raise KeyboardInterrupt
        calls.append(job[2].name)
        return real(e, job)

    stopped._perturb = first_then_interrupt  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        stopped.run(start="perturb")
    assert not (tmp_path / "work" / "4-perturb.jsonl").exists()
    resumed, again = Builder(cfg, [env], log=log.append), []
    resumed_real = resumed._perturb
    resumed._perturb = lambda e, job: again.append(job[2].name) or resumed_real(e, job)  # type: ignore[method-assign]
    log.clear()
    resumed.run()
    assert "[perturb] resuming: 1 of 3 candidates done already (4-perturb.partial.jsonl)" in log
    assert len(again) == 2 and calls[0] not in again
    assert not (tmp_path / "work" / "4-perturb.partial.jsonl").exists()
    assert {load_case(p).metadata["perturbation"]: load_case(p).metadata["kind"]
            for p in (tmp_path / "cases").rglob("*.yaml")} == kinds


@pytest.mark.desktop
def test_agent_rollouts_join_the_rollouts_stage(env: XvfbEnvironment, tmp_path: Path) -> None:
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    write_rollout(rollouts, "mini", GOOD)
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "scripted.yaml").write_text(yaml.safe_dump({"provider": "script", "options": {"actions": GOOD}}))
    (agents / "idle.yaml").write_text("provider: noop\n")
    log: list[str] = []
    cfg = BuildConfig(work=tmp_path / "work", out=tmp_path / "cases", scripted=[rollouts], agents=["scripted", "idle"],
                      agent_dirs=[agents])
    Builder(cfg, [env], log=log.append).stage_rollouts()
    text = "\n".join(log)
    assert "[rollouts] kept 2; excluded dropped: 1" in text  # the scripted file + the script agent's run
    assert "agent:noop:mini-files: unsuccessful rollout" in text


@pytest.mark.desktop
def test_a_perturbation_agent_makes_mistakes_that_are_verified_like_the_catalogue(env: XvfbEnvironment,
                                                                                  tmp_path: Path) -> None:
    """The paper's perturbation agent: any model config, prompted to make a mistake within d actions from
    each target; its executed actions become the candidate's perturbation and pass the same checks."""
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    write_rollout(rollouts, "mini", GOOD + ["pyautogui.write('cat x.txt && clear\\n')"])
    agents = tmp_path / "agents"
    agents.mkdir()
    # a stand-in model whose "mistake" is a change of directory: hidden state, which only R_TC can see
    (agents / "mistaker.yaml").write_text(yaml.safe_dump({"provider": "script", "options": {
        "actions": ["pyautogui.write('cd /tmp && clear\\n')"]}}))
    (agents / "idle.yaml").write_text("provider: noop\n")
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text("- {name: other, domains: [text-editor], horizon: short, intent: visible, mistake: m,\n"
                         "   actions: [\"pyautogui.write('zz')\"]}\n")
    log: list[str] = []
    cfg = BuildConfig(work=tmp_path / "work", out=tmp_path / "cases", scripted=[rollouts], replays=2,
                      seeds_per_trajectory=1, seed=1, catalogue=catalogue, agent_dirs=[agents],
                      perturb_agents=["mistaker", "idle"])
    Builder(cfg, [env], log=log.append).run()
    text = "\n".join(log)
    # per target: mistaker short + long (the same single action: one is a duplicate), idle short + long (nothing)
    assert "[perturb] kept 2; excluded perturbation agent did nothing: 2" in text, text
    [case] = [load_case(p) for p in (tmp_path / "cases").rglob("*.yaml")]
    assert case.metadata["perturbation"].startswith("agent-mistaker-")
    assert case.metadata["kind"] == "hidden-state" and case.metadata["intended_kind"] is None
    assert [a.text for a in case.perturbation] == ["cd /tmp && clear\n"]
    assert case.metadata["mistake"] == "scripted step 1"


def test_shipped_catalogue_covers_the_mistakes_the_paper_names() -> None:
    catalogue = load_catalogue()
    mistakes = " | ".join(p.mistake for p in catalogue)
    for named in ("wrong menu", "wrong keystrokes", "closing a window", "deleting text", "saving over a file",
                  "changing a setting"):
        assert named in mistakes
    assert {p.horizon for p in catalogue} == {"short", "long"}
    assert {p.intent for p in catalogue} == {"visible", "hidden-state", "visual-only"}


@pytest.mark.parametrize(("entry", "message"), [
    ("- {name: x, domains: [files], horizon: short, intent: visible, mistake: m}", r"entry 0 \(x\): missing actions"),
    ("- {name: x, domains: [files], horizon: medium, intent: visible, mistake: m, actions: [\"pyautogui.press('a')\"]}",
     r"entry 0 \(x\): horizon: 'medium' is not one of short, long"),
    ("- {name: x, domains: [files], horizon: short, intent: oops, mistake: m, actions: [\"pyautogui.press('a')\"]}",
     r"entry 0 \(x\): intent: 'oops' is not one of visible, hidden-state, visual-only"),
    ("- {name: x, domains: [files], horizon: short, intent: visible, mistake: m, actions: [\"os.system('x')\"]}",
     r"entry 0 \(x\): actions: .*not allowed"),
    (("- {name: x, domains: [files], horizon: short, intent: visible, mistake: m,\n"
      "   actions: [\"pyautogui.press('a')\", \"pyautogui.press('b')\"]}"),
     r"entry 0 \(x\): actions: a short-horizon mistake takes 1..1 actions, got 2"),
    (("- {name: x, domains: [files], horizon: long, intent: visible, mistake: m,\n"
      "   actions: [\"pyautogui.press('a')\", \"pyautogui.press('b')\"]}"),
     r"entry 0 \(x\): actions: a long-horizon mistake takes 3..5 actions, got 2"),
])
def test_bad_catalogue_entry_names_file_entry_and_field(tmp_path: Path, entry: str, message: str) -> None:
    path = tmp_path / "catalogue.yaml"
    path.write_text(entry)
    with pytest.raises(ValueError, match=rf"catalogue\.yaml: {message}"):
        load_catalogue(path)


def test_a_built_case_carries_the_files_its_setup_and_evaluator_read(tmp_path: Path) -> None:
    from pytest_retrace.dataset.casewrite import with_own_files
    from pytest_retrace.evaluators import evaluate
    from pytest_retrace.replay.cases import Task

    rollout = tmp_path / "rollouts"
    (rollout / "data").mkdir(parents=True)
    (rollout / "data" / "in.txt").write_text("input")
    (rollout / "data" / "want.txt").write_text("wanted")
    task = Task.model_validate({
        "id": "t", "instruction": "x", "domain": "d",
        "setup": [{"type": "file", "path": "~/in.txt", "src": "data/in.txt"}],
        "evaluator": {"func": "exact_match", "result": {"type": "local_file", "path": "data/want.txt"},
                      "expected": {"type": "local_file", "path": "data/want.txt"}}})
    domain = tmp_path / "out" / "d"
    own = with_own_files(task, rollout, domain, domain / "case-1")
    shutil.rmtree(rollout)  # the built case must not need its rollout any more
    assert (domain / own.setup[0].src).read_text() == "input"
    got = own.evaluator["result"]["path"]
    assert got == own.evaluator["expected"]["path"] == "case-1/expected/0-want.txt"
    assert evaluate(own.evaluator, None, domain).score == 1.0  # type: ignore[arg-type]
