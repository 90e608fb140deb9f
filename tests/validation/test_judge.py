"""The LLM judge (`retrace judge`): its reply read strictly (no verdict is ever guessed), and a real run (noop and
oracle on one case, on a real desktop, with --retrace-keep-screens) judged through the loopback server of each
provider kind, with each SDK: what the request holds and what it never holds (the oracle's verdict, the key),
the verdicts written beside the run, an unreadable reply and a failed API as no verdict, resume, the dry run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import PIL.Image
import pytest

from pytest_retrace.agents import ModelConfig
from pytest_retrace.cli import main
from pytest_retrace.testing import (
    ANTHROPIC,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    EchoingCredentials,
    LoopbackServer,
    Reply,
    Request,
    Script,
    anthropic_message,
    chat_completion,
    message_item,
    openai_response,
    text_block,
)
from pytest_retrace.validation.files import judge_file
from pytest_retrace.validation.judge import (
    NO_SCREEN,
    UnreadableReply,
    calls_needed,
    create_judge,
    judge_run,
    read_reply,
    read_verdicts,
)
from pytest_retrace.validation.samples import load_samples
from tests.helpers import REPO

KEY = "sk-judge-test-0123456789abcdefSECRET"
PRICES = {"input": 2.5, "output": 15.0}
NOOP, ORACLE = "typo-short-noop-implicit-r10", "typo-short-oracle-explicit-none-r10"


# -- the reply, read strictly ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("reply", "verdict"), [
    ("The typo is gone and the text is as before.\nVerdict: recovered", "recovered"),
    ("xyz is still there.\n\n**Verdict: not recovered**\n", "not_recovered"),
    ("Same screen.\n`Verdict: Not_Recovered.`", "not_recovered"),
    ("Verdict: recovered", "recovered"),  # no reasons: still a clear verdict
])
def test_a_reply_ending_in_one_verdict_line_is_read(reply: str, verdict: str) -> None:
    assert read_reply(reply)[0] == verdict


@pytest.mark.parametrize(("reply", "why"), [
    ("", "empty"),
    ("It looks recovered to me.", "last line is not"),
    ("Verdict: recovered\nThe text matches, mostly.", "last line is not"),
    ("Verdict: partially recovered", "last line is not"),
    ("Verdict: recovered?", "last line is not"),
    ("Verdict: not recovered\nOn second thought the cursor moved back.\nVerdict: recovered", "both verdicts"),
])
def test_any_other_reply_is_unreadable_never_guessed(reply: str, why: str) -> None:
    with pytest.raises(UnreadableReply, match=why):
        read_reply(reply)


def test_the_rationale_is_the_reply_before_its_verdict() -> None:
    assert read_reply("The text\n  reads 'Hello '.\nVerdict: recovered") == ("recovered", "The text reads 'Hello '.")


# -- a real run, judged ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """noop (not recovered) and oracle (recovered) on mousepad/typo-short, keeping every recovered screen."""
    root = tmp_path_factory.mktemp("project")
    shutil.copytree(REPO / "tests" / "data" / "cases", root / "cases")
    shutil.copytree(REPO / "agents", root / "agents")
    (root / "pytest.ini").write_text("[pytest]\ntestpaths = cases\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path_factory.mktemp("envtmp"))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--retrace-model=noop,oracle",
                           "-k", "typo-short", "--retrace-keep-screens", "--retrace-run=r1", "-q"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]  # noop failed its recovery
    return root / "reports" / "r1"


@pytest.fixture
def run(real_run: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the real run for one test (the judge writes beside it)."""
    copy = tmp_path / "r1"
    shutil.copytree(real_run, copy)
    yield copy


