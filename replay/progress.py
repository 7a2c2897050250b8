"""Progress of long commands (`simulate`, `replay`, `report`, `model validate`) on stderr.

Display only: nothing here reads or changes what a command computes or prints on stdout. Whether a
command shows progress is `--progress` / `--no-progress`, else whether stderr is a terminal. On a
terminal the display is a live `rich` bar that is erased when the step ends; forced on with stderr
not a terminal (a log file, CI), it is a plain line every `LINE_EVERY_S` seconds and one at the end.

A simulation reports through `SimProgress`, the callback `replay.simulator.Simulation.run` calls
(every `Simulation.PROGRESS_EVERY` time points, cheap: the callback itself draws at most every
`DRAW_EVERY_S` seconds of wall time): simulated time reached, jobs finished of those submitted,
events per second, elapsed and estimated time left (from the jobs finished so far). The other
commands go step by step (`StepProgress`: a run's log read, a plot drawn, a model validated).
"""

from __future__ import annotations

import sys
import time
from contextvars import ContextVar
from typing import IO, Any, Callable

DRAW_EVERY_S = 0.25
"""Least wall time between two redraws of a live display."""
LINE_EVERY_S = 10.0
"""Least wall time between two plain progress lines (stderr not a terminal, progress forced on)."""

SimCallback = Callable[[float, int, int, int], None]
"""(simulated seconds reached, events so far, jobs finished, jobs submitted so far)."""

current: ContextVar[SimCallback | None] = ContextVar("replay_progress", default=None)
"""The callback `replay.run.simulate` uses when it is given none (so a what-if, which calls it
inside `replay.whatif`, reports too)."""


def add_flag(parser: Any) -> None:
    import argparse

    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show progress on stderr (default: only when stderr is a terminal)")


def enabled(flag: bool | None, stream: IO[str] | None = None) -> bool:
    """`flag` where given, else whether `stream` (stderr) is a terminal."""
    if flag is not None:
        return bool(flag)
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or odd stream: no progress
        return False


def clock(seconds: float) -> str:
    """A wall-time span as h:mm:ss (or m:ss under an hour)."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def simulated(seconds: float) -> str:
    """Simulated time as hours (or minutes under an hour)."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def eta(elapsed: float, done: float, total: float) -> float:
    """Wall seconds left if the rest goes at the pace so far; inf before anything is done."""
    if total <= 0:
        return float("inf")
    if done >= total:
        return 0.0
    if done <= 0:
        return float("inf")
    return elapsed * (total - done) / done


