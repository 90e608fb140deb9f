"""Shared helpers for the project's own tests, imported as `from tests.helpers import ...`: conftest.py keeps only
fixtures and hooks, and a test module that imported conftest as a module would depend on pytest's rootdir
and import mode to find it."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

from pytest_retrace.envs.procfs import read_environ

REPO = Path(__file__).resolve().parent.parent
_TAG = re.compile(rb"RETRACE_(?:ENV|TASK)=([^\0]*)")


def interruptible() -> None:
    """preexec_fn for a run a test will Ctrl-C: SIGINT back to its default. A job a non-interactive shell put in the
    background (`bash .ci/run &`) ignores SIGINT, every descendant inherits that, and Python then installs no
    KeyboardInterrupt handler: the run would go on as if never interrupted (two fresh-clone CI failures)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def retrace_processes(prefix: str) -> dict[int, str]:
    """Live processes started by a retrace environment whose root lies under `prefix` (pid -> cmdline).

    Every process an environment starts carries RETRACE_ENV (the desktop) or RETRACE_TASK (its tasks) =<its root dir>, so this
    finds leaks of one particular run even while other test workers run desktops of their own."""
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        # not a bare read (empty while a process execs); a zombie has none: it holds no resources
        environ = read_environ(int(entry.name))
        for match in _TAG.finditer(environ):
            if match.group(1).decode(errors="replace").startswith(prefix):
                cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found[int(entry.name)] = cmd
                break
    return found


def summary(p: pytest.Pytester, run: str) -> dict:
    return json.loads((p.path / "reports" / run / "summary.json").read_text())


def records(p: pytest.Pytester, run: str) -> list[dict]:
    return [json.loads(line) for line in (p.path / "reports" / run / "results.jsonl").read_text().splitlines()]


def groups(s: dict) -> dict[str, dict]:
    return {g["model"]: g for g in s["groups"]}


def assert_no_leftovers(p: pytest.Pytester) -> None:
    tmp = str(p._retrace_tmp)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5
    while (left := retrace_processes(tmp)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == {}, f"processes outlived the session: {left}"


def docker_client():
    """A docker engine's client, or None where there is none (no SDK, no engine, no permission). Under CI
    (RETRACE_REQUIRE_DOCKER=1) a missing engine fails the test instead: the docker tests must run there."""
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except Exception as exc:  # noqa: BLE001 - every way of not having docker here
        if os.environ.get("RETRACE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"RETRACE_REQUIRE_DOCKER=1 but no docker engine answers: {exc}")
        return None


# --- case files for the unit tests -------------------------------------------------------------------

SCREEN = (64, 48)  # small screenshots keep the tests fast; the format allows any `screen`

# The structure of cases/mousepad/typo-short.yaml, with a small screen.
VALID: dict[str, Any] = {
    "task": {
        "id": "mousepad-hello-world",
        "instruction": 'Write "Hello world" into notes.txt in the open text editor and save the file.',
        "domain": "text-editor",
        "setup": [
            {"type": "file", "path": "~/notes.txt", "content": ""},
            {"type": "launch", "command": ["mousepad", "~/notes.txt"], "window": "Mousepad"},
        ],
        "evaluator": {
            "func": "compare_text_file",
            "result": {"type": "vm_file", "path": "~/notes.txt"},
            "expected": {"type": "rule", "rules": {"text": "Hello world"}},
        },
    },
    "trajectory": ["pyautogui.write('Hello ')", "pyautogui.write('world')", "pyautogui.hotkey('ctrl', 's')"],
    "t_seed": 1,
    "perturbation": ["pyautogui.write('xyz')"],
    "d": 1,
    "screenshots": {"target": "typo/target.png", "error": "typo/error.png"},
    "screen": list(SCREEN),
    "metadata": {"source_model": "scripted", "horizon": "short", "kind": "visible", "mistake": "wrong keystrokes"},
}


def png(path: Path, size: tuple[int, int] = SCREEN) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (255, 255, 255)).save(path)


def write_case(directory: Path, name: str, data: dict[str, Any] | str, pngs: bool = True) -> Path:
    """Write ``name.yaml`` (a mapping dumped as YAML, or raw text) and, by default, VALID's two screenshots
    (typo/target.png, typo/error.png) at SCREEN size unless they exist already."""
    path = directory / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    if pngs:
        for rel in VALID["screenshots"].values():
            if not (path.parent / rel).exists():
                png(path.parent / rel)
    return path


# --- validation (issue 25): samples and runs written by hand ------------------------------------------

def validation_sample(sid: str, *, r_o: bool | None, r_tc: bool | None, ssim: float | None = None,
                      threshold: float | None = 0.99, model: str = "m", strategy: str = "implicit",
                      rationales: tuple[str, ...] = ()) -> Any:
    """A Sample built directly (no run on disk): ReTrace's verdict is R_O ∧ R_TC, as the oracle gives it."""
    from pytest_retrace.results.records import Step
    from pytest_retrace.validation.samples import Oracle, Sample

    return Sample(
        id=sid, run="run", nodeid=f"cases/x.yaml::test_recovery[{sid}]", case="x", task="t", domain="d",
        kind="visible", model=model, strategy=strategy, budget=1, run_index=0, instruction="do it", history=[],
        recovery=[Step(stage="recover", action="click", rationale=r) for r in rationales],
        target=Path("/nonexistent/target.png"), error=Path("/nonexistent/error.png"), recovered=None,
        oracle=Oracle(recovered=bool(r_o and r_tc), r_o=r_o, r_tc=r_tc, ssim=ssim, ssim_threshold=threshold),
    )


def write_run(run_dir: Path, case_dir: Path, tests: list[dict[str, Any]]) -> Path:
    """A run directory with a results.jsonl of finished records of VALID's case (written under ``case_dir``):
    each test a dict of Record fields over the defaults (``name`` names the test id)."""
    from pytest_retrace.results.records import Record

    case = write_case(case_dir, "typo", VALID).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for t in tests:
        fields = {"case": VALID["task"]["id"], "task": VALID["task"]["id"], "domain": "text-editor", "horizon": "short",
                  "kind": "visible", "model": "m", "strategy": "implicit", "budget": 1,
                  "finished_at": "2026-01-01T00:00:00+00:00", "ssim_threshold": 0.99} | t
        name = fields.pop("name")
        fields["verdict"] = "recovered" if fields.get("r_o") and fields.get("r_tc") else "not_recovered"
        lines.append(Record(nodeid=f"{case}::test_recovery[{name}]", **fields).to_json())
    (run_dir / "results.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return run_dir
