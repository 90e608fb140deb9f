"""Recovery intention: the TF-IDF cosine against a hand computation, the references, the rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_retrace.validation.intention import (
    IntentionError,
    intention,
    markdown,
    plot,
    reference,
    reference_files,
    similarities,
)
from tests.helpers import REPO, validation_sample


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
    text = reference("explicit-0E", REPO / "agents" / "prompts")
    assert "recovery agent" in text and "$" not in text  # the placeholders ($instruction, $budget) dropped


def test_rows_per_model_and_strategy(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "recovery-prefix.md").write_text("restore the target state")
    for name in ("0E", "0R", "none", "context"):
        (prompts / f"recovery-explicit-{name}.md").write_text("$instruction: undo the mistake.")
    samples = [
        validation_sample("1", r_o=True, r_tc=True, model="m", strategy="explicit-0E",
                          rationales=("restore the target state", "undo the mistake")),
        validation_sample("2", r_o=False, r_tc=False, model="m", strategy="explicit-0E", rationales=("open gimp",)),
        validation_sample("3", r_o=False, r_tc=False, model="m", strategy="implicit", rationales=()),
        validation_sample("4", r_o=False, r_tc=False, model="m", strategy="implicit", rationales=("click save", "")),
    ]
    rows = intention(samples, prompts)
    assert [(r.model, r.strategy, r.samples, r.silent) for r in rows] == [("m", "explicit-0E", 2, 0),
                                                                          ("m", "implicit", 2, 1)]
    explicit, implicit = rows
    # sample 1 says every word of the reference (minus stop words and the dropped "$instruction"): cosine 1
    assert explicit.scores == [pytest.approx(1.0), pytest.approx(0.0)]
    assert (explicit.mean, explicit.median) == (pytest.approx(0.5), pytest.approx(0.5))
    assert explicit.sd == pytest.approx(math.sqrt(0.5))  # sample sd of {1, 0}
    assert (explicit.q1, explicit.q3) == (pytest.approx(0.25), pytest.approx(0.75))
    assert implicit.scores == [pytest.approx(0.0)] and implicit.sd is None
    assert "| m | implicit | recovery-prefix.md + recovery-explicit-0E.md | 2 | 1 | 0.000 |" in markdown(rows)
    assert plot(rows, tmp_path / "intention.png").read_bytes()[:4] == b"\x89PNG"


def test_a_missing_prompt_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(IntentionError, match=r"recovery-prefix\.md: No such file"):
        intention([validation_sample("1", r_o=True, r_tc=True, rationales=("x",))], tmp_path)


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
    assert rows["explicit-0E"]["samples"] == rows["implicit"]["samples"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["intention.json", "intention.md", "intention.png"]
    assert main(["intention", str(run), "--prompts", str(tmp_path)]) == 2
    assert "recovery-prefix.md: No such file" in capsys.readouterr().err
