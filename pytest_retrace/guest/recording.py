"""OSWorld's /start_recording and /end_recording: ffmpeg's x11grab recording the display to an MP4, run in the
desktop through the `GuestBackend` (in the task's sandbox for an Environment, so the recording ends with the
task at the next reset at the latest). One recording at a time per server, as OSWorld's."""

from __future__ import annotations

import shlex
import threading
import time
import uuid

from pytest_retrace.guest.backend import GuestBackend

START_CHECK = 2.0  # seconds ffmpeg must survive for the start to count (OSWorld waits as long)
STOP_DEADLINE = 15.0  # seconds ffmpeg may take to write the file's index after SIGINT (OSWorld's)
_NO_FFMPEG = 127


class Recorder:
    def __init__(self, backend: GuestBackend) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.pid: int | None = None
        self.path = ""

    def _alive(self, pid: int) -> bool:
        """Whether ffmpeg still runs: a zombie does not (an orphan's new parent may reap it late)."""
        script = 's=$(cut -d")" -f2- "/proc/$1/stat" 2>/dev/null | cut -d" " -f2); [ -n "$s" ] && [ "$s" != Z ]'
        return self.backend.run(["sh", "-c", script, "sh", str(pid)], False, 10)["returncode"] == 0

    def _log(self) -> str:
        res = self.backend.run(["tail", "-c", "600", self.path + ".log"], False, 10)
        return res["output"].strip()

    def start(self) -> tuple[int, dict[str, str]]:
        with self.lock:
            if self.pid is not None and self._alive(self.pid):
                return 400, {"status": "error", "message": "Recording is already in progress."}
            width, height = self.backend.screen_size()
            self.path = f"/tmp/retrace-recording-{uuid.uuid4().hex}.mp4"
            script = ('command -v ffmpeg >/dev/null 2>&1 || { echo "ffmpeg is not installed on this desktop" >&2; '
                      'exit 127; }\n'
                      f'ffmpeg -nostdin -y -f x11grab -draw_mouse 1 -s {width}x{height} -i "$DISPLAY" -c:v libx264 '
                      f'-r 30 {shlex.quote(self.path)} </dev/null >/dev/null 2>{shlex.quote(self.path + ".log")} &\n'
                      'echo $!\n')
            res = self.backend.run(script, True, 30)
            if res["returncode"] != 0:
                status = 501 if res["returncode"] == _NO_FFMPEG else 500
                return status, {"status": "error", "message": f"cannot start recording: {res['error'].strip()}"}
            pid = int(res["output"].split()[-1])
            time.sleep(START_CHECK)
            if not self._alive(pid):
                return 500, {"status": "error", "message": "Failed to start recording. ffmpeg terminated "
                                                           f"unexpectedly. Error: {self._log()}"}
            self.pid = pid
            return 200, {"status": "success", "message": "Started recording successfully."}

    def end(self) -> tuple[int, bytes | dict[str, str]]:
        with self.lock:
            pid, self.pid = self.pid, None
            if pid is None or not self._alive(pid):
                return 400, {"status": "error", "message": "No recording in progress to stop."}
            self.backend.run(["kill", "-INT", str(pid)], False, 10)  # ffmpeg writes the MP4's index and exits
            deadline = time.monotonic() + STOP_DEADLINE
            while self._alive(pid):
                if time.monotonic() > deadline:
                    self.backend.run(["kill", "-KILL", str(pid)], False, 10)
                    log = self._log()
                    self.backend.run(["rm", "-f", self.path, self.path + ".log"], False, 10)
                    return 500, {"status": "error", "message": "Recording process was unresponsive and had to be "
                                                               f"killed. Stderr: {log}"}
                time.sleep(0.1)
            try:
                data = self.backend.read(self.path)
            finally:
                self.backend.run(["rm", "-f", self.path, self.path + ".log"], False, 10)
            if not data:
                return 500, {"status": "error", "message": "Recording failed. The output file is missing or empty."}
            return 200, data

    def abort(self) -> None:
        """At the server's shutdown: a recording still running is stopped and its files removed (nobody can
        fetch it any more, and ffmpeg would go on recording the desktop)."""
        with self.lock:
            pid, self.pid = self.pid, None
            if pid is None:
                return
            try:
                self.backend.run(["kill", "-KILL", str(pid)], False, 10)
                self.backend.run(["rm", "-f", self.path, self.path + ".log"], False, 10)
            except Exception:  # noqa: BLE001 - the desktop may be gone already: nothing left to stop then
                pass
