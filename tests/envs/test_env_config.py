"""The environment layer's contract without a desktop: providers by name, options checked before anything
starts, configs in envs/NAME.yaml, secrets kept out of reports, and the layering (envs/ below the case schema
and the evaluators)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.envs import PROVIDERS, environment_factory, register_environment
from pytest_retrace.envs.config import EnvConfigError, load_env_config

pytest_plugins = ["pytester"]


def test_a_provider_name_with_options_from_the_command_line() -> None:
    config = load_env_config("xvfb", [], ["memory_limit=2147483648"])
    assert (config.provider, config.options) == ("xvfb", {"memory_limit": 2147483648})
    assert config.describe() == "xvfb (memory_limit=2147483648)"


def test_a_config_file_and_a_command_line_override(tmp_path: Path) -> None:
    (tmp_path / "small.yaml").write_text("provider: xvfb\noptions:\n  memory_limit: 1024\n")
    assert load_env_config("small", [tmp_path]).options == {"memory_limit": 1024}
    assert load_env_config("small", [tmp_path], ["memory_limit=2048"]).options == {"memory_limit": 2048}
    assert load_env_config(str(tmp_path / "small.yaml")).provider == "xvfb"


@pytest.mark.parametrize(("name", "overrides", "message"), [
    ("nope", [], "unknown environment provider 'nope'; known: "),
    ("xvfb", ["memry_limit=1"], "provider 'xvfb' has no option 'memry_limit' (its options: memory_limit)"),
    ("xvfb", ["size=10x10"], "option 'size' is set by the harness (see --retrace-size)"),
    ("xvfb", ["memory_limit"], "environment option 'memory_limit': write KEY=VALUE"),
    ("missing.yaml", [], "environment config missing.yaml: no such file"),
])
def test_a_bad_environment_is_refused_by_name(name: str, overrides: list[str], message: str) -> None:
    with pytest.raises(EnvConfigError) as info:
        load_env_config(name, [], overrides)
    assert message in str(info.value)


def test_a_broken_config_file_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("provider: xvfb\nimage: x\n")
    with pytest.raises(EnvConfigError, match=r"bad\.yaml: a mapping with `provider`, `options`"):
        load_env_config("bad", [tmp_path])


def test_secrets_never_reach_a_description() -> None:
    def factory(token: str = "", url: str = "", **_: Any) -> Any:
        return None

    register_environment("with-secret", factory)
    try:
        config = load_env_config("with-secret", [], ["token=s3cr3t", "url=http://127.0.0.1:5000"])
        assert "s3cr3t" not in config.describe() and "url=http://127.0.0.1:5000" in config.describe()
    finally:
        PROVIDERS.pop("with-secret")


def test_a_third_party_provider_is_found_through_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    import pytest_retrace.envs as envs

    ep = EntryPoint(name="thirdparty", value="pytest_retrace.envs.xvfb.environment:XvfbEnvironment",
                    group="pytest_retrace.environments")
    monkeypatch.setattr(envs, "entry_points", lambda group: [ep] if group == envs.ENTRY_POINT_GROUP else [])
    try:
        from pytest_retrace.envs.xvfb.environment import XvfbEnvironment

        assert environment_factory("thirdparty") is XvfbEnvironment
        assert "thirdparty" in envs.provider_names()
    finally:
        PROVIDERS.pop("thirdparty", None)


def test_the_plugin_refuses_a_bad_environment_before_any_test(pytester: pytest.Pytester) -> None:
    (pytester.path / "agents").mkdir()
    (pytester.path / "agents" / "noop.yaml").write_text("provider: noop\n")
    res = pytester.runpytest_subprocess("--collect-only", "--retrace-model=noop", "--retrace-env-option=memry_limit=1")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--retrace-env: *provider 'xvfb' has no option 'memry_limit'*"])
