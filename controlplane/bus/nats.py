"""The NATS JetStream bus: one stream over every control-plane subject.

All I/O with NATS is in this module. Publishes always carry a `Nats-Msg-Id`
(made up when the caller gives none), so a publish retried after a timeout is
stored once: JetStream drops the duplicate within its de-duplication window.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import uuid
from typing import AsyncIterator, Sequence
from urllib.parse import urlparse

from . import natspy  # noqa: F401  (first: nats-py without aiohttp until it is needed)

# isort: split
import nats
import nats.errors
import nats.js.errors
from nats.js import api

from ..aio import wait_or_timeout
from ..auth.credentials import Credentials
from ..auth.store import AuthError
from ..events.catalog import STREAM_NAME, STREAM_SUBJECTS
from . import nats_headers as header_client
from .base import Bus, Consumer, Delivery, PubAck

log = logging.getLogger(__name__)


class _QuietTlsClose(logging.Filter):
    """asyncio warns on every close of a TLS connection that the server ends first; nothing is wrong."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_QuietTlsClose())

MSG_ID = "Nats-Msg-Id"


def _ack_meta(reply: str) -> tuple[int, int, float, int, int]:
    """(stream seq, deliveries, stored time in s, pending, consumer seq) from a JetStream ack subject:
    $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>, or with
    <domain>.<account hash> after ACK."""
    t = reply.split(".")
    base = 2 if len(t) == 9 else 4
    return int(t[base + 3]), int(t[base + 2]), int(t[base + 5]) / 1e9, int(t[base + 6]), int(t[base + 4])


def _delivery(msg) -> Delivery:
    seq, deliveries, stored, _, consumer_seq = _ack_meta(msg.reply)
    headers = msg.headers
    # nats-py's nak takes its delay as this contract's does (none when 0)
    return Delivery(msg.subject, msg.data, seq, headers.get(MSG_ID) if headers else None, stored,
                    deliveries, msg.ack, msg.nak, consumer_seq)


def _differs(have: api.StreamConfig, want: api.StreamConfig) -> bool:
    """Whether the stream's configuration lacks what this deployment wants (only then is it changed). More
    replicas than wanted is not a lack: a service connecting with the default never takes copies away."""
    return (sorted(have.subjects or []) != sorted(want.subjects or []) or have.storage != want.storage
            or have.duplicate_window != want.duplicate_window or (have.num_replicas or 1) < want.num_replicas
            or have.retention != want.retention or have.discard != want.discard)


async def _reachable(url: str, timeout: float) -> None:
    """Fail fast when no server of `url` accepts a connection (reconnects later retry for ever)."""
    errors = []
    for server in url.split(","):
        parsed = urlparse(server.strip() if "://" in server else f"nats://{server.strip()}")
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 4222
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            writer.close()
            return
        except (OSError, asyncio.TimeoutError) as exc:
            errors.append(f"{host}:{port}: {exc or type(exc).__name__}")
    raise ConnectionError("no NATS server reachable (" + "; ".join(errors) + ")")


def _refused(exc: Exception) -> bool:
    """Whether a connection error means the server will never take this client as it is (wrong or missing
    credentials, a certificate that does not verify, TLS wanted on one side only)."""
    text = str(exc).lower()
    return (isinstance(exc, (nats.errors.AuthorizationError, ssl.SSLError, ssl.CertificateError))
            or any(w in text for w in ("authorization", "authentication", "tls", "ssl", "certificate",
                                       "secure connection", "nkey")))


def _refusal_text(url: str, exc: Exception, credentials: Credentials | None) -> str:
    used = credentials.describe() if credentials is not None else "no credentials"
    text = f"NATS at {redact_url(url)} refused the connection ({used}): {exc or type(exc).__name__}"
    if (credentials is None or credentials.seed_file is None) and "authoriz" in str(exc).lower():
        text += (". The server requires credentials: pass --creds FILE (an nkey seed), set RUBICK_NATS_CREDS, "
                 "or run where `rubick up` keeps them (<data-dir>/auth); see docs/security.md")
    return text


