"""The transport under the model adapters: one concurrency limit per endpoint shared by every process on
the machine (real processes, real file locks), retries that honour retry-after within a cap, and what
counts as an infrastructure error."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from pytest_retrace.agents import AgentInfraError
from pytest_retrace.agents.transport import CallStats, ConcurrencyLimit, Transport, TransportOptions


def _hold(lock_dir: str, n: int, log: str, hold: float) -> None:
    limit = ConcurrencyLimit("https://api.example/v1", n, Path(lock_dir))
    with limit.slot():
        start = time.monotonic()
        time.sleep(hold)
        with open(log, "a") as fh:
            fh.write(f"{start} {time.monotonic()}\n")


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = current = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


def test_the_limit_holds_across_processes(tmp_path: Path) -> None:
    """16 processes (as 16 xdist workers would) against an endpoint limited to 3: never more than 3 at once,
    and all of them get through."""
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hold, args=(str(tmp_path / "locks"), 3, str(log), 0.3)) for _ in range(16)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    intervals = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    assert len(intervals) == 16
    assert _max_overlap(intervals) == 3  # type: ignore[arg-type]


def test_a_killed_holder_gives_its_slot_back(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    holder = ctx.Process(target=_hold, args=(str(tmp_path), 1, str(tmp_path / "log"), 600))
    holder.start()
    time.sleep(1.0)
    holder.kill()  # a crashed worker: its file descriptors close, and the lock with them
    holder.join(10)
    start = time.monotonic()
    with ConcurrencyLimit("https://api.example/v1", 1, tmp_path).slot():
        assert time.monotonic() - start < 2


class Status(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.response = type("R", (), {"headers": headers or {}})()


class Transient(Exception):
    pass


def transport(tmp_path: Path, **options: object) -> Transport:
    opts = TransportOptions(**{"initial_backoff": 0.01, "max_backoff": 0.05, **options})  # type: ignore[arg-type]
    return Transport("test", opts, (Transient,), lock_dir=tmp_path)


def failing(*errors: Exception):  # noqa: ANN201 - a call that raises the given errors, then succeeds
    queue = list(errors)

    def call() -> str:
        if queue:
            raise queue.pop(0)
        return "ok"

    return call


def test_retry_after_is_honoured_and_capped(tmp_path: Path) -> None:
    stats = CallStats()
    start = time.monotonic()
    assert transport(tmp_path).call(failing(Status(429, {"retry-after": "1"})), stats) == "ok"
    assert 1.0 <= time.monotonic() - start < 2.0 and stats.retries == 1
    start = time.monotonic()  # a server asking for an hour waits max_wait, not an hour
    assert transport(tmp_path, max_wait=0.5).call(failing(Status(503, {"retry-after": "3600"})), CallStats()) == "ok"
    assert time.monotonic() - start < 1.5
    start = time.monotonic()
    transport(tmp_path).call(failing(Status(429, {"retry-after-ms": "300"})), CallStats())
    assert 0.3 <= time.monotonic() - start < 1.0


def test_transient_failures_retry_then_become_infrastructure_errors(tmp_path: Path) -> None:
    stats = CallStats()
    assert transport(tmp_path).call(failing(Transient(), Status(500), Status(502)), stats) == "ok"
    assert stats.retries == 3
    with pytest.raises(AgentInfraError, match=r"HTTP 500 after 3 attempt\(s\)") as info:
        transport(tmp_path, max_retries=2).call(failing(*[Status(500)] * 5), CallStats())
    assert info.value.kind == "transport"
    with pytest.raises(AgentInfraError, match=r"Transient after 1 attempt"):
        transport(tmp_path, max_retries=0).call(failing(Transient()), CallStats())


def test_a_rejected_request_is_an_api_error_at_once_and_other_exceptions_pass_through(tmp_path: Path) -> None:
    stats = CallStats()
    with pytest.raises(AgentInfraError, match="HTTP 401") as info:
        transport(tmp_path).call(failing(Status(401)), stats)
    assert info.value.kind == "api" and stats.retries == 0
    with pytest.raises(ZeroDivisionError):  # a bug is not the API's fault: it surfaces as itself
        transport(tmp_path).call(lambda: 1 / 0, CallStats())
