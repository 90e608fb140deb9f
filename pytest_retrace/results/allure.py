"""Allure results for recovery tests (with allure-pytest's ``--alluredir``), written through the plugin's own
hooks like any third party's writer.

allure-pytest already writes one result per test; this adds what a reader of a recovery benchmark needs:
- labels and **non-excluded** parameters (model, strategy, budget, run, domain, kind, horizon), so that
  models, budgets and repeated runs of one case are different tests in Allure's history, never retries of one
  (the test's own parameter, the whole case object, is hidden and excluded);
- a step per replay stage in the **test body**, with its real timing: reset, prefix, verify, perturbation,
  context, recovery (a step per model turn inside), R_O, suffix, R_TC. They run in the ``retrace_result``
  fixture, since an infrastructure failure there must be a pytest *error* (Allure: *broken*), and a failed
  recovery fails the test body's assertion (Allure: *failed*); but the replay is what the test measures, so
  its steps go to the test itself and the test's start is its set-up's start (allure-pytest starts a test's
  clock at the call, which left a 10 s replay a 0.3 s test on the timeline);
- attachments in the step they belong to: the recorded target and error screenshots in their verify steps,
  the recovered one and an SSIM heatmap in R_O, the actions with the model's rationale per turn in the
  recovery, the evaluator's output in R_TC; the record on the test;
- the harness's bookkeeping fixtures (the case parameter, the agent and judge caches, retrace_result, whose
  steps are the body now) are left out of Set up / Tear down, and so is the finalizer pytest >= 9.1 adds to
  every fixture, which allure-pytest 2.16 writes as a tear-down that never ends (status unknown;
  allure-python#918); the desktop's start and close stay;
- a case file that does not load is a *broken* result naming the file and the error (pytest runs nothing
  then, and allure-pytest writes nothing for a collection error);
- categories.json (not recovered: R_O only / R_TC only / both; case files that did not load; infrastructure
  errors) and environment.properties, written once by the controller.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import allure
import allure_commons
import pytest
from allure_commons import plugin_manager
from allure_commons.model2 import (
    ATTACHMENT_PATTERN,
    Attachment,
    ExecutableItem,
    Label,
    Status,
    StatusDetails,
    TestResult,
    TestResultContainer,
    TestStepResult,
)
from allure_commons.types import AttachmentType, LabelType
from allure_commons.utils import md5, now, uuid4

from pytest_retrace.results.caserun import ForwardRun, case_run_of, forward_run_of

if TYPE_CHECKING:
    from allure_commons.reporter import AllureReporter

    from pytest_retrace.experiments.forward import ForwardResult
    from pytest_retrace.replay.result import RecoveryResult, Stage
    from pytest_retrace.results.forward import ForwardRecord
    from pytest_retrace.results.records import Record

NOT_LOADED = "case file did not load"

# Allure 2 matches these regular expressions (Java) against the whole message, Allure 3 (JavaScript) searches
# them: [\s\S] is "any character, newlines included" in both dialects. The assertion's message carries
# "R_O=..., R_TC=..." (assertion.explain); a case file that did not load, NOT_LOADED. Allure 2 puts a result in
# the first category it matches (generator 2.x, measured); the infrastructure one leaves the case files out
# anyway, so that the order does not matter.
CATEGORIES = [
    {"name": "Not recovered: R_O and R_TC failed", "matchedStatuses": ["failed"],
     "messageRegex": r"[\s\S]*R_O=False, R_TC=False[\s\S]*"},
    {"name": "Not recovered: R_O only (the screen differs, the task still completes)", "matchedStatuses": ["failed"],
     "messageRegex": r"[\s\S]*R_O=False, R_TC=True[\s\S]*"},
    {"name": "Not recovered: R_TC only (the screen matches, hidden state is broken)", "matchedStatuses": ["failed"],
     "messageRegex": r"[\s\S]*R_O=True, R_TC=False[\s\S]*"},
    {"name": "Case files that did not load", "matchedStatuses": ["broken"],
     "messageRegex": rf"^{NOT_LOADED}[\s\S]*"},
    {"name": "Infrastructure errors (excluded from rates)", "matchedStatuses": ["broken"],
     "messageRegex": rf"^(?!{NOT_LOADED})[\s\S]*"},
]

# Fixtures of the harness that only hand objects around (the case parameter, caches of agents and judges) or
# whose work is the test body's steps (retrace_result): in Set up / Tear down they are noise on every test.
HIDDEN_FIXTURES = frozenset({"retrace_run", "retrace_case", "retrace_agent", "_retrace_agents", "_retrace_judges",
                             "retrace_result", "retrace_forward_run", "retrace_forward_result"})
# The stages whose step gets attachments (by stage name, a verify stage by its title), and which: the last
# attempt's verify step, next to the screen it got when the state did not reproduce.
ATTACH_TO = {"verify s_target": "target", "verify s_error": "error", "recover": "actions", "observe": "screen",
             "evaluate": "evaluator"}


def _reporter(config: pytest.Config) -> AllureReporter | None:
    """allure-pytest's reporter (the listener's): allure-commons has no public call to put a step on a test
    rather than on the innermost running fixture, nor to move a test's start."""
    listener = config.pluginmanager.get_plugin("allure_listener")
    return getattr(listener, "allure_logger", None)


