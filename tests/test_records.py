"""The typed, versioned result record: one shape in memory, on disk and in every hook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_retrace import cli
from pytest_retrace.results.records import SCHEMA_VERSION, Failure, Record, RecordError, Step
from pytest_retrace.results.session import read_records


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
