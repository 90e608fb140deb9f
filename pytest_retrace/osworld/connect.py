"""The VM server OSWorld's code talks to, for one of our desktops: ``retrace guest``'s routes served on loopback
in front of the :class:`Environment` (whatever its provider), and the desktop's Chrome DevTools and VLC ports
relayed to loopback.

desktop-env's getters and SetupController reach a VM through ``http://{vm_ip}:{server_port}`` and Chrome through
``{vm_ip}:{chromium_port}``. Serving that API from the harness's side, in front of the environment, keeps every
provider's guards (the sandbox, confined file reads, the remote client's token and bounds) on each call, and needs
nothing inside the desktop: the xvfb sandbox hides the harness's virtualenv, and a remote guest's token never
reaches OSWorld's code."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from pytest_retrace.envs import EnvError, Environment
from pytest_retrace.osworld.server import VMServer

CHROMIUM_PORT = 9222  # where OSWorld's task configs make Chrome's DevTools listen (socat from 1337)
VLC_PORT = 8080  # VLC's HTTP interface, which OSWorld's vlc getters read

_SERVED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def vm_server(env: Environment) -> VMServer:
    """The VM server for ``env``, started on first use and kept while ``env`` lives."""
    from pytest_retrace.guest import serve_environment  # the guest's web framework only for OSWorld cases

    with _LOCK:
        handle = _SERVED.get(env)
        if handle is None:
            handle = serve_environment(env, host="127.0.0.1", port=0)
            _SERVED[env] = handle
            weakref.finalize(env, handle.close)
    return VMServer(host="127.0.0.1", server_port=handle.port, chromium_port=_relayed(env, CHROMIUM_PORT),
                    vlc_port=_relayed(env, VLC_PORT), platform=_platform(env), screen=_screen(env))


def _relayed(env: Environment, port: int) -> int:
    """A loopback port reaching ``port`` inside the desktop; without a relay (a provider that cannot make one)
    the port itself, which a getter then fails to reach on loopback as it would on a VM without that app."""
    forward = getattr(env, "forward", None)
    if not callable(forward):
        return port
    try:
        return int(forward(port))
    except EnvError:
        raise
    except NotImplementedError:
        return port


def _platform(env: Environment) -> str:
    return str(getattr(env, "platform", "Linux") or "Linux")


def _screen(env: Environment) -> tuple[int, int]:
    size = getattr(env, "size", None)
    return (int(size[0]), int(size[1])) if isinstance(size, (tuple, list)) and len(size) == 2 else (1920, 1080)
