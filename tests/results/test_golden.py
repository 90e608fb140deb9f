"""What the summary's readers print, pinned to the byte: summary.json, summary.md, ``retrace summary`` (table and
--json), the terminal's tables and ``retrace report`` (text, report.md, --json) of two fixed runs, against
files in tests/data/golden/ written by the code before the readers took the typed Summary. A change here is a
change of a published format: regenerate them on purpose only (``python -m tests.results.test_golden``) and
say so in the commit."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from pytest_retrace import cli
from pytest_retrace.results.merge import merge_runs
from pytest_retrace.results.records import Failure, Record
from pytest_retrace.results.report import render_markdown, render_report
from pytest_retrace.results.summary import GateVerdict, RunInfo, Summary, build_summary
from pytest_retrace.results.tables import format_table
from tests.helpers import REPO

GOLDEN = REPO / "tests" / "data" / "golden"
CASES = [  # case, domain, kind, horizon
    ("c1", "files", "visible", "short"), ("c2", "files", "subtle", "long"), ("c3", "sheets", "hidden-state", "long"),
    ("c4", "sheets", "visual-only", "short"), ("c5", "web", None, None), ("c6", "web", "visible", "long"),
    ("c7", "files", "custom", "medium"),
]
ERRORS = ("env", "desync", "transport")


def _record(run: str, i: int, case: str, domain: str, kind: str | None, horizon: str | None, model: str,
            strategy: str, budget: int, run_index: int) -> Record:
    """A record whose verdict, criteria, SSIM and usage vary with its position, so that every column differs."""
    pick = (7 * i + 3 * len(model) + budget + run_index) % 6
    error = pick == 5 and i % 2 == 0
    r_o, r_tc = [(True, True), (True, False), (False, True), (False, False), (True, True), (True, False)][pick]
    verdict = "error" if error else "recovered" if r_o and r_tc else "not_recovered"
    usage = {"calls": 2 + i % 3, "input_tokens": 1000 + 37 * i, "output_tokens": 50 + i,
             **({"cost": 0.0012345 * (i + 1)} if model == "n" else {})}
    return Record(
        nodeid=f"cases/{domain}/{case}.yaml::test_recovery[{case}-{model}-{strategy}-r{budget}-run{run_index}]",
        case=case, task=f"task-{case}", domain=domain, horizon=horizon, kind=kind, model=model, strategy=strategy,
        budget=budget, run_index=run_index, finished_at="2026-12-01T00:00:00+00:00", verdict=verdict,
        recovered=None if error else r_o and r_tc, r_o=None if error else r_o, r_tc=None if error else r_tc,
        ssim=None if error else round(0.9 + ((13 * i) % 97) / 1000.0 + 1e-7 * i, 9),
        error=Failure(stage="reset", kind=ERRORS[i % 3], message="boom") if error else None,
        error_state_verified_by="determinism" if kind == "hidden-state" else "screen",
        usage={} if error else usage,
        context_usage={"calls": 1, "input_tokens": 300, "output_tokens": 7} if strategy == "explicit" else {},
        artifacts={} if verdict == "recovered" else {"recovered": f"artifacts/{case}-{model}/recovered.png"},
    )


def golden_records() -> dict[str, list[Record]]:
    """Two runs: "before" (models m and n, two strategies, budgets 3 and 10, two run indices, errors, a rerun,
    a crashed worker's record) and "after" (model m again on fewer cases)."""
    before: list[Record] = []
    i = 0
    for model in ("m", "n"):
        for strategy in ("implicit", "explicit"):
            for budget in (3, 10):
                for run_index in (0, 1):
                    for case, domain, kind, horizon in CASES:
                        before.append(_record("before", i, case, domain, kind, horizon, model, strategy, budget,
                                              run_index))
                        i += 1
    before.append(before[0].model_copy(update={"verdict": "not_recovered"}))  # a rerun: ignored
    before.append(before[1].model_copy(update={"verdict": "recovered"}))  # replaces an error or is ignored
    before.append(Record(nodeid="cases/web/c9.yaml::test_recovery[c9-m-implicit-r10-run0]", case=None, task=None,
                         domain=None, horizon=None, kind=None, model="m", strategy="implicit", budget=10,
                         finished_at="2026-12-01T00:00:00+00:00", verdict="error",
                         error=Failure(stage="worker", kind="crash", message="worker died")))
    after = [_record("after", i + 5, case, domain, kind, horizon, "m", "implicit", budget, 0)
             for budget in (3, 10) for case, domain, kind, horizon in CASES[:5]]
    return {"before": before, "after": after}


def _run(records: list[Record], digests: dict[str, str], **extra: object) -> RunInfo:
    return RunInfo(
        models=sorted({r.model for r in records}), env="xvfb", budgets=[3, 10], ssim_threshold=0.99, exitstatus=1,
        started_at="2026-12-01T00:00:00+00:00", finished_at="2026-12-01T00:10:00+00:00",
        git={"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": True},
        versions={"pytest-retrace": "0.1.0", "pytest": "8.3.0"}, command=["retrace", "run", "-n", "2"],
        model_configs=[{"name": "m", "provider": "anthropic", "model": "claude-x", "config_digest": "sha256:" + "ab" * 32},
                       {"name": "n", "provider": "scripted"}],
        cases={c: {"file": f"cases/{c}.yaml", "digest": d} for c, d in digests.items()}, **extra)


def golden_summaries() -> dict[str, Summary]:
    runs = golden_records()
    digests = {c: f"sha256:{c}" for c, *_ in CASES}
    before = build_summary(runs["before"], _run(runs["before"], digests, sample=1, collection_errors=1,
                                                case_file_errors=[{"file": "cases/x.yaml", "error": "bad"}]))
    gate = GateVerdict(passed=False, problems=["m implicit r=3: recovery rate 40.0% < 50.0%"], notes=["a note"],
                       strict=True, baseline={"path": "baselines/b.json", "groups": [{"name": "m", "p": 0.5}]})
    after = build_summary(runs["after"], _run(runs["after"], {**digests, "c2": "sha256:changed"}))
    return {"before": before.gated(gate).with_run(saved_baseline="baselines/b.json"), "after": after}


def golden_outputs(tmp: Path) -> dict[str, str]:
    """Every rendering of the fixed runs, by the file in tests/data/golden/ that holds it."""
    runs, summaries = golden_records(), golden_summaries()
    out: dict[str, str] = {}
    dirs = []
    for name, records in runs.items():
        run_dir = tmp / name
        run_dir.mkdir(parents=True)
        (run_dir / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
        (run_dir / "summary.json").write_text(summaries[name].to_json())
        out[f"summary-{name}.json"] = summaries[name].to_json()
        dirs.append(str(run_dir))
    summary = summaries["before"]
    out["summary.md"] = render_markdown(summary, "golden run", ["plots/rates.png", "plots/kinds.png"])
    out["tables.txt"] = "\n\n".join(format_table(summary, by=by) for by in (None, "domain", "kind", "horizon"))
    out["retrace-summary.txt"] = _cli(["summary", str(tmp / "before" / "results.jsonl")])
    out["retrace-summary.json"] = _cli(["summary", "--json", str(tmp / "before" / "results.jsonl")])
    out["retrace-report.txt"] = _cli(["report", *dirs])
    out["retrace-report.json"] = _cli(["report", "--json", *dirs])
    out["report.md"] = render_report(merge_runs(dirs), plots=["plots/rates.png"])
    return {name: text.replace(str(tmp), "TMP") for name, text in out.items()}


def _cli(argv: list[str]) -> str:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli.main(argv) == 0
    return stdout.getvalue()


NAMES = ("summary-before.json", "summary-after.json", "summary.md", "tables.txt", "retrace-summary.txt",
         "retrace-summary.json", "retrace-report.txt", "retrace-report.json", "report.md")


@pytest.mark.parametrize("name", NAMES)
def test_output_is_unchanged(name: str, tmp_path: Path) -> None:
    outputs = golden_outputs(tmp_path)
    assert outputs[name] == (GOLDEN / name).read_text(encoding="utf-8")


def test_every_output_is_pinned(tmp_path: Path) -> None:
    assert sorted(golden_outputs(tmp_path)) == sorted(NAMES) == sorted(p.name for p in GOLDEN.iterdir())


def test_summary_json_reads_back_to_the_same_summary() -> None:
    for name, summary in golden_summaries().items():
        again = Summary.from_dict(json.loads((GOLDEN / f"summary-{name}.json").read_text(encoding="utf-8")))
        assert again == summary
        assert again.to_json() == summary.to_json()


if __name__ == "__main__":  # regenerate tests/data/golden/ (on purpose only: see the module docstring)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, text in golden_outputs(Path(tmp)).items():
            (GOLDEN / name).write_text(text, encoding="utf-8")
            print(f"wrote {GOLDEN / name}", file=sys.stderr)
