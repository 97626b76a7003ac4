"""A child process that dies with its parent: Linux's PR_SET_PDEATHSIG.

A supervisor that is killed with ``kill -9`` cannot stop its children, and children started in sessions of their
own do not get the terminal's signals either, so without this they outlive it. ``set_parent_death_signal`` asks
the kernel to send a signal to the calling process when its parent dies; ``on_parent_death`` is the
``preexec_fn`` for ``subprocess.Popen`` that does it in the child, between fork and exec.

The kernel tracks the *thread* that forked the child: start children from a thread that lives as long as the
supervisor (its main thread), or they receive the signal when that thread ends. A no-op off Linux.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
# Resolved once, in the parent: the preexec_fn then only calls into libc (no dlopen between fork and exec).
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def set_parent_death_signal(sig: int) -> None:
    """PR_SET_PDEATHSIG: the kernel sends ``sig`` to this process when its parent dies (Linux; else nothing)."""
    if _prctl is None:
        return
    if _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def on_parent_death(sig: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child started with it gets ``sig`` when the process that started it dies. It runs only
    a libc call between fork and exec (resolved before the fork), which is what makes it safe beside threads."""
    return lambda: set_parent_death_signal(sig)


def exit_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """A process pool's ``initializer`` (with ``initargs=(os.getpid(),)``): the worker gets ``sig`` when the process
    that started it dies, and exits at once if that happened before this ran. Without it the workers of a
    ``ProcessPoolExecutor`` outlive a parent killed with ``kill -9``: each holds the pool's call queue open, so none
    ever reads the end of it (seen: a forecaster's fit workers and their resource tracker still running 40 minutes
    after a crash test). The pool must start its workers from a thread that lives as long as the parent (the
    event loop's or the main thread), as ``on_parent_death`` says."""
    set_parent_death_signal(sig)
    if os.getppid() != parent_pid:  # the parent died before the signal was asked for
        os._exit(1)
