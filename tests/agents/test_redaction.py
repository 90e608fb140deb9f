"""No API key leaves an adapter (issue 21, item 4): a server that quotes the key it was sent — in a 401's error
body, or in a reply's text — must not put it into an exception, a rationale, an invalid step, a log record,
pytest's output or results.jsonl. Per provider: Anthropic, OpenAI Responses (computer and preview), and
OpenAI-compatible chat (UI-TARS, Qwen, pyautogui), each through its official SDK against a loopback server."""

from __future__ import annotations

import logging
import shutil
import traceback
from typing import Any

import numpy as np
import pytest

from pytest_retrace.agents import (
    AgentContext,
    AgentInfraError,
    ModelConfig,
    Observation,
    create_agent,
    create_chat,
)
from pytest_retrace.agents.llm import redacted_errors
from pytest_retrace.agents.prompts import Text
from pytest_retrace.agents.secrets import PLACEHOLDER, RedactedError, redact, register_secret
from pytest_retrace.agents.transport import CallStats, Transport, TransportOptions
from pytest_retrace.testing import EchoingCredentials, LoopbackServer
from tests.helpers import REPO, records

pytest_plugins = ["pytester"]

# A key shaped like no known credential: only its registration (the config's api_key_env) can catch it bare.
PLAIN_KEY = "loopback-PLAIN-secret-5d1e" * 2
SK_KEY = "sk-proj-" + "SECRET-do-not-leak-9b2c" * 2
ANT_KEY = "sk-ant-api03-" + "SECRET-do-not-leak-7f3a" * 2

# dialect -> (provider, options, key)
DIALECTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "anthropic": ("anthropic", {}, ANT_KEY),
    "anthropic-toolset": ("anthropic", {"tool_version": "computer_toolset_20260801"}, PLAIN_KEY),
    "openai-computer": ("openai", {"tool": "computer"}, SK_KEY),
    "openai-preview": ("openai", {"tool": "computer_use_preview", "model": "computer-use-preview"}, PLAIN_KEY),
    "ui-tars": ("openai-compat", {"parser": "uitars", "image": {"coordinates": "smart-resize"}}, PLAIN_KEY),
    "qwen": ("openai-compat", {"parser": "qwen"}, SK_KEY),
    "pyautogui": ("openai-compat", {"parser": "pyautogui"}, PLAIN_KEY),
}


def _agent_config(server: LoopbackServer, provider: str, options: dict[str, Any]) -> ModelConfig:
    base = server.openai_url if provider.startswith("openai") else server.url
    options = {"base_url": base, "api_key_env": "ECHO_TEST_KEY", "model": "m",
               "transport": {"max_retries": 0}, **options}
    return ModelConfig(f"echo-{provider}", provider, options=options, path=REPO / "agents" / "x.yaml")


def _turn(agent: Any) -> Any:
    agent.start(AgentContext("Restore the document.", "recovery", "explicit-none", 3, (640, 400),
                             target_screenshot=np.zeros((400, 640, 3), np.uint8)))
    return agent.act(Observation(np.zeros((400, 640, 3), np.uint8), 0, 3))


def _formatted(exc: BaseException) -> str:
    """The exception as Python (and pytest, which follows the same chain) prints it: every chained one too."""
    return "".join(traceback.format_exception(exc))


# -- the redaction itself -----------------------------------------------------------------------------------
def test_redact_replaces_registered_keys_and_whatever_looks_like_a_credential() -> None:
    register_secret("opaque-registered-value-31337")
    text = ("401: invalid key opaque-registered-value-31337; Authorization: Bearer abc.DEF-123_xyz~=; "
            "x-api-key: zzzzzzzzzzzzzzzz, 'api_key': 'qqqqqqqqqqqq', sk-ant-api03-AAAAAAAAAAAA and sk-BBBBBBBBBB")
    out = redact(text)
    for secret in ("opaque-registered-value-31337", "abc.DEF-123_xyz~=", "zzzzzzzzzzzzzzzz", "qqqqqqqqqqqq",
                   "AAAAAAAAAAAA", "BBBBBBBBBB"):
        assert secret not in out
    assert out.count(PLACEHOLDER) == 6
    assert out.startswith("401: invalid key [redacted]; Authorization: Bearer [redacted]; x-api-key: [redacted]")


