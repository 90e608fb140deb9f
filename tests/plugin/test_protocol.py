"""--retrace-protocol=paper (docs/paper.md): the paper's case selection on the built-in suite against its
metadata, every screenshot kept for the conversing models, the fixed settle window, one shared subset across
strategies against a hand computation, and a look-only turn spending a step on a real desktop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_retrace.actions import Action
from pytest_retrace.agents import AgentContext, AgentTurn, Observation
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import load_case
from pytest_retrace.replay.drive import recover
from pytest_retrace.replay.result import RecoveryResult, ReplayOptions
from pytest_retrace.results.records import Record
from pytest_retrace.results.stats import summarize
from tests.helpers import REPO

pytest_plugins = ["pytester"]


def _kept(path: Path) -> bool:
    meta = load_case(path).metadata
    return meta.get("kind") != "visual-only" and float(meta.get("ssim_error_vs_target", 0.0)) < 0.99


def test_the_papers_case_selection_leaves_out_visual_only_and_near_identical_cases(pytester: pytest.Pytester) -> None:
    files = sorted((REPO / "cases").glob("*/*.yaml"))
    expected = sum(map(_kept, files))
    assert 0 < expected < len(files)
    res = pytester.runpytest_subprocess(f"--retrace-cases={REPO / 'cases'}", "--retrace-model=noop",
                                        "--retrace-protocol=paper", "--retrace-dry-run", "-p", "no:cacheprovider",
                                        f"--rootdir={REPO}", "-c", str(REPO / "pyproject.toml"))
    res.stdout.fnmatch_lines(["*the paper's protocol*", f"{expected} test(s); at most 0 model calls in all"])
    res = pytester.runpytest_subprocess(f"--retrace-cases={REPO / 'cases'}", "--retrace-model=noop",
                                        f"--retrace-agents={REPO / 'agents'}", "--retrace-protocol=exact",
                                        "--retrace-dry-run")
    res.stderr.fnmatch_lines(["*--retrace-protocol: 'exact' is not one of default, paper*"])


def test_a_case_s_horizon_kind_and_domain_select_its_tests_with_k(pytester: pytest.Pytester) -> None:
    """The paper's figures are per horizon (Figure 7: long): ``-k horizon_long`` picks the cases the metadata says."""
    cases = [load_case(p) for p in sorted((REPO / "cases").glob("*/*.yaml"))]
    expected = sum(c.horizon == "long" and c.metadata.get("kind") == "hidden-state" for c in cases)
    assert 0 < expected < len(cases)
    res = pytester.runpytest_subprocess(f"--retrace-cases={REPO / 'cases'}", "--retrace-model=noop", "--collect-only",
                                        "-q", "-k", "horizon_long and kind_hidden-state", "-p", "no:cacheprovider",
                                        f"--rootdir={REPO}", "-c", str(REPO / "pyproject.toml"))
    res.stdout.fnmatch_lines([f"{expected}/{len(cases)} tests collected*"])


def test_the_protocol_keeps_every_screenshot_and_settles_for_the_papers_10_s(pytester: pytest.Pytester) -> None:
    from pytest_retrace.plugin.experiments import ALL_SCREENSHOTS
    from pytest_retrace.plugin.options import settings_key

    config = pytester.parseconfigure("--retrace-model=claude,noop", "--retrace-protocol=paper",
                                     f"--retrace-agents={REPO / 'agents'}", "--retrace-settle=3", "--retrace-dry-run")
    settings = config.stash[settings_key]
    claude, noop = settings.models
    assert claude.options["max_screenshots"] == ALL_SCREENSHOTS and "max_screenshots" not in noop.options
    assert (settings.settle.mode, settings.settle.timeout, settings.protocol) == ("fixed", 10.0, "paper")


def _rec(model: str, strategy: str, case: str, verdict: str) -> Record:
    return Record(nodeid=f"c/{case}.yaml::test_recovery[{case}-{model}-{strategy}-r10]", case=case, task=case,
                  domain="d", horizon="short", kind="visible", model=model, strategy=strategy, budget=10,
                  finished_at="2026-01-01T00:00:00+00:00", verdict=verdict,  # type: ignore[arg-type]
                  **({"error": {"stage": "context", "kind": "api", "message": "down"}} if verdict == "error" else
                     {"r_o": verdict == "recovered", "r_tc": verdict == "recovered"}))


def test_one_shared_subset_across_models_and_strategies() -> None:
    records = [_rec(m, s, c, "recovered") for m in ("a", "b") for s in ("explicit-0E", "explicit-context")
               for c in ("c1", "c2", "c3")]
    # explicit-context's contextualizer failed on c1 for model a: by default only that strategy's shared set
    # loses c1; the paper's subset loses it for every strategy
    records[3] = _rec("a", "explicit-context", "c1", "error")
    per_strategy = {(g.model, g.strategy): g.common_n for g in summarize(records).groups}
    across = {(g.model, g.strategy): g.common_n for g in summarize(records, shared_across_strategies=True).groups}
    assert per_strategy == {("a", "explicit-0E"): 3, ("a", "explicit-context"): 2, ("b", "explicit-0E"): 3,
                            ("b", "explicit-context"): 2}
    assert set(across.values()) == {2}


class _LooksFirst:
    """Looks at the screen twice (no action), then ends."""

    name, privileged, calls_per_turn = "looker", False, 0

    def start(self, context: AgentContext) -> None:
        self.turns = 0

    def act(self, observation: Observation) -> AgentTurn:
        self.turns += 1
        return AgentTurn([], "let me look again") if self.turns <= 2 else AgentTurn([Action("done")], "done")

    def close(self) -> None:
        pass


@pytest.mark.desktop
def test_a_look_only_turn_spends_a_step_under_the_papers_protocol(env: XvfbEnvironment) -> None:
    context = AgentContext(instruction="x", mode="recovery", strategy="explicit-none", budget=5, screen=env.size,
                           target_screenshot=np.zeros((8, 8, 3), np.uint8))
    for count_looks, spent in ((False, 0), (True, 2)):
        result = RecoveryResult("t", 0.0, budget=5)
        recover(env, _LooksFirst(), context, ReplayOptions(budget=5, count_looks=count_looks), result)  # type: ignore[arg-type]
        assert result.actions_used == spent and result.agent_turns == 3
    assert [s.action["action"] for s in result.steps] == ["observe", "observe", "done"]
