"""`retrace agreement STUDY`: how often ReTrace, its two halves and the judges agree with people (paper 5.4.2,
B.3, C: Tables 1, 12 and 13, the annotators' Cohen's κ), as typed rows built here only (:func:`tables`).

Definitions (docs/validation.md, "Sampling and agreement"), the paper's where it gives one:

- **consensus**: a sample's human label when every annotator the plan gave it to answered and all answered
  the same; every statistic but κ uses only such samples (the paper: "only samples for which both human
  annotators ... agree");
- **win rate** of ReTrace against an alternative (Table 1): on the consensus samples drawn for it where the
  two verdicts differ, the share whose label is ReTrace's (the verdicts are binary and differ: the other
  share is the alternative's). Computed per annotator pair and averaged over the pairs, as the paper
  ("independently computed ... for every annotator pair, and report the average"); ``micro`` pools them;
- **alignment** (Table 12): on the distinct consensus samples of the study where R_O and R_TC disagree, the
  share where R_TC alone, R_O alone and ReTrace give the label; micro-averaged (pooled over pairs and
  alternatives, each sample once);
- **thresholds** (Table 13): on every distinct consensus sample, the share where R_O at SSIM threshold t
  (verdicts.r_o_at, from the stored SSIM) gives the label;
- **environmental noise** (Table 11): on the consensus samples whose annotators also agree on the second
  question (is every visible difference environmental noise? an unanswered one counts as no), the share of
  ReTrace's verdicts *not* affected by noise: all but those where the people disagree with ReTrace and say the
  difference is only noise;
- **κ**: per annotator pair, Cohen's κ (scikit-learn's ``cohen_kappa_score``) and the raw agreement on the
  samples both answered, then their means over the pairs, as the paper reports them. κ is undefined when
  both gave one same label throughout (chance agreement 1): None, and left out of the mean.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from pytest_retrace.validation.files import PLAN, Plan, PlannedSample
from pytest_retrace.validation.samples import Sample, load_samples
from pytest_retrace.validation.sampling import counted_for
from pytest_retrace.validation.verdicts import (
    JUDGE,
    judges_of,
    label,
    r_o_at,
    read_annotations,
    samples_by_run,
    verdict,
)

THRESHOLDS = (0.99, 0.95, 0.91)  # Table 13's


class AgreementError(ValueError):
    """A study whose tables cannot be made; the message names the file."""


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PairWin(_Row):
    annotators: list[str]
    decided: int  # consensus samples where the alternative and ReTrace differ
    wins: int  # of them, labelled as ReTrace judged
    rate: float | None


class WinRow(_Row):
    """Table 1: ReTrace against one alternative."""

    alternative: str
    label: str
    drawn: int  # planned samples counted for it
    available: int | None  # its pool when the plan was drawn
    consensus: int  # drawn samples whose annotators agree
    decided: int  # consensus samples where the verdicts (still) differ: the win rate's denominator
    wins: int
    win_rate: float | None  # mean over the pairs with a decided sample (the paper's)
    micro: float | None  # wins / decided, pooled
    pairs: list[PairWin]


class AlignmentRow(_Row):
    """Table 12 (oracle) and Table 13 (threshold)."""

    oracle: str
    n: int
    aligned: int
    rate: float | None


class KappaRow(_Row):
    annotators: list[str]
    n: int  # samples both answered
    agreed: int
    agreement: float | None
    kappa: float | None  # None: undefined (one same label throughout) or nothing answered


class NoiseRow(_Row):
    """Table 11: ReTrace's verdicts unaffected by environmental noise."""

    n: int  # consensus samples whose annotators agree on the noise question too
    affected: int  # of them: the people disagree with ReTrace and call the difference noise
    unaffected_rate: float | None