class AllureWriter:
    """Registered on every process of a run given ``--alluredir`` (the controller and each xdist worker)."""

    def __init__(self, results_dir: Path, environment: dict[str, str]) -> None:
        self.results_dir = results_dir
        self.environment = environment  # the run's models, env, budgets...: environment.properties' retrace.*
        self._steps: dict[int, str] = {}  # id(stage) -> Allure step uuid, while the stage runs
        self._open: list[str] = []  # uuids of the running stages, innermost last
        self._attach_to: dict[str, TestStepResult] = {}  # ATTACH_TO's values -> that step of the running test
        self._started: dict[str, int] = {}  # nodeid -> the test's start (ms), its set-up's
        self._fixtures = _HarnessFixtures()
        self._config: pytest.Config | None = None

    # -- the controller: categories and environment, once -------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        self._config = config
        allure_commons.plugin_manager.register(self._fixtures)
        config.add_cleanup(lambda: allure_commons.plugin_manager.unregister(self._fixtures))
        if hasattr(config, "workerinput"):
            return
        from importlib.metadata import version

        self.results_dir.mkdir(parents=True, exist_ok=True)
        (self.results_dir / "categories.json").write_text(json.dumps(CATEGORIES, indent=2) + "\n")
        env = {**{f"retrace.{k}": v for k, v in self.environment.items()}, "pytest-retrace": version("pytest-retrace")}
        (self.results_dir / "environment.properties").write_text(
            "".join(f"{k}={v}\n" for k, v in env.items()))

    # -- a case file that did not load: a broken result of its own ------------------------------------
    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # On the controller only: under xdist every worker collects and fails alike, and the controller gets
        # the error once (xdist drops the copies). A run that only lists tests (--collect-only, --retrace-dry-run)
        # writes no results, as allure-pytest writes none then.
        config = self._config
        if not report.failed or config is None or hasattr(config, "workerinput") or config.option.collectonly:
            return
        if Path(report.nodeid).suffix not in (".yaml", ".yml"):  # only case files are collected from YAML
            return
        plugin_manager.hook.report_result(result=_not_loaded(report))

    # -- each test: its name, labels and parameters, before any fixture runs --------------------------
    @pytest.hookimpl(tryfirst=True)  # inside allure-pytest's setup wrapper, which has started the test result
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        run = case_run_of(item)
        reporter = _reporter(item.config)
        forward = forward_run_of(item)
        if (run is None and forward is None) or reporter is None:
            return
        test = reporter.get_test(None)
        if test is not None:
            self._started[item.nodeid] = test.start
        self._attach_to, self._open = {}, []
        if forward is not None:
            _forward_labels(forward)
            return
        assert run is not None
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

    @pytest.hookimpl(tryfirst=True)  # inside allure-pytest's call wrapper, which has just restarted the clock
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        started = self._started.pop(item.nodeid, None)
        reporter = _reporter(item.config)
        test = reporter.get_test(None) if reporter is not None else None
        if started is not None and test is not None:
            test.start = started  # the replay ran in set-up: its time is the test's

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        run, forward = case_run_of(item), forward_run_of(item)
        if run is None and forward is None:
            return
        reporter = _reporter(item.config)
        test = reporter.get_test(None) if reporter is not None else None
        if item.nodeid in self._started and test is not None:  # set-up failed, no call: the test ends here
            self._started.pop(item.nodeid)
            test.stop = now()
        # the title: allure-pytest sets its own at the end of set-up, so here, after it
        if forward is not None:
            again = f" · run {forward.run_index + 1}" if forward.runs > 1 else ""
            allure.dynamic.title(f"{forward.task.id} [{forward.model.name} · forward{again}]")
            return
        assert run is not None
        again = f" · run {run.run_index + 1}" if run.runs > 1 else ""
        allure.dynamic.title(f"{run.case.id} [{run.model.name} · {run.strategy} · r={run.budget}{again}]")

    # -- stages as steps of the test, with their real start and stop ------------------------------------
    @pytest.hookimpl
    def pytest_retrace_stage_start(self, item: pytest.Item, stage: Stage) -> None:
        uuid = self._steps[id(stage)] = uuid4()
        reporter = _reporter(item.config)
        test = reporter.get_test(None) if reporter is not None else None
        if reporter is None or test is None:  # an allure-pytest without its reporter: under the fixture
            plugin_manager.hook.start_step(uuid=uuid, title=stage.title, params={})
            self._open.append(uuid)
            return
        step = TestStepResult(name=stage.title, start=now())
        # a top-level stage on the test (the replay runs inside retrace_result's set-up, the innermost item),
        # a turn inside the running recovery, and whatever stages an agent runs inside its turn (the oracle
        # replays the prefix): those never get the case's attachments
        top = not self._open
        reporter.start_step(self._open[-1] if self._open else test.uuid, uuid, step)
        self._open.append(uuid)
        slot = ATTACH_TO.get(stage.title if stage.name == "verify" else stage.name)
        if top and slot is not None:
            self._attach_to[slot] = step

    @pytest.hookimpl
    def pytest_retrace_stage_end(self, item: pytest.Item, stage: Stage) -> None:
        uuid = self._steps.pop(id(stage), None)
        if uuid is None:
            return
        reporter = _reporter(item.config)
        step = reporter.get_item(uuid) if reporter is not None else None
        # Some titles are known only at the end ("R_O: SSIM 0.9731 < 0.99"); allure-commons cannot rename a step
        if step is not None:
            step.name = stage.title
        if stage.screenshot is not None:  # a state that did not reproduce: what the replay got, in its step
            allure.attach(_png(stage.screenshot), name=f"{stage.title}: the screen got",
                          attachment_type=allure.attachment_type.PNG)
        if stage.error is not None:  # the harness broke: Allure's "broken"
            exc: BaseException | None = stage.error
        elif stage.failed is None:
            exc = None
        elif stage.name in ("reset", "verify"):  # a reconstruction attempt, retried: the harness's, not the agent's
            exc = RuntimeError(stage.failed)
        else:  # a check of the agent's recovery that did not hold: Allure's "failed"
            exc = AssertionError(stage.failed)
        plugin_manager.hook.stop_step(uuid=uuid, exc_type=type(exc) if exc else None, exc_val=exc, exc_tb=None)
        if self._open and self._open[-1] == uuid:
            self._open.pop()

    # -- attachments, in their stages' steps --------------------------------------------------------------
    @pytest.hookimpl
    def pytest_retrace_result(self, item: pytest.Item, result: RecoveryResult, record: Record) -> None:
        run = case_run_of(item)
        reporter = _reporter(item.config)
        test = reporter.get_test(None) if reporter is not None else None
        if run is None or test is None:
            return
        steps = self._attach_to
        self._attach_to = {}
        png = AttachmentType.PNG
        for key, name, path in (("target", "target (s_target)", run.case.target_png),
                                ("error", "error (s_error)", run.case.error_png)):
            if path.is_file():
                _attach(steps.get(key, test), path.read_bytes(), name, png)
        recovered, target = result.recovered_screenshot, result.target_screenshot
        if recovered is not None:
            from pytest_retrace.screen.similarity import ssim_heatmap

            observe = steps.get("screen", test)
            _attach(observe, _png(recovered), "recovered", png)
            if target is not None and target.shape == recovered.shape:
                _attach(observe, _png(ssim_heatmap(target, recovered, run.case.masks)),
                        "SSIM heatmap (red: low SSIM to the target)", png)
        if record.actions:
            _attach(steps.get("actions", test), _actions_text(record), "actions", AttachmentType.TEXT)
        if record.evaluator_score is not None or record.evaluator_details:
            lines = [f"R_TC: {record.r_tc}; evaluator score {record.evaluator_score}", *record.evaluator_details]
            _attach(steps.get("evaluator", test), "\n".join(lines) + "\n", "evaluator", AttachmentType.TEXT)
        _attach(test, record.model_dump_json(indent=2), "record", AttachmentType.JSON)


    @pytest.hookimpl
    def pytest_retrace_forward_result(self, item: pytest.Item, result: ForwardResult, record: ForwardRecord) -> None:
        reporter = _reporter(item.config)
        test = reporter.get_test(None) if reporter is not None else None
        if test is None:
            return
        self._attach_to = {}
        last = result.frames[-1] if result.frames else result.initial
        if last is not None:
            _attach(test, _png(last), "final screen", AttachmentType.PNG)
        if record.evaluator_details:
            _attach(test, "\n".join([f"score {record.score}", *record.evaluator_details]) + "\n", "evaluator",
                    AttachmentType.TEXT)
        _attach(test, record.model_dump_json(indent=2), "record", AttachmentType.JSON)


