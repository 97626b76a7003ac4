"""A child process that dies with its parent: Linux's PR_SET_PDEATHSIG.

A supervisor that is killed with ``kill -9`` cannot stop its children, and children started in sessions of their
own do not get the terminal's signals either, so without this they outlive it. ``set_parent_death_signal`` asks
the kernel to send a signal to the calling process when its parent dies.

A child is given it by ``dies_with_parent``, which prefixes its command with this module run as a program: that
sets the signal, checks the parent is still alive, then execs the command (the setting survives ``execve``). It
is not done in a ``preexec_fn``: that runs Python between fork and exec, and in a process with gRPC's threads
the child then crashed with SIGSEGV before exec (26 of 300 starts beside a busy grpc.aio server; engines the
gpu-partitioner started failed that way). Without a ``preexec_fn`` CPython starts the child with vfork and it runs
no Python before exec: 0 of 300 failed. Under uvloop (the router's loop) ``create_subprocess_exec`` goes through
libuv, which forks, and gRPC's at-fork handlers crashed the child all the same (18 of 300): a process that runs
gRPC on uvloop starts children with ``subprocess.Popen``, not through its loop.

The kernel tracks the *thread* that forked the child: start children from a thread that lives as long as the
supervisor (its main thread, or the event loop's), or they receive the signal when that thread ends. Off Linux
the command runs as it is.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence

_PR_SET_PDEATHSIG = 1
_MODULE = "greenserve.common.parent_death"  # run as a program by dies_with_parent (``python -m``)
_LINUX = sys.platform.startswith("linux")
_prctl = ctypes.CDLL(None, use_errno=True).prctl if _LINUX else None


def set_parent_death_signal(sig: int) -> None:
    """PR_SET_PDEATHSIG: the kernel sends ``sig`` to this process when its parent dies (Linux; else nothing)."""
    if _prctl is None:
        return
    if _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def dies_with_parent(argv: Sequence[str], sig: int = signal.SIGTERM,
                     env: Mapping[str, str] | None = None) -> list[str]:
    """``argv`` prefixed so that the process it starts gets ``sig`` when the calling process dies. The program is
    looked up here, on ``env``'s PATH as ``subprocess`` would, so a missing one still raises FileNotFoundError in
    the caller. Off Linux, ``argv`` itself."""
    if not _LINUX:
        return list(argv)
    program = shutil.which(argv[0], path=(env if env is not None else os.environ).get("PATH", os.defpath))
    if program is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    return [sys.executable, "-m", _MODULE, str(os.getpid()), str(int(sig)), os.path.abspath(program), *argv]


def exit_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """Asks for ``sig`` when the parent dies, and exits at once if ``parent_pid`` is no longer the parent (it died
    before the signal was asked for). Also a process pool's ``initializer`` (with ``initargs=(os.getpid(),)``):
    without it the workers of a ``ProcessPoolExecutor`` outlive a parent killed with ``kill -9``: each holds the
    pool's call queue open, so none ever reads the end of it (seen: a forecaster's fit workers and their resource
    tracker still running 40 minutes after a crash test). The pool must start its workers from a thread that
    lives as long as the parent (the event loop's or the main thread)."""
    set_parent_death_signal(sig)
    if os.getppid() != parent_pid:
        os._exit(1)


def main(argv: Sequence[str]) -> None:
    """``PARENT_PID SIGNAL PROGRAM ARGV0 [ARG ...]``: the signal on the parent's death, then exec PROGRAM."""
    parent_pid, sig, program, *args = argv
    exit_with_parent(int(parent_pid), int(sig))
    try:
        os.execv(program, args)
    except OSError as exc:
        print(f"cannot run {program}: {exc.strerror}", file=sys.stderr)
        os._exit(126 if exc.errno != errno.ENOENT else 127)


if __name__ == "__main__":
    main(sys.argv[1:])
