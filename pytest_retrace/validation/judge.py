"""The LLM judge of finished records (issue 25; the paper's GPT-5.4 evaluator of Table 1, with this project's own
prompt, ``agents/prompts/judge-system.md``): one model call per sample, shown what the paper's evaluator saw
(:class:`~pytest_retrace.validation.samples.Sample`, never the oracle's verdict), its answer written to
``<run>/judge/<judge>.jsonl`` beside the run. It never changes the oracle's verdict in results.jsonl.

A judge is any chat model config (``agents/judge.yaml``: GPT-5.4 through the Responses API), called through the
adapters and their transport: retries, the endpoint's concurrency limit, usage and cost in every line.

No verdict is ever guessed. A reply whose last line is not ``Verdict: recovered`` or ``Verdict: not recovered``
(or that names both verdicts on lines of their own) is "unreadable reply: ..."; the API down after the
transport's retries is "api: ..."; a sample whose run kept no recovered screen (a run without
``--retrace-keep-screens`` keeps it for failed tests only) is "no recovered screen: ..." and costs no call. A
rerun asks again every sample without a verdict, and no other.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from pytest_retrace.actions import Action, ActionError
from pytest_retrace.actions.pyautogui_render import to_pyautogui
from pytest_retrace.agents import AgentInfraError, ChatModel, ModelConfig, Usage, create_chat
from pytest_retrace.agents.prompts import JUDGE_KEY, Image, Part, Prompts, Text, config_prompts
from pytest_retrace.replay.cases import load_png
from pytest_retrace.results.records import Step
from pytest_retrace.text import clip
from pytest_retrace.validation.files import JudgeVerdict, Verdict, judge_file, read_jsonl
from pytest_retrace.validation.samples import Sample

# the last line, alone: "Verdict: recovered" / "Verdict: not recovered" (markdown emphasis and a full stop tolerated)
_VERDICT_LINE = re.compile(r"^[\s`*_>]*verdict\s*:\s*[`*_]*\s*(recovered|not[ _]recovered)\s*[`*_.]*\s*$",
                           re.IGNORECASE)
_STEP_FIELDS = {"stage", "settle", "settled", "rationale", "error"}  # a Step's own fields, not its action's
RATIONALE_LIMIT = 4000
NO_SCREEN = ("no recovered screen: the run kept no image of it (rerun the tests with --retrace-keep-screens to "
             "keep the recovered screen of every finished test)")


class UnreadableReply(ValueError):
    """A reply that names no verdict, or more than one."""


def read_reply(text: str) -> tuple[Verdict, str]:
    """(verdict, rationale) from a judge's reply: its last non-empty line is the verdict, the rest its reasons."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        raise UnreadableReply("the reply is empty")
    found = _VERDICT_LINE.match(lines[-1])
    if found is None:
        raise UnreadableReply(f"its last line is not `Verdict: recovered` or `Verdict: not recovered`: "
                              f"{clip(lines[-1].strip(), 200)!r}")
    verdict: Verdict = "recovered" if found.group(1).lower() == "recovered" else "not_recovered"
    earlier = {_kind(m.group(1)) for m in map(_VERDICT_LINE.match, lines[:-1]) if m is not None}
    if earlier - {verdict}:  # a judge that changed its mind on its way: neither answer is its verdict
        raise UnreadableReply("it names both verdicts on lines of their own")
    return verdict, clip(" ".join(" ".join(lines[:-1]).split()), RATIONALE_LIMIT)


def _kind(word: str) -> Verdict:
    return "recovered" if word.lower() == "recovered" else "not_recovered"


def describe_step(step: Step) -> str:
    """A recorded action as pyautogui code (screen pixels), as the agents are shown their own past steps."""
    fields = {k: v for k, v in step.model_dump().items() if k not in _STEP_FIELDS}
    try:
        return to_pyautogui(Action.from_dict(fields))
    except (ActionError, KeyError, TypeError, ValueError):  # a record from another version: its fields as written
        return json.dumps(fields, sort_keys=True)


