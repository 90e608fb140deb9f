"""The layout of the report directory and of each run directory in it, in one place: every file a run writes or
another command reads is named here, and every module builds those paths with these functions.

    reports/                    --retrace-report-dir
      <run>/                    one run (--retrace-run, or a new name per run)
        results.jsonl           the records, one per test: the run itself; everything else is a view of it
        forward.jsonl           a forward run's records (--retrace-experiment=forward), one per episode
        trajectories/           a forward run's episodes in OSWorld's results layout (experiments.trajectory)
        summary.json            the summary computed from the records, with the run's provenance
        summary.md              the same for people, linking the plots
        plots/                  the figures (plots.PLOTS), each as PNG, PDF and SVG
        artifacts/<test>/       a test's images for a human to check (the recovered screen, its diff)
        .progress/              the workers' live progress (progress.py)
      baselines/<name>.json     saved baselines (--retrace-save-baseline, --retrace-baseline NAME)

``retrace report --out DIR`` lays out its directory as a run's: report.md beside plots/, linked relatively.
"""

from __future__ import annotations

from pathlib import Path

RESULTS = "results.jsonl"
FORWARD = "forward.jsonl"
TRAJECTORIES = "trajectories"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
REPORT_MD = "report.md"  # retrace report --out
PLOTS = "plots"  # summary.md links its figures relative to the run directory: plots/<name>
ARTIFACTS = "artifacts"
PROGRESS = ".progress"
BASELINES = "baselines"


def results_file(run_dir: Path) -> Path:
    return run_dir / RESULTS


def forward_file(run_dir: Path) -> Path:
    return run_dir / FORWARD


def trajectories_dir(run_dir: Path) -> Path:
    return run_dir / TRAJECTORIES


def summary_json(run_dir: Path) -> Path:
    return run_dir / SUMMARY_JSON


def summary_md(run_dir: Path) -> Path:
    return run_dir / SUMMARY_MD


def report_md(out: Path) -> Path:
    return out / REPORT_MD


def plots_dir(run_dir: Path) -> Path:
    return run_dir / PLOTS


def artifacts_dir(run_dir: Path, test: str) -> Path:
    """Where one test's artifacts go; `test` is already a safe file name."""
    return run_dir / ARTIFACTS / test


def progress_dir(run_dir: Path) -> Path:
    return run_dir / PROGRESS


def baseline_file(report_dir: Path, name: str) -> Path:
    return report_dir / BASELINES / f"{name}.json"


def results_of(run: Path) -> Path:
    """A run directory's results file; a path to a file is taken as the results file itself."""
    return results_file(run) if run.is_dir() else run


def run_label(results: Path) -> str:
    """A run's name: its directory's for a results.jsonl, the file's stem for a results file kept elsewhere."""
    return results.parent.name if results.name == RESULTS else results.stem


def runs_in(report_dir: Path) -> list[Path]:
    """The results files of the runs in `report_dir`, newest first; none when the directory does not exist."""
    if not report_dir.is_dir():
        return []
    return sorted(report_dir.glob(f"*/{RESULTS}"), key=lambda f: f.stat().st_mtime, reverse=True)
