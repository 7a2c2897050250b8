"""`Client.submit` returns as soon as the verdict is known: a refusal from admission or the policy, or both
having acknowledged the submission without one; with neither running it waits its whole window. Real
nats-server, real service shells."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from controlplane.admission import AdmissionCore
from controlplane.bus.nats import JetStreamBus
from controlplane.client import Client
from controlplane.events import Event, ModelRef, Rejected, make
from controlplane.service import ServiceShell

from .samples import PAYLOADS

WINDOW = 30.0  # far longer than any verdict takes: a submit that returns before it did not wait it out


class Refuser:
    """A policy that refuses one job id."""

    name = "policy"
    subjects = ("job.submitted",)

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id

    def handle(self, event: Event) -> list[Event]:
        if event.payload.job_id != self.job_id:
            return []
        return [make("job.rejected", Rejected(subject="job.submitted", reason="no plan fits", field="model",
                                              event_id=event.id, job_id=self.job_id),
                     time=event.time, id=f"policy-rej-{event.id}", source="policy")]


def job(job_id: str, model: str = "gpt2"):
    base = PAYLOADS["job.submitted"]
    return dataclasses.replace(base, job_id=job_id, model=ModelRef(type=model))


async def run_services(bus: JetStreamBus, *cores) -> tuple[asyncio.Event, list[asyncio.Task]]:
    stop = asyncio.Event()
    shells = [ServiceShell(core, bus, rejects=core.name == "admission") for core in cores]
    tasks = [asyncio.create_task(s.run(stop)) for s in shells]
    await asyncio.gather(*(s.ready.wait() for s in shells))
    return stop, tasks


async def test_a_submit_returns_at_its_verdict(js_bus):
    stop, tasks = await run_services(js_bus, AdmissionCore(["gpt2"]), Refuser("vit-9"))
    client = Client(js_bus)
    try:
        t0 = time.monotonic()
        accepted = await client.submit(job("gpt2-1"), wait_s=WINDOW)
        assert accepted.rejected is None and time.monotonic() - t0 < WINDOW
        for durable in ("svc-admission", "svc-policy"):  # both had answered it
            info = await js_bus.js.consumer_info(js_bus.stream, durable)
            assert info.ack_floor.stream_seq >= accepted.seq

        refused = await client.submit(job("llama-2", model="no-such-model"), wait_s=WINDOW)
        assert refused.rejected is not None and refused.rejected.field == "data.model.type"
        by_policy = await client.submit(job("vit-9"), wait_s=WINDOW)
        assert by_policy.rejected is not None and by_policy.rejected.reason == "no plan fits"
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_a_submit_waits_for_a_policy_that_is_away(js_bus):
    """Admission accepts at once; the policy (its consumer exists) comes back half a second later and
    refuses: the submit waits for it instead of taking admission's silence for the verdict."""
    stop, tasks = await run_services(js_bus, Refuser("vit-9"))
    stop.set()
    await asyncio.gather(*tasks)
    stop, tasks = await run_services(js_bus, AdmissionCore(["gpt2"]))

    async def back_later() -> tuple[asyncio.Event, list[asyncio.Task]]:
        await asyncio.sleep(0.5)
        return await run_services(js_bus, Refuser("vit-9"))

    policy = asyncio.create_task(back_later())
    try:
        t0 = time.monotonic()
        late = await Client(js_bus).submit(job("vit-9"), wait_s=WINDOW)
        assert late.rejected is not None and late.rejected.reason == "no plan fits"
        assert 0.5 <= time.monotonic() - t0 < WINDOW
    finally:
        p_stop, p_tasks = await policy
        p_stop.set()
        stop.set()
        await asyncio.gather(*tasks, *p_tasks)


async def test_with_no_service_running_a_submit_waits_its_window(js_bus):
    t0 = time.monotonic()
    result = await Client(js_bus).submit(job("gpt2-2"), wait_s=0.3)
    assert result.rejected is None and time.monotonic() - t0 >= 0.3