def shown(sample: Sample) -> list[Part]:
    """What the judge is given, in order: the task, the history up to and including the mistake, the target and
    error screens, the recovery with the agent's words, the recovered screen. No model name, no strategy, no
    oracle: a judge must decide from what a person would see."""
    assert sample.recovered is not None
    target = load_png(sample.target)
    height, width = target.shape[:2]
    history = [f"Step {i}{' (the mistake)' if s.stage == 'perturb' else ''}: {describe_step(s)}"
               for i, s in enumerate(sample.history, 1)]
    parts: list[Part] = [
        Text(f"The task: {sample.instruction}"),
        Text(f"The steps taken before the recovery, oldest first (coordinates are pixels of the {width}x{height} "
             "screen):\n" + ("\n".join(history) or "(none recorded)")),
        Text("The target state (the screen before the mistake, which the agent was to restore):"), Image(target),
        Text("The error state (the screen after the mistake, where the agent began):"), Image(load_png(sample.error)),
    ]
    recovery, said = [], None
    for i, s in enumerate(sample.recovery, 1):
        line = f"Action {i}: {describe_step(s)}"
        if s.rationale and s.rationale != said:  # a turn's words, once for the actions it took
            line += f"\n  The agent's reasoning: {' '.join(s.rationale.split())}"
            said = s.rationale
        if s.error:
            line += f"\n  It did not run: {' '.join(s.error.split())}"
        recovery.append(line)
    parts += [Text("The agent's recovery, in order:\n" + ("\n".join(recovery) or "(the agent took no action)")),
              Text("The recovered state (the screen the agent left):"), Image(load_png(sample.recovered)),
              Text("Is the recovered state the target state? End with one line: `Verdict: recovered` or "
                   "`Verdict: not recovered`.")]
    return parts


class Judge:
    """A chat model asked, per sample, whether the agent recovered."""

    def __init__(self, name: str, chat: ChatModel, prompts: Prompts) -> None:
        self.name, self.chat, self.prompts = name, chat, prompts

    def verdict(self, sample: Sample) -> JudgeVerdict:
        line = {"sample": sample.id, "nodeid": sample.nodeid, "judge": self.name}
        if sample.recovered is None:
            return JudgeVerdict(**line, verdict=None, error=NO_SCREEN)
        try:
            reply, usage = self.chat.complete(self.prompts.text(JUDGE_KEY), shown(sample))
        except AgentInfraError as exc:  # after the transport's retries; its message quotes no credential
            return JudgeVerdict(**line, verdict=None, error=f"api: {exc}", usage=Usage(calls=1).to_dict())
        try:
            verdict, rationale = read_reply(reply)
        except UnreadableReply as exc:
            return JudgeVerdict(**line, verdict=None, error=f"unreadable reply: {exc}", usage=usage.to_dict(),
                                rationale=clip(" ".join(reply.split()), RATIONALE_LIMIT))
        return JudgeVerdict(**line, verdict=verdict, rationale=rationale, usage=usage.to_dict())

    def close(self) -> None:
        self.chat.close()


def create_judge(config: ModelConfig) -> Judge:
    """The judge a chat model config describes; its prompt ``judge_system`` is read now (a config error, else)."""
    chat = create_chat(config)
    prompts = config_prompts(config)
    prompts.text(JUDGE_KEY)
    return Judge(config.name, chat, prompts)


# -- the judge's file: appended a line per verdict, read back for resume and the agreement --------------------
class JudgeFileError(ValueError):
    """A judge file that cannot be read; the message names the file and the line."""


def read_verdicts(path: Path) -> dict[str, JudgeVerdict]:
    """The latest line per sample of a judge file (none: {}); a torn last line is skipped (files.read_jsonl), so
    its sample is asked again."""
    if not path.is_file():
        return {}
    return {v.sample: v for _, v in read_jsonl(path, JudgeVerdict, JudgeFileError)}


