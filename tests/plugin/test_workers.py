"""--retrace-workers: xdist's workers forked from the fork server (the default) or started as xdist starts them,
on real desktops: the same verdicts, the plugin's asserts still rewritten, nothing left behind."""

from __future__ import annotations

import pytest

from tests.helpers import assert_no_leftovers, records

pytest_plugins = ["pytester"]

# each worker writes down its parent's command line: the fork server's, or the controller's
CONFTEST = '''
import os
from pathlib import Path


def pytest_configure(config):
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\\0", b" ").decode()
        Path("parents").mkdir(exist_ok=True)
        Path("parents", worker).write_text(parent)
'''


@pytest.mark.desktop
def test_forked_workers_give_the_verdicts_of_started_ones(project: pytest.Pytester) -> None:
    project.makeconftest(CONFTEST)
    verdicts, parents = {}, {}
    for start in ("fork", "exec"):
        res = project.runpytest_subprocess("--retrace-model=oracle,noop", "-k", "typo-short or select-all-short", "-n",
                                           "2", f"--retrace-workers={start}", f"--retrace-run={start}",
                                           "-p", "no:cacheprovider", "-W", "error::pytest.PytestAssertRewriteWarning",
                                           "--tb=short")
        res.assert_outcomes(passed=2, failed=2)
        # the test function's assert is rewritten: pytest_assertrepr_compare explains the verdict (in each
        # failure, and in the short summary's lines where the terminal is wide enough)
        assert res.stdout.str().count("not recovered: R_O=") >= 2, res.stdout.str()
        verdicts[start] = {r["nodeid"]: (r["verdict"], r["r_o"], r["r_tc"]) for r in records(project, start)}
        parents[start] = {p.read_text() for p in (project.path / "parents").iterdir()}
        assert len(parents[start]) >= 1
        for p in (project.path / "parents").iterdir():
            p.unlink()
    assert verdicts["fork"] == verdicts["exec"]
    assert all("pytest_retrace/forkserver/zygote.py" in p for p in parents["fork"]), parents
    assert not any("zygote.py" in p for p in parents["exec"]), parents
    assert not list(project._retrace_tmp.glob("retrace-fork-*"))  # type: ignore[attr-defined]
    assert_no_leftovers(project)


def test_a_wrong_worker_start_is_a_usage_error(project: pytest.Pytester) -> None:
    res = project.runpytest_subprocess("--retrace-model=oracle", "--retrace-workers=spawn")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--retrace-workers: 'spawn' is not one of fork, exec*"])


def test_workers_forked_with_a_preloaded_sdk_warn_of_nothing(project: pytest.Pytester,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A Claude model has the server import anthropic, which imports anyio, a pytest plugin's package: pytest in
    every worker would warn that it cannot rewrite it (it did, in a benchmark)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")  # no call is made: every test is deselected
    res = project.runpytest_subprocess("--retrace-model=claude-sonnet-4.6", "-n", "2", "-k", "no-such-test",
                                       "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert "rewritten" not in res.stdout.str() + res.stderr.str()
    assert "2 workers" in res.stdout.str() or "created: 2/2 workers" in res.stdout.str()
