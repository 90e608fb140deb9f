"""Recovery intention: the TF-IDF cosine against a hand computation, the references, the rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_retrace.results.intention import (
    IntentionError,
    intention,
    prompt_files,
    reference,
    reference_files,
    similarities,
)
from pytest_retrace.results.records import Record
from tests.helpers import REPO


def _test(tid: str, *, model: str = "m", strategy: str = "implicit", rationales: tuple[str, ...] = (),
          privileged: bool = False) -> Record:
    return Record(nodeid=f"cases/x.yaml::test_recovery[{tid}]", case=f"c{tid}", task="t", domain="d", horizon="short",
                  kind="visible", model=model, strategy=strategy, budget=1, privileged=privileged,
                  finished_at="2026-12-02T00:00:00+00:00", verdict="not_recovered",
                  actions=[{"stage": "prefix", "action": "click", "rationale": "restore the target state"},
                           *({"stage": "recover", "action": "click", "rationale": r} for r in rationales)])


def test_the_cosine_by_hand() -> None:
    # corpus: the reference "restore target state" and the document "restore state state" (no stop words)
    # smooth idf = ln((1 + n) / (1 + df)) + 1 with n = 2: restore 1, state 1, target ln(3/2) + 1
    # sublinear tf = 1 + ln(tf): "state" twice in the document counts 1 + ln 2
    idf_target = math.log(3 / 2) + 1
    ref = {"restore": 1.0, "target": idf_target, "state": 1.0}
    doc = {"restore": 1.0, "state": 1 + math.log(2)}
    dot = sum(ref[w] * doc.get(w, 0.0) for w in ref)
    expected = dot / (math.sqrt(sum(v * v for v in ref.values())) * math.sqrt(sum(v * v for v in doc.values())))
    assert similarities(["restore state state"], ["restore target state"]) == [pytest.approx(expected)]
    assert expected == pytest.approx(0.6869, abs=1e-4)


def test_identical_disjoint_and_stop_words_only() -> None:
    scores = similarities(["Undo the typing", "open the browser", "the and of"], ["undo typing"] * 3)
    assert scores == [pytest.approx(1.0), pytest.approx(0.0), pytest.approx(0.0)]


def test_each_strategy_is_compared_with_its_recovery_prompt() -> None:
    assert reference_files("explicit-0R") == ["recovery-prefix.md", "recovery-explicit-0R.md"]
    assert reference_files("implicit") == ["recovery-prefix.md", "recovery-explicit-0E.md"]  # its counterpart
    with pytest.raises(IntentionError, match="strategy 'sideways'"):
        reference_files("sideways")
    text = reference("explicit-0E", prompt_files(REPO / "agents" / "prompts"))
    assert "recovery agent" in text and "$" not in text  # the placeholders ($instruction, $budget) dropped


def test_rows_per_model_and_strategy(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "recovery-prefix.md").write_text("restore the target state")
    for name in ("0E", "0R", "none", "context"):
        (prompts / f"recovery-explicit-{name}.md").write_text("$instruction: undo the mistake.")
    records = [
        _test("1", strategy="explicit-0E", rationales=("restore the target state", "undo the mistake")),
        _test("2", strategy="explicit-0E", rationales=("open gimp",)),
        _test("3", strategy="implicit"),  # the prefix's words are not the agent's: silent
        _test("4", strategy="implicit", rationales=("click save", "")),
        _test("5", model="oracle", strategy="implicit", rationales=("replay",), privileged=True),  # not a model
    ]
    rows = intention(records, lambda model: prompt_files(prompts))
    assert [(r.model, r.strategy, r.tests, r.silent) for r in rows] == [("m", "explicit-0E", 2, 0),
                                                                        ("m", "implicit", 2, 1)]
    explicit, implicit = rows
    # sample 1 says every word of the reference (minus stop words and the dropped "$instruction"): cosine 1
    assert explicit.scores == [pytest.approx(1.0), pytest.approx(0.0)]
    assert (explicit.mean, explicit.median) == (pytest.approx(0.5), pytest.approx(0.5))
    assert explicit.sd == pytest.approx(math.sqrt(0.5))  # sample sd of {1, 0}
    assert (explicit.q1, explicit.q3) == (pytest.approx(0.25), pytest.approx(0.75))
    assert implicit.scores == [pytest.approx(0.0)] and implicit.sd is None
    assert implicit.reference == ["recovery-prefix.md", "recovery-explicit-0E.md"]


def test_a_missing_prompt_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(IntentionError, match=r"recovery-prefix\.md: No such file"):
        intention([_test("1", rationales=("x",))], lambda model: prompt_files(tmp_path))


def test_the_command_on_a_run_on_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from pytest_retrace.cli import main
    from tests.helpers import write_run

    said = "I will restore the target state exactly and undo the mistakes"
    run = write_run(tmp_path / "run-1", tmp_path / "cases", [
        {"name": "a", "strategy": "explicit-0E", "r_o": True, "r_tc": True,
         "actions": [{"stage": "prefix", "action": "click"}, {"stage": "recover", "action": "click", "rationale": said}]},
        {"name": "b", "strategy": "implicit", "r_o": False, "r_tc": False,
         "actions": [{"stage": "recover", "action": "type", "rationale": "typing the rest of the sentence"}]},
    ])
    out = tmp_path / "out"
    assert main(["intention", str(run), "--prompts", str(REPO / "agents" / "prompts"), "--json", "--out", str(out)]) == 0
    rows = {r["strategy"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["explicit-0E"]["mean"] > rows["implicit"]["mean"]  # the one that talks about restoring
    assert rows["explicit-0E"]["tests"] == rows["implicit"]["tests"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["intention.json", "intention.md", "intention.pdf",
                                                     "intention.png", "intention.svg"]
    assert main(["intention", str(run), "--prompts", str(tmp_path)]) == 2
    assert "recovery-prefix.md: No such file" in capsys.readouterr().err


def test_a_runs_summary_has_the_intention_of_the_models_that_explained(tmp_path: Path) -> None:
    """summary.json's ``intention``, summary.md's table and plots/intention.png, with each model's own prompts; a
    run of scripted baselines only has none (its summary.json keeps the keys it always had)."""
    from pytest_retrace.results.plots import write_plots
    from pytest_retrace.results.report import render_markdown
    from pytest_retrace.results.summary import RunInfo, Summary, build_summary

    run = RunInfo(models=["m"], env="xvfb", budgets=[1], ssim_threshold=0.99, exitstatus=0)
    files = prompt_files(REPO / "agents" / "prompts")
    records = [_test("1", strategy="explicit-0R", rationales=("Undo the mistake: restore the target screen",)),
               _test("2", strategy="explicit-0R", rationales=("click the menu",))]
    summary = build_summary(records, run, prompt_files={"m": files}.get)
    [row] = summary.intention
    assert (row.model, row.strategy, row.tests, row.silent) == ("m", "explicit-0R", 2, 0)
    assert row.scores[0] > row.scores[1] > 0 or row.scores[0] > row.scores[1] == 0
    assert Summary.from_dict(summary.to_dict()) == summary  # read back: the same rows
    assert "## Recovery intention" in render_markdown(summary, "run", [])
    assert "intention.png" in [p.name for p in write_plots(summary, tmp_path)]
    scripted = build_summary([_test("3", model="oracle", rationales=("x",), privileged=True)], run,
                             prompt_files={"oracle": files}.get)
    assert scripted.intention == [] and "intention" not in scripted.to_dict()
