"""The files a case names, and where they may lie: inside the case's directory or, for a file several cases
use, in the suite's shared folder (docs/cases.md)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pytest_retrace.evaluators.plan import Check, Group, compile_block
from pytest_retrace.text import show as _show

# A suite's folder of the files several cases use (a probe script, a page, a screenshot), kept once: next to
# the app folders (cases/shared/), named by a case as ../shared/<file>. Only those files live there.
SHARED_DIR = "shared"


def outside_dir(base: Path, rel: str) -> str | None:
    """Why `rel` (relative to `base`) leaves `base` once `..` and symlinks are resolved, or None."""
    try:
        root = base.resolve()
        target = (root / rel).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL byte
        return f"{_show(rel)} cannot be resolved: {exc}"
    if target != root and root in target.parents:
        return None
    return f"{_show(rel)} is outside the case directory {base}"


def outside_case(case_dir: Path, rel: str, *, shared: bool = True) -> str | None:
    """Why `rel` may not be a file of the case in `case_dir` (None when fine): it must lie inside the case
    directory or, written as ``../shared/<file>``, inside the suite's shared folder next to it."""
    if outside_dir(case_dir, rel) is None:
        return None
    prefix = f"../{SHARED_DIR}/"
    if shared and rel.startswith(prefix) and outside_dir(case_dir.parent / SHARED_DIR, rel[len(prefix):]) is None:
        return None
    where = f" or the shared folder {case_dir.parent / SHARED_DIR}" if shared else ""
    return f"{_show(rel)} is outside the case directory {case_dir}{where}"


def local_files(plan: Group | Check) -> Iterator[tuple[str, str]]:
    """(field, path) of every local_file getter in a compiled evaluator."""
    if isinstance(plan, Group):
        for item in plan.items:
            yield from local_files(item)
        return
    for block, where in ((plan.result, plan.result_where), (plan.expected, plan.expected_where)):
        if block is not None and block.get("type") == "local_file":
            yield f"{where}.path", block["path"]


def vm_files(evaluator: dict[str, Any]) -> list[str]:
    """The task files (``vm_file`` getters) an evaluator reads: what a task's outcome depends on."""
    def walk(plan: Group | Check) -> Iterator[str]:
        if isinstance(plan, Group):
            for item in plan.items:
                yield from walk(item)
            return
        for block in (plan.result, plan.expected):
            if block is not None and block.get("type") == "vm_file":
                yield block["path"]

    return list(dict.fromkeys(walk(compile_block(evaluator, "task.evaluator"))))


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header, without decoding the image (collection must stay fast)."""
    with path.open("rb") as fh:
        head = fh.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError("is not a PNG file")
    return struct.unpack(">II", head[16:24])


def file_hash(path: Path) -> str:
    """A file's content as a name: ``sha256:<hex>``, or ``missing``."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def by_content(case: Any) -> dict[str, Any]:
    """A loaded case (a RecoveryCase) as plain data with every file it references replaced by its content's
    hash, and without its own path: two cases are the same case, wherever they and their files lie, when these
    are equal (``retrace build``'s sharing and the calibration's restamp check exactly that)."""
    data = case.model_dump(mode="json")
    del data["path"]
    for name in ("target", "error"):
        data["screenshots"][name] = file_hash(case.dir / data["screenshots"][name])
    for step in data["task"]["setup"]:
        if step.get("type") == "file" and step.get("src") is not None:
            step["src"] = file_hash(case.dir / step["src"])

    data["task"]["evaluator"] = map_local_files(data["task"]["evaluator"], lambda p: file_hash(case.dir / p))
    if data["task"].get("osworld") is not None:  # the files OSWorld's config and getters take from its cache
        cache = data["task"]["osworld"]["cache"]
        data["task"]["osworld"]["cache"] = {name: file_hash(case.dir / rel) for name, rel in cache.items()}
    return data


def map_local_files(node: Any, new_path: Callable[[str], str]) -> Any:
    """An evaluator block with the path of every ``local_file`` getter (an expected file shipped with the case)
    replaced by ``new_path(path)``; the rest is copied as it is."""
    if isinstance(node, list):
        return [map_local_files(x, new_path) for x in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "local_file" and isinstance(node.get("path"), str):
        return {**node, "path": new_path(node["path"])}
    return {k: map_local_files(v, new_path) for k, v in node.items()}
