"""What xdist starts as a worker's "python" when the fork server is on: ``python -I -S client.py SOCKET ARGS...``.

It hands its stdin, stdout and stderr, argv, cwd and environment to the fork server (zygote.py), closes its own
copies (the worker holds the pipes now: the controller sees EOF when the worker ends, not when this does), and lives
as long as the worker: it exits with the worker's status, and when xdist kills it, the server kills the worker.
Standard library only, and no site (-S): it is started once per worker and must cost next to nothing. Where the
server is gone or declines, it becomes the interpreter itself (exec), as if the server had never been there.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import sys


def main() -> None:
    path, args = sys.argv[1], sys.argv[2:]
    body = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        message = struct.pack("!I", len(body)) + body
        sent = conn.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
        conn.sendall(message[sent:])
        reply = conn.makefile("rb")
        first = reply.readline().split()
    except OSError:
        first = []
    if first[:1] != [b"pid"]:
        os.execv(sys.executable, [sys.executable, *args])
    pid = int(first[1])
    # a terminal's Ctrl-C reaches the worker itself (it is in this process group); a SIGTERM sent to this process
    # is passed on
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(pid, signum))
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    last = reply.readline().split()
    code = int(last[1]) if last[:1] == [b"exit"] else 1
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


if __name__ == "__main__":
    main()
