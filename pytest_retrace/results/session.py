"""Per-run state on the controller: the run directory, the records as tests finish, and the summary computed
from records only (so -n 0, -n 2 and a merged or resumed run give the same numbers). Writing them is the job of
the writers (writers.py), which implement the plugin's own hooks like any third party's."""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_retrace.replay.result import RecoveryResult
from pytest_retrace.results import provenance, rundir
from pytest_retrace.results.forward import ForwardRecord, read_forward
from pytest_retrace.results.records import Record, read_lines
from pytest_retrace.results.summary import RunInfo, Summary, SummaryError, build_summary

if TYPE_CHECKING:
    from pytest_retrace.agents import ModelConfig


def _prompt_files(model: ModelConfig) -> dict[str, Path]:
    """The prompt files a model config's agent reads (its prompts_dir, its overrides): the recovery intention's
    references."""
    from pytest_retrace.agents.prompts import config_prompts

    return dict(config_prompts(model).paths)


def new_run_name(models: list[str]) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{'+'.join(models)}"[:120]


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("_")[:150]


def save_artifacts(run_dir: Path, nodeid: str, result: RecoveryResult) -> list[Path]:
    """Recovered screenshot and a diff against the target, for a verdict a human wants to check."""
    from PIL import Image

    from pytest_retrace.screen.similarity import diff_image

    if result.recovered_screenshot is None or result.target_screenshot is None:
        return []
    out = rundir.artifacts_dir(run_dir, safe_name(nodeid.split("::")[-1]))
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "recovered.png", out / "diff.png"]
    # zlib level 1, as for the model's screenshots (agents/images.py): a quarter of the CPU of the default level
    Image.fromarray(result.recovered_screenshot).save(paths[0], compress_level=1)
    Image.fromarray(diff_image(result.target_screenshot, result.recovered_screenshot)).save(paths[1], compress_level=1)
    return paths


@dataclass
class RetraceSession:
    """The controller's view of a run: every record as it arrives, and the summary computed from them."""

    run_dir: Path
    records: list[Record] = field(default_factory=list)
    forward: list[ForwardRecord] = field(default_factory=list)  # a forward run's (results/forward.py)
    summary: Summary | None = None
    started_at: str = field(default_factory=provenance.now)

    @property
    def results_path(self) -> Path:
        return rundir.results_file(self.run_dir)

    @property
    def forward_path(self) -> Path:
        return rundir.forward_file(self.run_dir)

    def add(self, record: Record) -> None:
        self.records.append(record)

    def add_forward(self, record: ForwardRecord) -> None:
        self.forward.append(record)

    def load(self) -> None:
        """The records an earlier session of this run wrote (a resumed or repeated run appends to them)."""
        if self.results_path.is_file():
            self.records = read_records(self.results_path)
        if self.forward_path.is_file():
            self.forward = read_forward(self.forward_path)

    def finished(self) -> frozenset[str]:
        """Tests of this run that have a verdict (not an infrastructure error): a resumed run skips them."""
        return frozenset(r.nodeid for r in [*self.records, *self.forward] if not r.is_error)

    def finish(self, run: dict[str, Any], *, root: Path | None = None,
               models: Sequence[ModelConfig] = ()) -> Summary:
        """The summary of the run's records, with ``run`` (summary.RunInfo's fields) and — given the checkout
        ``root`` the test ids are relative to — the run's provenance (provenance.run_metadata)."""
        if root is not None:
            run = {**run, **provenance.run_metadata(root=root, models=models, records=self.records,
                                                    started_at=self.started_at)}
        files = {m.name: _prompt_files(m) for m in models}
        self.summary = build_summary(self.records, RunInfo(**run), forward=self.forward,
                                     prompt_files=files.get if files else None)
        return self.summary

    def set_exitstatus(self, status: int) -> None:
        """The process's final exit status into summary.json (see :func:`write_exitstatus`)."""
        if self.summary is not None:
            self.summary = self.summary.with_run(exitstatus=int(status))
        write_exitstatus(self.run_dir, status)


def write_exitstatus(run_dir: Path, status: int) -> None:
    """Set ``run.exitstatus`` of the run's summary.json to the status the process exits with. The summary is
    written when the session finishes, but the status is decided after that (pytest's own plugins, and
    ``retrace run``, which has its own exit codes), so whoever decides last writes it here."""
    path = rundir.summary_json(run_dir)
    if not path.is_file():
        return  # no summary was written (collect-only, a broken writer): nothing to correct
    try:
        summary = Summary.read(path)
    except SummaryError:
        return  # not one this version wrote: not ours to rewrite
    if summary.run.exitstatus == int(status):
        return
    path.write_text(summary.with_run(exitstatus=int(status)).to_json())
    markdown = rundir.summary_md(run_dir)  # its "Run" list names the status too (report._md_provenance)
    if markdown.is_file():
        text = markdown.read_text(encoding="utf-8")
        markdown.write_text(re.sub(r"(?m)^- exit status: .*$", f"- exit status: {int(status)}", text, count=1),
                            encoding="utf-8")


def read_records(path: Path) -> list[Record]:
    """Records of a results.jsonl (records.read_lines: a torn last line skipped, any other bad line named)."""
    return read_lines(path, Record.from_json)
