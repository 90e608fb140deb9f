"""One registry for every pluggable kind: names, lazy imports, entry points and the errors a bad name or a
broken third-party package gives. The entry point tests install a real (minimal) distribution — a
``*.dist-info`` with ``METADATA`` and ``entry_points.txt`` beside its module — on a child interpreter's path, so
importlib.metadata finds it exactly as it would a pip-installed plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.registry import BrokenEntryPoint, Registry, UnknownName
from tests.helpers import REPO

DIST = "retrace-fake-plugin"
PLUGIN_MODULE = "retrace_fake_plugin"

# Every kind the plugin package offers, and one broken entry point per group: its module imports an SDK that
# is not installed.
ENTRY_POINTS = f"""\
[pytest_retrace.agents]
fake-agent = {PLUGIN_MODULE}:FakeAgent
broken-agent = retrace_fake_broken:FakeAgent

[pytest_retrace.chat_models]
fake-chat = {PLUGIN_MODULE}:FakeChat
broken-chat = retrace_fake_broken:FakeChat

[pytest_retrace.environments]
fake-env = {PLUGIN_MODULE}:FakeEnvironment
broken-env = retrace_fake_broken:FakeEnvironment
"""

PLUGIN = '''\
class FakeAgent:
    name, privileged, calls_per_turn = "fake-agent", False, 7

    def __init__(self, config):
        self.config = config


class FakeChat:
    name = "fake-chat"

    def __init__(self, config):
        self.config = config


class FakeEnvironment:
    name = "fake-env"

    def __init__(self, size=(640, 480), **options):
        self.size, self.options = size, options
'''

# Runs in the child: what each lookup returned or raised, and whether the plugin's module was imported yet.
CHILD = textwrap.dedent(f"""\
    import json, sys
    from pytest_retrace import agents, envs
    from pytest_retrace.agents import ModelConfig, agent_factory, create_agent, create_chat

    out = {{"names": {{"agents": agents.AGENTS.names(), "chats": agents.CHATS.names(),
                      "envs": envs.provider_names()}},
           "imported_after_names": "{PLUGIN_MODULE}" in sys.modules}}
    env = envs.create_environment("fake-env", size=(10, 20), colour="red")
    out["env"] = [type(env).__module__, env.size, env.options]
    out["agent_calls_per_turn"] = agent_factory(ModelConfig("m", "fake-agent")).calls_per_turn
    out["agent"] = type(create_agent(ModelConfig("m", "fake-agent"))).__name__
    out["chat"] = type(create_chat(ModelConfig("m", "fake-chat"))).__name__
    errors = {{}}
    for label, call in [("agent", lambda: agent_factory(ModelConfig("m", "broken-agent"))),
                        ("chat", lambda: create_chat(ModelConfig("m", "broken-chat"))),
                        ("env", lambda: envs.environment_factory("broken-env")),
                        ("unknown-chat", lambda: create_chat(ModelConfig("m", "nope")))]:
        try:
            call()
            errors[label] = None
        except Exception as exc:
            errors[label] = [type(exc).__name__, str(exc)]
    out["errors"] = errors
    print(json.dumps(out))
