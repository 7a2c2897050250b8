"""The in-training reporter: training code publishes `metrics.iteration` with a few lines.

    reporter = Reporter.from_run(run)               # or Reporter(job_id=..., model_type=..., ...)
    for it in range(start, target):
        with reporter.step(it):                     # iteration time
            with reporter.phase("fwd"): loss = engine(x, y)
            with reporter.phase("bwd"): engine.backward(loss)
            with reporter.phase("opt"): engine.step()
    reporter.close()

or, with DeepSpeed, `engine = reporter.timed(engine)` times forward, backward and step
itself and closes an iteration at every gradient-accumulation boundary.

Publishing happens on a background thread with its own NATS connection. Training never
waits for it: measurements go into a bounded buffer, and when NATS is away they stay
there and are sent when it is back (the oldest are dropped past `buffer` entries). Each
message id is `<job>-a<attempt>-i<iteration>`, so a resend is stored once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from typing import Any, Iterator, Sequence

from controlplane.events import MetricsIteration, Plan, build, encode, make

log = logging.getLogger(__name__)

PHASES = ("fwd", "bwd", "opt")


class Reporter:
    def __init__(self, *, job_id: str, model_type: str, plan: Plan, gpus_per_node: Sequence[int],
                 nats_url: str | None, node: str = "", cpus_per_gpu: int | None = None, attempt: int = 1,
                 buffer: int = 10_000, source: str = "reporter", credentials: Any = None) -> None:
        self.job_id, self.model_type, self.plan = job_id, model_type, plan
        self.credentials = credentials
        """`controlplane.auth.Credentials`; None: those the agent named in the environment (docs/security.md)."""
        self.gpus_per_node = tuple(gpus_per_node)
        self.node, self.cpus_per_gpu, self.attempt = node, cpus_per_gpu, attempt
        self.nats_url, self.source = nats_url, source
        self.published = 0
        self.dropped = 0
        self._queue: collections.deque[tuple[str, bytes, str]] = collections.deque()
        self._buffer = buffer
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._phases: dict[str, float] = {}
        self._step_t0: float | None = None
        self.last: dict[str, float | None] = {}
        """The latest measurement: iter_time_s, fwd_s, bwd_s, opt_s."""
        self._thread: threading.Thread | None = None
        if nats_url:
            self._thread = threading.Thread(target=self._run, name="rubick-reporter", daemon=True)
            self._thread.start()

    @classmethod
    def from_run(cls, run: dict[str, Any], **kw: Any) -> "Reporter":
        """From the run file the agent writes for each launch (see agents.launcher)."""
        return cls(job_id=run["job_id"], model_type=run["model_type"], plan=build(Plan, run["plan"]),
                   gpus_per_node=run["gpus_per_node"], nats_url=run.get("nats_url"), node=run.get("node", ""),
                   cpus_per_gpu=run.get("cpus_per_gpu"), attempt=run.get("attempt", 1), **kw)

    # --- measuring ------------------------------------------------------------------
    def step_begin(self) -> None:
        self._step_t0 = time.perf_counter()
        self._phases = {}

    def step_end(self, iteration: int) -> float:
        """Close the iteration begun by `step_begin`, queue its measurement, return its time."""
        if self._step_t0 is None:
            raise RuntimeError("step_end without step_begin")
        elapsed = max(time.perf_counter() - self._step_t0, 1e-9)
        self._step_t0 = None
        self.report(iteration, elapsed, **{f"{k}_s": self._phases.get(k) for k in PHASES})
        return elapsed

    @contextlib.contextmanager
    def step(self, iteration: int) -> Iterator[None]:
        self.step_begin()
        yield
        self.step_end(iteration)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time of the block to phase `name` (fwd, bwd or opt) of the current iteration."""
        if name not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {name!r}")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - t0

    def timed(self, engine: Any, start_iteration: int = 0) -> "TimedEngine":
        return TimedEngine(engine, self, start_iteration)

    def report(self, iteration: int, iter_time_s: float, *, fwd_s: float | None = None, bwd_s: float | None = None,
               opt_s: float | None = None) -> None:
        """Queue one measurement; returns at once."""
        self.last = {"iter_time_s": iter_time_s, "fwd_s": fwd_s, "bwd_s": bwd_s, "opt_s": opt_s}
        payload = MetricsIteration(job_id=self.job_id, model_type=self.model_type, iteration=iteration,
                                   iter_time_s=iter_time_s, plan=self.plan, gpus_per_node=self.gpus_per_node,
                                   node=self.node, cpus_per_gpu=self.cpus_per_gpu, fwd_s=fwd_s, bwd_s=bwd_s,
                                   opt_s=opt_s)
        msg_id = f"{self.job_id}-a{self.attempt}-i{iteration}"
        subject = f"metrics.iteration.{self.node}" if self.node else "metrics.iteration"
        event = make(subject, payload, time=time.time(), id=msg_id, source=self.source)
        with self._lock:
            if len(self._queue) >= self._buffer:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append((event.subject, encode(event), msg_id))
        self._wake.set()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is buffered (waiting at most `timeout` s), then stop the thread."""
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline and self._thread.is_alive():
            self._wake.set()
            time.sleep(0.02)
        self._stop.set()
        self._wake.set()
        self._thread.join(max(0.1, deadline - time.monotonic()))
        self._thread = None

    # --- the publishing thread ------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._publish_loop())
        except Exception:  # never let the reporter take training down
            log.exception("reporter stopped")

    async def _publish_loop(self) -> None:
        from controlplane.auth import AuthError
        from controlplane.auth.credentials import credentials_from_env
        from controlplane.bus.nats import JetStreamBus

        bus = None
        backoff = 0.2
        while not self._stop.is_set():
            if bus is None:
                try:
                    bus = await JetStreamBus.connect(self.nats_url, name=f"reporter-{self.job_id}",
                                                     credentials=self.credentials or credentials_from_env(),
                                                     create_stream=False, connect_timeout=2.0)
                    backoff = 0.2
                except AuthError as exc:  # said once per attempt, loudly: it will not mend by itself
                    log.error("reporter: %s; %d buffered", exc, self.pending)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                except Exception as exc:
                    log.info("reporter: NATS not reachable (%s); %d buffered", exc, self.pending)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
            with self._lock:
                item = self._queue[0] if self._queue else None
            if item is None:
                await asyncio.to_thread(self._wake.wait, 0.5)
                self._wake.clear()
                continue
            try:
                await bus.publish(item[0], item[1], item[2], timeout=1.0, retries=2)
            except Exception as exc:
                log.info("reporter: publish failed (%s); will retry", type(exc).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            with self._lock:
                if self._queue and self._queue[0] is item:
                    self._queue.popleft()
            self.published += 1
        if bus is not None:
            await bus.close()


class TimedEngine:
    """A DeepSpeed engine whose forward, backward and step are timed for the reporter.

    An iteration ends at each gradient-accumulation boundary (`engine.step()` that updates)."""

    def __init__(self, engine: Any, reporter: Reporter, start_iteration: int = 0) -> None:
        self.engine, self.reporter, self.iteration = engine, reporter, start_iteration
        self.last_iter_time_s: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def __call__(self, *args: Any, **kw: Any) -> Any:
        if self.reporter._step_t0 is None:
            self.reporter.step_begin()
        with self.reporter.phase("fwd"):
            return self.engine(*args, **kw)

    def backward(self, loss: Any, **kw: Any) -> Any:
        with self.reporter.phase("bwd"):
            return self.engine.backward(loss, **kw)

    def step(self, **kw: Any) -> Any:
        boundary = self.engine.is_gradient_accumulation_boundary()
        with self.reporter.phase("opt"):
            out = self.engine.step(**kw)
        if boundary:
            self.last_iter_time_s = self.reporter.step_end(self.iteration)
            self.iteration += 1
        return out
