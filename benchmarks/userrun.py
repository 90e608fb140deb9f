"""A pytest run as a user's machine makes it: what the benchmarks that start pytest share.

Two things of a developer's machine would otherwise be measured as the harness's cost (issue 26's profile):

- ``PYTHONDONTWRITEBYTECODE`` (set on this workplace's machines): with it no ``.pyc`` is ever written for the
  editable package, so every pytest process compiles every module again and pytest re-rewrites the plugin's
  modules: about 0.7 CPU-s more per process, paid by each xdist worker. A user's install has its bytecode
  (pip compiles what it installs; a first run writes the rest), so the variable is dropped and the package
  compiled once before anything is timed.
- Hypothesis's pytest plugin (a ``dev`` extra of this project, not a dependency of the plugin) costs every
  process about 0.5 CPU-s at start-up; ``-p no:hypothesispytest`` keeps it out (harmless where it is absent).
"""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"]


def environment(**extra: str) -> dict[str, str]:
    """os.environ without PYTHONDONTWRITEBYTECODE, plus ``extra``; the package's bytecode compiled (once)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    compileall.compile_dir(REPO / "pytest_retrace", quiet=1)
    return {**env, **extra}
