"""Recovery intention (paper Figure 6): per model and strategy, how close the agent's words during the
recovery are to the recovery prompt — do its rationales even talk about restoring a state? In a run's summary
(summary.json's ``intention``, summary.md, plots/intention.png; the prompts are each model config's) and
``retrace intention RUN...`` (a prompt directory given).

The measure (docs/validation.md): one document per finished test of a model (not of a scripted baseline),
its recovery turns' rationales joined;
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
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from pytest_retrace.agents.prompts import FILES
from pytest_retrace.replay.strategies import STRATEGIES
from pytest_retrace.results.records import Record, dedupe

_PLACEHOLDER = re.compile(r"\$\{?\w+\}?")
_COUNTERPART = {"implicit": "explicit-0E"}  # the recovery prompt an implicit agent is measured against


class IntentionError(ValueError):
    """Prompts or samples the measure cannot be taken on; the message names the file or the value."""


class IntentionRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    strategy: str
    reference: list[str]  # the prompt files compared with
    tests: int
    silent: int  # tests with no rationale: not scored
    mean: float | None
    sd: float | None
    median: float | None
    q1: float | None
    q3: float | None
    scores: list[float]  # one per scored test, in the order they finished


def reference_keys(strategy: str) -> list[str]:
    """The prompt keys (agents.prompts.FILES) a strategy's rationales are compared with."""
    if strategy not in STRATEGIES:
        raise IntentionError(f"strategy {strategy!r}: not one of {', '.join(STRATEGIES)}")
    return ["recovery_prefix", f"recovery_{_COUNTERPART.get(strategy, strategy)}"]


def reference_files(strategy: str) -> list[str]:
    return [FILES[key] for key in reference_keys(strategy)]


def prompt_files(prompts_dir: Path) -> dict[str, Path]:
    """Every prompt key's file in one directory (``retrace intention --prompts``); a run's summary uses each
    model config's own (agents.prompts.Prompts.paths, its overrides included)."""
    return {key: prompts_dir / name for key, name in FILES.items()}


def reference(strategy: str, files: dict[str, Path]) -> str:
    parts = []
    for key in reference_keys(strategy):
        path = files[key]
        try:
            parts.append(_PLACEHOLDER.sub(" ", path.read_text(encoding="utf-8")))
        except OSError as exc:
            raise IntentionError(f"{path}: {exc.strerror or exc}") from None
    return "\n\n".join(parts)


def words(record: Record) -> str:
    return "\n".join(s.rationale for s in record.actions
                     if s.stage == "recover" and s.rationale and s.rationale.strip())


def similarities(documents: Sequence[str], references: Sequence[str]) -> list[float]:
    """TF-IDF cosine of each document with its reference (same index), one vocabulary for all."""
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
    except ImportError:
        raise IntentionError("the intention measure needs scikit-learn (a dependency of pytest-retrace)") from None
    vectorizer = TfidfVectorizer(lowercase=True, stop_words="english", sublinear_tf=True)
    matrix = vectorizer.fit_transform([*references, *documents])
    refs, docs = matrix[: len(references)], matrix[len(references):]
    # rows are L2-normalised: the dot product is the cosine (0 for a document with no word in the vocabulary)
    return [float(docs[i].multiply(refs[i]).sum()) for i in range(len(documents))]


def intention(records: Sequence[Record], files: Callable[[str], dict[str, Path] | None]) -> list[IntentionRow]:
    """One row per (model, strategy) of the finished tests of models (scripted baselines, which say nothing, are
    left out), in the order they first appear. ``files``: a model's prompt files (key -> path); None: a model
    whose prompts are unknown (a resumed run's earlier model no longer configured), left out."""
    tests = [r for r in dedupe(records)[0] if not r.is_error and not r.privileged and files(r.model) is not None]
    texts = {(m, s): reference(s, files(m) or {}) for m, s in dict.fromkeys((x.model, x.strategy) for x in tests)}
    spoken = [(x, w) for x in tests if (w := words(x))]
    scores = similarities([w for _, w in spoken], [texts[x.model, x.strategy] for x, _ in spoken]) if spoken else []
    by_test = {x.nodeid: score for (x, _), score in zip(spoken, scores)}
    rows = []
    for model, strategy in texts:
        group = [x for x in tests if (x.model, x.strategy) == (model, strategy)]
        values = [by_test[x.nodeid] for x in group if x.nodeid in by_test]
        quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
        rows.append(IntentionRow(
            model=model, strategy=strategy, reference=reference_files(strategy), tests=len(group),
            silent=len(group) - len(values), mean=_r(statistics.fmean(values)) if values else None,
            sd=_r(statistics.stdev(values)) if len(values) > 1 else None,
            median=_r(statistics.median(values)) if values else None,
            q1=_r(quartiles[0]) if values else None, q3=_r(quartiles[2]) if values else None,
            scores=[_r(v) for v in values]))
    return rows


def _r(x: float) -> float:
    return round(x, 6)  # as every float of the summary: read back from summary.json, the same row
