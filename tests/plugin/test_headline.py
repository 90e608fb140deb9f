"""The headline command, `pytest --retrace-model=claude -n N`, as a user runs it: the shipped config, the
SDK's own ANTHROPIC_BASE_URL pointing at a loopback server, the key from the environment — which must never
appear in any output or report — and one concurrency limit shared by every xdist worker."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import yaml

from pytest_retrace.testing import LoopbackServer, UndoingClaude
from tests.helpers import REPO, records, summary

# both tests run the plugin on real desktops in a pytester subprocess
pytestmark = pytest.mark.desktop

pytest_plugins = ["pytester"]
# two cases of the first suite (one ctrl+z recovers the first), kept as test data
V1 = REPO / "tests" / "data" / "v1-cases" / "text-editor"
KEY = "sk-ant-api03-" + "SECRET-do-not-leak-7f3a9c" * 2


USAGE = {"input_tokens": 1000, "output_tokens": 50, "cache_read_input_tokens": 200}


@pytest.fixture
def suite(project: pytest.Pytester) -> pytest.Pytester:
    for case in ("append-line-t1-stray-keys", "append-line-t1-save-junk"):
        shutil.copy(V1 / f"{case}.yaml", project.path / "cases" / "mousepad")
        shutil.copytree(V1 / case, project.path / "cases" / "mousepad" / case)
    return project


def test_pytest_retrace_model_claude_measures_it_and_the_key_never_leaks(suite: pytest.Pytester,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    with LoopbackServer(UndoingClaude(usage=USAGE)) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)  # the SDK's own variable: the config names no URL
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        res = suite.runpytest_subprocess("--retrace-model=claude", "-n", "2", "-k", "stray-keys",
                                         "--retrace-strategy=implicit,explicit-context", "--retrace-run=headline",
                                         "-v", "-rA", "--log-level=DEBUG", "-p", "no:cacheprovider")
    assert [r.error for r in server.requests if r.error] == []
    res.assert_outcomes(passed=2)
    recs = {r["strategy"]: r for r in records(suite, "headline")}
    assert {s: r["model"] for s, r in recs.items()} == {"implicit": "claude-sonnet-4.6",
                                                         "explicit-context": "claude-sonnet-4.6"}
    implicit = recs["implicit"]
    assert implicit["usage"]["calls"] == 2
    assert (implicit["usage"]["input_tokens"], implicit["usage"]["output_tokens"]) == (2000, 100)
    assert implicit["usage"]["cache_read_tokens"] == 400
    # the config's prices: $3 / $15 / $0.30 per million input / output / cache-read tokens
    assert implicit["usage"]["cost"] == pytest.approx((2000 * 3 + 100 * 15 + 400 * 0.30) / 1e6)
    assert implicit["usage"]["latency"] > 0
    assert [a.get("rationale") for a in implicit["actions"] if a["stage"] == "recover"] == [
        "Undo the stray keys.", "The target state is restored."]
    assert recs["explicit-context"]["context_usage"]["calls"] == 1  # the contextualizer's summary
    [summarise] = [r for r in server.requests if "tools" not in r.body]
    assert len(summarise.images) == 2  # the 0-R history (t_seed = 1 step) and the target
    recovery = [r for r in server.requests if "tools" in r.body and "recovery agent" in r.body["system"][0]["text"]]
    assert recovery and UndoingClaude.SUMMARY in str(recovery[0].body["messages"][0])
    group = summary(suite, "headline")["groups"]
    assert sum(g["calls"] for g in group) == 5 and all(g["rate"] == 1.0 for g in group)

    # the key reached the API (the SDK sends it), and nothing else
    assert all(KEY in r.headers.get("authorization", "") + r.headers.get("x-api-key", "") for r in server.requests)
    output = res.stdout.str() + res.stderr.str()
    files = [p for p in suite.path.rglob("*") if p.is_file()]
    assert len(output) > 1000 and any(p.suffix == ".jsonl" for p in files)
    leaks = [str(p) for p in files if KEY.encode() in p.read_bytes()] + (["terminal output"] if KEY in output else [])
    assert leaks == [], leaks


def test_one_concurrency_limit_is_shared_by_every_worker(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four workers against an endpoint limited to 2 requests in flight: the server never sees more. (The
    lock files live under TMPDIR, which the `project` fixture makes this test's own.)"""
    model = UndoingClaude(latency=0.8)
    config = yaml.safe_load((REPO / "agents" / "claude-sonnet-4.6.yaml").read_text())
    config["options"]["transport"] = {"concurrency": 2}
    (suite.path / "agents" / "claude-limited.yaml").write_text(yaml.safe_dump(config))
    with LoopbackServer(model) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        res = suite.runpytest_subprocess("--retrace-model=claude-limited", "-n", "4", "-k", "mousepad",
                                         "-p", "no:cacheprovider")
    outcomes: dict[str, Any] = res.parseoutcomes()
    assert outcomes.get("errors", 0) == 0 and outcomes["passed"] + outcomes["failed"] == 5
    assert len(server.requests) == 10  # 5 cases x (ctrl+z, done)
    assert model.peak == 2