class Missing(Exception):
    """What `until_made` waits for is not there yet (the text says what)."""


async def until_made(make, stop: asyncio.Event, on_wait=None, every_s: float = 2.0, missing=(Missing,)):
    """`await make()` again every `every_s` seconds while it raises one of `missing` (something another
    component is to create first), calling `on_wait(str(exc))` the first time; its result, or None when
    `stop` is set first."""
    said = False
    while not stop.is_set():
        try:
            return await make()
        except missing as exc:
            if not said and on_wait is not None:
                on_wait(str(exc))
            said = True
        await wait_or_timeout(stop, every_s)
    return None


def redact_url(url: str) -> str:
    """A server URL fit to print: any user, password or token in it replaced by `***`."""
    out = []
    for server in url.split(","):
        scheme, sep, rest = server.partition("://")
        if sep and "@" in rest:
            rest = "***@" + rest.rsplit("@", 1)[1]
        out.append(scheme + sep + rest)
    return ",".join(out)


class JetStreamBus(Bus):
    def __init__(self, nc, js, stream: str) -> None:
        self.nc = nc
        self.js = js
        self.stream = stream
        self.violations: list[str] = []
        """Permission violations the server reported on this connection (newest last)."""
        self._violation_waiters: set[asyncio.Future] | None = None
        """Publishes waiting to hear of a violation (None: an unrestricted identity, nothing to watch)."""

    @classmethod
    async def connect(cls, url: str, *, name: str = "rubick", stream: str = STREAM_NAME,
                      subjects: Sequence[str] = STREAM_SUBJECTS, create_stream: bool = True,
                      dedupe_window: float = 120.0, storage: str = "file", replicas: int = 1,
                      connect_timeout: float = 5.0, credentials: Credentials | None = None) -> "JetStreamBus":
        """Connect (with `credentials`: an nkey seed and/or TLS) and, with `create_stream`, make sure the
        stream exists with this configuration (creating or changing it needs the bootstrap identity).

        Credentials the server refuses, a certificate that does not verify, or a server that wants
        credentials none were given for fail here with `AuthError` saying so, instead of a silent
        retry loop; an unreachable server fails with ConnectionError."""
        options = credentials.nats_options() if credentials is not None else {}
        loop = asyncio.get_running_loop()
        fatal: asyncio.Future = loop.create_future()
        bus: JetStreamBus | None = None

        async def on_error(exc: Exception) -> None:
            if bus is None and _refused(exc):
                if not fatal.done():
                    fatal.set_result(exc)
                return
            if bus is not None and "permissions violation" in str(exc).lower():
                bus._violated(str(exc))
                log.error("nats: %s (this identity may not do that; see docs/security.md)", exc)
                return
            log.warning("nats: %s", exc)

        await _reachable(url, connect_timeout)
        servers = [u.strip() for u in url.split(",") if u.strip()]  # a cluster's servers, comma-separated
        connecting = asyncio.ensure_future(header_client.connect(
            servers, name=name, connect_timeout=connect_timeout, max_reconnect_attempts=-1, reconnect_time_wait=0.25,
            allow_reconnect=True, error_cb=on_error, **options))
        await asyncio.wait([connecting, fatal], timeout=max(30.0, 3 * connect_timeout),
                           return_when=asyncio.FIRST_COMPLETED)
        if not connecting.done():
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
            exc = fatal.result() if fatal.done() else None
            raise AuthError(_refusal_text(url, exc, credentials)) if exc is not None else \
                ConnectionError(f"no connection to {redact_url(url)} in time")
        nc = connecting.result()
        js = nc.jetstream(timeout=5.0)
        bus = cls(nc, js, stream)
        if credentials is not None and credentials.seed_file is not None:
            bus._violation_waiters = set()  # a restricted identity may be refused a publish: watch for it
        if create_stream:
            await bus.ensure_stream(subjects, dedupe_window, storage, replicas)
        return bus

    async def ensure_stream(self, subjects: Sequence[str], dedupe_window: float, storage: str,
                            replicas: int) -> None:
        config = api.StreamConfig(
            name=self.stream, subjects=list(subjects), retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE if storage == "file" else api.StorageType.MEMORY,
            duplicate_window=dedupe_window, num_replicas=replicas, discard=api.DiscardPolicy.OLD,
        )
        try:
            info = await self.js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            info = None
        try:
            if info is None:
                await self.js.add_stream(config)
            elif _differs(info.config, config):
                config.num_replicas = max(replicas, info.config.num_replicas or 1)
                await self.js.update_stream(config)
        except (nats.errors.TimeoutError, asyncio.TimeoutError, nats.js.errors.APIError) as exc:
            denied = [v for v in self.violations if "$JS.API.STREAM" in v]
            if info is None or denied:
                raise PermissionError(
                    f"stream {self.stream} {'does not exist' if info is None else 'has an older configuration'} "
                    f"and this identity may not {'create' if info is None else 'change'} it "
                    f"({denied[-1] if denied else type(exc).__name__}): start `rubick up` or run "
                    "`rubick auth bootstrap` with the bootstrap identity first") from None
            raise

    async def _publish_watched(self, subject: str, data: bytes, msg_id: str, timeout: float):
        """A publish that fails at once when the server reports it may not be made, instead of after
        `timeout` (the server drops a forbidden publish and says so only asynchronously)."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(self.js.publish(subject, data, timeout=timeout, headers={MSG_ID: msg_id}))
        deadline = loop.time() + timeout + 0.5
        try:
            while True:
                waiter = loop.create_future()
                self._violation_waiters.add(waiter)
                try:
                    await asyncio.wait([task, waiter], timeout=max(0.0, deadline - loop.time()),
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    self._violation_waiters.discard(waiter)
                if task.done():
                    return task.result()
                denied = self.denied(subject)
                if denied:
                    raise PermissionError(f"not allowed to publish {subject}: {denied}")
                if loop.time() >= deadline:
                    raise nats.errors.TimeoutError
        finally:
            if not task.done():
                task.cancel()

    def _violated(self, text: str) -> None:
        self.violations.append(text)
        del self.violations[:-100]
        for waiter in list(self._violation_waiters or ()):
            if not waiter.done():
                waiter.set_result(None)

    def denied(self, subject: str) -> str | None:
        """The server's permission violation for publishing `subject` on this connection, if it reported one."""
        needle = f'publish to "{subject}"'.lower()
        return next((v for v in reversed(self.violations) if needle in v.lower()), None)

    async def stream_created(self) -> str:
        """Creation time of the stream: tells one stream's sequence numbers from another's."""
        info = await self.js.stream_info(self.stream)
        return str(info.created or "")

    async def publish(self, subject: str, data: bytes, msg_id: str | None = None, *, timeout: float = 2.0,
                      retries: int = 20) -> PubAck:
        msg_id = msg_id or uuid.uuid4().hex
        delay = 0.05
        for attempt in range(retries + 1):
            try:
                if self._violation_waiters is None:
                    ack = await self.js.publish(subject, data, timeout=timeout, headers={MSG_ID: msg_id})
                else:
                    ack = await self._publish_watched(subject, data, msg_id, timeout)
                return PubAck(seq=ack.seq, duplicate=bool(ack.duplicate))
            except (nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError,
                    nats.errors.ConnectionReconnectingError, nats.errors.ConnectionClosedError,
                    nats.js.errors.ServiceUnavailableError) as exc:
                denied = self.denied(subject)
                if denied:
                    raise PermissionError(f"not allowed to publish {subject}: {denied}") from None
                if attempt == retries:
                    raise
                log.info("publish %s retry %d after %s", subject, attempt + 1, type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    async def publish_many(self, items: Sequence[tuple[str, bytes, str | None]], *,
                           timeout: float = 5.0) -> list[PubAck]:
        """Asynchronous publishes with acknowledgements collected at the end.

        Any publish not acknowledged in time (the server went away, say) is retried one
        by one with the same message id, so it is stored exactly once.
        """
        ids = [m or uuid.uuid4().hex for _, _, m in items]
        futures: list[asyncio.Future | None] = []
        for (subject, data, _), msg_id in zip(items, ids):
            try:
                futures.append(await self.js.publish_async(subject, data, headers={MSG_ID: msg_id}))
            except Exception:  # not even sent: retried below
                futures.append(None)
        live = [f for f in futures if f is not None]
        if live:
            await asyncio.wait(live, timeout=timeout)
        acks: list[PubAck] = []
        for (subject, data, _), msg_id, fut in zip(items, ids, futures):
            if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
                ack = fut.result()
                acks.append(PubAck(seq=ack.seq, duplicate=bool(ack.duplicate)))
                continue
            if fut is not None and not fut.done():
                fut.cancel()
            acks.append(await self.publish(subject, data, msg_id))
        return acks

    async def consumer(self, durable: str, subjects: Sequence[str] = (">",), *, ack_wait: float = 30.0,
                       ack_all: bool = False, max_ack_pending: int = 100_000,
                       start_seq: int | None = None) -> Consumer:
        """A durable pull consumer that resumes right after its acknowledged position.

        When the durable exists (a restart), it is re-created starting at its ack floor + 1:
        messages that were delivered to the previous instance but not acknowledged come
        again at once and in stream order, instead of after `ack_wait` and after newer ones.
        With `start_seq` it is re-created starting there instead. One instance per durable name.
        """
        start = 1
        try:
            info = await self.js.consumer_info(self.stream, durable)
            start = int(info.ack_floor.stream_seq or 0) + 1 if info.ack_floor else 1
            await self.js.delete_consumer(self.stream, durable)
        except nats.js.errors.NotFoundError:
            pass
        if start_seq is not None:
            start = max(1, start_seq)
        config = api.ConsumerConfig(
            durable_name=durable, name=durable,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if start > 1 else api.DeliverPolicy.ALL,
            opt_start_seq=start if start > 1 else None,
            ack_policy=api.AckPolicy.ALL if ack_all else api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait, max_ack_pending=max_ack_pending, max_deliver=-1,
            filter_subjects=None if list(subjects) == [">"] else list(subjects),
        )
        await self.js.add_consumer(self.stream, config)
        sub = await self.js.pull_subscribe_bind(durable=durable, stream=self.stream,
                                                pending_msgs_limit=-1, pending_bytes_limit=-1)
        return _JetStreamConsumer(sub, start - 1)

    async def read(self, subjects: Sequence[str] = (">",), start_seq: int = 1,
                   end_seq: int | None = None) -> AsyncIterator[Delivery]:
        if end_seq is None:
            end_seq = await self.last_seq()
        if end_seq < start_seq:
            return
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start_seq),
            ack_policy=api.AckPolicy.NONE, inactive_threshold=30.0, mem_storage=True,
            filter_subjects=None if list(subjects) == [">"] else list(subjects),
        )
        sub = await self.js.pull_subscribe("", stream=self.stream, config=config)
        unavailable = 0
        try:
            while True:
                try:
                    msgs = await sub.fetch(1000, timeout=1.0)
                except (nats.errors.TimeoutError, asyncio.TimeoutError):
                    return
                except nats.js.errors.ServiceUnavailableError:  # JetStream still recovering (a server restarted)
                    unavailable += 1
                    if unavailable > 40:  # about 10 s
                        raise
                    await asyncio.sleep(0.25)
                    continue
                unavailable = 0
                for msg in msgs:
                    d = _delivery(msg)
                    if d.seq > end_seq:
                        return
                    yield d
                    if d.seq == end_seq or _ack_meta(msg.reply)[3] == 0:
                        return
        finally:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection may be gone; the consumer expires by itself
                pass

    async def wait_for_stream(self, stop: asyncio.Event, on_wait=None, every_s: float = 2.0) -> bool:
        """Wait until the stream exists (made by the deployment's bootstrap, which an identity that may only
        use it cannot do itself). `on_wait(text)` is called once when it has to wait. False when `stop` is
        set first."""
        async def probe() -> bool:
            try:
                return bool(await self.js.stream_info(self.stream))
            except nats.js.errors.NotFoundError:
                raise Missing(f"the stream {self.stream} does not exist yet") from None
        return bool(await until_made(probe, stop, on_wait, every_s))

    async def last_seq(self) -> int:
        info = await self.js.stream_info(self.stream)
        return int(info.state.last_seq)

    async def close(self) -> None:
        # Publishes are all acknowledged before they return, and acks are flushed here;
        # draining would wait for lingering pull requests, so close directly.
        if not self.nc.is_closed:
            try:
                await self.nc.flush(timeout=2)
            except Exception:
                pass
            await self.nc.close()


