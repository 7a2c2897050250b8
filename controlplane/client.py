"""Python API for external systems: validate a job and publish `job.submitted`.

    from controlplane.client import Client, load_job

    job = load_job("examples/jobs/gpt2-guaranteed.yaml")      # or build a JobSubmitted yourself
    async with await Client.connect("nats://127.0.0.1:4222") as client:
        result = await client.submit(job)                      # waits briefly for a refusal
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

import nats
import yaml

from .bus.nats import JetStreamBus
from .events import Event, Invalid, JobSubmitted, Rejected, build, decode, encode, make, new_id
from .events.schema import to_plain


def job_from_dict(doc: Any) -> JobSubmitted:
    return build(JobSubmitted, doc)


def load_job(path: str | Path) -> JobSubmitted:
    """Read and validate a job file (YAML or JSON, the fields of `job.submitted`)."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise Invalid(f"no such file: {path}") from None
    except yaml.YAMLError as exc:
        raise Invalid(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
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
    async def connect(cls, nats_url: str, *, connect_timeout: float = 3.0) -> "Client":
        try:
            bus = await JetStreamBus.connect(nats_url, name="rubick-client", create_stream=False,
                                             connect_timeout=connect_timeout)
        except (nats.errors.NoServersError, OSError, asyncio.TimeoutError) as exc:
            raise ConnectionError(f"cannot reach NATS at {nats_url}: {exc or type(exc).__name__}") from None
        return cls(bus)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def publish(self, event: Event) -> int:
        ack = await self.bus.publish(event.subject, encode(event), event.id)
        return ack.seq

    async def submit(self, job: JobSubmitted, *, wait_s: float = 2.0, source: str = "client") -> SubmitResult:
        """Publish `job.submitted`; for up to `wait_s` seconds, listen for its `job.rejected`."""
        event = submission(job, source=source)
        answer: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_rejected(msg) -> None:
            try:
                rej = decode(msg.data, msg.subject).payload
            except Invalid:
                return
            if rej.event_id == event.id and not answer.done():
                answer.set_result(rej)

        sub = await self.bus.nc.subscribe("job.rejected", cb=on_rejected) if wait_s > 0 else None
        try:
            ack = await self.bus.publish(event.subject, encode(event), event.id)
            rejected = None
            if sub is not None:
                try:
                    rejected = await asyncio.wait_for(answer, wait_s)
                except asyncio.TimeoutError:
                    rejected = None
        finally:
            if sub is not None:
                await sub.unsubscribe()
        return SubmitResult(event, ack.seq, ack.duplicate, rejected)

    async def close(self) -> None:
        await self.bus.close()