class _HarnessFixtures:
    """Leaves the harness's bookkeeping out of the containers allure-pytest writes (see HIDDEN_FIXTURES), and
    the tear-down allure-pytest makes of pytest's own per-fixture finalizer: it wraps it like a fixture's
    finalizer, but that finalizer reports the container before the wrapper can close the tear-down, which
    is then written without a status (Allure: unknown) and no start."""

    @allure_commons.hookimpl(tryfirst=True)  # before allure-commons' file logger writes the container
    def report_container(self, container: TestResultContainer) -> None:
        container.befores = [f for f in container.befores if f.name not in HIDDEN_FIXTURES]
        container.afters = [f for f in container.afters if f.name.split("::")[0] not in HIDDEN_FIXTURES
                            and not (f.name.endswith("::<lambda>") and f.status is None)]


def _attach(parent: ExecutableItem, body: str | bytes, name: str, kind: AttachmentType) -> None:
    """An attachment on a step that has ended (or on the test): the reporter attaches only to running items."""
    source = ATTACHMENT_PATTERN.format(prefix=uuid4(), ext=kind.extension)
    parent.attachments.append(Attachment(name=name, source=source, type=kind.mime_type))
    plugin_manager.hook.report_attached_data(body=body, file_name=source)


def _not_loaded(report: pytest.CollectReport) -> TestResult:
    """A broken result for a case file that did not load, named by the file, with the loader's error."""
    at = now()
    path, error = report.nodeid, report.longreprtext.strip()
    # the loader's message names the file (CaseFile.repr_failure), as its absolute path
    message = f"{NOT_LOADED}: {error}" if Path(path).name in error.split("\n")[0] else f"{NOT_LOADED}: {path}: {error}"
    labels = [Label(LabelType.PARENT_SUITE, "case files that did not load"), Label(LabelType.SUITE, path),
              Label(LabelType.FRAMEWORK, "pytest"), Label("package", path)]
    return TestResult(name=f"{path} (did not load)", fullName=path, uuid=uuid4(), historyId=md5(path),
                      testCaseId=md5(path), start=at, stop=at, status=Status.BROKEN, labels=labels,
                      statusDetails=StatusDetails(message=message, trace=report.longreprtext))


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


