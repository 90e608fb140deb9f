"""The sample plan of a human evaluation (paper B.3): for each alternative evaluator, the finished tests where
ReTrace's verdict differs from the alternative's, N of them drawn at random, split between annotator pairs.

How it is drawn (same runs, annotators, N, seed and judges: the same plan, byte for byte):

- the pool of an alternative (``r_tc``, ``r_o``, ``judge:<name>``): every sample whose alternative verdict is
  known and differs from ReTrace's, ordered by sample id (so the order the runs finished in does not matter);
- N of them drawn with ``random.Random("<seed>:<alternative>")``: each alternative's draw is a uniform sample of
  its own pool, and does not change when a judge is added or removed; all of them where the pool is smaller
  (``Plan.available`` says how many there were);
- a sample drawn for several alternatives (a judge's pool overlaps R_O's or R_TC's; those two never overlap,
  as R = R_O ∧ R_TC) is shown once, under the first alternative that drew it, ``also_for`` naming the others.
  It counts for each of them in its win rate (each alternative keeps its own uniform draw), and once in the
  pooled tables (alignment, thresholds, κ), as the paper removed the duplicates of its evaluation sets;
- the shown samples, alternative by alternative in draw order, go round-robin to the annotator pairs (the
  annotators as given, taken two by two), one counter for the whole plan so that the pairs' loads differ by
  at most one sample.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_retrace.validation.files import Plan, PlannedSample, check_name
from pytest_retrace.validation.samples import Sample, load_samples
from pytest_retrace.validation.verdicts import (
    R_O,
    R_TC,
    judge_alternative,
    judges_of,
    samples_by_run,
    verdict,
)


class SamplingError(ValueError):
    """Arguments a plan cannot be drawn from; the message names the value."""


def pairs(annotators: Sequence[str]) -> list[list[str]]:
    """The annotators two by two, in the order given."""
    if len(annotators) < 2 or len(annotators) % 2:
        raise SamplingError(f"annotators {', '.join(annotators) or '(none)'}: give an even number (pairs, in order)")
    if len(set(annotators)) != len(annotators):
        raise SamplingError(f"annotators {', '.join(annotators)}: a name is given twice")
    for a in annotators:
        try:
            check_name(a, "annotator")
        except ValueError as exc:
            raise SamplingError(str(exc)) from None
    return [list(annotators[i:i + 2]) for i in range(0, len(annotators), 2)]


def draw_plan(runs: Sequence[Path], annotators: Sequence[str], per_alternative: int, seed: int,
              judges: Sequence[str] = (), *,
              load: Callable[[Path], list[Sample]] = load_samples) -> Plan:
    """The plan for these runs (run directories or their results.jsonl); ``judges``: the judges whose verdicts
    (<run>/judge/<name>.jsonl) are alternatives too. ``load``: how a run's samples are read (tests)."""
    teams = pairs(annotators)
    if per_alternative < 1:
        raise SamplingError(f"per-alternative {per_alternative}: draw at least 1 sample per alternative")
    if len(set(judges)) != len(judges):
        raise SamplingError(f"judges {', '.join(judges)}: a name is given twice")
    try:
        alternatives = [R_TC, R_O, *(judge_alternative(j) for j in judges)]
    except ValueError as exc:
        raise SamplingError(str(exc)) from None
    by_run = samples_by_run(runs, load)
    verdicts = judges_of(by_run, judges)
    run_of = {s.id: run_dir for run_dir, run_samples in by_run.items() for s in run_samples}
    every = sorted((s for run_samples in by_run.values() for s in run_samples), key=lambda s: s.id)
    shown: dict[str, PlannedSample] = {}
    available: dict[str, int] = {}
    turn = 0
    for alternative in alternatives:
        pool = [s for s in every if (v := verdict(s, alternative, verdicts)) is not None and v != s.oracle.recovered]
        available[alternative] = len(pool)
        drawn = random.Random(f"{seed}:{alternative}").sample(pool, min(per_alternative, len(pool)))
        for s in drawn:
            if s.id in shown:
                first = shown[s.id]
                shown[s.id] = first.model_copy(update={"also_for": [*first.also_for, alternative]})
                continue
            shown[s.id] = PlannedSample(sample=s.id, run=str(run_of[s.id]), nodeid=s.nodeid, alternative=alternative,
                                        annotators=teams[turn % len(teams)])
            turn += 1
    return Plan(seed=seed, per_alternative=per_alternative, runs=[str(r) for r in by_run],
                annotators=list(annotators), samples=list(shown.values()), available=available)


def counted_for(planned: PlannedSample) -> list[str]:
    """Every alternative a planned sample counts for in the win rates."""
    return [planned.alternative, *planned.also_for]