class _Appender:
    """One line per verdict, appended as it comes under a lock (the workers share the file)."""

    def __init__(self, path: Path) -> None:
        self.path, self.lock = path, threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes() if path.is_file() else b""
        if data and not data.endswith(b"\n"):  # a line torn by a killed judge: never finished, so dropped
            with path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def write(self, verdict: JudgeVerdict) -> None:
        with self.lock, self.path.open("a", encoding="utf-8") as f:
            f.write(verdict.model_dump_json() + "\n")
            f.flush()


# -- a run judged -----------------------------------------------------------------------------------------------
@dataclass
class Tally:
    """One run after the judge: its samples' latest verdicts, and what this session asked and spent."""

    run: Path
    file: Path
    samples: int = 0
    to_ask: int = 0  # samples without a verdict before this session
    calls: int = 0  # model calls this session (0 on a dry run)
    verdicts: int = 0
    no_verdict: int = 0
    unjudged: int = 0  # no line at all (a dry run)
    agree: int = 0  # verdicts equal to the oracle's
    errors: dict[str, int] = field(default_factory=dict)  # no verdict, by kind (api, unreadable reply, ...)
    usage: Usage = field(default_factory=Usage)

    def line(self) -> str:
        tokens = f"{self.usage.input_tokens} in / {self.usage.output_tokens} out"
        cost = "unknown (no prices in the config)" if self.usage.cost is None else f"${self.usage.cost:.4f}"
        why = ", ".join(f"{n} {k}" for k, n in sorted(self.errors.items()))
        return (f"{self.run}: {self.samples} sample(s): {self.verdicts} verdict(s), {self.no_verdict} no verdict"
                f"{f' ({why})' if why else ''}{f', {self.unjudged} not judged yet' if self.unjudged else ''}; "
                f"agreement with the oracle {self.agree}/{self.verdicts}; this session: {self.calls} call(s), "
                f"{tokens} tokens, cost {cost}; {self.file}")


def pending(samples: Iterable[Sample], done: dict[str, JudgeVerdict]) -> list[Sample]:
    """The samples to ask: every one without a verdict yet (unjudged, or no verdict last time)."""
    return [s for s in samples if (v := done.get(s.id)) is None or v.verdict is None]


def judge_run(run_dir: Path, samples: list[Sample], name: str, judge: Judge | None, *, workers: int = 1,
              on_verdict: Callable[[Sample, JudgeVerdict], None] | None = None) -> Tally:
    """Judge a run's samples not judged yet (``judge`` None: a dry run, nothing asked) and tally the result."""
    path = judge_file(run_dir, name)
    done = read_verdicts(path)
    todo = pending(samples, done)
    tally = Tally(run_dir, path, samples=len(samples), to_ask=len(todo))
    if judge is not None and todo:
        appender = _Appender(path)
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="retrace-judge") as pool:

            def ask(sample: Sample) -> JudgeVerdict:
                verdict = judge.verdict(sample)
                appender.write(verdict)  # at once, by the worker: a paid answer is kept whatever happens next
                return verdict

            futures = {pool.submit(ask, s): s for s in todo}
            for future in as_completed(futures):
                verdict = future.result()
                done[verdict.sample] = verdict
                tally.calls += int(verdict.usage.get("calls") or 0)
                tally.usage.add(Usage(input_tokens=int(verdict.usage.get("input_tokens") or 0),
                                      output_tokens=int(verdict.usage.get("output_tokens") or 0),
                                      cost=verdict.usage.get("cost")))
                if on_verdict is not None:
                    on_verdict(futures[future], verdict)
    for sample in samples:
        v = done.get(sample.id)
        if v is None:
            tally.unjudged += 1
        elif v.verdict is None:
            tally.no_verdict += 1
            kind = (v.error or "unknown").split(":", 1)[0]
            tally.errors[kind] = tally.errors.get(kind, 0) + 1
        else:
            tally.verdicts += 1
            tally.agree += (v.verdict == "recovered") == sample.oracle.recovered
    return tally


def calls_needed(samples: Iterable[Sample], done: dict[str, JudgeVerdict]) -> int:
    """Model calls a judge would make: one per pending sample whose recovered screen was kept."""
    return sum(1 for s in pending(samples, done) if s.recovered is not None)
