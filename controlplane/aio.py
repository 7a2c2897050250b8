"""Waits with a time limit that a cancellation always ends.

Every wait with a time limit in the shells is `asyncio.timeout`, never `asyncio.wait_for`: on Python 3.11,
`wait_for` swallows a cancellation that arrives as the awaited work completes and returns its result. A loop
cancelled at that moment goes on: a lease keeper cancelled as a renewal came back renewed for ever the lease
of a term that had ended, and its replica waited on it for ever.
"""

from __future__ import annotations

import asyncio


async def wait_or_timeout(event: asyncio.Event, timeout_s: float) -> bool:
    """Until `event` is set or `timeout_s` has passed; whether it is set."""
    try:
        async with asyncio.timeout(max(0.0, timeout_s)):
            await event.wait()
    except TimeoutError:
        pass
    return event.is_set()
