"""Taking a known number of deliveries from a consumer in a test.

A consumer's `fetch(batch)` returns what has arrived once the first delivery is in: `batch` is a most, not a
promise, and on a loaded machine the server's later messages can come a moment after the first. A test that
expects n deliveries asks again until it has them or the time is up."""

from __future__ import annotations

import asyncio


async def fetch_all(consumer, want: int, timeout: float = 5.0) -> list:
    """Up to `want` deliveries from `consumer`, fetching again until there are that many or `timeout` has passed."""
    got: list = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(got) < want and loop.time() < deadline:
        got += await consumer.fetch(want - len(got), timeout=min(0.5, max(0.05, deadline - loop.time())))
    return got
