"""A desktop's processes die with the xdist worker that started them, however it dies (kill -9 included): the
kernel's parent-death signal, PR_SET_PDEATHSIG."""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Sequence

# Loaded once, here: a preexec_fn runs between fork and exec, where a dlopen could wait forever on the loader's
# lock if another thread of the worker (the X thread, xthread.py) held it at the fork.
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)


def die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the worker that started it dies."""
    _LIBC.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv`, killed when the worker dies, as die_with_parent does but without a preexec_fn, which makes
    subprocess fork the whole worker instead of vfork (3x the CPU per process: benchmarks/bench_spawn.py)."""
    return ["setpriv", "--pdeathsig", "KILL", "--", *argv]
