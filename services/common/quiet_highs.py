"""HiGHS prints its banner ("Running HiGHS 1.x ... Copyright ...") on stdout when a process builds its first
``highspy.Highs()``, before any option can turn its output off (every solver here sets ``output_flag`` false right
after). In `greenserve evaluate` each worker process printed it through the progress bar. ``silence_banner()`` builds
that first instance with stdout pointed at /dev/null; HiGHS prints the banner once per process, so later instances
print nothing either."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

_done = False


def silence_banner() -> None:
    """Have this process's HiGHS banner printed to /dev/null (once; later calls do nothing)."""
    global _done
    if _done:
        return
    _done = True
    try:
        import highspy
    except ImportError:  # no HiGHS, no banner
        return
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        highspy.Highs()
        with contextlib.suppress(OSError, AttributeError):  # C stdio's buffer, should HiGHS not have flushed it
            ctypes.CDLL(None).fflush(None)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