def test_redact_leaves_ordinary_text_and_dummy_keys_alone() -> None:
    register_secret("EMPTY")  # a local server's dummy key: too short to be a secret, a word in messages
    text = ("The EMPTY cell B2 holds sk-1; click(start_box='(10,20)'); api_key_env: UI_TARS_API_KEY; "
            "options.api_key_env: the environment variable OPENAI_API_KEY is not set")
    assert redact(text) == text


def test_an_infrastructure_error_never_carries_a_key_whoever_raises_it() -> None:
    register_secret(PLAIN_KEY)
    assert PLAIN_KEY not in str(AgentInfraError(f"HTTP 401: bad key {PLAIN_KEY}", kind="api"))


def test_the_transport_redacts_before_it_cuts_a_long_message(tmp_path: Any) -> None:
    """_brief keeps 300 characters: a key cut in two there would no longer be recognised whole."""
    register_secret(PLAIN_KEY)

    class Refused(Exception):
        status_code = 401

    def call() -> None:
        raise Refused("x" * 270 + PLAIN_KEY)

    transport = Transport("test", TransportOptions(max_retries=0), (), lock_dir=tmp_path)
    with pytest.raises(AgentInfraError) as info:
        transport.call(call, CallStats())
    assert PLAIN_KEY[:12] not in str(info.value) and PLACEHOLDER in str(info.value)


def test_an_exception_escaping_an_adapter_keeps_its_type_but_not_the_key() -> None:
    register_secret(PLAIN_KEY)
    # still a ValueError: the run calls it an agent bug by its type
    with pytest.raises(ValueError) as info, redacted_errors():
        try:
            raise KeyError(f"header {PLAIN_KEY}")
        except KeyError as inner:
            raise ValueError(f"could not use {PLAIN_KEY}") from inner
    assert PLAIN_KEY not in _formatted(info.value) and PLACEHOLDER in _formatted(info.value)

    class Opaque(Exception):
        def __str__(self) -> str:  # its text is not its args: only a replacement can hide the key
            return f"secret {PLAIN_KEY}"

    with pytest.raises(RedactedError) as replaced, redacted_errors():
        raise Opaque()
    assert PLAIN_KEY not in _formatted(replaced.value) and "Opaque: secret [redacted]" in str(replaced.value)