class Agreement(_Row):
    study: str
    planned: int
    answered: int  # by every annotator it was given to
    consensus: int
    split: int  # answered by all, not the same answer
    wins: list[WinRow]
    alignment: list[AlignmentRow]  # on R_O / R_TC disagreements
    thresholds: list[AlignmentRow]  # R_O at each SSIM threshold
    kappa: list[KappaRow]
    noise: NoiseRow | None = None  # None: no noise answers given (tables() without them)
    mean_agreement: float | None
    mean_kappa: float | None


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    """Cohen's κ of two raters' binary labels; None where undefined (chance agreement 1) or empty."""
    if not a:
        return None
    try:
        from sklearn.metrics import cohen_kappa_score
    except ImportError:
        raise AgreementError("Cohen's κ needs scikit-learn (a dependency of pytest-retrace)") from None
    with warnings.catch_warnings():  # the undefined case warns; it is reported as None instead
        warnings.simplefilter("ignore")
        kappa = float(cohen_kappa_score(list(a), list(b), labels=[False, True]))
    return None if math.isnan(kappa) else kappa  # NaN: undefined


def consensus(planned: PlannedSample, answers: dict[str, dict[str, bool]]) -> bool | None:
    given = answers.get(planned.sample, {})
    labels = {given[a] for a in planned.annotators if a in given}
    if len(given) < len(planned.annotators) or len(labels) != 1:
        return None
    return labels.pop()


def _alternatives(plan: Plan) -> list[str]:
    seen = list(plan.available)
    for p in plan.samples:
        seen += [a for a in counted_for(p) if a not in seen]
    return seen


def _wins(plan: Plan, alternative: str, samples: dict[str, Sample], judges: dict[str, dict[str, bool | None]],
          answers: dict[str, dict[str, bool]]) -> WinRow:
    drawn = [p for p in plan.samples if alternative in counted_for(p)]
    per_pair: dict[tuple[str, ...], list[int]] = {}  # pair -> [decided, wins]
    agreed = 0
    for p in drawn:
        counts = per_pair.setdefault(tuple(p.annotators), [0, 0])
        human = consensus(p, answers)
        if human is None:
            continue
        agreed += 1
        s = samples[p.sample]
        other = verdict(s, alternative, judges)
        if other is None or other == s.oracle.recovered:
            continue  # no longer a disagreement (a judge file rewritten since the plan): not a contest
        counts[0] += 1
        counts[1] += human == s.oracle.recovered
    pairs = [PairWin(annotators=list(k), decided=d, wins=w, rate=_rate(w, d)) for k, (d, w) in per_pair.items()]
    rates = [p.rate for p in pairs if p.rate is not None]
    decided, wins = sum(p.decided for p in pairs), sum(p.wins for p in pairs)
    return WinRow(alternative=alternative, label=label(alternative), drawn=len(drawn),
                  available=plan.available.get(alternative), consensus=agreed, decided=decided, wins=wins,
                  win_rate=statistics.fmean(rates) if rates else None, micro=_rate(wins, decided), pairs=pairs)


def _aligned(name: str, pairs: list[tuple[bool | None, bool]]) -> AlignmentRow:
    known = [(v, h) for v, h in pairs if v is not None]
    aligned = sum(v == h for v, h in known)
    return AlignmentRow(oracle=name, n=len(known), aligned=aligned, rate=_rate(aligned, len(known)))


def _kappa(plan: Plan, answers: dict[str, dict[str, bool]]) -> list[KappaRow]:
    rows = []
    for team in dict.fromkeys(tuple(p.annotators) for p in plan.samples if len(p.annotators) == 2):
        both = [answers[p.sample] for p in plan.samples if tuple(p.annotators) == team
                and all(a in answers.get(p.sample, {}) for a in team)]
        a, b = [x[team[0]] for x in both], [x[team[1]] for x in both]
        agreed = sum(x == y for x, y in zip(a, b))
        rows.append(KappaRow(annotators=list(team), n=len(both), agreed=agreed, agreement=_rate(agreed, len(both)),
                             kappa=cohen_kappa(a, b)))
    return rows


