"""The files an OSWorld task takes from OSWorld's cache directory (``<cache>/<task id>/``) instead of the
network: each ``download`` step's file, under the name desktop-env's SetupController gives it
(osworld/setup.py ``cached``), and each ``cloud_file`` getter's ``dest``. ``retrace build --osworld`` copies
them into a case; ``retrace osworld cache --placeholders`` writes empty stand-ins for them, a measuring aid only
(docs/osworld.md): ``retrace osworld check`` then shows what the cache's absence hid, and a case built from
placeholders would not pass, since they are not the files."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_retrace.osworld.evaluate import getter_blocks
from pytest_retrace.osworld.setup import cached


@dataclass(frozen=True)
class CacheFile:
    """One file of a task's cache: its name there, the URL OSWorld fetches it from, and the field naming it."""

    name: str
    url: str
    where: str


def cache_files(task: dict[str, Any]) -> list[CacheFile]:
    """Every cache file a task definition names (config and postconfig downloads, cloud_file getters), each
    name once, in the order the task names them. Malformed entries are left out: the check reports them."""
    evaluator = task.get("evaluator") if isinstance(task.get("evaluator"), dict) else {}
    found: dict[str, CacheFile] = {}
    for item in [*_downloads(task.get("config"), "config"), *_downloads(evaluator.get("postconfig"),
                                                                         "evaluator.postconfig"),
                 *_cloud_files(evaluator)]:
        found.setdefault(item.name, item)
    return list(found.values())


def _downloads(steps: Any, where: str) -> Iterator[CacheFile]:
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        params = step.get("parameters") if isinstance(step, dict) else None
        if step.get("type") != "download" or not isinstance(params, dict) or not isinstance(params.get("files"), list):
            continue
        for j, entry in enumerate(params["files"]):
            url, path = (entry.get("url"), entry.get("path")) if isinstance(entry, dict) else (None, None)
            if isinstance(url, str) and url and isinstance(path, str) and path:
                yield CacheFile(cached(Path(), url, path).name, url, f"{where}[{i}].files[{j}]")


def _cloud_files(evaluator: dict[str, Any]) -> Iterator[CacheFile]:
    """desktop-env's get_cloud_file: ``path`` and ``dest`` are one URL and name, or lists of them (``multi``)."""
    for field, getter in getter_blocks(evaluator):
        if getter.get("type") != "cloud_file":
            continue
        urls, dests = getter.get("path"), getter.get("dest")
        if not getter.get("multi"):
            urls, dests = [urls], [dests]
        if not (isinstance(urls, list) and isinstance(dests, list)):
            continue
        for url, dest in zip(urls, dests):
            if isinstance(url, str) and isinstance(dest, str) and dest and "/" not in dest:
                yield CacheFile(dest, url, f"evaluator.{field}")


def write_placeholders(cache: Path, tasks: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """An empty file at ``cache/<task id>/<name>`` for every cache file of ``tasks`` that is not there yet (a
    real file is never replaced); (written, already there)."""
    written = present = 0
    for task in tasks:
        task_id = task.get("id")
        if not isinstance(task_id, str) or not task_id or "/" in task_id or task_id in (".", ".."):
            continue
        for item in cache_files(task):
            path = cache / task_id / item.name
            if path.exists():
                present += 1
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
            written += 1
    return written, present


__all__ = ["CacheFile", "cache_files", "write_placeholders"]
