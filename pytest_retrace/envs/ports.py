"""A TCP port of a desktop, relayed to a port of the harness's own loopback (``Environment.forward``).

OSWorld's code reaches a VM at one address, ``vm_ip``: its server on ``server_port`` and Chrome's DevTools on
``chromium_port`` (its setup steps and getters call ``connect_over_cdp(f"http://{vm_ip}:{chromium_port}")``). The
harness serves that VM API on ``127.0.0.1`` in front of the environment (osworld/connect.py), so every desktop
port OSWorld's code needs is given on ``127.0.0.1`` too, by a :class:`Relay`:

- **xvfb**: a task without the network has a network namespace of its own (xvfb/sandbox.py): its
  ``127.0.0.1:9222`` is not the harness's, which is what lets sixteen desktops each run OSWorld's ``socat
  tcp-listen:9222`` beside a browser with a DevTools port. The relay opens each upstream connection inside that
  namespace. A socket belongs to the namespace it was created in, whichever thread uses it later, and
  ``setns(CLONE_NEWNET)`` moves only the calling thread; so each accepted connection is served by a thread of its
  own that enters the namespace, creates and connects its upstream socket, relays, and ends with the connection:
  no other thread of the worker (the X thread, pytest's) ever changes namespace.
- **docker, remote**: a plain relay to the container's or the guest's address, where a port the task listens on
  all addresses (socat's) is reached, as OSWorld's harness reaches its VM's.

Only the harness may use a relay: a task that has the network shares the harness's loopback and could otherwise
connect to another desktop's relay. A connection is accepted when the socket it comes from belongs to this
process's user (``/proc/net/tcp`` names each socket's owner); a task's processes run as the sandbox's own uid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
from pathlib import Path

from pytest_retrace.envs import EnvError, check_port

CLONE_NEWNET = 0x40000000
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
_CHUNK = 1 << 16


class Relay:
    """Connections to 127.0.0.1:``local_port`` relayed to ``host:port``, seen from the network namespace
    ``netns`` (a ``/proc/PID/ns/net`` path; None: the harness's own). Until :meth:`close`."""

    def __init__(self, port: int, host: str = "127.0.0.1", netns: str | None = None) -> None:
        self.port = check_port(port)
        self.host = host
        try:
            # held open: the namespace stays what this relay means even if its init is already going
            self._ns = os.open(netns, os.O_RDONLY | os.O_CLOEXEC) if netns is not None else None
        except OSError as exc:
            raise EnvError(f"forward {port}: the task's network namespace is gone ({exc})") from None
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.local_port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, name=f"retrace-relay-{port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, peer = self._listener.accept()
            except OSError:
                return  # closed
            if _socket_uid(peer[1], self.local_port) != os.geteuid():
                client.close()  # not the harness's: a task with the network reaching for a desktop's port
                continue
            threading.Thread(target=self._serve, args=(client,), name=f"retrace-relay-{self.port}-conn",
                             daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        """One connection, in a thread of its own (the only one that enters the task's namespace)."""
        upstream = None
        try:
            if not self._track(client):
                return
            if self._ns is not None and _LIBC.setns(self._ns, CLONE_NEWNET) != 0:
                return  # the namespace cannot be entered: the client sees its connection closed
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if not self._track(upstream):
                return
            try:
                upstream.settimeout(30)
                upstream.connect((self.host, self.port))
                upstream.settimeout(None)
            except OSError:
                return  # nothing listens there (yet): as a refused connection would look to the client
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    self._untrack(sock)

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                sock.close()
                return False
            self._sockets.add(sock)
            return True

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        sock.close()

    def close(self) -> None:
        """Stop listening and cut every relayed connection."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            open_sockets = list(self._sockets)
        # shutdown, not only close: it wakes a thread blocked in accept() or recv() on the socket
        for sock in (self._listener, *open_sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        if self._ns is not None:
            os.close(self._ns)
            self._ns = None


class Relays:
    """A provider's relays, one per desktop port, closed together (at reset, when the desktop changes, and
    at close)."""

    def __init__(self) -> None:
        self._open: dict[int, Relay] = {}

    def forward(self, port: int, host: str = "127.0.0.1", netns: str | None = None) -> int:
        """The loopback port relayed to ``host:port`` (from ``netns``), made on first use."""
        if check_port(port) not in self._open:
            self._open[port] = Relay(port, host, netns)
        return self._open[port].local_port

    def close(self) -> None:
        for relay in self._open.values():
            relay.close()
        self._open.clear()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy one direction until its end closes, then pass the end on (the other direction goes on)."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        pass  # reset, or cut by close()
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _socket_uid(port: int, to: int) -> int | None:
    """The owner of the IPv4 TCP socket from 127.0.0.1:`port` to 127.0.0.1:`to` in this namespace (from
    /proc/net/tcp, where 127.0.0.1 is written 0100007F), or None when there is none."""
    local, remote = f"0100007F:{port:04X}", f"0100007F:{to:04X}"
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 7 and fields[1] == local and fields[2] == remote:
                return int(fields[7])
    return None
