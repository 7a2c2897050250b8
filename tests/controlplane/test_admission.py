"""Admission and the service shell: every bad message answered with a *.rejected event, state kept
across restarts, rejections never answered in turn. Runs on the in-memory bus (same contract)."""

from __future__ import annotations

import asyncio
import dataclasses

import msgpack
import pytest

from controlplane.admission import AdmissionCore
from controlplane.bus import MemoryBus
from controlplane.events import Invalid, ModelRef, Resources, Plan, decode, encode, make
from controlplane.events.catalog import CONTROL
from controlplane.service import ServiceShell
from tests.shells import run_until_done

from .samples import NEW_SPEC, PAYLOADS, sample

KNOWN = ["gpt2", "bert", "llama7"]


async def run_shell(bus: MemoryBus, until: int, core: AdmissionCore | None = None) -> ServiceShell:
    return await run_until_done(ServiceShell(core or AdmissionCore(KNOWN), bus, rejects=True), bus, until=until)


def rejections(bus: MemoryBus):
    out = []
    for _, s, d in bus.messages():
        if s.endswith(".rejected"):
            try:
                out.append((s, decode(d, s).payload))
            except Invalid:
                pass  # a broken message published on a rejection subject by a test
    return out


def submitted(job_id: str, n: int, **changes):
    job = dataclasses.replace(PAYLOADS["job.submitted"], job_id=job_id, **changes)
    return make("job.submitted", job, time=100.0 + n, id=f"sub-{n}", source="test")


async def test_bad_messages_get_precise_rejections():
    bus = MemoryBus()
    bad_version = msgpack.unpackb(encode(submitted("v-job", 1)))
    bad_version["v"] = 9
    extra = msgpack.unpackb(encode(submitted("x-job", 2)))
    extra["data"]["colour"] = "blue"
    await bus.publish("job.submitted", b"\xc1 not msgpack")
    await bus.publish("job.submitted", msgpack.packb(bad_version))
    await bus.publish("job.submitted", msgpack.packb(extra))
    unknown = msgpack.unpackb(encode(submitted("f-job", 3)))
    unknown["subject"] = "job.frobnicated"
    await bus.publish("job.frobnicated", msgpack.packb(unknown))
    await bus.publish("metrics.iteration", b"\x01")
    await run_shell(bus, 5)
    got = rejections(bus)
    assert [s for s, _ in got] == ["job.rejected", "job.rejected", "job.rejected", "job.rejected",
                                   "metrics.rejected"]
    reasons = [(r.reason, r.field, r.stream_seq) for _, r in got]
    assert reasons[0] == ("malformed msgpack", "", 1)
    assert reasons[1] == ("unknown schema version", "v", 2)
    assert reasons[2] == ("unknown field", "data.colour", 3)
    assert reasons[3] == ("unknown subject", "subject", 4)
    assert got[2][1].job_id == "x-job" and got[2][1].event_id == "sub-2"


async def test_semantic_refusals_and_reused_ids():
    bus = MemoryBus()
    events = [
        submitted("ok-1", 1),
        submitted("ok-1", 2),  # reused id
        submitted("mystery", 3, model=ModelRef(type="gpt9")),  # unknown type, no spec
        submitted("brand-new", 4, model=ModelRef(type="my-gpt", spec=NEW_SPEC)),  # new type with its spec
        submitted("uses-new", 5, model=ModelRef(type="my-gpt")),  # now known
    ]
    for e in events:
        await bus.publish(e.subject, encode(e), e.id)
    await run_shell(bus, len(events))
    got = {r.job_id: r.reason for _, r in rejections(bus)}
    assert got == {"ok-1": "job id reused",
                   "mystery": "unknown model type (give its full spec to add a new type)"}


async def test_resources_beyond_the_cluster_are_refused():
    bus = MemoryBus()
    node = make("node.registered", PAYLOADS["node.registered"], time=1.0, id="n0", source="agent")
    big = submitted("too-big", 1, plan=Plan(dp=16), resources=Resources(gpus=16), global_batch_size=32)
    for e in (node, big):
        await bus.publish(e.subject, encode(e), e.id)
    await run_shell(bus, 2)
    ((subject, rej),) = rejections(bus)
    assert (subject, rej.reason, rej.field, rej.expected, rej.got) == \
        ("job.rejected", "more GPUs than the cluster has", "data.resources.gpus", "<= 8", "16")


