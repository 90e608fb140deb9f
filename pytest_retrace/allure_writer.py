"""Allure results for recovery tests (with allure-pytest's ``--alluredir``), written through the plugin's own
hooks like any third party's writer.

allure-pytest already writes one result per test; this adds what a reader of a recovery benchmark needs:
- labels and **non-excluded** parameters (model, strategy, budget, run, domain, kind, horizon), so that
  models, budgets and repeated runs of one case are different tests in Allure's history, never retries of one
  (the test's own parameter, the whole case object, is hidden and excluded);
- a step per replay stage with its real timing: reset, prefix, verify, perturbation, context, recovery (a step
  per model turn inside), R_O, suffix, R_TC. They run in the ``retrace_result`` fixture, since an
  infrastructure failure there must be a pytest *error* (Allure: *broken*), so Allure shows them under its
  "Set up"; a failed recovery fails the test body's assertion (Allure: *failed*);
- attachments in the test body: the target, error and recovered screenshots, an SSIM heatmap, the actions with
  the model's rationale per turn, the evaluator's output and the record;
- categories.json (not recovered: R_O only / R_TC only / both; infrastructure errors) and
  environment.properties, written once by the controller.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .plugin import CaseRun, Settings
    from .records import Record
    from .replay import RecoveryResult, Stage

# Allure 2 matches these regular expressions (Java) against the whole message, Allure 3 (JavaScript) searches
# them: [\s\S] is "any character, newlines included" in both dialects. The assertion's message carries
# "R_O=..., R_TC=..." (assertion.explain).
CATEGORIES = [
    {"name": "Not recovered: R_O and R_TC failed", "matchedStatuses": ["failed"],
     "messageRegex": r"[\s\S]*R_O=False, R_TC=False[\s\S]*"},
    {"name": "Not recovered: R_O only (the screen differs, the task still completes)", "matchedStatuses": ["failed"],
     "messageRegex": r"[\s\S]*R_O=False, R_TC=True[\s\S]*"},
    {"name": "Not recovered: R_TC only (the screen matches, hidden state is broken)", "matchedStatuses": ["failed"],
     "messageRegex": r"[\s\S]*R_O=True, R_TC=False[\s\S]*"},
    {"name": "Infrastructure errors (excluded from rates)", "matchedStatuses": ["broken"]},
]


def _run_of(item: pytest.Item) -> CaseRun | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("retrace_run") if callspec is not None else None


class AllureWriter:
    """Registered on every process of a run given ``--alluredir`` (the controller and each xdist worker)."""

    def __init__(self, results_dir: Path, settings: Settings) -> None:
        self.results_dir = results_dir
        self.settings = settings
        self._steps: dict[int, str] = {}  # id(stage) -> Allure step uuid
        self._attach_later: dict[str, tuple[RecoveryResult, Record, CaseRun]] = {}

    # -- the controller: categories and environment, once -------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        if hasattr(config, "workerinput"):
            return
        from importlib.metadata import version

        self.results_dir.mkdir(parents=True, exist_ok=True)
        (self.results_dir / "categories.json").write_text(json.dumps(CATEGORIES, indent=2) + "\n")
        env = {
            "retrace.models": ", ".join(m.name for m in self.settings.models),
            "retrace.env": self.settings.env.describe(),
            "retrace.budgets": ", ".join(map(str, self.settings.budgets)),
            "retrace.ssim_threshold": str(self.settings.ssim_threshold),
            "retrace.runs": str(self.settings.runs),
            "pytest-retrace": version("pytest-retrace"),
        }
        (self.results_dir / "environment.properties").write_text(
            "".join(f"{k}={v}\n" for k, v in env.items()))

    # -- each test: its name, labels and parameters, before any fixture runs --------------------------
    @pytest.hookimpl(tryfirst=True)  # inside allure-pytest's setup wrapper, which has started the test result
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        run = _run_of(item)
        if run is None:
            return
        import allure

        case = run.case
        allure.dynamic.description(
            f"**Task** ({case.task.domain}): {case.task.instruction}\n\n"
            f"Target s_target after {case.t_seed} of {len(case.trajectory)} ground-truth actions; "
            f"the mistake: {case.metadata.get('mistake') or case.metadata.get('perturbation') or 'see the case'} "
            f"({len(case.perturbation)} action(s), d={case.d}). Recovered means R_TC ∧ R_O.\n\n"
            f"Case file: `{case.path.name}`")
        kind = str(case.metadata.get("kind") or "unknown")
        # Suites: model · strategy · budget > domain > kind; Behaviors: domain > kind > horizon
        allure.dynamic.parent_suite(f"{run.model.name} · {run.strategy} · r={run.budget}")
        allure.dynamic.suite(case.task.domain)
        allure.dynamic.sub_suite(kind)
        allure.dynamic.epic(case.task.domain)
        allure.dynamic.feature(kind)
        allure.dynamic.story(case.horizon)
        allure.dynamic.tag(run.model.name, run.strategy, kind)
        params = {"model": run.model.name, "strategy": run.strategy, "budget": run.budget,
                  "run": run.run_index + 1, "domain": case.task.domain, "kind": kind, "horizon": case.horizon}
        for name, value in params.items():
            allure.dynamic.label(name, str(value))  # filterable, and what the tests read
            allure.dynamic.parameter(name, value)
        # the pytest parameter itself is the whole case object: hidden, and kept out of the history id
        allure.dynamic.parameter("retrace_run", run.id, excluded=True, mode=allure.parameter_mode.HIDDEN)

    # -- stages as steps, with their real start and stop ----------------------------------------------
    @pytest.hookimpl
    def pytest_retrace_stage_start(self, item: pytest.Item, stage: Stage) -> None:
        from allure_commons import plugin_manager
        from allure_commons.utils import uuid4

        uuid = self._steps[id(stage)] = uuid4()
        plugin_manager.hook.start_step(uuid=uuid, title=stage.title, params={})

    @pytest.hookimpl
    def pytest_retrace_stage_end(self, item: pytest.Item, stage: Stage) -> None:
        from allure_commons import plugin_manager

        uuid = self._steps.pop(id(stage), None)
        if uuid is None:
            return
        # Some titles are known only at the end ("R_O: SSIM 0.9731 < 0.99"): allure-commons has no public
        # call to rename a step, so rename it through the reporter when this allure-pytest exposes it.
        listener = item.config.pluginmanager.get_plugin("allure_listener")
        step = getattr(getattr(listener, "allure_logger", None), "get_item", lambda _: None)(uuid)
        if step is not None and hasattr(step, "name"):
            step.name = stage.title
        if stage.screenshot is not None:  # a state that did not reproduce: what the replay got, in its step
            import allure

            allure.attach(_png(stage.screenshot), name=f"{stage.title}: the screen got",
                          attachment_type=allure.attachment_type.PNG)
        if stage.error is not None:  # the harness broke: Allure's "broken"
            exc: BaseException | None = stage.error
        elif stage.failed is None:
            exc = None
        elif stage.name == "verify":  # a reconstruction attempt that will be retried: the harness's, not the agent's
            exc = RuntimeError(stage.failed)
        else:  # a check of the agent's recovery that did not hold: Allure's "failed"
            exc = AssertionError(stage.failed)
        plugin_manager.hook.stop_step(uuid=uuid, exc_type=type(exc) if exc else None, exc_val=exc, exc_tb=None)

    # -- attachments ------------------------------------------------------------------------------------
    @pytest.hookimpl
    def pytest_retrace_result(self, item: pytest.Item, result: RecoveryResult, record: Record) -> None:
        run = _run_of(item)
        if run is None:
            return
        if result.error is not None:
            self._attach(result, record, run)  # no test body will run: attach under the set-up
        else:
            self._attach_later[item.nodeid] = (result, record, run)

    @pytest.hookimpl(tryfirst=True)  # inside allure-pytest's call wrapper, before the assertion: the test body
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        later = self._attach_later.pop(item.nodeid, None)
        if later is not None:
            self._attach(*later)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self._attach_later.pop(item.nodeid, None)  # a test body that never ran must not keep its screenshots
        run = _run_of(item)
        if run is not None:  # the title: allure-pytest sets its own at the end of set-up, so here, after it
            import allure

            again = f" · run {run.run_index + 1}" if run.runs > 1 else ""
            allure.dynamic.title(f"{run.case.id} [{run.model.name} · {run.strategy} · r={run.budget}{again}]")

    def _attach(self, result: RecoveryResult, record: Record, run: CaseRun) -> None:
        import allure

        from .similarity import ssim_heatmap

        png = allure.attachment_type.PNG
        for name, path in (("target (s_target)", run.case.target_png), ("error (s_error)", run.case.error_png)):
            if path.is_file():
                allure.attach.file(str(path), name=name, attachment_type=png)
        recovered, target = result.recovered_screenshot, result.target_screenshot
        if recovered is not None:
            allure.attach(_png(recovered), name="recovered", attachment_type=png)
            if target is not None and target.shape == recovered.shape:
                allure.attach(_png(ssim_heatmap(target, recovered, run.case.masks)),
                              name="SSIM heatmap (red: low SSIM to the target)", attachment_type=png)
        allure.attach(_actions_text(record), name="actions", attachment_type=allure.attachment_type.TEXT)
        if record.evaluator_score is not None or record.evaluator_details:
            lines = [f"R_TC: {record.r_tc}; evaluator score {record.evaluator_score}", *record.evaluator_details]
            allure.attach("\n".join(lines) + "\n", name="evaluator", attachment_type=allure.attachment_type.TEXT)
        allure.attach(record.model_dump_json(indent=2), name="record", attachment_type=allure.attachment_type.JSON)


def _png(pixels: Any) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)  # fast: these are one-off attachments
    return buf.getvalue()


def _actions_text(record: Record) -> str:
    """Every action of the replay, by stage, with the model's rationale once per turn."""
    lines: list[str] = []
    last_rationale = None
    for step in record.actions:
        fields = step.model_dump(exclude={"stage", "action", "settle", "settled", "rationale", "error"},
                                 exclude_none=True)
        args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        line = f"{step.stage:8} {step.action}({args})"
        if not step.settled:
            line += f"  (the screen still changed after {step.settle:.1f} s)"
        if step.error:
            line += f"  !! {step.error}"
        if step.rationale and step.rationale != last_rationale:
            lines.append(f"{'':8} # {step.rationale.strip()[:2000]}")
            last_rationale = step.rationale
        lines.append(line)
    return "\n".join(lines) + "\n"
