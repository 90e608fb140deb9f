"""How xdist's workers start (``--retrace-workers``): forked from the fork server (pytest_retrace/forkserver), or
as xdist starts them. Registered by the controller only, when the run distributes."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_retrace.plugin.options import Settings


def distributes(config: pytest.Config) -> bool:
    """Will xdist start workers? (Its own cmdline_main has turned -n into ``dist`` and ``tx`` by configure.)"""
    return getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None)) \
        and not config.option.collectonly


class ForkedWorkers:
    """Starts the fork server at configure time, so that it imports the workers' modules while the controller
    builds its models (both import the SDK: one per core), and points xdist's local gateways at it."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        from pytest_retrace.forkserver import ForkServer, ForkServerError, modules_for

        self.server: Any = ForkServer(modules_for(m.provider for m in settings.models))
        try:
            self.server.start()
        except (OSError, ForkServerError) as exc:
            config.issue_config_time_warning(pytest.PytestWarning(f"--retrace-workers=fork: {exc}"), stacklevel=2)
            self.server = None
            return
        config.add_cleanup(self.server.close)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_setupnodes(self, config: pytest.Config, specs: list[Any]) -> None:
        """The local workers (``popen`` gateways) are forked; remote or customised gateways start as always."""
        if self.server is None:
            return
        for spec in specs:
            if spec.popen and not spec.python and not spec.via:
                spec.python = self.server.python()
