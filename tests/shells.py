"""Running a service shell in a test until it has dealt with everything stored for it."""

from __future__ import annotations

import asyncio

from controlplane.service import ServiceShell


async def run_until_done(shell: ServiceShell, bus, *, until: int = 0, timeout_s: float = 30.0) -> ServiceShell:
    """Run `shell` until the bus holds at least `until` messages and the shell is past the last stored message of
    its subjects (its own answers among them), then stop it. It waits on the shell's stream position
    (`ServiceShell.seq`): counts of handled and rebuilt messages miss the ones refused at decoding, and a shell run
    again rebuilds what it had handled before (its `ready` is cleared, so this run's is waited for)."""
    shell.ready.clear()
    stop = asyncio.Event()
    task = asyncio.create_task(shell.run(stop))
    try:
        for _ in range(int(timeout_s / 0.01)):
            await asyncio.sleep(0.01)
            stored = await bus.last_seq()
            last = 0
            async for d in bus.read(tuple(shell.core.subjects), 1, stored):
                last = d.seq
            if stored >= until and shell.ready.is_set() and shell.seq >= last:
                break
        else:
            raise AssertionError(f"the shell got to seq {shell.seq} of {await bus.last_seq()} in {timeout_s:g} s")
    finally:
        stop.set()
        await task
    return shell
