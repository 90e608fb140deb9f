"""Helpers of the annotation page's tests (test_annotate*.py): a small real run to draw samples from, the page's
server as a real `retrace annotate` process, and a plain HTTP client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.validation.files import Plan, PlannedSample
from pytest_retrace.validation.samples import Sample, load_samples
from tests.helpers import REPO

ORACLE_KEYS = {"oracle", "verdict", "r_o", "r_tc", "ssim", "ssim_threshold"}


def small_run(base: Path) -> Path:
    """A real run of the terminal cases with two agents (8 finished tests, the recovered screens kept), made
    once per test process under `base` and reused."""
    reports = base / "annotate-run"
    done = reports / "done"
    if not done.is_file():
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RETRACE_"))}
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "cases/terminal", "--retrace-model=oracle",
             "--retrace-model=noop", "--retrace-sample", "1", "--retrace-keep-screens", "-q",
             f"--retrace-report-dir={reports}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]  # 1: noop fails its tests
        done.write_text("")
    (run,) = [p for p in reports.iterdir() if p.is_dir()]
    return run


def write_plan(study: Path, run: Path, assign: dict[str, slice]) -> list[Sample]:
    """A plan of the run's samples, annotator NAME seeing samples[assign[NAME]]; returns the samples in order."""
    samples = load_samples(run)
    planned = [PlannedSample(sample=s.id, run=str(run), nodeid=s.nodeid, alternative="all",
                             annotators=[who for who, part in assign.items() if s in samples[part]])
               for s in samples]
    Plan(seed=0, per_alternative=None, runs=[str(run)], annotators=list(assign), samples=planned).write(study)
    return samples


@dataclass
class Server:
    """`retrace annotate STUDY` as a real process (the worktree's package: cwd is the repository)."""

    proc: subprocess.Popen
    url: str
    banner: str  # the line it printed on start

    @classmethod
    def start(cls, study: Path, *args: str, env: dict[str, str] | None = None) -> Server:
        proc = subprocess.Popen([sys.executable, "-m", "pytest_retrace.cli", "annotate", str(study), *args],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
        line = proc.stdout.readline()  # the URL, printed once the socket listens
        if not line.startswith("retrace annotate: http"):
            proc.kill()
            raise AssertionError(f"no URL printed: {line!r} {proc.stderr.read()}")
        return cls(proc, line.split()[2], line)

    @property
    def port(self) -> str:
        return self.url.split(":")[2].split("/")[0]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc.stdout.close()
        self.proc.stderr.close()


def http(url: str, body: bytes | dict | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, parsed JSON or raw bytes) of a GET, or a POST when `body` is given."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, raw, kind = response.status, response.read(), response.headers.get("content-type", "")
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers.get("content-type", "")
    return status, json.loads(raw) if kind.startswith("application/json") else raw


def wait_for(condition: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")
