"""One active replica per service: a lease in a NATS key-value bucket.

Every replica of a service (`rubick service NAME`, started two or more times) competes for the key
`NAME` of the bucket `rubick-leases`. The bucket's TTL (its entries' maximum age) is the lease's time
to live: an entry nobody renews is removed by the server that long after it was written. A replica
holds the lease from a successful `create` (the key is absent) and keeps it by `update`s that name
the revision it last wrote; a replica that took the key over in between makes such an update fail.

The holder counts the lease as held only until `deadline_s` after it *sent* its last successful
renewal (`deadline_s` < the TTL): the entry lives at least the TTL from then, so a holder that is
paused, partitioned or slow stops processing before the server can let a standby take over. Before
handling each message the active replica checks `held()`; what it publishes carries ids derived from
its inputs (`Nats-Msg-Id`), so an input handled again after a take-over is stored once.

A standby polls the key and takes it over once it is gone (a dead holder: the TTL after its last
renewal; a holder that stopped cleanly deletes its key at once).

Creating the bucket is a deployment's bootstrap step (`ensure_lease_bucket`: `rubick up`, or a
`rubick service` allowed to create streams); ordinary replicas only bind to it (`lease_bucket`).
This is a shell-side module: no core imports it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from .bus import natspy  # noqa: F401  (first: nats-py without aiohttp until it is needed)

# isort: split
import nats.errors
import nats.js.errors
from nats.js import api
from nats.js.kv import KeyValue

from .aio import wait_or_timeout

log = logging.getLogger(__name__)

BUCKET = "rubick-leases"
DEFAULT_TTL_S = 5.0
"""Time to live of a lease that is not renewed: a standby takes over about this long after the
active replica died."""


class LeaseBucketMissing(RuntimeError):
    """The lease bucket does not exist and this identity may not (or was told not to) create it."""


class LeaseLost(RuntimeError):
    """Raised inside an active term when the lease is no longer held: stop processing at once."""


@dataclass(frozen=True)
class LeaseTerms:
    """The timing of a lease, all derived from the bucket's TTL."""

    ttl_s: float
    renew_every_s: float
    deadline_s: float
    """How long after sending its last successful renewal the holder counts the lease held."""
    poll_s: float
    """How often a standby looks whether the lease is free."""

    @classmethod
    def of_ttl(cls, ttl_s: float) -> "LeaseTerms":
        if not ttl_s > 0:
            raise ValueError(f"lease TTL must be > 0 s, got {ttl_s!r}")
        return cls(ttl_s=ttl_s, renew_every_s=ttl_s / 5, deadline_s=ttl_s * 0.6, poll_s=min(0.25, ttl_s / 10))

    def __post_init__(self) -> None:
        if not 0 < self.renew_every_s < self.deadline_s < self.ttl_s:
            raise ValueError(f"lease terms need 0 < renew_every_s < deadline_s < ttl_s, got {self}")


async def ensure_lease_bucket(js, ttl_s: float = DEFAULT_TTL_S, replicas: int = 1) -> KeyValue:
    """The lease bucket, created with `ttl_s` where it does not exist yet (an existing bucket keeps
    its TTL). For the deployment's bootstrap identity."""
    try:
        return await js.key_value(BUCKET)
    except nats.js.errors.BucketNotFoundError:
        pass
    log.info("creating the lease bucket %s (TTL %g s)", BUCKET, ttl_s)
    return await js.create_key_value(api.KeyValueConfig(bucket=BUCKET, history=1, ttl=ttl_s, replicas=replicas,
                                                        description="rubick: one active replica per service"))


async def lease_bucket(js) -> KeyValue:
    """The existing lease bucket (for replicas that use it but may not create it)."""
    try:
        return await js.key_value(BUCKET)
    except nats.js.errors.BucketNotFoundError:
        raise LeaseBucketMissing(f"the lease bucket {BUCKET!r} does not exist: start the deployment's bootstrap "
                                 "(`rubick up`, or a `rubick service` allowed to create it) first") from None


async def bucket_terms(kv: KeyValue) -> LeaseTerms:
    status = await kv.status()
    ttl = status.ttl
    if not ttl:
        raise LeaseBucketMissing(f"the lease bucket {BUCKET!r} has no TTL: a dead holder would keep it for ever")
    return LeaseTerms.of_ttl(float(ttl))


