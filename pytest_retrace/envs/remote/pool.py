"""The remote provider's options: the pool of guest URLs, which guest this worker takes, the reset command."""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Sequence
from pathlib import Path


def parse_urls(urls: str | Sequence[str] | None, urls_file: str | Path | None) -> list[str]:
    """The pool's URLs, in order, each checked to be an http(s) URL with a host."""
    found: list[str] = []
    if isinstance(urls, str):
        found += [u.strip() for u in urls.split(",") if u.strip()]
    elif urls is not None:
        if not all(isinstance(u, str) for u in urls):
            raise ValueError(f"urls: a comma-separated string or a list of URLs, got {urls!r}")
        found += [u.strip() for u in urls if u.strip()]
    if urls_file is not None:
        try:
            text = Path(urls_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"urls_file: cannot read {urls_file}: {exc.strerror or exc}") from None
        found += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for url in found:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"urls: {url!r} is not an http:// or https:// URL with a host")
    if not found:
        raise ValueError("the remote environment needs guest URLs: option urls (comma-separated) or urls_file")
    return found


def worker_index() -> int:
    """This process's index in the pool: N of PYTEST_XDIST_WORKER=gwN, 0 without xdist."""
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return int(match.group(1)) if match else 0


def parse_reset(reset: str | None) -> tuple[str | None, str | None]:
    """Option ``reset`` as (where, command): ("guest" | "host", CMD), or (None, None) without one."""
    if reset is None or (isinstance(reset, str) and not reset.strip()):
        return None, None
    if not isinstance(reset, str):
        raise ValueError(f"reset: a shell command (guest:CMD or host:CMD), got {reset!r}")  # noqa: TRY004 - an option's value
    where, sep, command = reset.partition(":")
    if sep and where.strip() in ("guest", "host"):
        if not command.strip():
            raise ValueError(f"reset: {reset!r} names no command")
        return where.strip(), command.strip()
    return "guest", reset.strip()
