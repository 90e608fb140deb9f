"""Options of the docker provider that need parsing: the engines (``hosts``) and a memory size."""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence


def parse_hosts(hosts: str | Sequence[str] | None) -> list[str]:
    if hosts is None or hosts == "":
        return []
    items = hosts.split(",") if isinstance(hosts, str) else list(hosts)
    out = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"hosts: engine URLs (unix://, tcp://, ssh://), got {item!r}")
        url = item.strip()
        if urllib.parse.urlsplit(url).scheme not in ("unix", "tcp", "ssh", "http", "https", "npipe"):
            raise ValueError(f"hosts: {url!r} is not an engine URL (unix:///var/run/docker.sock, tcp://HOST:2376, "
                             "ssh://USER@HOST)")
        out.append(url)
    return out


def parse_memory(value: int | str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"memory: bytes or a size like 4g, got {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)
    except (ValueError, IndexError):
        raise ValueError(f"memory: bytes or a size like 4g, got {value!r}") from None
