"""Tie a child process's life to its parent's, and find processes by what they run (Linux; no-ops elsewhere).

`die_with_parent(sig)` is a `preexec_fn` for `subprocess.Popen`: the child asks the kernel to send it
`sig` when its parent dies (PR_SET_PDEATHSIG), so a `kill -9` of the parent leaves no orphan. The
kernel sends it when the *thread* that forked the child ends, so call Popen from a thread that lives as
long as the parent (the main thread), never from a worker thread of a pool.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A preexec function that makes the child receive `sig` when the parent dies; None where the kernel
    cannot (not Linux) or where it would fire too early (not called on the main thread)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request was made
            os.kill(os.getpid(), sig)

    return preexec


def pid_alive(pid: int) -> bool:
    """A live process (not a zombie)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def parent_pid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def pids_running(predicate: Callable[[list[str]], bool]) -> list[int]:
    """Live processes whose command line satisfies `predicate` (empty where /proc is missing)."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if name.isdigit() and int(name) != os.getpid():
            args = cmdline(int(name))
            if args and predicate(args) and pid_alive(int(name)):
                out.append(int(name))
    return sorted(out)


def exit_at_once(code: int) -> None:
    """End this process with `code` once what it wrote is flushed (log handlers, stdout, stderr), skipping the
    interpreter's teardown.

    For a process that has already saved, sent and closed everything it owes (a training process after its
    status file, checkpoint and reporter are done and its process group destroyed; torchrun after its workers
    ended): tearing down torch and DeepSpeed takes seconds of CPU per process, and a reconfiguration waits for
    every one of them before it can start the job again. Never for a process with work left in atexit handlers.

    A process started by `multiprocessing` (a training process torchrun forked from a warm launcher,
    `agents.torchrun`) raises `SystemExit(code)` instead: its caller hands the result back to the parent, which
    waits for it, and multiprocessing then ends the process with `os._exit` itself."""
    import logging
    import multiprocessing

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if multiprocessing.parent_process() is not None:
        raise SystemExit(code)
    os._exit(code)
