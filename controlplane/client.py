"""Python API for external systems: validate a job and publish `job.submitted`.

    from controlplane.client import Client, load_job

    job = load_job("examples/jobs/gpt2-guaranteed.yaml")      # or build a JobSubmitted yourself
    async with await Client.connect("nats://127.0.0.1:4222") as client:
        result = await client.submit(job)                      # returns once the verdict is known
        if result.rejected:
            print(result.rejected.reason)

Everything is validated before it is sent: a bad job raises `Invalid` naming
the field, and nothing is published.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bus import natspy  # noqa: F401  (first: nats-py without aiohttp until it is needed)

# isort: split
import nats
import nats.errors
import nats.js.errors
import yaml

from .auth import Credentials, Identity, find_credentials
from .bus.nats import JetStreamBus, redact_url
from .events import (
    Event,
    Invalid,
    JobSubmitted,
    Rejected,
    build,
    decode,
    encode,
    make,
    new_id,
)
from .events.catalog import rejection_subject
from .events.payloads import JobControl, JobPriority, QuotaSet
from .events.schema import to_plain

VERDICT_DURABLES = ("svc-admission", "svc-policy")
"""The consumers of the services that may refuse a submission."""


def job_from_dict(doc: Any) -> JobSubmitted:
    return build(JobSubmitted, doc)


def load_job(path: str | Path) -> JobSubmitted:
    """Read and validate a job file (YAML or JSON, the fields of `job.submitted`)."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise Invalid(f"no such file: {path}") from None
    except OSError as exc:
        raise Invalid(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise Invalid(f"{path} is not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise Invalid(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise Invalid(f"{path} is nested too deeply to be a job") from None
    return job_from_dict(doc)


def job_to_dict(job: JobSubmitted) -> dict:
    return to_plain(job)


def submission(job: JobSubmitted, *, source: str = "client", time: float | None = None,
               event_id: str | None = None) -> Event:
    import time as _time
    return make("job.submitted", job, time=_time.time() if time is None else time,
                id=event_id or new_id("sub-"), source=source)


@dataclass
class SubmitResult:
    event: Event
    seq: int
    duplicate: bool
    rejected: Rejected | None = None


class Client:
    def __init__(self, bus: JetStreamBus) -> None:
        self.bus = bus

    @classmethod
    async def connect(cls, nats_url: str, *, connect_timeout: float = 3.0, credentials: Credentials | None = None,
                      data_dir: str | Path | None = None, identity: Identity | None = None) -> "Client":
        """Connect as a submitter. Without `credentials`, they are found as every command finds them
        ($RUBICK_NATS_CREDS, or the `rubick up` of `data_dir`, default .rubick): see docs/security.md.
        Refused or missing credentials raise `AuthError` saying what is missing."""
        if credentials is None:
            from .endpoints import DEFAULT_DATA_DIR, read_endpoints
            folder = Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR
            credentials = find_credentials(identity or Identity("submitter"), data_dir=folder,
                                           endpoints=read_endpoints(folder))
        try:
            bus = await JetStreamBus.connect(nats_url, name="rubick-client", create_stream=False,
                                             connect_timeout=connect_timeout, credentials=credentials)
        except (nats.errors.NoServersError, OSError, asyncio.TimeoutError) as exc:
            raise ConnectionError(f"cannot reach NATS at {redact_url(nats_url)}: {exc or type(exc).__name__}") from None
        return cls(bus)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def publish(self, event: Event) -> int:
        ack = await self.bus.publish(event.subject, encode(event), event.id)
        return ack.seq

    async def submit(self, job: JobSubmitted, *, wait_s: float = 2.0, source: str = "client") -> SubmitResult:
        """Publish `job.submitted` and return its verdict as soon as it is known: its `job.rejected`, or
        None once every service that may refuse it has acknowledged it (each publishes a refusal before it
        acknowledges what it refused). `wait_s` bounds the wait (0: do not wait for a verdict)."""
        return await self._judged(submission(job, source=source), wait_s)

    async def cancel(self, job_id: str, *, tenant: str | None = None, reason: str = "", wait_s: float = 2.0,
                     source: str = "client") -> SubmitResult:
        """Ask for a job to be cancelled: its resources are freed at the policy's next round (at once), its
        processes checkpoint and stop, and it ends `cancelled`. The verdict as for `submit`: a
        `job.rejected` naming why (unknown job, already over, another tenant's), or None."""
        return await self._control("job.cancel", job_id, tenant, reason, wait_s, source)

    async def suspend(self, job_id: str, *, tenant: str | None = None, reason: str = "", wait_s: float = 2.0,
                      source: str = "client") -> SubmitResult:
        """Ask for a job to be held: its processes checkpoint and stop and it gets no resources until resumed."""
        return await self._control("job.suspend", job_id, tenant, reason, wait_s, source)

    async def resume(self, job_id: str, *, tenant: str | None = None, reason: str = "", wait_s: float = 2.0,
                     source: str = "client") -> SubmitResult:
        """Ask for a suspended job to be scheduled again; it resumes from its checkpoint."""
        return await self._control("job.resume", job_id, tenant, reason, wait_s, source)

    async def set_priority(self, job_id: str, priority: int, *, tenant: str | None = None, reason: str = "",
                           wait_s: float = 2.0, source: str = "client") -> SubmitResult:
        """Change a job's priority (`job.priority`): the policy applies it at once. The verdict as for `submit`:
        a `job.rejected` naming why (a priority out of range, an unknown job, one already over, another
        tenant's), or None."""
        import time as _time
        payload = build(JobPriority, {"job_id": job_id, "priority": priority, "tenant": tenant, "reason": reason})
        event = make("job.priority", payload, time=_time.time(), id=new_id("prio-"), source=source)
        return await self._judged(event, wait_s)

    async def set_quota(self, tenant: str, gpus: int | None = None, *, share: float | None = None,
                        new_tenant: bool = False, reason: str = "", wait_s: float = 2.0,
                        source: str = "client") -> SubmitResult:
        """Set a tenant's quota (`quota.set`; the bootstrap identity's right): the GPUs its guaranteed jobs
        may hold, or their `share` (0..1) of the live nodes' GPUs, applied by the policy at once. The verdict:
        a `quota.rejected` naming why (an unknown tenant without `new_tenant`, more GPUs than the cluster
        has), or None."""
        import time as _time
        payload = build(QuotaSet, {"tenant": tenant, "gpus": gpus, "share": share, "new_tenant": new_tenant,
                                   "reason": reason})
        event = make("quota.set", payload, time=_time.time(), id=new_id("quota-"), source=source)
        return await self._judged(event, wait_s)

    async def _control(self, subject: str, job_id: str, tenant: str | None, reason: str, wait_s: float,
                       source: str) -> SubmitResult:
        import time as _time
        event = make(subject, build(JobControl, {"job_id": job_id, "tenant": tenant, "reason": reason}),
                     time=_time.time(), id=new_id(subject.split(".")[1][:4] + "-"), source=source)
        return await self._judged(event, wait_s)

    async def publish_judged(self, event: Event, wait_s: float = 2.0) -> SubmitResult:
        """Publish a submission or an owner's request made by hand (its own id and time: a simulated
        cluster's clock, say) and wait, at most `wait_s`, for its verdict as `submit` does."""
        return await self._judged(event, wait_s)

    async def _judged(self, event: Event, wait_s: float) -> SubmitResult:
        """Publish `event` and wait (at most `wait_s`) for its verdict."""
        sub = await self.bus.nc.subscribe(rejection_subject(event.subject)) if wait_s > 0 else None
        try:
            ack = await self.bus.publish(event.subject, encode(event), event.id)
            rejected = await self._verdict(sub, event.id, ack.seq, wait_s) if sub is not None else None
        finally:
            if sub is not None:
                await sub.unsubscribe()
        return SubmitResult(event, ack.seq, ack.duplicate, rejected)

    async def _verdict(self, sub, event_id: str, seq: int, wait_s: float) -> Rejected | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        durables = list(VERDICT_DURABLES)
        seen: set[str] = set()
        pause = 0.002
        while True:
            answered = bool(durables) and await self._acknowledged(durables, seq, deadline - loop.time(), seen)
            # a refusal is delivered before the answer that says it was acknowledged: it is queued by now
            listen = 0.001 if answered else max(0.001, min(pause, deadline - loop.time()))
            rejected = await _refusal(sub, event_id, listen)
            if rejected is not None or answered or loop.time() >= deadline:
                return rejected
            pause = min(2 * pause, 0.05)

    async def _acknowledged(self, durables: list[str], seq: int, timeout: float, seen: set[str]) -> bool:
        """Whether every running service of `durables` has acknowledged stream sequence `seq`. A service
        with no consumer is dropped from `durables`; an error (no answer, no permission) empties it. A consumer
        `seen` earlier in this wait that is missing now is being re-created by its service, which is starting
        again (`JetStreamBus.consumer`): it is waited for, not dropped."""
        for durable in list(durables):
            try:
                info = await self.bus.js.consumer_info(self.bus.stream, durable, timeout=max(0.05, min(timeout, 1.0)))
            except nats.js.errors.NotFoundError:
                if durable in seen:
                    return False
                durables.remove(durable)
                continue
            except Exception:  # noqa: BLE001 - cannot tell: wait for a refusal until the deadline
                durables.clear()
                return False
            seen.add(durable)
            floor = info.ack_floor.stream_seq if info.ack_floor else 0
            if int(floor or 0) < seq:
                return False
        return bool(durables)

    async def close(self) -> None:
        await self.bus.close()


async def _refusal(sub, event_id: str, timeout: float) -> Rejected | None:
    """The refusal of `event_id` among the messages `sub` has received, waiting at most `timeout` for one."""
    while True:
        try:
            msg = await sub.next_msg(timeout=timeout)
        except nats.errors.TimeoutError:
            return None
        try:
            rej = decode(msg.data, msg.subject).payload
        except Invalid:
            continue
        if rej.event_id == event_id:
            return rej
        timeout = 0.001
