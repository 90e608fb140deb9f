"""The typed, versioned result record: one shape in memory, on disk and in every hook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_retrace import cli
from pytest_retrace.results.records import SCHEMA_VERSION, Failure, Record, RecordError, Step
from pytest_retrace.results.session import read_records
from pytest_retrace.results.summary import GateVerdict, RunInfo, Summary, SummaryError, build_summary


def record(nodeid: str = "cases/x.yaml::test_recovery[x-noop-implicit-r10]", **fields: object) -> Record:
    base = Record(nodeid=nodeid, case=None, task=None, domain=None, horizon=None, kind=None, model="noop",
                  strategy="implicit", budget=10, finished_at="2026-01-01T00:00:00+00:00", verdict="error",
                  error=Failure(stage="setup", kind="env", message="no display"))
    return base.model_copy(update=fields)


def test_a_record_round_trips_through_its_json_line() -> None:
    rec = record(verdict="not_recovered", error=None, r_o=False, r_tc=True, ssim=0.5,
                 actions=[Step(stage="recover", action="click", x=3, y=4, settle=0.3, rationale="why")])
    line = rec.to_json()
    assert "\n" not in line and json.loads(line)["schema_version"] == SCHEMA_VERSION
    again = Record.from_json(line)
    assert again == Record.from_dict(json.loads(line))
    assert again.actions[0].model_dump()["x"] == 3 and again.actions[0].rationale == "why"


@pytest.mark.parametrize(("data", "message"), [
    ({"schema_version": 99}, "schema_version 99: this version of pytest-retrace reads 1 only"),
    ({"schema_version": None}, "schema_version None"),
    ({"verdict": "maybe"}, "verdict: Input should be 'recovered', 'not_recovered' or 'error'"),
    ({"budget": "ten"}, "budget: Input should be a valid integer"),
    ({"colour": "red"}, "colour: Extra inputs are not permitted"),
], ids=["future-version", "no-version", "verdict", "budget", "unknown-field"])
def test_a_record_this_version_cannot_read_is_refused_by_name(data: dict, message: str) -> None:
    raw = {**json.loads(record().to_json()), **data}
    with pytest.raises(RecordError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Record.from_dict(raw)


def test_reading_a_results_file_skips_only_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    lines = [record(nodeid=f"n{i}").to_json() for i in range(3)]
    path.write_text("\n".join(lines) + "\n" + lines[0][:40])  # killed in the middle of the fourth write
    assert [r.nodeid for r in read_records(path)] == ["n0", "n1", "n2"]
    path.write_text(lines[0] + "\n{\"not\": \"a record\"}\n" + lines[1] + "\n")
    with pytest.raises(RecordError, match=r"results\.jsonl:2: record schema_version None"):
        read_records(path)


def test_retrace_summary_names_the_bad_line_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(record().to_json() + "\n[1, 2]\n" + record().to_json() + "\n")
    assert cli.main(["summary", str(path)]) == 2
    assert f"{path}:2: a record must be a JSON object, got list" in capsys.readouterr().err
    path.write_text(record().to_json() + "\n")
    assert cli.main(["summary", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["n_records"], summary["n_errors"], summary["error_kinds"]) == (1, 1, {"env": 1})


# --- the typed summary ------------------------------------------------------------------------------
RUN = RunInfo(models=["noop"], env="xvfb", budgets=[10], ssim_threshold=0.99, exitstatus=1)


def finished(nodeid: str, recovered: bool) -> Record:
    return record(nodeid, verdict="recovered" if recovered else "not_recovered", error=None, recovered=recovered)


def test_the_summary_round_trips_through_summary_json_with_the_keys_it_always_had(tmp_path: Path) -> None:
    summary = build_summary([finished("a", True), finished("b", False), record("c")], RUN)
    data = summary.to_dict()
    # gate and run.saved_baseline appear only when there is one, as before
    assert set(data) == {"schema_version", "groups", "domains", "kinds", "horizons", "n_records", "n_errors",
                         "n_ignored_reruns", "error_kinds", "n_verified_by_determinism", "run", "failed"}
    assert "saved_baseline" not in data["run"] and data["schema_version"] == 1
    (tmp_path / "summary.json").write_text(summary.to_json())
    again = Summary.read(tmp_path / "summary.json")
    assert again == summary and again.groups[0].rate == 0.5 and again.groups[0].model_dump()["ci_low"] >= 0
    gated = summary.gated(GateVerdict(passed=False, problems=["too low"], notes=[], strict=False))
    saved = gated.with_run(saved_baseline="reports/baselines/x.json")
    assert saved.to_dict()["gate"]["problems"] == ["too low"] and saved.to_dict()["run"]["saved_baseline"]
    assert summary.gate is None and summary["n_records"] == 3  # copies; the dict's keys still read


@pytest.mark.parametrize(("data", "message"), [
    ({"schema_version": 2}, "summary schema_version 2: this version of pytest-retrace reads 1"),
    ({"n_errors": "x"}, "n_errors: Input should be a valid integer"),
], ids=["future-version", "bad-field"])
def test_a_summary_this_version_cannot_read_is_refused_by_name(tmp_path: Path, data: dict, message: str) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({**build_summary([record()], RUN).to_dict(), **data}))
    with pytest.raises(SummaryError, match=message):
        Summary.read(path)


@pytest.mark.parametrize(("pytest_status", "gate", "collection_errors", "plain", "measuring"), [
    (1, None, 0, 1, 0),  # failed recoveries: pytest says 1, retrace run measured
    (0, None, 0, 0, 0),
    (1, None, 2, 1, 4),  # a case file that did not load: a usage error of retrace run
    (1, True, 0, 0, 0),  # the gate decides under both
    (0, False, 2, 1, 1),
    (2, None, 0, 2, 2),  # interrupted: pytest's own status
], ids=["failed", "ok", "case-file", "gate-passed", "gate-failed", "interrupted"])
def test_one_place_decides_the_exit_status(pytest_status: int, gate: bool | None, collection_errors: int,
                                           plain: int, measuring: int) -> None:
    summary = build_summary([record()], RUN.model_copy(update={"collection_errors": collection_errors}))
    if gate is not None:
        summary = summary.gated(GateVerdict(passed=gate, problems=[] if gate else ["x"], notes=[], strict=False))
    assert summary.exit_status(pytest_status) == plain
    assert summary.exit_status(pytest_status, measuring=True) == measuring
