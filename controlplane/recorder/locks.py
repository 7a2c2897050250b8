"""Locks of an event-log folder (advisory `flock`, released by the kernel when a process dies).

- The manifest lock (the folder itself, exclusive, held for milliseconds): whoever changes a stream's
  manifest holds it, so the recorder's appended line and a compaction's rewrite never race.
- The recording lock (`.recorder.lock`, shared): a recorder holds it while it runs. `rubick log compact`
  takes it exclusively, without waiting, so it refuses a log a live recorder writes, and a recorder that
  starts meanwhile waits for it.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

RECORDING_LOCK = ".recorder.lock"


class Busy(Exception):
    """The folder is locked by someone else."""


@contextmanager
def manifest_lock(log_dir: Path) -> Iterator[None]:
    fd = os.open(log_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _open(log_dir: Path) -> int:
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    return os.open(Path(log_dir) / RECORDING_LOCK, os.O_RDWR | os.O_CREAT, 0o644)


def hold_recording(log_dir: Path, wait: bool = True) -> int:
    """Take the recording lock shared (a recorder runs here); returns the descriptor to `release`.
    Without `wait`, raise `Busy` when a compaction by hand holds it."""
    fd = _open(log_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        raise Busy(str(log_dir)) from None
    return fd


def hold_alone(log_dir: Path) -> int:
    """Take the recording lock exclusively without waiting (no recorder runs here); `Busy` otherwise."""
    fd = _open(log_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy(str(log_dir)) from None
    return fd


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)
