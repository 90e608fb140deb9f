"""`retrace annotate` over plain HTTP, on samples of a real run: the plan of every sample, the blind sample view,
the five images, every answer on disk as it is acknowledged, bad input answered 4xx with nothing written, a
killed server resuming, the token off loopback."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pytest_retrace.cli import main
from pytest_retrace.validation.files import Annotation, Plan, annotations_file
from pytest_retrace.validation.samples import load_samples
from tests.validation.annotating import ORACLE_KEYS, Server, http, small_run, write_plan

pytestmark = pytest.mark.desktop  # the samples come from a real run on the desktop


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_run(tmp_path_factory.getbasetemp())


@pytest.fixture
def served(tmp_path: Path, run: Path):
    """alice sees samples 0-5, bob 2-7."""
    samples = write_plan(tmp_path, run, {"alice": slice(0, 6), "bob": slice(2, 8)})
    server = Server.start(tmp_path, "--port", "0")
    yield server, samples, tmp_path
    server.stop()


def test_all_makes_a_plan_of_every_sample(tmp_path: Path, run: Path, capsys: pytest.CaptureFixture) -> None:
    study = tmp_path / "study"
    assert main(["annotate", "--all", str(run), "--annotators", "ann,ben", "--out", str(study)]) == 0
    plan = Plan.read(study)
    samples = load_samples(run)
    assert len(samples) == 8
    assert [p.sample for p in plan.samples] == [s.id for s in samples]
    assert {p.alternative for p in plan.samples} == {"all"} and plan.per_alternative is None
    assert all(p.annotators == ["ann", "ben"] for p in plan.samples)
    before = (study / "plan.json").read_bytes()
    assert main(["annotate", "--all", str(run), "--annotators", "x", "--out", str(study)]) == 2  # fixed once made
    assert (study / "plan.json").read_bytes() == before
    assert main(["annotate", "--all", str(run), "--annotators", "../evil", "--out", str(tmp_path / "o")]) == 2
    assert "annotator '../evil'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_sample_view_is_blind_and_images_are_served_by_name(served) -> None:
    server, samples, study = served
    status, nxt = http(server.url + "api/next?annotator=bob")
    assert (status, nxt) == (200, {"annotator": "bob", "sample": samples[2].id, "done": 0, "total": 6})
    for s in samples:
        status, view = http(server.url + f"api/samples/{s.id}")
        assert status == 200
        assert view["instruction"] == s.instruction and view["id"] == s.id
        assert [step["action"] for step in view["recovery"]] == [step.action for step in s.recovery]
        assert [step["rationale"] for step in view["recovery"]] == [step.rationale for step in s.recovery]
        text = json.dumps(view)
        assert not ORACLE_KEYS & set(view), view.keys()
        assert not {"model", "strategy", "nodeid", "target", "error", "recovered"} & set(view)
        assert str(s.target) not in text and str(study) not in text and "/tmp" not in text
        assert view["images"] == dict.fromkeys(["target", "error", "recovered", "diff", "heatmap"], True)
    s = samples[1]  # noop: the recovered screen is the error screen, not the target
    size = Image.open(s.target).size
    for name in ("target", "error", "recovered", "diff", "heatmap"):
        status, raw = http(server.url + f"api/samples/{s.id}/images/{name}")
        assert status == 200, raw
        assert Image.open(io.BytesIO(raw)).size == size
    assert http(server.url + f"api/samples/{s.id}/images/target")[1] == s.target.read_bytes()
    assert sorted(p.name for p in (study / "cache" / s.id).iterdir()) == ["diff.png", "heatmap.png"]
    heat = np.asarray(Image.open(study / "cache" / s.id / "heatmap.png").convert("RGB"))
    assert ((heat[..., 0] > 200) & (heat[..., 1] < 100)).any(), "no dissimilar (red) pixel in the heatmap"
    for bad in (f"api/samples/{s.id}/images/plan", f"api/samples/{s.id}/images/..%2F..%2Fplan.json",
                "api/samples/000000000000/images/target", "api/samples/..%2Fplan.json"):
        status, body = http(server.url + bad)  # a route's own 404, or the router's for a path with a '/' in it
        assert status == 404 and b"alternative" not in (body if isinstance(body, bytes) else json.dumps(body).encode())
    status, page = http(server.url + "?annotator=alice")
    assert status == 200 and b"static/page.js" in page
    status, guideline = http(server.url + "api/guideline")
    assert status == 200 and b"environmental noise" in guideline


def test_bad_answers_get_4xx_and_change_nothing(served) -> None:
    server, samples, study = served
    post = server.url + "api/answers"
    ok = {"annotator": "alice", "sample": samples[0].id, "recovered": True, "environmental_only": None}
    status, body = http(post, ok)
    assert status == 201 and body == {"annotator": "alice", "sample": samples[1].id, "done": 1, "total": 6}
    alice = annotations_file(study, "alice")
    before = alice.read_bytes()
    bad = [
        (422, b"{not json", "not an answer"),
        (422, {**ok, "sample": samples[1].id, "recovered": "yes"}, "recovered"),
        (422, {**ok, "sample": samples[1].id, "recovered": 1}, "recovered"),
        (422, {k: v for k, v in ok.items() if k != "environmental_only"} | {"sample": samples[1].id}, "environmental_only"),
        (422, {**ok, "sample": samples[1].id, "oracle": True}, "oracle"),
        (422, {**ok, "sample": samples[1].id, "note": "x" * 2001}, "note"),
        (404, {**ok, "annotator": "mallory"}, "unknown annotator 'mallory'"),
        (404, {**ok, "sample": "000000000000"}, "unknown sample '000000000000'"),
        (404, {**ok, "sample": samples[7].id}, "not assigned to 'alice'"),  # bob's only
        (409, {**ok, "recovered": False}, "already answered"),
    ]
    for status, body, says in bad:
        got, reply = http(post, body)
        assert got == status and says in reply["error"], (body, got, reply)
    assert alice.read_bytes() == before
    assert not annotations_file(study, "bob").exists() and not annotations_file(study, "mallory").exists()
    assert http(server.url + "api/next?annotator=alice")[1]["sample"] == samples[1].id
    assert http(server.url + "api/next?annotator=mallory")[0] == 404


def test_same_answer_twice_at_once_is_written_once(served) -> None:
    server, samples, study = served
    results: list[int] = []

    def answer(who: str, sid: str) -> None:
        results.append(http(server.url + "api/answers", {"annotator": who, "sample": sid, "recovered": False,
                                                         "environmental_only": False})[0])

    threads = [threading.Thread(target=answer, args=("bob", samples[i].id)) for i in (2, 2, 2, 3, 4)]
    threads += [threading.Thread(target=answer, args=("alice", samples[i].id)) for i in (2, 3, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [201] * 5 + [409] * 3
    bob = [Annotation.model_validate_json(line) for line in annotations_file(study, "bob").read_text().splitlines()]
    assert sorted(a.sample for a in bob) == sorted(samples[i].id for i in (2, 3, 4))
    alice = annotations_file(study, "alice").read_text().splitlines()
    assert sorted(Annotation.model_validate_json(line).sample for line in alice) == sorted([samples[2].id,
                                                                                          samples[3].id])


def test_killed_server_loses_nothing_acknowledged(served) -> None:
    server, samples, study = served
    for i in (0, 1):
        assert http(server.url + "api/answers", {"annotator": "alice", "sample": samples[i].id, "recovered": i == 0,
                                                 "environmental_only": True, "note": f"n{i}"})[0] == 201
    server.kill()
    alice = annotations_file(study, "alice")
    whole = alice.read_bytes()
    with alice.open("ab") as f:  # what a kill in the middle of a (never acknowledged) write would leave
        f.write(b'{"schema_version":1,"sample":"' + samples[2].id.encode())
    again = Server.start(study, "--port", server.port)
    try:
        assert "2 answers so far" in again.banner
        assert alice.read_bytes() == whole  # the cut line dropped; the two acknowledged ones kept
        assert [a.note for a in map(Annotation.model_validate_json, whole.decode().splitlines())] == ["n0", "n1"]
        assert http(again.url + "api/next?annotator=alice")[1] == {
            "annotator": "alice", "sample": samples[2].id, "done": 2, "total": 6}
        assert http(again.url + "api/answers", {"annotator": "alice", "sample": samples[1].id, "recovered": True,
                                                "environmental_only": None})[0] == 409
        assert http(again.url + "api/answers", {"annotator": "alice", "sample": samples[2].id, "recovered": True,
                                                "environmental_only": None})[0] == 201
        assert len(alice.read_text().splitlines()) == 3
    finally:
        again.stop()


def test_a_broken_annotations_file_is_named(tmp_path: Path, run: Path) -> None:
    samples = write_plan(tmp_path, run, {"alice": slice(0, 2)})
    path = annotations_file(tmp_path, "alice")
    path.parent.mkdir()
    path.write_text(Annotation(sample=samples[5].id, annotator="alice", recovered=True).model_dump_json() + "\n")
    with pytest.raises(AssertionError, match=rf"alice.jsonl:1: sample '{samples[5].id}' was planned for nobody, not 'alice'"):
        Server.start(tmp_path, "--port", "0")


def test_off_loopback_a_token_is_required_and_never_stored(tmp_path: Path, run: Path) -> None:
    samples = write_plan(tmp_path, run, {"alice": slice(0, 8)})
    server = Server.start(tmp_path, "--host", "0.0.0.0", "--port", "0")
    try:
        assert "?token=" in server.url
        token = server.url.split("?token=")[1]
        base = server.url.split("?")[0].replace("0.0.0.0", "127.0.0.1")
        for path in ("", "api/study", "api/next?annotator=alice", f"api/samples/{samples[0].id}/images/target"):
            assert http(base + path)[0] == 401
            assert http(base + path, headers={"X-Retrace-Token": "wrong"})[0] == 401
            assert http(base + path, headers={"X-Retrace-Token": token})[0] == 200
            assert http(base + path + ("&" if "?" in path else "?") + f"token={token}")[0] == 200
        answer = {"annotator": "alice", "sample": samples[0].id, "recovered": True, "environmental_only": None}
        assert http(base + "api/answers", answer)[0] == 401
        assert not annotations_file(tmp_path, "alice").exists()
        assert http(base + "api/answers", answer, headers={"X-Retrace-Token": token})[0] == 201
    finally:
        server.stop()
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or token.encode() not in path.read_bytes(), path


def test_docs_show_the_pages_guideline() -> None:
    from pytest_retrace.validation.annotate import GUIDELINE
    from tests.helpers import REPO

    text = GUIDELINE.read_text(encoding="utf-8").replace("### ", "#### ")
    assert text in (REPO / "docs" / "validation.md").read_text(encoding="utf-8")
