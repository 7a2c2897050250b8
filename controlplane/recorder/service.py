"""The recorder service: every message of the stream into the Parquet event log.

Crash safety comes from acknowledging late: messages are buffered, written to
a file atomically, and only then acknowledged (one ack covers the whole batch,
the consumer acks all earlier messages with it). After a crash JetStream
redelivers what was not acknowledged; sequences already in a file are skipped,
so the log has no gaps and no duplicate rows.

Messages are taken in stream order only. A server that goes away with a pull
reply in flight has counted those messages as delivered, so after it comes back
the recorder is handed later ones first; taking them would leave a hole, and the
ack-all after them would acknowledge the missing ones away. At a hole the
recorder writes and acknowledges what came before it and fetches again from the
first missing sequence. Only when a fetch started there is still handed a later
message first are the missing ones taken as gone from the stream (its limits or
a purge removed them), which is logged as an error and counted.

With `compact` (the default), after a file is written and more than
`compact_after` small closed files (under `roll_rows` rows) are listed, a thread
merges them (`compact.py`) while recording goes on; the file being written is
never one of them. A merge interrupted by a crash is resolved when the recorder
starts, before anything else.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from .. import metrics
from ..bus.base import Bus, Delivery
from ..bus.inorder import reopen_retrying
from .rows import row_of
from . import compact, locks, manifest
from .writer import TMP_PREFIX, clean_temporaries, recorded_max_seq, write_atomic

log = logging.getLogger(__name__)


def stream_token(identity: str) -> str:
    """A short file-name token for a stream's identity (its creation time)."""
    return hashlib.sha1(identity.encode()).hexdigest()[:10]


@dataclass
class RecorderConfig:
    log_dir: Path
    durable: str = "recorder"
    roll_rows: int = 200_000
    roll_bytes: int = 64 * 1024 * 1024
    roll_seconds: float = 2.0
    fetch_batch: int = 2000
    compact: bool = True
    """Merge small closed files in the background (`compact.py`)."""
    compact_after: int = 16
    """Merge once more than this many small files (under `roll_rows` rows) are listed."""


