"""Keeping a suite's case files once: a screenshot or setup file that several cases use moves into the suite's
shared folder (``<suite>/shared/``, named by the cases as ``../shared/<file>``), a file one case names twice is
kept once in its own directory, and the case YAMLs are pointed at the kept copy. `retrace build` and `retrace
record` end with this pass, so what they write is already in this form.

A YAML is edited in place (its comments and layout stay): only the path scalars change, and the case is
loaded again afterwards and must be the same case file for file (:func:`..replay.casefiles.by_content`),
or the edit is undone.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_retrace.replay.casefiles import SHARED_DIR, by_content, file_hash
from pytest_retrace.replay.cases import CaseError, RecoveryCase, load_case


@dataclass(frozen=True)
class Site:
    """One field of one case naming a file."""

    case: RecoveryCase
    field: str
    rel: str  # as the YAML writes it, relative to the case's directory
    file: Path  # normalised


def _shared_name(site: Site, digest: str) -> str:
    """A shared file's name: what it is, and the start of its content hash (two versions never collide)."""
    stem = "screen" if site.field.startswith("screenshots.") else re.sub(r"^\d+-", "", Path(site.rel).stem)
    suffix = Path(site.rel).suffix
    # the plugin collects every YAML under a case root as a case: a shared YAML file must not look like one
    suffix += ".txt" if suffix in (".yaml", ".yml") else ""
    return f"{stem or 'file'}-{digest.removeprefix('sha256:')[:12]}{suffix}"


def _sites(files: list[Path], log: Callable[[str], object]) -> list[Site]:
    out = []
    for path in files:
        try:
            case = load_case(path, check_screenshots=False)
        except CaseError as exc:
            log(f"  not shared (the case does not load): {exc}")
            continue
        for field, file in case.files().items():
            # the evaluator reads its local files from the case's own directory only
            if not field.startswith("task.evaluator") and file.is_file():
                out.append(Site(case, field, dict(case.references())[field], file))
    return out


def _rewrite(case: RecoveryCase, moves: dict[str, str]) -> bool:
    """Point the case's YAML from each old path to its new one; False (the file unchanged) unless the case
    loads as the same case afterwards."""
    text = case.path.read_text(encoding="utf-8")
    before = by_content(case)
    new = text
    for old, rel in moves.items():
        # the whole scalar only, plain or quoted, so that a longer path containing this one is left alone
        new = re.sub(rf"(?m)(?<=[\s'\"]){re.escape(old)}(?=['\"]?[ \t]*(?:#.*)?$)", rel, new)
    case.path.write_text(new, encoding="utf-8")
    try:
        same = by_content(load_case(case.path, check_screenshots=False)) == before
    except CaseError:
        same = False
    if not same:
        case.path.write_text(text, encoding="utf-8")
    return same


def share_duplicates(root: Path, log: Callable[[str], object] = print) -> list[Path]:
    """Keep every file the cases of the suite in ``root`` (``root/<app>/*.yaml``) name once, shared ones in
    ``root/shared/``; return the case files changed. A file that no case names any more is removed."""
    root = Path(os.path.normpath(root))
    files = sorted(root.glob("*/*.yaml"))
    by_hash: dict[str, list[Site]] = defaultdict(list)
    for site in _sites(files, log):
        by_hash[file_hash(site.file)].append(site)
    shared = root / SHARED_DIR
    moves: dict[Path, dict[str, str]] = defaultdict(dict)  # case file -> old rel -> new rel
    copies: dict[Path, Path] = {}  # kept file -> a file it is copied from
    for digest, sites in sorted(by_hash.items()):
        if len({s.file for s in sites}) == 1 and (len({s.case.path for s in sites}) == 1
                                                 or sites[0].file.parent == shared):
            continue  # kept once already, where it belongs
        if len({s.case.path for s in sites}) == 1:
            keep = sites[0].file  # one case's file named twice: its own directory keeps one
        else:
            in_shared = [s.file for s in sites if s.file.parent == shared]
            keep = in_shared[0] if in_shared else shared / _shared_name(sites[0], digest)
            copies.setdefault(keep, sites[0].file)
        for s in sites:
            if s.file != keep:
                moves[s.case.path][s.rel] = (f"../{SHARED_DIR}/{keep.name}" if keep.parent == shared
                                             else keep.relative_to(s.case.dir).as_posix())
    for keep, source in copies.items():
        if not keep.exists():
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_bytes(source.read_bytes())
    cases = {s.case.path: s.case for group in by_hash.values() for s in group}
    changed = []
    for path, case_moves in sorted(moves.items()):
        if _rewrite(cases[path], case_moves):
            changed.append(path)
        else:
            log(f"  not shared: {path}: the edited file would not be the same case")
    # the copies no case names any more
    still = {s.file for s in _sites(files, lambda _: None)}
    for sites in by_hash.values():
        for s in sites:
            if s.file not in still and s.file.exists():
                s.file.unlink()
                _prune_empty(s.file.parent, root)
    return changed


def _prune_empty(folder: Path, root: Path) -> None:
    while folder != root and root in folder.parents and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