""")


def _install_plugin(root: Path) -> None:
    info = root / "retrace_fake_plugin-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    (root / f"{PLUGIN_MODULE}.py").write_text(PLUGIN)
    (root / "retrace_fake_broken.py").write_text("import retrace_sdk_that_is_not_installed\n")


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("site")
    _install_plugin(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", CHILD], check=False, env=env, cwd=root, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_an_installed_plugin_of_each_kind_is_listed_with_the_built_ins(child: dict[str, Any]) -> None:
    names = child["names"]
    assert names["agents"] == sorted(names["agents"])
    assert {"fake-agent", "broken-agent", "noop", "anthropic"} <= set(names["agents"])
    assert {"fake-chat", "broken-chat", "anthropic", "openai-compat"} <= set(names["chats"])
    assert {"fake-env", "broken-env", "xvfb", "docker"} <= set(names["envs"])
    assert "fake-chat" not in names["agents"] and "fake-agent" not in names["chats"]


def test_listing_names_imports_no_plugin(child: dict[str, Any]) -> None:
    assert child["imported_after_names"] is False


def test_each_kind_is_found_by_name_through_its_entry_point(child: dict[str, Any]) -> None:
    assert child["env"] == [PLUGIN_MODULE, [10, 20], {"colour": "red"}]
    assert child["agent_calls_per_turn"] == 7
    assert child["agent"] == "FakeAgent"
    assert child["chat"] == "FakeChat"


@pytest.mark.parametrize(("label", "error", "kind", "name", "value"), [
    ("agent", "AgentConfigError", "agent provider", "broken-agent", "retrace_fake_broken:FakeAgent"),
    ("chat", "AgentConfigError", "chat provider", "broken-chat", "retrace_fake_broken:FakeChat"),
    ("env", "BrokenEntryPoint", "environment provider", "broken-env", "retrace_fake_broken:FakeEnvironment"),
])
def test_a_broken_entry_point_names_its_distribution_and_the_import_error(
        child: dict[str, Any], label: str, error: str, kind: str, name: str, value: str) -> None:
    raised, message = child["errors"][label]
    assert raised == error
    assert f"{kind} {name!r}: entry point {name} = {value} of distribution {DIST} 1.2.3" in message
    assert "ModuleNotFoundError: No module named 'retrace_sdk_that_is_not_installed'" in message


def test_an_unknown_chat_provider_lists_the_installed_ones(child: dict[str, Any]) -> None:
    raised, message = child["errors"]["unknown-chat"]
    assert raised == "AgentConfigError"
    assert message.startswith("m: provider: 'nope' has no chat implementation (known: anthropic, broken-chat, ")
    assert "fake-chat" in message


def test_the_built_in_providers_import_no_sdk_until_asked() -> None:
    code = ("import sys; from pytest_retrace import agents, envs; agents.AGENTS.names(); envs.provider_names(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'anthropic', 'openai', 'docker'} "
            "or m in {'pytest_retrace.envs.docker.environment', 'pytest_retrace.agents.anthropic'}))")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- the class itself, in-process ------------------------------------------------------------------------------
def _registry(*installed: EntryPoint) -> Registry[Any]:
    return Registry("judge", "pytest_retrace.judges", {"exact": "pytest_retrace.registry:Registry"},
                    entry_points=lambda group: [ep for ep in installed if ep.group == group])


def test_an_unknown_name_names_the_kind_and_every_known_name() -> None:
    reg = _registry(EntryPoint("fuzzy", "x:y", "pytest_retrace.judges"), EntryPoint("other", "x:y", "elsewhere"))
    with pytest.raises(UnknownName, match=r"^unknown judge 'nope'; known: exact, fuzzy$") as info:
        reg.get("nope")
    assert isinstance(info.value, ValueError) and info.value.known == ["exact", "fuzzy"]


def test_a_string_target_is_imported_on_get_and_a_registered_name_wins_over_an_entry_point() -> None:
    reg = _registry(EntryPoint("exact", "retrace_no_such_module:judge", "pytest_retrace.judges"))
    assert reg.get("exact") is Registry
    reg.register("mine", len)
    assert reg.get("mine") is len and "mine" in reg and reg.names() == ["exact", "mine"]


@pytest.mark.parametrize(("target", "message"), [
    ("no_colon", r"judge 'x': target 'no_colon' is not 'module:attribute'"),
    (":attr", r"judge 'x': target ':attr' is not 'module:attribute'"),
    (42, r"judge 'x': target must be callable or 'module:attribute', not int"),
])
def test_a_bad_target_is_refused_when_registered(target: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        _registry().register("x", target)


def test_two_packages_offering_one_name_differently_is_an_error_not_a_guess() -> None:
    reg = _registry(EntryPoint("fuzzy", "a:judge", "pytest_retrace.judges"),
                    EntryPoint("fuzzy", "b:judge", "pytest_retrace.judges"))
    with pytest.raises(BrokenEntryPoint, match=r"judge 'fuzzy': .* several different 'fuzzy' .*a:judge.*b:judge"):
        reg.get("fuzzy")


def test_an_entry_point_that_is_not_callable_is_refused() -> None:
    reg = _registry(EntryPoint("version", "sys:version", "pytest_retrace.judges"))
    with pytest.raises(BrokenEntryPoint, match=r"entry point version = sys:version .* is a str, not a callable"):
        reg.get("version")