async def test_restart_rebuilds_state_from_the_stream():
    bus = MemoryBus()
    first = submitted("persist-1", 1)
    await bus.publish(first.subject, encode(first), first.id)
    await run_shell(bus, 1)
    again = submitted("persist-1", 2)
    await bus.publish(again.subject, encode(again), again.id)
    shell = await run_shell(bus, 2, AdmissionCore(KNOWN))  # a fresh core: the shell restores it
    assert shell.restored >= 1
    assert [r.reason for _, r in rejections(bus)] == ["job id reused"]


async def test_rejections_are_never_answered():
    bus = MemoryBus()
    await bus.publish("job.rejected", b"\xc1 broken rejection")
    await bus.publish("metrics.rejected", b"\xc1")
    await run_shell(bus, 2)
    assert rejections(bus) == []
    assert await bus.last_seq() == 2


async def test_a_retried_rejection_is_not_doubled():
    bus = MemoryBus()
    await bus.publish("job.submitted", b"\xc1")
    await run_shell(bus, 1)
    # a second admission replica (another durable) sees the same message: same answer id, stored once
    core = AdmissionCore(KNOWN)
    shell = ServiceShell(core, bus, rejects=True)
    shell.core.name = "admission-b"
    stop = asyncio.Event()
    task = asyncio.create_task(shell.run(stop))
    await asyncio.sleep(0.2)
    stop.set()
    await task
    assert len(rejections(bus)) == 1


@pytest.mark.parametrize("subject", sorted(PAYLOADS))
async def test_valid_events_pass_without_rejection(subject):
    bus = MemoryBus()
    before = [sample("job.submitted")] if subject in CONTROL else []  # a request about a job needs the job
    if subject == "job.resume":
        before.append(sample("job.suspend"))
    e = sample(subject)
    for x in (*before, e):
        await bus.publish(x.subject, encode(x), x.id)
    await run_shell(bus, len(before) + 1)
    # a rejection published as a sample is itself all there is on a rejection subject
    assert rejections(bus) == ([(subject, e.payload)] if subject.endswith(".rejected") else [])
    assert await bus.last_seq() == len(before) + 1


async def test_bad_workloads_are_refused_naming_the_field():
    """A workload a launcher could not run safely never reaches a node (docs/workloads.md)."""
    bus = MemoryBus()
    good = {"image": "ghcr.io/team-a/train:1.4", "command": ["python", "train.py"], "env": {"HF_HOME": "/c"},
            "checkpoint": {"pvc": "ckpt"}}
    cases = {
        "ok": ({}, None),
        "caps": ({"image": "Team/Train"}, "data.workload.image"),
        "reserved": ({"env": {"RUBICK_PLAN": "{}"}}, "data.workload.env.RUBICK_PLAN"),
        "badname": ({"env": {"1X": "a"}}, "data.workload.env.1X"),
        "both": ({"checkpoint": {"pvc": "a", "host_path": "/b"}}, "data.workload.checkpoint"),
        "climb": ({"checkpoint": {"host_path": "/srv/../etc"}}, "data.workload.checkpoint.host_path"),
        "relative": ({"working_dir": "work"}, "data.workload.working_dir"),
        "extra": ({"privileged": True}, "data.workload.privileged"),
        "argtype": ({"args": ["--n", 3]}, "data.workload.args[1]"),
    }
    for n, (job_id, (change, _)) in enumerate(cases.items()):
        raw = msgpack.unpackb(encode(submitted(job_id, n)))
        raw["data"]["workload"] = {**good, **change}
        await bus.publish("job.submitted", msgpack.packb(raw), f"w-{n}")
    await run_shell(bus, len(cases))
    got = {r.job_id or r.event_id: r.field for _, r in rejections(bus)}
    assert got == {job_id: fld for job_id, (_, fld) in cases.items() if fld}, got
