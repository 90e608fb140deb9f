"""`retrace agreement`: every statistic against a hand computation on a small hand-written study."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_retrace.validation.agreement import (
    Agreement,
    AgreementError,
    agreement,
    cohen_kappa,
    markdown,
    plot,
)
from pytest_retrace.validation.files import (
    Annotation,
    JudgeVerdict,
    Plan,
    PlannedSample,
    annotations_file,
    judge_file,
)
from pytest_retrace.validation.verdicts import VerdictError
from tests.helpers import validation_sample, write_run

AB, CD = ["a", "b"], ["c", "d"]
T, F = True, False
# ReTrace = R_O ∧ R_TC. t*: R_TC alone says recovered, ReTrace not; o*: R_O alone says recovered, ReTrace not.
SAMPLES = {s.id: s for s in [
    validation_sample("t1", r_o=F, r_tc=T, ssim=0.97),
    validation_sample("t2", r_o=F, r_tc=T, ssim=0.92),
    validation_sample("t3", r_o=F, r_tc=T, ssim=0.5),
    validation_sample("t4", r_o=F, r_tc=T, ssim=0.995),  # above the threshold, R_O failed: never settled
    validation_sample("o1", r_o=T, r_tc=F, ssim=0.995),
    validation_sample("o2", r_o=T, r_tc=F, ssim=0.999),
    validation_sample("o3", r_o=T, r_tc=F, ssim=0.992),
    validation_sample("o4", r_o=T, r_tc=F, ssim=0.99),
    validation_sample("j1", r_o=T, r_tc=T, ssim=1.0),  # ReTrace: recovered; the judge: not
]}
PLANNED = [("t1", "r_tc", AB, []), ("t2", "r_tc", CD, []), ("t3", "r_tc", AB, []), ("t4", "r_tc", CD, []),
           ("o1", "r_o", AB, ["judge:gpt"]), ("o2", "r_o", CD, []), ("o3", "r_o", AB, []), ("o4", "r_o", CD, []),
           ("j1", "judge:gpt", AB, [])]
JUDGE = {"o1": "recovered", "j1": "not_recovered"}
ANSWERS = {  # annotator -> sample -> recovered?
    "a": {"t1": F, "t3": T, "o1": F, "o3": T, "j1": F},
    "b": {"t1": F, "t3": F, "o1": F, "o3": T, "j1": F},
    "c": {"t2": T, "t4": F, "o2": T, "o4": T},
    "d": {"t2": T, "t4": F, "o2": T},  # o4: not answered yet
}


def write_study(root: Path, answers=ANSWERS, noise: dict[str, dict[str, bool | None]] | None = None) -> Path:
    run, study = root / "run", root / "study"
    Plan(seed=1, per_alternative=4, runs=[str(run)], annotators=AB + CD, available={"r_tc": 4, "r_o": 9},
         samples=[PlannedSample(sample=s, run=str(run), nodeid=SAMPLES[s].nodeid, alternative=alt, annotators=who,
                                also_for=also) for s, alt, who, also in PLANNED]).write(study)
    path = judge_file(run, "gpt")
    path.parent.mkdir(parents=True)
    path.write_text("".join(JudgeVerdict(sample=s, nodeid="n", judge="gpt", verdict=v).model_dump_json() + "\n"
                            for s, v in JUDGE.items()), encoding="utf-8")
    for who, given in answers.items():
        file = annotations_file(study, who)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("".join(Annotation(sample=s, annotator=who, recovered=r,
                                           environmental_only=(noise or {}).get(who, {}).get(s)).model_dump_json()
                                + "\n" for s, r in given.items()), encoding="utf-8")
    return study


def compute(root: Path, **kw) -> Agreement:
    return agreement(write_study(root, **kw), load=lambda run_dir: list(SAMPLES.values()))


def test_counts_and_the_win_rates_of_table_1(tmp_path: Path) -> None:
    a = compute(tmp_path)
    # answered by every annotator given it: all but o4; t3 split (a: yes, b: no)
    assert (a.planned, a.answered, a.consensus, a.split) == (9, 8, 7, 1)
    wins = {w.alternative: w for w in a.wins}
    assert list(wins) == ["r_tc", "r_o", "judge:gpt"]
    # R_TC: a-b decided t1 (people: no, as ReTrace) -> 1/1; c-d t2 (yes: R_TC's) and t4 (no) -> 1/2
    r_tc = wins["r_tc"]
    assert (r_tc.drawn, r_tc.available, r_tc.consensus, r_tc.decided, r_tc.wins) == (4, 4, 3, 3, 2)
    assert [(p.annotators, p.decided, p.wins) for p in r_tc.pairs] == [(AB, 1, 1), (CD, 2, 1)]
    assert r_tc.win_rate == pytest.approx((1 / 1 + 1 / 2) / 2) and r_tc.micro == pytest.approx(2 / 3)
    # R_O: a-b o1 (no: ReTrace's), o3 (yes: R_O's) -> 1/2; c-d o2 (yes) -> 0/1; o4 half answered
    r_o = wins["r_o"]
    assert (r_o.decided, r_o.wins, r_o.win_rate, r_o.micro) == (3, 1, pytest.approx(0.25), pytest.approx(1 / 3))
    # the judge: o1 (drawn for R_O too; people: no, the judge: yes) won, j1 (people: no, ReTrace: yes) lost
    judge = wins["judge:gpt"]
    assert (judge.drawn, judge.decided, judge.wins, judge.win_rate, judge.available) == (2, 2, 1, 0.5, None)
    assert [p.annotators for p in judge.pairs] == [AB]


def test_alignment_on_r_o_r_tc_disagreements_table_12(tmp_path: Path) -> None:
    a = compute(tmp_path)
    # consensus samples with R_O != R_TC: t1 no, t2 yes, t4 no, o1 no, o2 yes, o3 yes (j1: both yes, out)
    # R_TC says yes on t*, no on o*: t2, o1 -> 2/6. R_O the opposite: 4/6. ReTrace says no on all: 3/6.
    assert [(r.oracle, r.n, r.aligned) for r in a.alignment] == [("R_TC", 6, 2), ("R_O", 6, 4), ("ReTrace", 6, 3)]
    assert a.alignment[0].rate + a.alignment[1].rate == pytest.approx(1.0)  # binary and opposite


def test_r_o_at_other_thresholds_table_13(tmp_path: Path) -> None:
    a = compute(tmp_path)
    # consensus: t1 .97 no, t2 .92 yes, t4 .995-unsettled no, o1 .995 no, o2 .999 yes, o3 .992 yes, j1 1.0 no
    # 0.99: R_O yes on o1 o2 o3 j1 -> right on t1 t4 o2 o3 = 4; 0.95: + t1 yes (wrong) = 3; 0.91: + t2 yes = 4
    assert [(r.oracle, r.n, r.aligned) for r in a.thresholds] == [("0.99", 7, 4), ("0.95", 7, 3), ("0.91", 7, 4)]


def test_cohens_kappa_per_pair_and_its_mean(tmp_path: Path) -> None:
    a = compute(tmp_path)
    ab, cd = a.kappa
    # a-b on t1 t3 o1 o3 j1: a yes on 2/5, b on 1/5; p_o = 4/5, p_e = 2/5*1/5 + 3/5*4/5 = 14/25
    assert (ab.annotators, ab.n, ab.agreed) == (AB, 5, 4)
    assert ab.kappa == pytest.approx((4 / 5 - 14 / 25) / (1 - 14 / 25))
    # c-d on t2 t4 o2 (o4: d has not answered): all the same, both labels used: κ = 1
    assert (cd.n, cd.agreed, cd.kappa) == (3, 3, pytest.approx(1.0))
    assert a.mean_agreement == pytest.approx((0.8 + 1.0) / 2)
    assert a.mean_kappa == pytest.approx((ab.kappa + 1.0) / 2)


def test_kappa_when_chance_agreement_is_total_is_undefined_not_a_number() -> None:
    assert cohen_kappa([T, T, T], [T, T, T]) is None  # p_e = 1: 0/0
    assert cohen_kappa([], []) is None
    assert cohen_kappa([T, T], [F, F]) == pytest.approx(0.0)  # p_o = p_e = 0
    assert cohen_kappa([T, F, T, F], [F, T, F, T]) == pytest.approx(-1.0)


def test_an_undefined_kappa_is_left_out_of_the_mean(tmp_path: Path) -> None:
    answers = ANSWERS | {"c": {"t2": T, "t4": T, "o2": T, "o4": T}, "d": {"t2": T, "t4": T, "o2": T}}
    a = compute(tmp_path, answers=answers)
    assert a.kappa[1].kappa is None and a.kappa[1].agreement == 1.0
    assert a.mean_kappa == pytest.approx(a.kappa[0].kappa)
    assert "| c & d | 3 | 3 | 100.0 % | undefined |" in markdown(a)


def test_markdown_json_and_plot(tmp_path: Path) -> None:
    a = compute(tmp_path)
    text = markdown(a)
    assert "| R_TC alone (w/o R_O) | 4 (4) | 3 | 3 | 2 | 75.0 % | 66.7 % |" in text
    assert "| judge gpt | 2 (?) | 2 | 2 | 1 | 50.0 % | 50.0 % |" in text
    assert "| 0.95 | 7 | 3 | 42.9 % |" in text
    assert Agreement.model_validate_json(a.model_dump_json()) == a
    png = plot(a, tmp_path / "out" / "agreement.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_broken_annotation_line_is_named(tmp_path: Path) -> None:
    study = write_study(tmp_path)
    file = annotations_file(study, "b")
    file.write_text(file.read_text().replace('"recovered":false', '"recovered":"maybe"', 1))
    with pytest.raises(VerdictError, match=r"annotations/b\.jsonl:1: recovered: "):
        agreement(study, load=lambda run_dir: list(SAMPLES.values()))
    file.write_text('{"sample": "t1", "annot\n')
    with pytest.raises(VerdictError, match=r"annotations/b\.jsonl:1: .*JSON"):
        agreement(study, load=lambda run_dir: list(SAMPLES.values()))


@pytest.mark.parametrize(("line", "match"), [
    ({"sample": "zz9", "annotator": "a"}, r"a\.jsonl:6: unknown sample 'zz9': not in .*plan"),
    ({"sample": "t2", "annotator": "a"}, r"a\.jsonl:6: sample 't2' was planned for c, d, not 'a'"),
    ({"sample": "t1", "annotator": "b"}, r"a\.jsonl:6: annotator 'b' in the file of 'a'"),
])
def test_an_answer_outside_the_plan_is_named(tmp_path: Path, line: dict, match: str) -> None:
    study = write_study(tmp_path)
    with annotations_file(study, "a").open("a") as f:
        f.write(Annotation(recovered=True, **line).model_dump_json() + "\n")
    with pytest.raises(VerdictError, match=match):
        agreement(study, load=lambda run_dir: list(SAMPLES.values()))


def test_a_plan_sample_missing_from_its_run_is_named(tmp_path: Path) -> None:
    study = write_study(tmp_path)
    with pytest.raises(AgreementError, match=r"plan\.json: sample j1 .* is not a finished test"):
        agreement(study, load=lambda run_dir: [s for s in SAMPLES.values() if s.id != "j1"])


def test_the_command_from_runs_on_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_retrace.cli import main

    run = write_run(tmp_path / "run-1", tmp_path / "cases", [
        {"name": "a", "r_o": True, "r_tc": False, "ssim": 0.995},
        {"name": "b", "r_o": False, "r_tc": True, "ssim": 0.9},
    ])
    study = tmp_path / "study"
    assert main(["annotate", "--sample", str(run), "--annotators", "x,y", "--per-alternative", "2", "--seed", "0",
                 "--out", str(study)]) == 0
    plan = Plan.read(study)
    for who in ("x", "y"):  # both say the R_O sample (a) was not recovered, the R_TC one (b) was
        file = annotations_file(study, who)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("".join(Annotation(sample=p.sample, annotator=who, recovered=p.alternative == "r_tc")
                                .model_dump_json() + "\n" for p in plan.samples))
    capsys.readouterr()
    assert main(["agreement", str(study), "--json", "--out", str(tmp_path / "out")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(w["alternative"], w["decided"], w["wins"]) for w in data["wins"]] == [("r_tc", 1, 0), ("r_o", 1, 1)]
    assert data["kappa"] == [{"annotators": ["x", "y"], "n": 2, "agreed": 2, "agreement": 1.0, "kappa": 1.0}]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["agreement.json", "agreement.md", "agreement.png"]
    assert main(["agreement", str(tmp_path / "nowhere")]) == 2
    assert "plan.json" in capsys.readouterr().err


def test_verdicts_unaffected_by_environmental_noise_table_11(tmp_path: Path) -> None:
    # consensus samples: t1 no, t2 yes, t4 no, o1 no, o2 yes, o3 yes, j1 no; ReTrace says no on all but j1.
    # Noise answers: t2 both yes (people say recovered, ReTrace not: affected); o2 c yes, d no (split: out);
    # o3 both yes (affected); t1 both yes but the people agree with ReTrace (not affected); the rest unanswered (no)
    noise = {"a": {"o3": True, "t1": True}, "b": {"o3": True, "t1": True}, "c": {"t2": True, "o2": True},
             "d": {"t2": True, "o2": False}}
    a = compute(tmp_path, noise=noise)
    assert a.noise is not None and (a.noise.n, a.noise.affected) == (6, 2)
    assert a.noise.unaffected_rate == pytest.approx(4 / 6)
    assert "## Verdicts unaffected by environmental noise (Table 11)" in markdown(a)