def _noise(plan: Plan, samples: dict[str, Sample], answers: dict[str, dict[str, bool]],
           noise: dict[str, dict[str, bool]]) -> NoiseRow:
    n = affected = 0
    for p in plan.samples:
        human = consensus(p, answers)
        said = {noise.get(p.sample, {}).get(a, False) for a in p.annotators}
        if human is None or len(said) != 1:
            continue
        n += 1
        affected += human != samples[p.sample].oracle.recovered and said == {True}
    return NoiseRow(n=n, affected=affected, unaffected_rate=_rate(n - affected, n))


def tables(study: str, plan: Plan, samples: dict[str, Sample], judges: dict[str, dict[str, bool | None]],
           answers: dict[str, dict[str, bool]], thresholds: Sequence[float] = THRESHOLDS,
           noise: dict[str, dict[str, bool]] | None = None) -> Agreement:
    """Every table of the study from its plan, the planned samples (id -> Sample), the judges' verdicts (judge
    -> sample id -> verdict), the answers (sample id -> annotator -> recovered?) and to the noise question
    (sample id -> annotator -> only environmental noise?; an unanswered one is no)."""
    labelled = [(p, h) for p in plan.samples if (h := consensus(p, answers)) is not None]
    answered = sum(all(a in answers.get(p.sample, {}) for a in p.annotators) for p in plan.samples)
    split = [(samples[p.sample].oracle, h) for p, h in labelled]
    disagree = [(o, h) for o, h in split if o.r_o is not None and o.r_tc is not None and o.r_o != o.r_tc]
    kappa = _kappa(plan, answers)
    agreements = [k.agreement for k in kappa if k.agreement is not None]
    kappas = [k.kappa for k in kappa if k.kappa is not None]
    return Agreement(
        study=study, planned=len(plan.samples), answered=answered, consensus=len(labelled),
        split=answered - len(labelled),
        wins=[_wins(plan, alt, samples, judges, answers) for alt in _alternatives(plan)],
        alignment=[_aligned("R_TC", [(o.r_tc, h) for o, h in disagree]),
                   _aligned("R_O", [(o.r_o, h) for o, h in disagree]),
                   _aligned("ReTrace", [(o.recovered, h) for o, h in disagree])],
        thresholds=[_aligned(f"{t:g}", [(r_o_at(o, t), h) for o, h in split]) for t in thresholds],
        kappa=kappa, noise=None if noise is None else _noise(plan, samples, answers, noise),
        mean_agreement=statistics.fmean(agreements) if agreements else None,
        mean_kappa=statistics.fmean(kappas) if kappas else None,
    )


def agreement(study: Path, thresholds: Sequence[float] = THRESHOLDS, *,
              load: Callable[[Path], list[Sample]] = load_samples) -> Agreement:
    """The tables of a study directory: its plan.json, the runs it names, their judge files and the
    annotations. ``load``: how a run's samples are read (tests)."""
    if not (study / PLAN).is_file():
        raise AgreementError(f"{study / PLAN}: no such file (a study directory holds the plan `retrace annotate "
                             "--sample` wrote and the annotations)")
    try:
        plan = Plan.read(study)
    except ValueError as exc:
        raise AgreementError(str(exc)) from None
    by_run = samples_by_run([Path(r) for r in plan.runs], load)
    samples = {s.id: s for run_samples in by_run.values() for s in run_samples}
    for p in plan.samples:
        if p.sample not in samples:
            raise AgreementError(f"{study / PLAN}: sample {p.sample} ({p.nodeid}) is not a finished test of "
                                 f"{p.run}")
    names = [a.removeprefix(JUDGE) for a in _alternatives(plan) if a.startswith(JUDGE)]
    judges = judges_of(by_run, names)
    given = read_annotations(study, plan)
    answers = {s: {who: a.recovered for who, a in by.items()} for s, by in given.items()}
    noise = {s: {who: bool(a.environmental_only) for who, a in by.items()} for s, by in given.items()}
    return tables(str(study), plan, samples, judges, answers, thresholds, noise)