def replica_id() -> str:
    """This process's name in the lease: host, pid and a random part (a restart is a new replica)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


_RETRIED = (nats.errors.Error, asyncio.TimeoutError, OSError)


@dataclass
class Lease:
    kv: KeyValue
    key: str
    holder: str
    terms: LeaseTerms
    clock: Callable[[], float] = time.monotonic
    revision: int | None = None
    valid_until: float = 0.0
    terms_held: int = 0
    """How often this replica became active."""
    acquired_at: float = 0.0
    _refused: bool = field(default=False, repr=False)

    def held(self) -> bool:
        return self.revision is not None and not self._refused and self.clock() < self.valid_until

    async def holder_now(self) -> str | None:
        """Who holds the lease now, as the bucket says (None: nobody)."""
        try:
            entry = await self.kv.get(self.key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        return entry.value.decode(errors="replace") if entry.value else None

    async def try_acquire(self) -> bool:
        sent = self.clock()
        try:
            async with asyncio.timeout(self.terms.deadline_s):
                rev = await self.kv.create(self.key, self.holder.encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except _RETRIED as exc:
            log.debug("lease %s: acquiring failed (%s)", self.key, exc)
            return False
        self.revision, self.valid_until, self._refused = rev, sent + self.terms.deadline_s, False
        self.terms_held += 1
        self.acquired_at = self.clock()
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica holds the lease (True) or `stop` is set (False)."""
        while not stop.is_set():
            if await self.try_acquire():
                return True
            await wait_or_timeout(stop, self.terms.poll_s)
        return False

    async def renew(self) -> bool:
        """One renewal; False when it failed (the lease may still be held until its deadline)."""
        if self.revision is None or self._refused:
            return False
        sent = self.clock()
        try:
            async with asyncio.timeout(max(0.01, self.valid_until - sent)):
                rev = await self.kv.update(self.key, self.holder.encode(), last=self.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            log.warning("lease %s: taken over by another replica", self.key)
            self._refused = True
            return False
        except _RETRIED as exc:
            log.info("lease %s: renewal failed (%s)", self.key, exc)
            return False
        self.revision, self.valid_until = rev, sent + self.terms.deadline_s
        return True

    async def keep(self, lost: asyncio.Event, done: asyncio.Event | None = None) -> None:
        """Renew until `done` is set or the task is cancelled; set `lost` as soon as the lease is no longer held.

        A cancellation alone cannot be relied on to end it: nats-py waits for the server's answer with
        `asyncio.wait_for`, which on Python 3.11 swallows a cancellation arriving as the answer does (the
        renewal returns as if nothing happened). So the keeper also stops on `done`, and on a cancellation it
        sees pending (`Task.cancelling()`) after any renewal; a keeper that went on would renew for ever the
        lease of a term that has ended."""
        done = asyncio.Event() if done is None else done
        me = asyncio.current_task()
        next_renew = self.clock() + self.terms.renew_every_s
        while self.held() and not done.is_set():
            wait = min(next_renew, self.valid_until) - self.clock()
            if wait > 0 and await wait_or_timeout(done, wait):
                return
            if self.clock() >= next_renew:
                ok = await self.renew()
                if me is not None and me.cancelling():
                    raise asyncio.CancelledError
                next_renew = self.clock() + (self.terms.renew_every_s if ok else self.terms.poll_s)
        if done.is_set():
            return
        log.warning("lease %s: lost (held %s)", self.key, self.holder)
        lost.set()

    async def release(self) -> None:
        """Give the lease up at once (a standby takes over without waiting for the TTL)."""
        rev, self.revision = self.revision, None
        if rev is None or self._refused:
            return
        try:
            async with asyncio.timeout(self.terms.deadline_s):
                await self.kv.delete(self.key, last=rev)
        except (nats.js.errors.KeyWrongLastSequenceError, *_RETRIED) as exc:
            log.info("lease %s: not released (%s); it expires by itself", self.key, exc)


Term = Callable[[asyncio.Event, Lease], Awaitable[None]]


async def run_replicated(lease: Lease, term: Term, stop: asyncio.Event,
                         on_standby: Callable[[], None] | None = None) -> None:
    """Be a standby until the lease is ours, run `term(term_stop, lease)` while it is, and go back to
    standby when it is lost; until `stop`. `term_stop` is set when `stop` is, or when the lease is
    lost; the term must stop at once then (and check `lease.held()` before each message). A term
    that returns while the lease is held ends the loop (its service stopped by itself)."""
    while not stop.is_set():
        if not await lease.try_acquire():
            if on_standby is not None:
                on_standby()
            if not await lease.acquire(stop):
                return
        term_stop, term_done = asyncio.Event(), asyncio.Event()
        keeper = asyncio.create_task(lease.keep(term_stop, term_done), name=f"lease-{lease.key}")
        stopper = asyncio.create_task(_relay(stop, term_stop))
        lost_in_term = False
        try:
            await term(term_stop, lease)
        except LeaseLost:
            log.warning("lease %s: lost in the middle of a term; standing by", lease.key)
            lost_in_term = True
        except Exception as exc:  # NATS away, or a server of a cluster gone: what the term asked timed out
            if lease.held() and not isinstance(exc, _RETRIED):
                raise
            log.warning("lease %s: the term ended on %s (%s); standing by", lease.key, type(exc).__name__,
                        "NATS not answering" if isinstance(exc, _RETRIED) else "the lease was lost")
            lost_in_term = True
            await wait_or_timeout(stop, lease.terms.poll_s)  # before trying again
        finally:
            term_done.set()
            stopper.cancel()
            keeper.cancel()
            await asyncio.gather(keeper, stopper, return_exceptions=True)
            # a renewal in flight may have made the lease valid again after the term saw it lost: the term
            # ended all the same, and must be run again, not taken for a service that stopped by itself
            lost = lost_in_term or not lease.held() or (term_stop.is_set() and not stop.is_set())
            await lease.release()
        if not lost and not stop.is_set():
            return


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()
