"""What a published number needs next to it: when and from which checkout a run was made, by which command,
with which packages and model configs, on exactly which case files. Computed once per session (by
:func:`run_metadata`, at the end of the run) into summary.json's ``run`` and rendered in summary.md.

:func:`case_digest` is the one digest of a case's files: the built-in suite's calibration record
(tests/suite_calibration.py, ``cases/calibration.json``) uses it too, so a run's digests can be compared with
the record's, and two runs' with each other (``retrace report``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_retrace.replay.cases import CaseError, load_case

if TYPE_CHECKING:
    from pytest_retrace.agents import ModelConfig
    from pytest_retrace.results.records import Record

# distributions whose versions can change a number: the harness, the metric's and the plots' libraries, the
# model SDKs. Those not installed are left out.
PACKAGES: tuple[str, ...] = ("pytest-retrace", "pytest", "pytest-xdist", "numpy", "scikit-image", "pillow",
                             "matplotlib", "pydantic", "anthropic", "openai", "docker", "allure-pytest")
# a command-line value that may be a secret (a guest's bearer token as an env option, say): never in a report
_SECRET = re.compile(r"(?i)(\b[\w-]*(?:key|token|secret|password|passwd|auth)[\w-]*=)[^,\s]+")


def case_digest(path: Path, root: Path | None = None) -> str:
    """The case file, every file it references (screenshots, setup files, the evaluator's local files, also
    those kept once in the suite's shared folder) and anything else in its own directory, by path relative to
    ``root`` (default: the directory holding the app directories, ``cases/`` for ``cases/<app>/<case>.yaml``).
    A changed shared file changes the digest of every case that uses it. For a case whose files all lie in its
    own directory this is the digest of the file and that directory, as it was before cases shared files."""
    root = path.parent.parent if root is None else root
    own = path.with_suffix("")
    files = {p for p in own.rglob("*") if p.is_file()} if own.is_dir() else set()
    try:
        files |= set(load_case(path, check_screenshots=False).files().values())
    except CaseError:
        pass  # a case that no longer loads: its file and own directory still say what it was
    h = hashlib.sha256()
    for rel in [Path(os.path.relpath(path, root)), *sorted({Path(os.path.relpath(f, root)) for f in files})]:
        f = root / rel
        h.update(str(rel).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest() if f.is_file() else b"missing")
    return "sha256:" + h.hexdigest()


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def redact(argv: Sequence[str]) -> list[str]:
    """The command line without the values of secret-looking options (``token=...`` -> ``token=***``)."""
    return [_SECRET.sub(r"\1***", a) for a in argv]


def git_state(root: Path) -> dict[str, Any] | None:
    """The checkout's commit and whether its work tree differs from it; None outside a git checkout (an
    installed package, a copied directory) or without git."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20,
                                  check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def model_info(model: ModelConfig) -> dict[str, Any]:
    """A model config as a reader needs it: the model id the API was asked for and the config file's digest
    (its options hold no key: keys come from the environment)."""
    path = model.path
    digest = None
    if path is not None and path.is_file():
        digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    return {"name": model.name, "provider": model.provider, "model": model.options.get("model"),
            "config": None if path is None else str(path), "config_digest": digest}


def case_files(records: Iterable[Record], root: Path) -> dict[str, Path]:
    """Case id -> its file, from the records' test ids (``<file>::test_recovery[...]``, relative to ``root``)."""
    out: dict[str, Path] = {}
    for r in records:
        if r.case is None or r.case in out:
            continue
        path = Path(r.nodeid.split("::", 1)[0])
        out[r.case] = path if path.is_absolute() else root / path
    return out


def case_digests(records: Iterable[Record], root: Path) -> dict[str, dict[str, Any]]:
    """Case id -> ``{"file", "digest"}`` for every case the records ran; digest None for a file that is gone
    (a resumed run whose case was since removed)."""
    out = {}
    for case, path in sorted(case_files(records, root).items()):
        rel = path.relative_to(root) if path.is_relative_to(root) else path
        out[case] = {"file": str(rel), "digest": case_digest(path) if path.is_file() else None}
    return out


def run_metadata(*, root: Path, models: Sequence[ModelConfig], records: Iterable[Record], started_at: str,
                 argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Everything of :mod:`provenance` for one run, computed once."""
    return {
        "started_at": started_at,
        "finished_at": now(),
        "command": redact(sys.argv if argv is None else argv),
        "cwd": str(Path.cwd()),
        "git": git_state(root),
        "versions": versions(),
        "platform": platform.platform(),
        "model_configs": [model_info(m) for m in models],
        "cases": case_digests(records, root),
    }