# -- rendering ------------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def markdown(a: Agreement) -> str:
    out = [f"# Agreement with people: {a.study}", "",
           (f"{a.planned} samples planned, {a.answered} answered by every annotator given them, {a.consensus} "
            f"with the same answer (used below), {a.split} split."), "",
           "## ReTrace against each alternative (Table 1)", "",
           "| alternative | drawn (of) | consensus | decided | ReTrace wins | win rate (mean of pairs) | pooled |",
           "|---|---|---|---|---|---|---|"]
    for w in a.wins:
        of = "?" if w.available is None else str(w.available)
        out.append(f"| {w.label} | {w.drawn} ({of}) | {w.consensus} | {w.decided} | {w.wins} | {_pct(w.win_rate)} "
                   f"| {_pct(w.micro)} |")
    out += ["", "## Alignment on R_O / R_TC disagreements (Table 12)", "", "| oracle | samples | aligned | rate |",
            "|---|---|---|---|"]
    out += [f"| {r.oracle} | {r.n} | {r.aligned} | {_pct(r.rate)} |" for r in a.alignment]
    out += ["", "## R_O at other SSIM thresholds (Table 13)", "", "| threshold | samples | aligned | rate |",
            "|---|---|---|---|"]
    out += [f"| {r.oracle} | {r.n} | {r.aligned} | {_pct(r.rate)} |" for r in a.thresholds]
    if a.noise is not None:
        out += ["", "## Verdicts unaffected by environmental noise (Table 11)", "",
                "| samples (agreed on both questions) | people disagree with ReTrace and call it noise | unaffected |",
                "|---|---|---|", f"| {a.noise.n} | {a.noise.affected} | {_pct(a.noise.unaffected_rate)} |"]
    out += ["", "## Between the annotators", "", "| pair | both answered | same answer | agreement | Cohen's κ |",
            "|---|---|---|---|---|"]
    for k in a.kappa:
        kappa = "undefined" if k.kappa is None else f"{k.kappa:.3f}"
        out.append(f"| {' & '.join(k.annotators)} | {k.n} | {k.agreed} | {_pct(k.agreement)} | {kappa} |")
    mean_kappa = "–" if a.mean_kappa is None else f"{a.mean_kappa:.3f}"
    out += ["", f"Mean over the pairs: agreement {_pct(a.mean_agreement)}, κ {mean_kappa}.", ""]
    return "\n".join(out)


def plot(a: Agreement, path: Path) -> Path:
    """One PNG, three panels: Table 1's win rates, Table 12's alignment, Table 13's thresholds."""
    from matplotlib.figure import Figure

    from pytest_retrace.results.plotkit import DPI, style

    path.parent.mkdir(parents=True, exist_ok=True)
    panels = [("ReTrace's win rate (Table 1)", [w.label for w in a.wins], [w.win_rate for w in a.wins]),
              ("Alignment, R_O ≠ R_TC (Table 12)", [r.oracle for r in a.alignment], [r.rate for r in a.alignment]),
              ("R_O by SSIM threshold (Table 13)", [r.oracle for r in a.thresholds], [r.rate for r in a.thresholds])]
    with style():  # the run's figures' deterministic style: the same data, the same picture
        fig = Figure(figsize=(13, 4.2))
        for i, (title, names, rates) in enumerate(panels):
            ax = fig.add_subplot(1, 3, i + 1)
            values = [100 * r if r is not None else 0.0 for r in rates]
            bars = ax.bar(range(len(names)), values, color="#4c72b0")
            for bar, r in zip(bars, rates):
                ax.annotate("n/a" if r is None else f"{100 * r:.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
            ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
            ax.set_ylim(0, 110)
            ax.set_ylabel("%")
            ax.set_title(title, fontsize=10)
            if i == 0:
                ax.axhline(50, color="grey", linestyle="--", linewidth=0.8)  # a coin's win rate
        fig.tight_layout()
        fig.savefig(path, dpi=DPI, metadata={"Software": None}, facecolor="white")
    return path