class Recorder:
    def __init__(self, bus: Bus, config: RecorderConfig, stream: str) -> None:
        self.bus = bus
        self.cfg = config
        self.stream = stream
        self.rows: list[tuple] = []
        self.bytes = 0
        self.last: Delivery | None = None
        self.first_buffered_at = 0.0
        self.max_seq = 0
        self.files_written = 0
        self.rows_written = 0
        self.skipped_duplicates = 0
        self.holes_refetched = 0
        self.gone_from_stream = 0
        """Messages the stream no longer had when the recorder came to them (never recorded)."""
        self._refetched_from: int | None = None
        self.on_flush = None  # optional callback(list_of_rows) for tests/benchmarks
        self.merges: list[compact.Merge] = []
        """The merges the background compaction made."""
        self._compacting: asyncio.Task | None = None
        self._stop_compacting = threading.Event()
        self.ready = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        log_dir = Path(self.cfg.log_dir)
        try:
            live = locks.hold_recording(log_dir, wait=False)
        except locks.Busy:
            log.warning("%s is being compacted by hand (rubick log compact): waiting for it", log_dir)
            live = await asyncio.to_thread(locks.hold_recording, log_dir)
        try:
            await self._run(log_dir, stop)
        finally:
            locks.release(live)

    async def _run(self, log_dir: Path, stop: asyncio.Event) -> None:
        for note in compact.recover(log_dir, self.stream):
            log.warning("%s", note)
        interrupted = set()
        for tmp in clean_temporaries(log_dir):
            log.warning("removed %s left by an interrupted write (its messages come again)", tmp.name)
            interrupted.add(tmp.name[len(TMP_PREFIX):])
        for note in manifest.repair(log_dir, self.stream, interrupted):
            log.warning("%s", note)
        self.max_seq = recorded_max_seq(log_dir, self.stream)
        consumer = await self._consumer()
        self.ready.set()
        lag_checked = 0.0
        try:
            while not stop.is_set():
                timeout = 0.25 if not self.rows else max(0.01, min(0.25, self._time_left()))
                msgs = await consumer.fetch(self.cfg.fetch_batch, timeout=timeout)
                hole = self._take(msgs)
                if hole is not None:
                    consumer = await self._refetch(consumer, hole)
                    continue
                if self._due():
                    await self.flush()
                now = time.monotonic()
                if now - lag_checked > 5.0:
                    lag_checked = now
                    lag = await consumer.lag()
                    if lag is not None:
                        metrics.CONSUMER_LAG.labels("recorder").set(lag)
            # drain what is already stored before stopping: nothing acked is left behind
            while True:
                msgs = await consumer.fetch(self.cfg.fetch_batch, timeout=0.2)
                if not msgs:
                    break
                hole = self._take(msgs)
                if hole is not None:
                    consumer = await self._refetch(consumer, hole)
                    continue
                if self._due():
                    await self.flush()
        finally:
            await self.flush()
            await consumer.close()
            if self._compacting is not None:
                self._stop_compacting.set()  # stops between merges; the one under way completes
                await asyncio.gather(self._compacting, return_exceptions=True)

    async def _consumer(self, start_seq: int | None = None):
        return await self.bus.consumer(self.cfg.durable, (">",), ack_all=True,
                                       ack_wait=max(60.0, 4 * self.cfg.roll_seconds),
                                       max_ack_pending=max(1_000_000, 2 * self.cfg.roll_rows), start_seq=start_seq)

    def _take(self, msgs: list[Delivery]) -> int | None:
        """Buffer the messages in stream order. At a hole (a message past the next sequence), stop and
        return its sequence: the messages before it were delivered but never arrived."""
        if not msgs:
            return None
        if not self.rows and self.last is None:
            self.first_buffered_at = time.monotonic()
        rows, max_seq, hole, taken = self.rows, self.max_seq, None, 0
        for m in msgs:
            if m.seq <= max_seq:
                self.skipped_duplicates += 1
            elif m.seq == max_seq + 1 or self._refetched_from == max_seq + 1:
                if m.seq != max_seq + 1:  # fetched again from the hole and still past it: gone from the stream
                    self.gone_from_stream += m.seq - max_seq - 1
                    log.error("messages %d..%d are not in the stream any more (removed by its limits or a purge): "
                              "they are not in the event log", max_seq + 1, m.seq - 1)
                self._refetched_from = None
                rows.append(row_of(m.seq, m.subject, m.data, m.msg_id, m.time))
                self.bytes += len(m.data)
                max_seq = m.seq
            else:
                hole = m.seq
                break
            self.last = m
            taken += 1
        self.max_seq = max_seq
        metrics.MESSAGES_IN.labels("recorder", "all").inc(taken)
        return hole

    async def _refetch(self, consumer, hole: int):
        """Write and acknowledge what came before a hole, then fetch again from its first sequence."""
        first = self.max_seq + 1
        log.warning("messages %d..%d were delivered but never arrived (the server or the connection went away with "
                    "them in flight): fetching them again", first, hole - 1)
        self.holes_refetched += 1
        await self.flush()
        await consumer.close()
        self._refetched_from = first
        return await reopen_retrying(lambda: self._consumer(start_seq=first), f"fetching again from message {first}")

    def _time_left(self) -> float:
        return self.cfg.roll_seconds - (time.monotonic() - self.first_buffered_at)

    def _due(self) -> bool:
        if self.last is None:
            return False
        return (len(self.rows) >= self.cfg.roll_rows or self.bytes >= self.cfg.roll_bytes
                or self._time_left() <= 0)

    async def flush(self) -> None:
        """Write buffered rows to a file, then acknowledge everything up to the last message."""
        step = max(1, self.cfg.roll_rows)
        for start in range(0, len(self.rows), step):
            rows = self.rows[start:start + step]
            path = await asyncio.to_thread(write_atomic, Path(self.cfg.log_dir), self.stream, rows)
            self.files_written += 1
            self.rows_written += len(rows)
            metrics.RECORDER_ROWS.inc(len(rows))
            metrics.RECORDER_FILES.inc()
            metrics.RECORDER_BYTES.inc(path.stat().st_size)
            if self.on_flush is not None:
                self.on_flush(rows)
        if self.last is not None:
            await self.last.ack()
        self.rows, self.bytes, self.last = [], 0, None
        if self.cfg.compact and (self._compacting is None or self._compacting.done()):
            self._compacting = asyncio.create_task(asyncio.to_thread(self._compact_closed))

    def _compact_closed(self) -> None:
        """In a thread: merge the small closed files once there are more than `compact_after`."""
        log_dir, target = Path(self.cfg.log_dir), max(1, self.cfg.roll_rows)
        found = manifest.read(log_dir, self.stream)
        if found is None or found.problems or compact.small_files(found.entries, target) <= self.cfg.compact_after:
            return
        try:
            merges = compact.compact(log_dir, self.stream, target, stop=self._stop_compacting.is_set)
        except (OSError, compact.CompactError, pl.exceptions.PolarsError) as exc:
            log.error("compacting %s failed (the log is unchanged where it stopped): %r", log_dir, exc)
            return
        self.merges.extend(merges)
        for m in merges:
            metrics.RECORDER_MERGES.inc()
            log.info("merged %d files into %s (%d rows)", len(m.sources), m.name, m.rows)
