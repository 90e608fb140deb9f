"""``retrace guest``: OSWorld's VM-server API (``desktop_env/server/main.py``, a Flask app on port 5000) for one
of our desktops, with OSWorld's request and response shapes, so that the ``remote`` provider and desktop-env's
own code (its PythonController, SetupController and getters) cannot tell it from an OSWorld VM.

One server for any desktop: every route acts on a `GuestBackend` (guest/backend.py). ``retrace guest`` serves the
machine it runs on (guest/work.py: a container's or VM's processes, files and display); `serve_environment`
serves a `pytest_retrace.envs` Environment from beside it (guest/envbackend.py: the xvfb sandbox hides the venv
and has its own network, so the server cannot run inside it).

The remote provider's subset (guest/app.py):

    GET  /screenshot        PNG bytes of the display
    GET  /screenshot?format=rgb  (ours) its RGB bytes, row-major, sized by X-Screen-Width / X-Screen-Height
    POST /execute           {"command": [...] | "...", "shell": false} -> {"status", "output", "error", "returncode"}
    POST /setup/execute     the same (SetupController's execute and command steps)
    POST /file              form field file_path -> the file's bytes (404 when missing)
    POST /setup/upload      multipart: file_path + file_data
    POST /setup/launch      {"command": ..., "shell": ...}
    POST /setup/open_file   {"path": ...} -> waits for a window whose title holds the file's name
    GET  /platform          "Linux"
    POST /screen_size       {"width", "height"}
    GET  /cursor_position   [x, y]
    GET  /health            {"status": "ok"} (ours: OSWorld has no health check)
    GET  /task_cpu          {"seconds": CPU time of the task's processes so far} (ours: settling on idle)

Every other endpoint desktop-env 1.0.2's controllers and getters call (guest/osworld_routes.py; caller in
brackets, P = PythonController, S = SetupController):

    GET  /terminal                         -> {"output": null, "status": "success"} [P.get_terminal_output, S.setup
                                              polls it first]: OSWorld's answer when no terminal is active, since
                                              the terminal's text comes through AT-SPI, which these desktops lack
    GET  /accessibility                    -> {"AT": OSWorld's XML} from pyatspi in the desktop (guest/accessibility.py);
                                              a 501 naming Task.accessibility when AT-SPI is off [P.get_accessibility_tree]
    POST /run_python {"code"}              -> {"status", "message", "need_more", "output", "error", "return_code"}
                                              [P.run_python_script]: python3 runs the code as a file, 30 s
    POST /run_bash_script {"script", "timeout", "working_dir"}
                                           -> {"status", "output" (stdout and stderr), "error": "", "returncode"}
                                              [P.run_bash_script]; a timeout is a 500 with returncode -1
    POST /setup/execute_with_verification {"command", "shell", "verification": {"window_exists",
         "command_success"}, "max_wait_time", "check_interval"}  (also /execute_with_verification)
                                           -> /execute's keys + "verification", "wait_time"; 500 when it fails
    POST /setup/activate_window {"window_name", "strict", "by_class"}   -> 200, 404 when no window matches
    POST /setup/close_window {"window_name", "strict", "by_class"}      -> 200 (wmctrl -c), 404, 501 without wmctrl
    POST /setup/change_wallpaper {"path"}  -> GNOME's picture-uri set (gsettings)  [S.change_wallpaper]
    POST /wallpaper                        -> that file's bytes [P.get_vm_wallpaper]
    POST /window_size  form app_class_name -> {"width", "height"} of its first window [P.get_vm_window_size]
    POST /desktop_path                     -> {"desktop_path": "~/Desktop"}, 404 without one [P.get_vm_desktop_path]
    POST /list_directory {"path"}          -> {"directory_tree": {"type", "name", "children"}} [P.get_vm_directory_tree]
    POST /start_recording, /end_recording  -> ffmpeg x11grab to an MP4, whose bytes /end_recording answers (400
                                              when none runs; 501 without ffmpeg) [P.start_recording, P.end_recording]

The getters call only these, directly (/execute, /setup/launch) or through PythonController (get_file,
execute_python_command, the get_vm_* calls); tests/guest/test_osworld_controllers.py reads the package's
source for every path it requests and checks that each is served.

Unlike OSWorld's server it binds 127.0.0.1 by default, takes a bearer token (and refuses a non-loopback
address without one), limits request bodies, command time and output, confines the file API (reads, writes,
directory trees, the wallpaper) to the home and /tmp, and answers every bad request with a JSON
``{"status": "error", "error": ...}`` and a 4xx naming the field. See docs/environments.md.
"""

from __future__ import annotations

from pytest_retrace.guest.app import create_app
from pytest_retrace.guest.config import GuestConfig, GuestError, is_loopback
from pytest_retrace.guest.server import ServedEnvironment, serve, serve_environment

__all__ = ["GuestConfig", "GuestError", "ServedEnvironment", "create_app", "is_loopback", "serve",
           "serve_environment"]
