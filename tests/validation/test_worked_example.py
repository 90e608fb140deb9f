"""docs/validation.md's worked example, end to end as a user runs it: a real run of the built-in suite's sample
(oracle and noop, the recovered screens kept), `retrace judge` with the shipped judge config through its official
SDK against a loopback stand-in, `retrace annotate --sample`, four scripted annotators answering through the real
page's HTTP API, and `retrace agreement`. The numbers the test asserts are the ones the docs print.

The stand-in judge sees only pixels: it answers "recovered" exactly when the recovered screenshot it is sent equals
the target screenshot. The scripted people know what each agent did: the oracle restores the target, noop leaves
the mistake in place; annotator ann2 gets one of its answers wrong on purpose, so the annotators disagree once."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import PIL.Image
import pytest

from pytest_retrace.testing import LoopbackServer, Reply, Request, message_item, openai_response
from pytest_retrace.validation.files import Plan
from pytest_retrace.validation.samples import load_samples
from tests.helpers import REPO
from tests.validation.annotating import Server, http

pytestmark = pytest.mark.desktop

_PNG = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")


def pixel_judge(request: Request) -> Reply:
    """The stand-in: the first image is the target, the third the recovered screen (the judge's prompt order)."""
    images = [np.asarray(PIL.Image.open(io.BytesIO(base64.b64decode(m)))) for m in _PNG.findall(json.dumps(request.body))]
    same = len(images) == 3 and images[0].shape == images[2].shape and bool((images[0] == images[2]).all())
    text = "The recovered screen is the target, pixel for pixel." if same else "The screens differ."
    return Reply(openai_response([message_item(f"{text}\nVerdict: {'recovered' if same else 'not recovered'}")],
                                 usage={"input_tokens": 3000, "output_tokens": 20}))


def retrace(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_retrace.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})}, check=False)


def test_a_human_evaluation_of_the_built_in_suite_end_to_end(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RETRACE_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--retrace-model=oracle,noop",
         "--retrace-sample", "1", "--retrace-keep-screens", "-n", "4", "-q", "--retrace-run=worked",
         f"--retrace-report-dir={reports}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # noop fails its tests: exit 1
    run = reports / "worked"
    samples = {s.id: s for s in load_samples(run)}
    assert len(samples) == 52  # 26 cases x 2 agents, no infrastructure error

    with LoopbackServer(pixel_judge) as server:
        judged = retrace("judge", str(run), "--model", "judge", "--workers", "4",
                         env={"OPENAI_BASE_URL": server.openai_url, "OPENAI_API_KEY": "sk-worked-example-key"})
    assert judged.returncode == 0, judged.stdout + judged.stderr
    verdicts = {json.loads(line)["sample"]: json.loads(line)["verdict"]
                for line in (run / "judge" / "judge.jsonl").read_text().splitlines()}
    assert len(verdicts) == 52 and None not in verdicts.values()

    study = tmp_path / "study"
    planned = retrace("annotate", "--sample", str(run), "--annotators", "ann1,ann2,ann3,ann4", "--per-alternative",
                      "6", "--seed", "0", "--judge", "judge", "--out", str(study))
    assert planned.returncode == 0, planned.stdout + planned.stderr
    plan = Plan.read(study)

    page = Server.start(study, "--port", "0")
    try:
        wrong_once = next(p.sample for p in plan.samples if "ann2" in p.annotators)
        for p in plan.samples:
            truth = samples[p.sample].model == "oracle"  # what the agent did
            for who in p.annotators:
                answer = truth != (who == "ann2" and p.sample == wrong_once)
                status, _ = http(page.url + "api/answers", {"annotator": who, "sample": p.sample, "recovered": answer,
                                                            "environmental_only": False})
                assert status == 201
    finally:
        page.stop()

    out = tmp_path / "agreement"
    agreed = retrace("agreement", str(study), "--json", "--out", str(out))
    assert agreed.returncode == 0, agreed.stdout + agreed.stderr
    tables = json.loads(agreed.stdout)
    # what the docs print (docs/validation.md, "A worked example")
    print(planned.stdout, json.dumps(tables, indent=1), sep="\n")
    wins = {w["alternative"]: w for w in tables["wins"]}
    assert set(wins) == {"r_tc", "r_o", "judge:judge"}
    for w in wins.values():  # the people are right by construction and ReTrace is right on this sample: it wins
        assert w["decided"] > 0 and w["wins"] == w["decided"] and w["win_rate"] == 1.0
    assert plan.available == {"r_tc": 7, "r_o": 12, "judge:judge": 5} and len(plan.samples) == 14
    assert (tables["consensus"], tables["split"]) == (13, 1)  # ann2's wrong answer
    assert [(r["oracle"], r["n"], r["aligned"]) for r in tables["alignment"]] == [("R_TC", 13, 8), ("R_O", 13, 5),
                                                                               ("ReTrace", 13, 13)]
    assert [(r["oracle"], r["aligned"]) for r in tables["thresholds"]] == [("0.99", 5), ("0.95", 4), ("0.91", 2)]
    assert tables["noise"] == {"n": 13, "affected": 0, "unaffected_rate": 1.0}
    assert [(k["agreed"], k["n"], k["kappa"]) for k in tables["kappa"]] == [(6, 7, 0.0), (7, 7, None)]
    assert sorted(p.name for p in out.iterdir()) == ["agreement.json", "agreement.md", "agreement.png"]
