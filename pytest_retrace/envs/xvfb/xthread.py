"""The harness's own connections to a task's X server (mss grabs, the DAMAGE watch), each call with a deadline.

Any X client can take a server grab (``XGrabServer``): the server then answers no other client until it lets
go, and a screenshot taken meanwhile waits with it. The task's processes are X clients, so an agent can hold a
grab for as long as it likes; a grab by a busy app lasts milliseconds. A blocking C call cannot be interrupted
from Python, so the connections live on a thread of their own and every call waits for it at most
``deadline`` seconds. A call past its deadline marks the display blocked: that call and every later one raise
:class:`DisplayBlocked` at once (the stuck call still holds the thread), until the desktop is recycled, which
ends the server and with it the stuck call (mss's XCB backend returns an error on a lost connection; it never
exits the process as Xlib's default handler would).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

from pytest_retrace.envs import DisplayBlocked, EnvError

T = TypeVar("T")
# Far above what any call takes on a loaded machine (a 1280x800 grab: ~5 ms; under -n 16 on 2 cores the
# slowest measured settle grab was well below 1 s), and far below a worker hung for good.
DEADLINE = 10.0


class XThread:
    """Runs calls on one thread that owns the X connections; ``call`` returns the result or raises
    DisplayBlocked past the deadline."""

    def __init__(self, display: str, deadline: float = DEADLINE) -> None:
        self.display, self.deadline = display, deadline
        self.blocked: str | None = None  # why the display is blocked; None while it answers
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"retrace-x{display}")

    def call(self, fn: Callable[..., T], *args: Any, what: str, extra: float = 0.0) -> T:
        """``fn(*args)`` on the X thread, within ``deadline + extra`` seconds (``extra``: time the call itself
        asks to wait, such as a DAMAGE wait's timeout)."""
        if self.blocked is not None:
            raise DisplayBlocked(self.blocked)
        future = self._pool.submit(fn, *args)
        try:
            return future.result(timeout=self.deadline + extra)
        except concurrent.futures.TimeoutError:
            self.blocked = (f"the X server {self.display} answered no {what} within {self.deadline + extra:g} s "
                            f"while running: an X client holds a server grab")
            raise DisplayBlocked(self.blocked) from None
        except EnvError:
            raise
        except Exception as exc:  # noqa: BLE001 - mss's ScreenShotError, Xlib's connection errors: a lost display
            raise EnvError(f"{what} on {self.display}: {type(exc).__name__}: {exc}") from exc

    def close(self, release: Callable[[], None]) -> None:
        """``release()`` the connections on their thread, unless a call is stuck there: then they are left to
        the server's end, which the caller brings about next (closing a connection another thread is blocked
        on is not safe)."""
        if self.blocked is None:
            try:
                self.call(release, what="disconnect")
            except DisplayBlocked:
                pass
        self._pool.shutdown(wait=False)
