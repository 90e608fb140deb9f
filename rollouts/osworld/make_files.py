"""Writes every file the OSWorld-format tasks (tasks/) download or compare against into an OSWorld cache
directory: ``<cache>/<task id>/<name>``, a download under the name desktop-env's SetupController looks for
(``<uuid5(url)>_<basename of path>``), a cloud_file under its ``dest``. Deterministic: the same bytes every run
(zip members and document properties carry fixed dates).

    .venv/bin/python rollouts/osworld/make_files.py CACHE_DIR
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import builders
from common import TASKS, download_name, task_id

ZIP_DATE = (2024, 1, 1, 0, 0, 0)


def task_files() -> Iterator[tuple[dict[str, Any], Path]]:
    for path in sorted(TASKS.glob("*/*.json")):
        yield json.loads(path.read_text()), path


def wanted(task: dict[str, Any]) -> dict[str, str]:
    """The task's cache names -> the file names they stand for (the basename of the URL)."""
    names: dict[str, str] = {}
    for step in task.get("config", []) + task["evaluator"].get("postconfig", []):
        if step["type"] == "download":
            for f in step["parameters"]["files"]:
                names[download_name(f["url"], f["path"])] = os.path.basename(f["url"])
    for side in ("expected", "result"):
        getters = task["evaluator"].get(side)
        for g in getters if isinstance(getters, list) else [getters]:
            if isinstance(g, dict) and g.get("type") == "cloud_file":
                paths = g["path"] if isinstance(g["path"], list) else [g["path"]]
                dests = g["dest"] if isinstance(g["dest"], list) else [g["dest"]]
                names.update({d: os.path.basename(p) for p, d in zip(paths, dests)})
    return names


def normalised(data: bytes) -> bytes:
    """A zip (xlsx, docx, pptx, tar-free archives) rewritten with fixed member dates, so its bytes are stable."""
    if not data.startswith(b"PK\x03\x04"):
        return data
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            fixed = zipfile.ZipInfo(info.filename, ZIP_DATE)
            fixed.compress_type = zipfile.ZIP_STORED if info.filename == "mimetype" else zipfile.ZIP_DEFLATED
            fixed.external_attr = 0o644 << 16
            body = src.read(info.filename)
            if info.filename == "docProps/core.xml":  # openpyxl and LibreOffice stamp the time of saving
                body = re.sub(rb"(<dcterms:(?:created|modified)[^>]*>)[^<]*", rb"\g<1>2024-01-01T00:00:00Z", body)
            if info.filename.endswith(".xml"):  # LibreOffice gives each text field a random GUID
                body = _numbered_fields(body)
            dst.writestr(fixed, body)
    return out.getvalue()


def _numbered_fields(xml: bytes) -> bytes:
    count = iter(range(1, 1 << 30))
    return re.sub(rb'<a:fld id="\{[0-9A-Fa-f-]{36}\}"',
                  lambda _: b'<a:fld id="{00000000-0000-4000-8000-%012d}"' % next(count), xml)


def make(cache: Path, only: set[str] | None = None) -> dict[str, list[str]]:
    """Write every task's files into ``cache``; the names written, per task id."""
    written: dict[str, list[str]] = {}
    slugs = {task_id(slug): slug for slug in builders.FILES}
    for task, path in task_files():
        tid = task["id"]
        if only and tid not in only:
            continue
        names = wanted(task)
        if not names:  # a task that downloads nothing and compares with no gold file
            continue
        slug = slugs.get(tid)
        if slug is None:
            raise SystemExit(f"{path}: no files are defined for task {tid} in builders.FILES")
        files = builders.FILES[slug]
        (cache / tid).mkdir(parents=True, exist_ok=True)
        for cache_name, name in sorted(names.items()):
            if name not in files:
                raise SystemExit(f"{path}: builders.FILES[{slug!r}] has no file {name!r}")
            (cache / tid / cache_name).write_bytes(normalised(files[name]()))
            written.setdefault(tid, []).append(cache_name)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache", type=Path)
    args = parser.parse_args()
    written = make(args.cache)
    print(f"{sum(map(len, written.values()))} files for {len(written)} tasks in {args.cache}")


if __name__ == "__main__":
    main()
