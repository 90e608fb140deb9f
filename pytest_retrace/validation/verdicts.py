"""Every verdict a sample gets, read in one place: ReTrace's (R = R_O ∧ R_TC), its two halves alone, R_O at
another SSIM threshold, a judge's (<run>/judge/<judge>.jsonl) and the people's (<study>/annotations/).

The alternatives ReTrace is compared with (paper B.3, Table 1) are named ``r_tc`` (R_TC alone: the task's
evaluator after the replayed suffix), ``r_o`` (R_O alone: the screenshot match) and ``judge:<name>``. A verdict
that is unknown (a stage that never ran, a judge without a verdict) is None: such a sample is never counted
for that alternative, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from pytest_retrace.validation.files import (
    ANNOTATIONS,
    Annotation,
    JudgeVerdict,
    Plan,
    check_name,
    judge_file,
    read_jsonl,
)
from pytest_retrace.validation.samples import Oracle, Sample

R_TC, R_O, JUDGE = "r_tc", "r_o", "judge:"
LABELS = {R_TC: "R_TC alone (w/o R_O)", R_O: "R_O alone (w/o R_TC)"}


class VerdictError(ValueError):
    """A verdict file that cannot be read or that names an unknown sample; the message names file and line."""


def label(alternative: str) -> str:
    return LABELS.get(alternative) or f"judge {alternative.removeprefix(JUDGE)}"


def judge_alternative(name: str) -> str:
    return JUDGE + check_name(name, "judge")


def r_o_at(oracle: Oracle, threshold: float) -> bool | None:
    """R_O had its SSIM threshold been ``threshold``, from the stored SSIM: ``ssim >= threshold``, as
    replay.scoring compares. R_O also fails a screen that never settled; where the stored SSIM passed the run's
    own threshold but R_O failed, that is why, and it fails at every threshold. (A screen below the run's
    threshold that also never settled cannot be told apart: it counts as settled.) No stored SSIM (the screen
    could not be read): the stored R_O at every threshold."""
    if oracle.ssim is None or oracle.ssim_threshold is None:
        return oracle.r_o
    unsettled = oracle.ssim >= oracle.ssim_threshold and oracle.r_o is False
    return oracle.ssim >= threshold and not unsettled


def verdict(sample: Sample, alternative: str, judges: dict[str, dict[str, bool | None]]) -> bool | None:
    """The alternative's verdict on a sample (True: recovered). ``judges``: judge name -> sample id -> verdict."""
    if alternative == R_TC:
        return sample.oracle.r_tc
    if alternative == R_O:
        return sample.oracle.r_o
    if alternative.startswith(JUDGE):
        return judges[alternative.removeprefix(JUDGE)].get(sample.id)
    raise ValueError(f"unknown alternative {alternative!r}: {R_TC}, {R_O} or {JUDGE}<name>")


def read_judge(run_dir: Path, judge: str, known: Iterable[str]) -> dict[str, bool | None]:
    """A judge's verdicts on a run's samples (sample id -> True / False / None), the last line of a sample
    winning (a rerun of `retrace judge` appends). ``known``: the run's sample ids; any other is an error (a
    renamed run directory changes every id)."""
    path = judge_file(run_dir, judge)
    if not path.is_file():
        raise VerdictError(f"{path}: no such file (run `retrace judge` on {run_dir} first)")
    ids = set(known)
    out: dict[str, bool | None] = {}
    for number, line in read_jsonl(path, JudgeVerdict, VerdictError):
        if line.sample not in ids:
            raise VerdictError(f"{path}:{number}: sample {line.sample!r} ({line.nodeid}) is not a sample of {run_dir}")
        out[line.sample] = None if line.verdict is None else line.verdict == "recovered"
    return out


def judges_of(samples: dict[Path, list[Sample]], names: Iterable[str]) -> dict[str, dict[str, bool | None]]:
    """judge name -> sample id -> verdict, over every run."""
    out: dict[str, dict[str, bool | None]] = {}
    for name in names:
        merged: dict[str, bool | None] = {}
        for run_dir, run_samples in samples.items():
            merged |= read_judge(run_dir, name, (s.id for s in run_samples))
        out[name] = merged
    return out


def read_annotations(study: Path, plan: Plan) -> dict[str, dict[str, Annotation]]:
    """sample id -> annotator -> their answer, from every <study>/annotations/<who>.jsonl. A
    person may change their mind: their last line for a sample wins. A line for a sample the plan does not
    hold, by someone the plan did not give it to, or under another annotator's file name is an error naming
    the file and the line."""
    planned = {s.sample: s for s in plan.samples}
    out: dict[str, dict[str, Annotation]] = {}
    folder = study / ANNOTATIONS
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        for number, a in read_jsonl(path, Annotation, VerdictError):
            where = f"{path}:{number}"
            if a.annotator != path.stem:
                raise VerdictError(f"{where}: annotator {a.annotator!r} in the file of {path.stem!r}")
            if a.sample not in planned:
                raise VerdictError(f"{where}: unknown sample {a.sample!r}: not in {study}'s plan")
            if a.annotator not in planned[a.sample].annotators:
                raise VerdictError(f"{where}: sample {a.sample!r} was planned for "
                                   f"{', '.join(planned[a.sample].annotators) or 'nobody'}, not {a.annotator!r}")
            out.setdefault(a.sample, {})[a.annotator] = a
    return out


def samples_by_run(runs: Iterable[Path], load: Callable[[Path], list[Sample]]) -> dict[Path, list[Sample]]:
    """run directory -> its samples; a run given twice is an error (its samples would be drawn twice)."""
    out: dict[Path, list[Sample]] = {}
    for run in runs:
        run_dir = (run.parent if run.suffix == ".jsonl" else run).resolve()
        if run_dir in out or any(r.name == run_dir.name for r in out):
            raise VerdictError(f"{run}: given twice (or two runs named {run_dir.name!r}: a sample id is the run's "
                               "name and the test's id)")
        out[run_dir] = load(run_dir)
    return out