def _config(provider: str, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch, **extra: object) -> ModelConfig:
    """A judge config of each provider kind, pointed at the loopback server the way a user would: the SDKs' own
    ANTHROPIC_BASE_URL / OPENAI_BASE_URL, or the config's base_url_env for an OpenAI-compatible server."""
    monkeypatch.setenv("JUDGE_TEST_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
    monkeypatch.setenv("JUDGE_COMPAT_URL", server.openai_url)
    options = {"model": "judge-model", "api_key_env": "JUDGE_TEST_KEY", "prices": PRICES,
               "prompts_dir": str(REPO / "agents" / "prompts"), **extra}
    if provider == "openai-compat":
        options["base_url_env"] = "JUDGE_COMPAT_URL"
    return ModelConfig(f"judge-{provider}", provider, options=options)


def _reply(provider: str, text: str) -> Reply:
    if provider == "anthropic":
        return Reply(anthropic_message([text_block(text)], usage={"input_tokens": 3000, "output_tokens": 80}))
    if provider == "openai":
        return Reply(openai_response([message_item(text)], usage={"input_tokens": 3000, "output_tokens": 80}))
    return Reply(chat_completion(text, usage={"prompt_tokens": 3000, "completion_tokens": 80, "total_tokens": 3080}))


WIRE = {"anthropic": ANTHROPIC, "openai": OPENAI_RESPONSES, "openai-compat": OPENAI_CHAT}


def _written(run: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in run.rglob("*") if p.is_file() and p.suffix != ".png")


@pytest.mark.desktop
@pytest.mark.parametrize("provider", ["anthropic", "openai", "openai-compat"])
def test_a_real_run_judged_through_each_provider(provider: str, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    samples = load_samples(run)
    assert [s.nodeid.split("[")[1][:-1] for s in samples] == [NOOP, ORACLE]
    results = (run / "results.jsonl").read_bytes()
    replies = [_reply(provider, "The stray 'xyz' is still in the editor.\nVerdict: not recovered"),
               _reply(provider, "The editor shows 'Hello ' as in the target.\nVerdict: recovered")]
    with LoopbackServer(Script(replies)) as server:
        judge = create_judge(_config(provider, server, monkeypatch))
        tally = judge_run(run, samples, judge.name, judge, workers=1)  # one at a time: the replies' order
        judge.close()
        sent = server.requests_for(WIRE[provider])
    assert len(sent) == 2 and all(r.error is None for r in sent)  # the strict checks passed
    for request, sample in zip(sent, samples, strict=True):
        shots = [sample.target, sample.error, sample.recovered]
        assert request.images == [PIL.Image.open(p).size for p in shots] == [(1280, 800)] * 3  # each sent whole
        body = re.sub(r"[A-Za-z0-9+/=]{200,}", "<image>", json.dumps(request.body))  # base64 may spell anything
        assert sample.instruction.replace('"', '\\"') in body
        assert "Step 1: pyautogui.write('Hello ')" in body and "Step 2 (the mistake): pyautogui.write('xyz')" in body
        assert "Step 3" not in body  # the oracle's replayed prefix is its recovery, not history
        assert json.dumps(sample.recovery[0].rationale)[1:-1] in body  # the agent's words
        assert "Verdict: not recovered" in body and "recovered state is the target state" in body  # prompt, question
        for leak in ("ssim", "r_tc", "r_o", "not_recovered", "compare_text_file", "evaluator", "0.999", "implicit",
                     "explicit-none", KEY):
            assert leak not in body, leak  # nothing of the oracle's verdict, the model's name, the key
    lines = read_verdicts(judge_file(run, f"judge-{provider}"))
    assert [(lines[s.id].nodeid, lines[s.id].verdict) for s in samples] == [
        (samples[0].nodeid, "not_recovered"), (samples[1].nodeid, "recovered")]
    first = lines[samples[0].id]
    assert first.rationale == "The stray 'xyz' is still in the editor." and first.error is None
    assert first.usage["input_tokens"] == 3000 and first.usage["output_tokens"] == 80 and first.usage["calls"] == 1
    assert first.usage["cost"] == pytest.approx((3000 * 2.5 + 80 * 15.0) / 1e6)
    assert (tally.verdicts, tally.no_verdict, tally.agree, tally.calls) == (2, 0, 2, 2)
    assert tally.usage.input_tokens == 6000 and tally.usage.cost == pytest.approx(2 * first.usage["cost"])
    assert (run / "results.jsonl").read_bytes() == results  # the oracle's verdicts untouched
    assert KEY not in _written(run)


@pytest.mark.desktop
def test_no_verdict_for_an_unreadable_reply_or_a_failed_api_then_resume(run: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreadable reply (quoting the key, as some servers do) and an API that keeps failing after the
    transport's retries are no verdict, with the reason; a rerun asks exactly those again; a third asks nothing."""
    samples = load_samples(run)
    fast = {"max_retries": 1, "initial_backoff": 0.01, "max_backoff": 0.02}
    failing = [EchoingCredentials(200), Reply.error(OPENAI_CHAT, 503, "overloaded"),
               Reply.error(OPENAI_CHAT, 503, "overloaded")]
    with LoopbackServer(Script(failing)) as server:
        judge = create_judge(_config("openai-compat", server, monkeypatch, transport=fast))
        tally = judge_run(run, samples, judge.name, judge, workers=1)
        judge.close()
        assert len(server.requests) == 3  # the failing call was retried once
    path = judge_file(run, judge.name)
    lines = read_verdicts(path)
    unreadable, api = lines[samples[0].id], lines[samples[1].id]
    assert unreadable.verdict is None and unreadable.error is not None
    assert unreadable.error.startswith("unreadable reply: its last line is not `Verdict: recovered`")
    assert api.verdict is None and (api.error or "").startswith("api: HTTP 503 after 2 attempt(s)")
    assert "overloaded" in (api.error or "")
    assert (tally.verdicts, tally.no_verdict, tally.errors) == (0, 2, {"unreadable reply": 1, "api": 1})
    assert KEY not in path.read_text() and "invalid key" in path.read_text()  # the echo is kept, its key redacted
    assert calls_needed(samples, lines) == 2
    with LoopbackServer(_by_the_agents_words) as server:  # two at once: answered by content, not by order
        judge = create_judge(_config("openai-compat", server, monkeypatch))
        tally = judge_run(run, samples, judge.name, judge, workers=2)
        judge.close()
        assert len(server.requests) == 2
    assert (tally.to_ask, tally.verdicts, tally.no_verdict, tally.agree) == (2, 2, 0, 2)
    assert len(path.read_text().splitlines()) == 4  # appended: the first answers are kept
    with LoopbackServer(Script([])) as server:
        judge = create_judge(_config("openai-compat", server, monkeypatch))
        tally = judge_run(run, samples, judge.name, judge)
        judge.close()
        assert server.requests == [] and (tally.to_ask, tally.calls, tally.verdicts) == (0, 0, 2)


def _by_the_agents_words(request: Request) -> Reply:
    said = "reasoning: oracle:" in json.dumps(request.body)
    return Reply(chat_completion("As before.\nVerdict: recovered" if said else "Still 'xyz'.\nVerdict: not recovered"))


def _agents(root: Path) -> Path:
    """A directory holding a judge config named ``x``, Responses API, through OPENAI_BASE_URL."""
    agents = root / "judge-agents"
    agents.mkdir(exist_ok=True)
    (agents / "x.yaml").write_text(
        f"provider: openai\noptions:\n  model: gpt-5.4\n  api_key_env: JUDGE_TEST_KEY\n  prices: {json.dumps(PRICES)}\n"
        f"  prompts_dir: {REPO / 'agents' / 'prompts'}\n  transport: {{max_retries: 0}}\n")
    return agents


@pytest.mark.desktop
def test_retrace_judge_on_the_command_line(run: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The dry run counts calls and makes none (it needs no key); a sample whose run kept no recovered screen is
    no verdict without a call; a torn last line of a killed judge is asked again; the summary line."""
    agents = _agents(run.parent)
    monkeypatch.delenv("JUDGE_TEST_KEY", raising=False)
    assert main(["judge", str(run / "results.jsonl"), "--model", "x", "--agents", str(agents), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 sample(s), 0 judged already; would make 2 call(s) to x" in out and "2 call(s) in all, none made" in out
    assert not (run / "judge").exists()
    # as a run without --retrace-keep-screens: the recovered test keeps no screen
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    records[1]["artifacts"] = {}
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    noop = load_samples(run)[0]
    judge_file(run, "x").parent.mkdir()
    judge_file(run, "x").write_text(json.dumps({"sample": noop.id, "nodeid": noop.nodeid, "judge": "x",
                                                "verdict": "recov"}))  # torn: a judge killed mid-line
    assert main(["judge", str(run), "--model", "x", "--agents", str(agents), "--dry-run"]) == 0
    assert "would make 1 call(s) to x (1 without a recovered screen: no verdict, no call)" in capsys.readouterr().out
    with LoopbackServer(Script([openai_response([message_item("xyz remains.\nVerdict: recovered")],
                                                usage={"input_tokens": 2000, "output_tokens": 100})])) as server:
        for name, value in {**server.env(KEY), "JUDGE_TEST_KEY": KEY}.items():
            monkeypatch.setenv(name, value)
        assert main(["judge", str(run), "--model", "x", "--agents", str(agents), "--workers", "3"]) == 0
        assert len(server.requests) == 1
    out = capsys.readouterr().out
    assert (f"{run}: 2 sample(s): 1 verdict(s), 1 no verdict (1 no recovered screen); agreement with the oracle "
            "0/1; this session: 1 call(s), 2000 in / 100 out tokens, cost $0.0065") in out
    lines = read_verdicts(judge_file(run, "x"))
    assert lines[noop.id].verdict == "recovered"  # the judge disagrees with the oracle: counted, not changed
    assert [v.error for v in lines.values() if v.verdict is None] == [NO_SCREEN]
    assert NO_SCREEN.startswith("no recovered screen: the run kept no image of it (rerun the tests with "
                                "--retrace-keep-screens")
    assert KEY not in _written(run)
    assert main(["judge", str(run), "--model", "x", "--agents", str(agents), "--workers", "0"]) == 2
    assert main(["judge", str(run), "--model", "nope", "--agents", str(agents)]) == 2
    assert "model 'nope': no nope.yaml" in capsys.readouterr().err
