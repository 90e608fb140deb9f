"""Recovery intention (paper Figure 6): per model and strategy, how close the agent's words during the
recovery are to the recovery prompt — do its rationales even talk about restoring a state?

The measure (docs/validation.md): one document per finished test, its recovery turns' rationales joined;
one reference per strategy, the recovery prompt: ``recovery-prefix.md`` and the strategy's instruction
(``recovery-explicit-<X>.md``), as agents/prompts.py composes them; ``implicit`` is never given one, and is
compared with the prompt of ``explicit-0E``, the explicit strategy with its history (the ground truth it
would have been told). ``$placeholders`` are dropped: the task's instruction is not part of the recovery
prompt, and counting it would reward a rationale that only pushes the task forward. Similarity is the
cosine of TF-IDF vectors (scikit-learn's ``TfidfVectorizer``: lower case, English stop words removed,
sublinear term frequency, L2-normalised), the vocabulary and IDF fitted on the references and every document
of the same call together, so scores are comparable within one call (one table), not across calls. A test
whose agent said nothing is left out (``silent``), not scored 0.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from pytest_retrace.agents.prompts import FILES
from pytest_retrace.replay.strategies import STRATEGIES
from pytest_retrace.validation.samples import Sample

_PLACEHOLDER = re.compile(r"\$\{?\w+\}?")
_COUNTERPART = {"implicit": "explicit-0E"}  # the recovery prompt an implicit agent is measured against


class IntentionError(ValueError):
    """Prompts or samples the measure cannot be taken on; the message names the file or the value."""


class IntentionRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    strategy: str
    reference: list[str]  # the prompt files compared with
    samples: int
    silent: int  # tests with no rationale: not scored
    mean: float | None
    sd: float | None
    median: float | None
    q1: float | None
    q3: float | None
    scores: list[float]  # one per scored test, in the samples' order


def reference_files(strategy: str) -> list[str]:
    if strategy not in STRATEGIES:
        raise IntentionError(f"strategy {strategy!r}: not one of {', '.join(STRATEGIES)}")
    explicit = _COUNTERPART.get(strategy, strategy)
    return [FILES["recovery_prefix"], FILES[f"recovery_{explicit}"]]


def reference(strategy: str, prompts_dir: Path) -> str:
    parts = []
    for name in reference_files(strategy):
        path = prompts_dir / name
        try:
            parts.append(_PLACEHOLDER.sub(" ", path.read_text(encoding="utf-8")))
        except OSError as exc:
            raise IntentionError(f"{path}: {exc.strerror or exc}") from None
    return "\n\n".join(parts)


def words(sample: Sample) -> str:
    return "\n".join(s.rationale for s in sample.recovery if s.rationale and s.rationale.strip())


def similarities(documents: Sequence[str], references: Sequence[str]) -> list[float]:
    """TF-IDF cosine of each document with its reference (same index), one vocabulary for all."""
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
    except ImportError:
        raise IntentionError("the intention measure needs scikit-learn: pip install 'pytest-retrace[validation]'") from None
    vectorizer = TfidfVectorizer(lowercase=True, stop_words="english", sublinear_tf=True)
    matrix = vectorizer.fit_transform([*references, *documents])
    refs, docs = matrix[: len(references)], matrix[len(references):]
    # rows are L2-normalised: the dot product is the cosine (0 for a document with no word in the vocabulary)
    return [float(docs[i].multiply(refs[i]).sum()) for i in range(len(documents))]


def intention(samples: Sequence[Sample], prompts_dir: Path) -> list[IntentionRow]:
    """One row per (model, strategy), in the order they first appear."""
    texts = {s: reference(s, prompts_dir) for s in dict.fromkeys(x.strategy for x in samples)}
    spoken = [(x, w) for x in samples if (w := words(x))]
    scores = similarities([w for _, w in spoken], [texts[x.strategy] for x, _ in spoken]) if spoken else []
    by_sample = {x.id: score for (x, _), score in zip(spoken, scores)}
    rows = []
    for model, strategy in dict.fromkeys((x.model, x.strategy) for x in samples):
        group = [x for x in samples if (x.model, x.strategy) == (model, strategy)]
        values = [by_sample[x.id] for x in group if x.id in by_sample]
        quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
        rows.append(IntentionRow(
            model=model, strategy=strategy, reference=reference_files(strategy), samples=len(group),
            silent=len(group) - len(values), mean=statistics.fmean(values) if values else None,
            sd=statistics.stdev(values) if len(values) > 1 else None,
            median=statistics.median(values) if values else None,
            q1=quartiles[0] if values else None, q3=quartiles[2] if values else None, scores=values))
    return rows


def markdown(rows: Sequence[IntentionRow]) -> str:
    def f(x: float | None) -> str:
        return "–" if x is None else f"{x:.3f}"

    out = ["# Recovery intention (Figure 6)", "",
           "TF-IDF cosine between the agent's recovery rationales and the recovery prompt (docs/validation.md).", "",
           "| model | strategy | compared with | tests | silent | mean | sd | median | q1 – q3 |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.model} | {r.strategy} | {' + '.join(r.reference)} | {r.samples} | {r.silent} | {f(r.mean)} "
                   f"| {f(r.sd)} | {f(r.median)} | {f(r.q1)} – {f(r.q3)} |")
    return "\n".join(out) + "\n"


def plot(rows: Sequence[IntentionRow], path: Path) -> Path:
    """Box plots of the scores per (model, strategy), the mean marked."""
    import matplotlib.style
    from matplotlib.figure import Figure

    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.style.context("default"):  # not the user's matplotlibrc
        fig = Figure(figsize=(max(6.0, 0.9 * len(rows) + 2), 4.8))
        ax = fig.add_subplot()
        data = [r.scores or [float("nan")] for r in rows]
        ax.boxplot(data, showmeans=True, widths=0.6)
        ax.set_xticks(range(1, len(rows) + 1), [f"{r.model}\n{r.strategy}" for r in rows], rotation=30, ha="right",
                      fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_ylabel("TF-IDF cosine with the recovery prompt")
        ax.set_title("Recovery intention: rationales vs. recovery prompt", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=120, metadata={"Software": None}, facecolor="white")
    return path