class _Display:
    """One line of progress: a live rich bar on a terminal, else plain lines every LINE_EVERY_S."""

    def __init__(self, label: str, total: float, stream: IO[str] | None, live: bool | None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.live = enabled(None, self.stream) if live is None else live
        self.label, self.total = label, float(total)
        self.t0 = time.perf_counter()
        self._last_draw = float("-inf")
        self._last_line = self.t0
        self._progress = None
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn
            from rich.table import Column

            console = Console(file=self.stream, force_terminal=True, highlight=False)
            self._progress = Progress(TextColumn("{task.description}",
                                                 table_column=Column(no_wrap=True, min_width=min(len(label), 40))),
                                      BarColumn(bar_width=12),
                                      TextColumn("{task.fields[detail]}", markup=False), console=console, transient=True,
                                      auto_refresh=False)
            self._task = self._progress.add_task(label, total=max(self.total, 1.0), detail="")
            self._progress.start()

    def update(self, done: float, detail: str, *, force: bool = False) -> None:
        now = time.perf_counter()
        if self._progress is not None:
            if force or now - self._last_draw >= DRAW_EVERY_S:
                self._last_draw = now
                self._progress.update(self._task, completed=done, detail=detail)
                self._progress.refresh()
        elif force or now - self._last_line >= LINE_EVERY_S:
            self._last_line = now
            print(f"{self.label}: {detail}", file=self.stream, flush=True)

    def close(self, detail: str) -> None:
        if self._progress is not None:
            self._progress.stop()  # transient: the bar is erased, the command's own output follows
            self._progress = None
        else:
            print(f"{self.label}: {detail}", file=self.stream, flush=True)


class SimProgress:
    """The progress callback of one simulation (`SimCallback`), shown while it runs.

    `total_jobs`: the submissions in its input (the bar's length; the ETA assumes the jobs left
    finish at the pace of those finished so far, a rough guess early in a trace)."""

    def __init__(self, label: str, total_jobs: int, *, stream: IO[str] | None = None, live: bool | None = None) -> None:
        self.total_jobs = int(total_jobs)
        self._display = _Display(label, total_jobs, stream, live)
        self.last: tuple[float, int, int, int] = (0.0, 0, 0, 0)

    def detail(self) -> str:
        now, events, finished, submitted = self.last
        total = max(self.total_jobs, submitted)  # a what-if learns its submissions as it goes
        elapsed = time.perf_counter() - self._display.t0
        rate = events / elapsed if elapsed > 0 else 0.0
        left = eta(elapsed, finished, total)
        # the most telling first: a narrow terminal cuts the end off
        return (f"simulated {simulated(now)}, {finished}/{total} jobs done, ETA {clock(left)}, "
                f"{rate:,.0f} events/s, elapsed {clock(elapsed)}, {events:,} events, {submitted} submitted")

    def __call__(self, now: float, events: int, finished: int, submitted: int) -> None:
        self.last = (now, events, finished, submitted)
        d = self._display
        if submitted > d.total and d._progress is not None:
            d.total = float(submitted)
            d._progress.update(d._task, total=d.total)
        t = time.perf_counter()
        if (d._progress is not None and t - d._last_draw >= DRAW_EVERY_S) or \
                (d._progress is None and t - d._last_line >= LINE_EVERY_S):
            d.update(finished, self.detail())

    def close(self) -> None:
        self._display.close(self.detail() + " (finished)")

    def __enter__(self) -> "SimProgress":
        self._token = current.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        current.reset(self._token)
        self.close()


class ReplayProgress:
    """The progress callback of a replay check (`replay.verify.verify`): (events fed, events in the
    log, simulated seconds of the last one fed). Where the cores are checked in several processes,
    this process's share stands for the whole (the shares are balanced by weight)."""

    def __init__(self, label: str, *, stream: IO[str] | None = None, live: bool | None = None) -> None:
        self._display = _Display(label, 0, stream, live)
        self.last: tuple[int, int, float] = (0, 0, 0.0)

    def detail(self) -> str:
        fed, total, now = self.last
        elapsed = time.perf_counter() - self._display.t0
        rate = fed / elapsed if elapsed > 0 else 0.0
        return (f"simulated {simulated(now)}, {fed:,}/{total:,} events fed, ETA {clock(eta(elapsed, fed, total))}, "
                f"{rate:,.0f} events/s, elapsed {clock(elapsed)}")

    def __call__(self, fed: int, total: int, now: float) -> None:
        self.last = (fed, total, now)
        d = self._display
        if d._progress is not None and d.total != total:
            d.total = float(total)
            d._progress.update(d._task, total=max(d.total, 1.0))
        t = time.perf_counter()
        if (d._progress is not None and t - d._last_draw >= DRAW_EVERY_S) or \
                (d._progress is None and t - d._last_line >= LINE_EVERY_S):
            d.update(fed, self.detail())

    def close(self) -> None:
        self._display.close(self.detail() + " (finished)")

    def __enter__(self) -> "ReplayProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StepProgress:
    """Progress through a known number of steps (`advance(what)` after each)."""

    def __init__(self, label: str, total: int, *, stream: IO[str] | None = None, live: bool | None = None) -> None:
        self.total, self.done, self.what = int(total), 0, ""
        self._display = _Display(label, total, stream, live)
        self._display.update(0, self.detail(), force=self._display.live)

    def detail(self) -> str:
        elapsed = time.perf_counter() - self._display.t0
        return (f"{self.done}/{self.total}, ETA {clock(eta(elapsed, self.done, self.total))}, "
                f"elapsed {clock(elapsed)}" + (f": {self.what}" if self.what else ""))

    def step(self, what: str) -> None:
        """Say what is being done now (before it is done)."""
        self.what = what
        self._display.update(self.done, self.detail(), force=self._display.live)

    def advance(self, what: str = "") -> None:
        self.done += 1
        if what:
            self.what = what
        self._display.update(self.done, self.detail(), force=self._display.live)

    def close(self) -> None:
        self._display.close(self.detail() + " (finished)")

    def __enter__(self) -> "StepProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class NoProgress:
    """What a command uses with progress off: every call does nothing."""

    def __call__(self, *args: Any) -> None:
        return None

    def step(self, what: str) -> None:
        return None

    def advance(self, what: str = "") -> None:
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> "NoProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def steps(on: bool, label: str, total: int) -> StepProgress | NoProgress:
    return StepProgress(label, total, live=None) if on else NoProgress()


def sim(on: bool, label: str, total_jobs: int) -> SimProgress | NoProgress:
    return SimProgress(label, total_jobs, live=None) if on else NoProgress()


def replay(on: bool, label: str) -> ReplayProgress | NoProgress:
    return ReplayProgress(label, live=None) if on else NoProgress()
