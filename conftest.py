"""Repository-level defaults for running the built-in suite (`pytest --retrace-model=NAME`) and the
project's own tests (`pytest tests`). Options themselves live in pyproject.toml's [tool.pytest.ini_options].
"""

from __future__ import annotations

import shutil

import pytest

# What the built-in cases and the desktop tests need on the machine; scripts/bootstrap installs them.
DESKTOP_TOOLS = ("Xvfb", "openbox", "xdotool", "xprop", "unshare", "mousepad", "gnumeric", "ssconvert", "xterm")


def pytest_report_header(config: pytest.Config) -> str:
    missing = [tool for tool in DESKTOP_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"retrace desktop: MISSING {', '.join(missing)} — run scripts/bootstrap"
    return "retrace desktop: Xvfb, openbox, xdotool and the suite's apps are installed"
