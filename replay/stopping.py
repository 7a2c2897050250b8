"""Stopping a simulation early on SIGTERM (a batch system's time limit) or SIGINT (Ctrl-C).

While a simulation runs (in the main thread), either signal asks it to stop at its next point in time instead of
killing the process, so the log and summary of what it simulated are still written (`during`). A command that
simulates also keeps the signals that come while it is still getting ready (reading the trace, fitting the models:
`before`): its simulation then stops at its first point in time, and the command still writes its run, with nothing
simulated, and exits 128 + the signal's number; a signal while the finished run is written lets the write end, and
the command exits the same way (`kept`). A second signal in either time is not kept: the process ends the way that
signal ends it by default.

Kept apart from `replay.run` so that a command can take the signals before it imports the simulator.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)

interrupted: list[int] = []
"""Signals that stopped a simulation early in this process (the command's exit code)."""

_asked: list[int] = []
"""Signals that came while a command was getting ready (`before`), first first."""
_within: list[bool] = []
"""Whether `before` is in force (one entry while it is)."""


@contextlib.contextmanager
def before() -> Iterator[None]:
    """Around a command that simulates: keep SIGTERM and SIGINT for its simulations (`during`) until it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ask(signum: int, _frame: Any) -> None:
        if _asked:  # asked twice: end now, as the signal would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        _asked.append(signum)

    _asked.clear()
    old = {s: signal.signal(s, ask) for s in SIGNALS}
    _within.append(True)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _within.pop()
        _asked.clear()


def kept() -> int | None:
    """The first signal `before` kept and no simulation has taken yet (None: none)."""
    return _asked[0] if _asked else None


@contextlib.contextmanager
def during(sim: Any) -> Iterator[None]:
    """While `sim` runs: a signal sets its `stop_requested`, and a signal kept by `before` sets it at once.
    `interrupted` then says which signal came first."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = _asked[:1]
    _asked.clear()  # taken: this simulation stops for it

    def ask(signum: int, _frame: Any) -> None:
        seen.append(signum)
        sim.stop_requested = signal.Signals(signum).name

    if seen:
        sim.stop_requested = signal.Signals(seen[0]).name
    old = {s: signal.signal(s, ask) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if seen:
            interrupted.append(seen[0])
            if _within:  # a signal while the command writes the run is a second one: it ends the process
                _asked.append(seen[0])