class _JetStreamConsumer(Consumer):
    """Pull consumer with one pull request kept outstanding and its replies drained in bulk.

    nats-py's `fetch` waits for each message of a batch separately (a task per message);
    here one wait covers the first message and the rest are taken from the subscription's
    queue as they arrive, which is several times cheaper per message.
    """

    def __init__(self, sub, base_floor: int = 0) -> None:
        self.sub = sub
        self.base_floor = base_floor
        self._queue: asyncio.Queue = sub._sub._pending_queue
        self._outstanding = 0  # messages still expected from the current pull request
        self._expires_at = 0.0

    async def _request(self, batch: int, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        if self._outstanding > 0 and loop.time() < self._expires_at:
            return
        expires = max(timeout, 0.05)
        request = json.dumps({"batch": batch, "expires": int(expires * 1e9)}).encode()
        await self.sub._js._nc.publish(self.sub._nms, request, self.sub._deliver)
        self._outstanding = batch
        self._expires_at = loop.time() + expires

    def _take(self, msg, out: list[Delivery]) -> None:
        headers = msg.headers
        status = headers.get("Status") if headers and not msg.data else None
        if status is not None:
            if status in ("404", "408", "409"):  # no messages / request expired / limits: request done
                self._outstanding = 0
            return  # 100 = heartbeat
        self._outstanding -= 1
        out.append(_delivery(msg))

    async def fetch(self, batch: int = 256, timeout: float = 1.0) -> list[Delivery]:
        out: list[Delivery] = []
        q = self._queue
        while not q.empty() and len(out) < batch:
            self._take(q.get_nowait(), out)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not out:
            await self._request(batch, max(0.05, deadline - loop.time()))
            remaining = min(deadline, self._expires_at) - loop.time()
            if remaining <= 0 and deadline <= loop.time():
                return out
            try:
                async with asyncio.timeout(max(0.001, remaining)):
                    msg = await q.get()
            except TimeoutError:
                if loop.time() >= deadline:
                    return out
                continue
            self._take(msg, out)
        # take what else has arrived, letting the reader parse more while the request is live
        idle = 0
        while len(out) < batch and self._outstanding > 0 and idle < 2:
            if q.empty():
                idle += 1
                await asyncio.sleep(0)
                continue
            idle = 0
            while not q.empty() and len(out) < batch:
                self._take(q.get_nowait(), out)
        return out

    async def lag(self) -> int | None:
        try:
            info = await self.sub.consumer_info()
        except (nats.errors.Error, asyncio.TimeoutError, OSError) as exc:  # the server is away or slow
            log.debug("consumer lag not known now: %s", exc)
            return None
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def ack_floor(self) -> int:
        info = await self.sub.consumer_info()
        floor = int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0
        return max(floor, self.base_floor)

    async def close(self) -> None:
        try:
            await self.sub.unsubscribe()
        except Exception:
            pass
