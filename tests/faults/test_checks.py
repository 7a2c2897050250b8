"""The matrix's checks can fail: an acknowledged event missing from the log is counted lost, a file
taken out of the log leaves a gap, a log that lacks what the live stream has folds to another state, and
a log replay cannot rebuild the cores of (no run description) does not pass.
Real nats-server, real recorder and Parquet files."""

from __future__ import annotations

import asyncio
import time

from controlplane.recorder.service import Recorder, RecorderConfig, stream_token

from .harness import Deployment, Nats, Outcome, connect, registered, submission


async def test_a_lost_event_a_gap_and_a_state_that_differs_are_caught(tmp_path):
    d = Deployment(tmp_path)
    d.nats = Nats(tmp_path, 1)
    d.bus = await connect(d.nats.url)
    stop = asyncio.Event()
    recorder = Recorder(d.bus, RecorderConfig(d.log, roll_seconds=0.1), stream_token(await d.bus.stream_created()))
    task = asyncio.create_task(recorder.run(stop))
    try:
        t0 = time.time()
        await d.publish(registered("n1", t0))
        await asyncio.sleep(0.5)  # a file of its own
        for i in range(3):
            await d.publish(submission(i, t0))
        deadline = time.monotonic() + 30
        while len(list(d.log.glob("*.parquet"))) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        stop.set()
        await task
        last = await d.bus.last_seq()

        clean = await d.check(Outcome("none"), last)
        assert (clean.lost, clean.duplicates, clean.gaps, clean.state_equal) == (0, 0, 0, True), clean
        assert clean.replay_rc != 0 and not clean.survived  # no service described its core: nothing to replay

        d.acked.append("never-published")
        min(d.log.glob("*.parquet")).unlink()  # the first file: the node's registration
        broken = await d.check(Outcome("broken"), last)
        assert broken.lost == 2 and broken.gaps == 1  # the registration and the id never stored
        assert not broken.state_equal and not broken.survived
    finally:
        stop.set()
        await d.bus.close()
        d.nats.stop()