def _forward_labels(run: ForwardRun) -> None:
    """A forward test (--retrace-experiment=forward): suites model · forward > domain, its task, and the
    parameter (the whole case object) hidden; its stages are steps like a recovery's."""
    task, start = run.task, run.start
    where = "its initial state" if start is None else \
        f"step {start.step} of episode {start.name} (condition {start.condition}, continuation {start.sample + 1})"
    allure.dynamic.description(f"**Task** ({task.domain}): {task.instruction}\n\nSolved from {where} in at most "
                               f"{run.max_steps} steps, judged by the task's evaluator.")
    experiment = "forward" if start is None else "ideal-recovery"
    allure.dynamic.parent_suite(f"{run.model.name} · {experiment}" + ("" if start is None else f" · R={start.condition}"))
    allure.dynamic.suite(task.domain)
    labels = {"model": run.model.name, "experiment": experiment, "task": task.id, "domain": task.domain,
              "max_steps": run.max_steps, "run": run.run_index + 1}
    if start is not None:
        labels |= {"condition": start.condition, "recovery_step": start.step, "continuation": start.sample + 1}
    for name, value in labels.items():
        allure.dynamic.label(name, str(value))
        allure.dynamic.parameter(name, value)
    allure.dynamic.parameter("retrace_forward_run", run.id, excluded=True, mode=allure.parameter_mode.HIDDEN)
