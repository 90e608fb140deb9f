"""The validation's commands: ``retrace agreement`` and ``retrace intention`` (``retrace judge`` and ``retrace
annotate``, ``--sample`` included, have modules of their own). Each takes argparse's namespace; ``add_validation_commands`` registers
them on the ``retrace`` parser."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

AGREEMENT_MD, AGREEMENT_JSON, AGREEMENT_PNG = "agreement.md", "agreement.json", "agreement.png"
INTENTION_MD, INTENTION_JSON, INTENTION_PNG = "intention.md", "intention.json", "intention.png"


def add_validation_commands(sub: argparse._SubParsersAction) -> None:
    agr = sub.add_parser("agreement", help="a study's agreement with people: win rates, alignment, SSIM "
                                           "thresholds, Cohen's κ (paper Tables 1, 12, 13)")
    agr.add_argument("study", metavar="STUDY", help="the study directory (plan.json, annotations/)")
    agr.add_argument("--thresholds", default="0.99,0.95,0.91", help="R_O's SSIM thresholds (default 0.99,0.95,0.91)")
    agr.add_argument("--json", action="store_true", help="print the tables as JSON")
    agr.add_argument("--out", metavar="DIR", help="write agreement.md, agreement.json and agreement.png here")
    agr.set_defaults(func=cmd_agreement)
    itn = sub.add_parser("intention", help="recovery intention (paper Figure 6): the agents' rationales against the "
                                           "recovery prompt, per model and strategy")
    itn.add_argument("runs", nargs="+", metavar="RUN", help="a run directory or its results.jsonl")
    itn.add_argument("--prompts", default="agents/prompts", help="the prompt files (default agents/prompts)")
    itn.add_argument("--json", action="store_true", help="print the rows as JSON")
    itn.add_argument("--out", metavar="DIR", help="write intention.md, intention.json and intention.png here")
    itn.set_defaults(func=cmd_intention)


def _fail(command: str, exc: Exception) -> int:
    print(f"retrace {command}: {exc}", file=sys.stderr)
    return 2


def _thresholds(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--thresholds {text!r}: comma-separated numbers") from None
    if not values or not all(0.0 <= t <= 1.0 for t in values):
        raise ValueError(f"--thresholds {text!r}: SSIM thresholds between 0 and 1")
    return values


def cmd_agreement(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    from pytest_retrace.validation.agreement import agreement, markdown, plot

    try:
        result = agreement(Path(args.study), _thresholds(args.thresholds))
    except ValueError as exc:  # AgreementError, VerdictError, SampleError
        return _fail("agreement", exc)
    text = result.model_dump_json(indent=2)
    print(text if args.json else markdown(result))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / AGREEMENT_MD).write_text(markdown(result) + f"\n![agreement]({AGREEMENT_PNG})\n", encoding="utf-8")
        (out / AGREEMENT_JSON).write_text(text + "\n", encoding="utf-8")
        plot(result, out / AGREEMENT_PNG)
        print(f"wrote {out / AGREEMENT_MD}, {AGREEMENT_JSON} and {AGREEMENT_PNG}", file=sys.stderr)
    return 0


def cmd_intention(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    """The recovery intention of runs made earlier (a run's own summary has it too, with each model config's
    prompts): here against one prompt directory, over every run given together (one vocabulary)."""
    from pytest_retrace.results.intention import intention, prompt_files
    from pytest_retrace.results.paper_figures import intention_rows as figure
    from pytest_retrace.results.plotkit import write_figures
    from pytest_retrace.results.records import RecordError
    from pytest_retrace.results.report import md_table
    from pytest_retrace.results.session import read_records
    from pytest_retrace.results.tables import intention_cells, pad_table

    files = prompt_files(Path(args.prompts))
    records = []
    try:
        for run in args.runs:
            path = Path(run) if run.endswith(".jsonl") else Path(run) / "results.jsonl"
            # a test id belongs to its run: the same test in two runs is two measurements
            records += [r.model_copy(update={"nodeid": f"{run}|{r.nodeid}"}) for r in read_records(path)]
        rows = intention(records, lambda model: files)
    except FileNotFoundError as exc:
        return _fail("intention", ValueError(f"{exc.filename}: no such file (a run directory or its results.jsonl)"))
    except (ValueError, RecordError) as exc:  # IntentionError, RecordError
        return _fail("intention", exc)
    if not rows:
        return _fail("intention", ValueError(f"{', '.join(args.runs)}: no finished test of a model to measure"))
    text = json.dumps([r.model_dump(mode="json") for r in rows], indent=2)
    print(text if args.json else pad_table(intention_cells(rows)))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / INTENTION_MD).write_text(f"# Recovery intention\n\n{md_table(intention_cells(rows))}\n\n"
                                        f"![intention]({INTENTION_PNG})\n", encoding="utf-8")
        (out / INTENTION_JSON).write_text(text + "\n", encoding="utf-8")
        write_figures(rows, out, {INTENTION_PNG: figure}, set(), None)
        print(f"wrote {out / INTENTION_MD}, {INTENTION_JSON} and {INTENTION_PNG} (.pdf, .svg)", file=sys.stderr)
    return 0
