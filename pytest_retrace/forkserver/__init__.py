"""xdist workers forked from one process that imported their heavy modules once (``--retrace-workers=fork``).

An API-bound run at ``-n 16`` on a small machine is CPU-bound on its workers' start-up before any test: each
starts Python, pytest and its plugins and imports numpy, scipy and the provider's SDK (``import anthropic`` alone
is about 2 CPU-s). :class:`ForkServer` starts zygote.py, which imports those once, and points every ``popen``
gateway's interpreter at client.py, which has the server fork the worker; the worker then starts exactly as
execnet starts it (``python -u -c BOOTSTRAP``, the same stdio pipes, cwd and environment), and imports pytest's
other plugins (never preloaded: pytest must rewrite their asserts) and this plugin's test functions, whose asserts
explain a verdict; the rest of this plugin is preloaded (its asserts are invariants no user reads).

Differences from a started worker, each on purpose: the modules are imported once, before the worker's own
environment is in place (none of them reads it at import time); BLAS runs one thread in every worker
(``OPENBLAS_NUM_THREADS=1`` in the server unless set: a forked child must not inherit a thread pool, and many
workers on few cores gain nothing from it); workers are children of the server, not of the controller; a
worker ends after its threads and atexit handlers without tearing its heap down (os._exit, as multiprocessing's
forked children): an object left open is not finalized, as the interpreter does not promise either.
"""

from __future__ import annotations

import os
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ZYGOTE, CLIENT = HERE / "zygote.py", HERE / "client.py"
READY_TIMEOUT = 30.0  # seconds for the server to bind its socket (an interpreter's start)

# What every worker of this plugin imports, in the order it does; each provider's SDK only when a model uses it.
# Measured: the modules a worker of a recovery run holds at its end that the server had not imported (issue 26).
COMMON = ("pytest", "numpy", "scipy.ndimage", "scipy.signal", "PIL.Image", "PIL.PngImagePlugin", "pydantic", "yaml",
          "Xlib.display", "Xlib.ext.damage", "skimage.metrics", "requests",
          # the screen grabs, SSIM's helpers and PIL's formats as a test's stages import them; pytest's pdb and
          # doctest plugins' lazy imports
          "mss", "mss.linux", "skimage.exposure", "skimage.util", "PIL.JpegImagePlugin", "PIL.GifImagePlugin",
          "PIL.BmpImagePlugin", "PIL.PpmImagePlugin", "Xlib.xauth", "pdb", "doctest")
# The SDKs' clients import their HTTP transport when they are made, not when the SDK is imported
TRANSPORT = ("httpcore2", "h11", "truststore", "trio")
SDKS = {"anthropic": ("anthropic", *TRANSPORT), "openai": ("openai", *TRANSPORT),
        "openai-compat": ("openai", *TRANSPORT)}
# This plugin's own modules a recovery test runs (zygote.preload: never its test functions, plugin/suite.py)
PLUGIN = ("pytest_retrace.plugin", "pytest_retrace.plugin.fixtures", "pytest_retrace.plugin.assertion",
          "pytest_retrace.replay.run", "pytest_retrace.envs.xvfb.environment")
ADAPTERS = {"anthropic": ("pytest_retrace.agents.anthropic",), "openai": ("pytest_retrace.agents.openai",),
            "openai-compat": ("pytest_retrace.agents.openai_compat",)}


def modules_for(providers: Iterable[str]) -> list[str]:
    providers = list(dict.fromkeys(providers))
    sdks = [m for p in providers for m in SDKS.get(p, ())]
    adapters = [m for p in providers for m in ADAPTERS.get(p, ())]
    return [*COMMON, *dict.fromkeys(sdks), *PLUGIN, *adapters]


class ForkServerError(RuntimeError):
    pass


class ForkServer:
    def __init__(self, modules: list[str]) -> None:
        self.modules = modules
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        assert self._dir is not None, "not started"
        return self._dir / "fork.sock"

    def start(self) -> None:
        """Start the server; returns once it listens (it imports the modules after: a worker that asks before
        waits for them, never for the interpreter it replaces)."""
        self._dir = Path(tempfile.mkdtemp(prefix="retrace-fork-"))  # 0700: only this user may connect
        env = dict(os.environ)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        self._proc = subprocess.Popen([sys.executable, str(ZYGOTE), str(self.socket), *self.modules],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], READY_TIMEOUT)
        line = self._proc.stdout.readline() if ready else b""
        if line.strip() != b"listening":
            self.close()
            raise ForkServerError(f"the fork server did not start within {READY_TIMEOUT:g} s "
                                  f"(printed {line[:200]!r}); workers start as usual")

    def python(self) -> str:
        """The ``python=`` of an execnet spec that has this server start the worker."""
        return shlex.join([sys.executable, "-I", "-S", str(CLIENT), str(self.socket)])

    def close(self) -> None:
        """Stop the server (closing its stdin): every worker it still has is killed. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
