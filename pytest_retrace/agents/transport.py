"""Calling a model API: retries with backoff that honour ``retry-after``, a timeout per call, and one
concurrency limit per provider endpoint shared by every xdist worker on the machine.

Why not the SDKs' own retries: they sleep while holding our concurrency slot and obey any ``retry-after``,
however long (an hour would stall a worker for an hour). Here a slot is held only while a request is in
flight, a wait is capped by ``max_wait``, and what exhausts the retries becomes an
:class:`~pytest_retrace.agents.AgentInfraError`, never a verdict on the agent.

The limit is a set of lock files (``flock``): a worker that dies releases its slot with its file
descriptors, so a crashed worker can never leak capacity.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from pytest_retrace.agents import AgentInfraError
from pytest_retrace.agents.secrets import redact
from pytest_retrace.text import clip

T = TypeVar("T")
RETRIABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))


class TransportOptions(BaseModel):
    """The ``transport:`` block of a model config."""

    model_config = ConfigDict(extra="forbid")

    timeout: float = Field(120.0, gt=0, description="seconds one call may take")
    max_retries: int = Field(6, ge=0, le=50, description="retries after the first attempt")
    initial_backoff: float = Field(1.0, gt=0)
    max_backoff: float = Field(30.0, gt=0)
    max_wait: float = Field(120.0, gt=0, description="cap on one wait, a server's retry-after included")
    concurrency: int = Field(8, ge=1, le=1024, description="requests in flight per endpoint, machine-wide")


@dataclass
class CallStats:
    retries: int = 0
    latency: float = 0.0  # wall time in call(), backoff and queueing included


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def _retry_after(exc: BaseException) -> float | None:
    """Seconds a server asked us to wait (``retry-after-ms`` or ``retry-after`` in seconds or as a date)."""
    import email.utils

    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        return float(headers.get("retry-after-ms")) / 1000
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        parsed = email.utils.parsedate_tz(value)
        return None if parsed is None else email.utils.mktime_tz(parsed) - time.time()


class Transport:
    """Runs SDK calls (made with the SDK's own retries off) under the retry policy and the shared limit."""

    def __init__(self, endpoint: str, options: TransportOptions, transient: tuple[type[BaseException], ...],
                 api_errors: tuple[type[BaseException], ...] = (), lock_dir: Path | None = None) -> None:
        self.options = options
        self.transient = transient  # connection errors and timeouts: always worth a retry
        self.api_errors = api_errors  # the SDK's own errors (a body it cannot read...): the API's fault, not the model's
        self.limit = ConcurrencyLimit(endpoint, options.concurrency, lock_dir)

    def call(self, fn: Callable[[], T], stats: CallStats) -> T:
        opts = self.options
        start = time.monotonic()
        attempt = 0
        try:
            while True:
                try:
                    with self.limit.slot():
                        return fn()
                except Exception as exc:  # classified below: anything else is re-raised untouched
                    status = _status(exc)
                    retriable = isinstance(exc, self.transient) or (status is not None and status in RETRIABLE_STATUS)
                    if not retriable:
                        if status is not None:
                            raise AgentInfraError(f"the API refused the request (HTTP {status}): {_brief(exc)}",
                                                  kind="api") from None
                        if isinstance(exc, self.api_errors):
                            raise AgentInfraError(f"{type(exc).__name__}: {_brief(exc)}", kind="api") from None
                        raise
                    if attempt >= opts.max_retries:
                        what = f"HTTP {status}" if status is not None else type(exc).__name__
                        raise AgentInfraError(f"{what} after {attempt + 1} attempt(s): {_brief(exc)}",
                                              kind="transport") from None
                    wait = _retry_after(exc)
                    if wait is None or wait <= 0:
                        wait = min(opts.initial_backoff * 2**attempt, opts.max_backoff) * (0.75 + 0.25 * random.random())
                    time.sleep(min(wait, opts.max_wait))
                    attempt += 1
                    stats.retries += 1
        finally:
            stats.latency += time.monotonic() - start


def _brief(exc: BaseException) -> str:
    # redacted before it is cut: a key cut in two would no longer be recognised, and half a key is a leak
    text = redact(" ".join(str(exc).split()))
    return clip(text, 300)


class ConcurrencyLimit:
    """At most `n` holders across every process of this machine, per endpoint: lock files, one held per
    request. The directory is per endpoint (a hash of it), so every run, worker and config that calls one API
    shares one pool: each caller uses the first `n` slots, so the endpoint never has more requests in flight
    than the largest `n`, and no caller more than its own."""

    def __init__(self, endpoint: str, n: int, lock_dir: Path | None = None) -> None:
        digest = hashlib.sha256(endpoint.encode()).hexdigest()[:16]
        self.dir = (lock_dir or Path(tempfile.gettempdir()) / "retrace-limits") / digest
        self.n = n

    @contextmanager
    def slot(self, poll: float = 0.02) -> Iterator[int]:
        self.dir.mkdir(parents=True, exist_ok=True)
        order = list(range(self.n))
        while True:
            random.shuffle(order)  # no slot is everyone's first choice
            for i in order:
                fd = os.open(self.dir / f"slot-{i}", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                try:
                    yield i
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
                return
            time.sleep(poll * (0.5 + random.random()))


def price(usage: Any, prices: dict[str, float] | None) -> float | None:
    """USD for a usage from per-million-token prices (input, output, cache_read, cache_write)."""
    if not prices:
        return None
    return (usage.input_tokens * prices.get("input", 0.0) + usage.output_tokens * prices.get("output", 0.0)
            + usage.cache_read_tokens * prices.get("cache_read", prices.get("input", 0.0))
            + usage.cache_write_tokens * prices.get("cache_write", prices.get("input", 0.0))) / 1e6