def test_the_sdk_loggers_never_log_a_key(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("ECHO_TEST_KEY", PLAIN_KEY)
    with LoopbackServer(EchoingCredentials(401)) as server:
        agent = create_agent(_agent_config(server, "anthropic", {}))
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("anthropic._base_client").debug("request headers %s", {"x-api-key": PLAIN_KEY})
        try:
            raise RuntimeError(f"body: {PLAIN_KEY}")
        except RuntimeError:
            logging.getLogger("httpx").exception("failed")
    agent.close()
    assert "request headers" in caplog.text and "failed" in caplog.text
    assert PLAIN_KEY not in caplog.text


# -- every provider, against a server that echoes the key --------------------------------------------------
@pytest.mark.parametrize(("status", "kind"), [(401, "api"), (503, "transport")])
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_an_error_quoting_the_key_gives_an_infrastructure_error_without_it(
        dialect: str, status: int, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rejected request (an api error at once) and a server error after the retries (transport) alike."""
    provider, options, key = DIALECTS[dialect]
    monkeypatch.setenv("ECHO_TEST_KEY", key)
    with LoopbackServer(EchoingCredentials(status)) as server:
        agent = create_agent(_agent_config(server, provider, options))
        with pytest.raises(AgentInfraError) as info:
            _turn(agent)
        agent.close()
    sent = [r.headers.get("authorization", "") + r.headers.get("x-api-key", "") for r in server.requests]
    assert sent and all(key in s for s in sent)  # the key did reach the server, which quoted it
    assert info.value.kind == kind and f"HTTP {status}" in str(info.value) and PLACEHOLDER in str(info.value)
    assert key not in _formatted(info.value)


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_a_reply_quoting_the_key_leaves_it_out_of_the_rationale_and_the_invalid_step(
        dialect: str, monkeypatch: pytest.MonkeyPatch) -> None:
    provider, options, key = DIALECTS[dialect]
    monkeypatch.setenv("ECHO_TEST_KEY", key)
    with LoopbackServer(EchoingCredentials(200)) as server:
        agent = create_agent(_agent_config(server, provider, options))
        turn = _turn(agent)
        agent.close()
    said = f"{turn.rationale}\n{turn.invalid or ''}"
    assert "invalid key" in said and PLACEHOLDER in said  # the model's words are kept, the key is not
    assert key not in said


@pytest.mark.parametrize("provider", ["anthropic", "openai", "openai-compat"])
def test_a_chat_model_neither_returns_nor_raises_the_key(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contextualizer's summary and the verifier's reason are a chat model's answer: records keep them."""
    monkeypatch.setenv("ECHO_TEST_KEY", PLAIN_KEY)
    with LoopbackServer(EchoingCredentials(200)) as server:
        chat = create_chat(_agent_config(server, provider, {}))
        text, _ = chat.complete("Describe.", [Text("the screen")])
    assert "invalid key" in text and PLAIN_KEY not in text
    with LoopbackServer(EchoingCredentials(401)) as server:
        chat = create_chat(_agent_config(server, provider, {}))
        with pytest.raises(AgentInfraError) as info:
            chat.complete("Describe.", [Text("the screen")])
    assert PLAIN_KEY not in _formatted(info.value)


# -- a whole pytest run, per provider, with the shipped configs ------------------------------------------
V1 = REPO / "tests" / "data" / "v1-cases" / "text-editor"
RUN_KEYS = {"ANTHROPIC_API_KEY": ANT_KEY, "OPENAI_API_KEY": SK_KEY, "UI_TARS_API_KEY": PLAIN_KEY,
            "QWEN_API_KEY": "qwen-PLAIN-secret-0a9f" * 2}
MODELS = "claude,gpt-5.4,ui-tars-1.5-7b,qwen3.5-9b"


@pytest.mark.desktop
@pytest.mark.parametrize("status", [401, 200])
def test_a_pytest_run_against_an_echoing_server_shows_no_key(project: pytest.Pytester, status: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`pytest --retrace-model=...` for every provider family, as a user runs it: 401 makes every test an
    infrastructure error (its message and pytest's chained traceback quote the server), 200 makes the echo the
    model's words (a rationale, a reply that does not parse). Neither the output, with debug logs, every
    report section and the frames' locals, nor any file the run writes (results.jsonl, summary, Allure's
    results) holds a key."""
    case = "append-line-t1-stray-keys"
    shutil.copy(V1 / f"{case}.yaml", project.path / "cases" / "mousepad")
    shutil.copytree(V1 / case, project.path / "cases" / "mousepad" / case)
    with LoopbackServer(EchoingCredentials(status)) as server:
        for variable in ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "UI_TARS_BASE_URL", "QWEN_BASE_URL"):
            monkeypatch.setenv(variable, server.url if variable.startswith("ANTHROPIC") else server.openai_url)
        for variable, key in RUN_KEYS.items():
            monkeypatch.setenv(variable, key)
        res = project.runpytest_subprocess(f"--retrace-model={MODELS}", "-k", "stray-keys", "--retrace-budget=1",
                                           "--retrace-run=echo", "-n", "2", "-rA", "--tb=long",
                                           "--showlocals", "--log-level=DEBUG", "--alluredir=allure",
                                           "-p", "no:cacheprovider")
    recs = records(project, "echo")
    assert sorted(r["model"] for r in recs) == sorted(["claude-sonnet-4.6", "gpt-5.4", "ui-tars-1.5-7b",
                                                       "qwen3.5-9b"])
    for variable, key in RUN_KEYS.items():  # every key was sent, so the server had it to quote
        assert any(key in r.headers.get("authorization", "") + r.headers.get("x-api-key", "")
                   for r in server.requests), variable
    output = res.stdout.str() + res.stderr.str()
    files = [p for p in project.path.rglob("*") if p.is_file()]
    assert any(p.parent.name == "allure" and p.name.endswith("-result.json") for p in files)
    leaks = [f"{p.relative_to(project.path)} ({v})" for p in files for v, k in RUN_KEYS.items()
             if k.encode() in p.read_bytes()]
    leaks += [f"pytest output ({v})" for v, k in RUN_KEYS.items() if k in output]
    assert leaks == [], leaks
    if status == 401:
        assert all(r["verdict"] == "error" and "HTTP 401" in str(r) for r in recs), recs
        assert output.count("invalid key Bearer [redacted]") >= 4  # the server's words are there, the keys not
    else:
        said = [(a.get("rationale") or "") + (a.get("error") or "") for r in recs for a in r["actions"]]
        assert sum("invalid key" in s for s in said) >= 4 and all(PLACEHOLDER in s for s in said if "invalid key" in s)
