"""The sample plan: pools where ReTrace disagrees, the seeded draw, the pairs, a sample drawn twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_retrace.validation.files import JudgeVerdict, Plan, judge_file
from pytest_retrace.validation.sampling import SamplingError, draw_plan, pairs
from pytest_retrace.validation.verdicts import VerdictError
from tests.helpers import validation_sample, write_run

# ReTrace = R_O ∧ R_TC: it disagrees with R_O alone where R_O passed and R_TC failed, and the other way round
R_O_ONLY = [validation_sample(f"o{i:02d}", r_o=True, r_tc=False) for i in range(6)]
R_TC_ONLY = [validation_sample(f"t{i:02d}", r_o=False, r_tc=True) for i in range(3)]
AGREE = [validation_sample("both", r_o=True, r_tc=True), validation_sample("none", r_o=False, r_tc=False),
         validation_sample("unknown", r_o=False, r_tc=None)]  # R_TC never ran: in no pool


def loader(samples):
    return lambda run_dir: list(samples)


def draw(per: int = 4, seed: int = 7, annotators=("a", "b", "c", "d"), samples=None, **kw) -> Plan:
    return draw_plan([Path("run")], list(annotators), per, seed, load=loader(samples or R_O_ONLY + R_TC_ONLY + AGREE),
                     **kw)


def test_the_pools_are_the_disagreements_and_a_small_pool_is_drawn_whole() -> None:
    plan = draw(per=4)
    assert plan.available == {"r_tc": 3, "r_o": 6}
    by_alt = {alt: {p.sample for p in plan.samples if p.alternative == alt} for alt in ("r_tc", "r_o")}
    assert by_alt["r_tc"] == {"t00", "t01", "t02"}  # all 3: fewer than N
    assert len(by_alt["r_o"]) == 4 and by_alt["r_o"] <= {s.id for s in R_O_ONLY}
    assert all(p.also_for == [] for p in plan.samples)  # R_O's and R_TC's pools never overlap


def test_the_same_inputs_give_the_same_plan_and_another_seed_another() -> None:
    first = draw(seed=7).model_dump_json()
    assert draw(seed=7).model_dump_json() == first
    # the runs' finishing order does not matter: pools are ordered by sample id
    assert draw(seed=7, samples=list(reversed(R_O_ONLY + R_TC_ONLY + AGREE))).model_dump_json() == first
    draws = {tuple(p.sample for p in draw(seed=s).samples if p.alternative == "r_o") for s in range(8)}
    assert len(draws) > 1  # the seed decides which 4 of the 6


def test_round_robin_over_the_pairs_in_order() -> None:
    plan = draw(per=4, annotators=("a", "b", "c", "d", "e", "f"))
    assert pairs(["a", "b", "c", "d", "e", "f"]) == [["a", "b"], ["c", "d"], ["e", "f"]]
    # R_TC's 3 first, then R_O's 4, one counter: a-b, c-d, e-f, a-b, ...
    assert [p.annotators for p in plan.samples] == [["a", "b"], ["c", "d"], ["e", "f"]] * 2 + [["a", "b"]]
    assert plan.for_annotator("e") == plan.for_annotator("f") and len(plan.for_annotator("a")) == 3


def write_judge(run_dir: Path, verdicts: dict[str, str | None]) -> None:
    path = judge_file(run_dir, "gpt")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(JudgeVerdict(sample=s, nodeid="n", judge="gpt", verdict=v).model_dump_json() + "\n"
                            for s, v in verdicts.items()), encoding="utf-8")


def test_a_judge_is_an_alternative_and_a_sample_it_shares_is_shown_once(tmp_path: Path) -> None:
    samples = R_O_ONLY[:2] + AGREE[:2]
    # the judge disagrees with ReTrace on o00, o01 (ReTrace: not recovered) and on "both"; no verdict on "none"
    write_judge(tmp_path, {"o00": "recovered", "o01": "recovered", "both": "not_recovered", "none": None})
    plan = draw_plan([tmp_path], ["a", "b"], 5, 1, ["gpt"], load=loader(samples))
    assert plan.available == {"r_tc": 0, "r_o": 2, "judge:gpt": 3}
    shown = {p.sample: p for p in plan.samples}
    assert sorted(shown) == ["both", "o00", "o01"]  # o00 and o01 drawn twice, shown once
    assert shown["o00"].alternative == "r_o" and shown["o00"].also_for == ["judge:gpt"]
    assert shown["both"].alternative == "judge:gpt" and shown["both"].also_for == []


def test_a_judge_line_naming_an_unknown_sample_is_an_error_naming_the_file_and_line(tmp_path: Path) -> None:
    write_judge(tmp_path, {"o00": "recovered", "elsewhere": "recovered"})
    with pytest.raises(VerdictError, match=r"judge/gpt\.jsonl:2: sample 'elsewhere'"):
        draw_plan([tmp_path], ["a", "b"], 5, 1, ["gpt"], load=loader(R_O_ONLY))
    with pytest.raises(VerdictError, match=r"no such file \(run `retrace judge`"):
        draw_plan([tmp_path], ["a", "b"], 5, 1, ["claude"], load=loader(R_O_ONLY))


@pytest.mark.parametrize(("annotators", "per", "match"), [
    (["a", "b", "c"], 2, "even number"), (["a", "a"], 2, "given twice"), (["a", "b/c"], 2, "names a file"),
    (["a", "b"], 0, "at least 1"),
])
def test_bad_arguments_are_named(annotators: list[str], per: int, match: str) -> None:
    with pytest.raises(SamplingError, match=match):
        draw(per=per, annotators=annotators)


def test_the_command_draws_from_a_run_on_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_retrace.cli import main

    run = write_run(tmp_path / "run-1", tmp_path / "cases", [
        {"name": "a", "r_o": True, "r_tc": False, "ssim": 0.995},
        {"name": "b", "r_o": False, "r_tc": True, "ssim": 0.9},
        {"name": "c", "r_o": True, "r_tc": True, "ssim": 1.0},
    ])
    argv = ["annotate", "--sample", str(run / "results.jsonl"), "--annotators", "x,y", "--per-alternative", "5", "--seed",
            "3", "--out", str(tmp_path / "study")]
    assert main(argv) == 0
    plan = json.loads((tmp_path / "study" / "plan.json").read_text())
    assert plan["available"] == {"r_tc": 1, "r_o": 1}
    assert [(s["alternative"], s["nodeid"].rsplit("[", 1)[1]) for s in plan["samples"]] == [("r_tc", "b]"), ("r_o", "a]")]
    assert plan["runs"] == [str(run.resolve())]
    assert "r_o: 1 drawn of 1 disagreeing with ReTrace" in capsys.readouterr().out
    first = (tmp_path / "study" / "plan.json").read_bytes()
    assert main(argv) == 2 and "a plan is fixed once made" in capsys.readouterr().err  # never overwritten
    (tmp_path / "study" / "plan.json").unlink()
    assert main(argv) == 0 and (tmp_path / "study" / "plan.json").read_bytes() == first  # drawn again: the same
    (tmp_path / "study" / "plan.json").unlink()
    assert main([*argv[:2], str(run), str(run), *argv[3:]]) == 2  # the same run twice
    assert "given twice" in capsys.readouterr().err
