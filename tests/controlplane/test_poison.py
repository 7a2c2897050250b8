"""Messages that once stopped a service, over a real nats-server: each is recorded as what it is, answered
where a core failed on it, acknowledged, and never handled again; what comes after goes on."""

from __future__ import annotations

import asyncio
import logging

import msgpack

from controlplane.admission import AdmissionCore
from controlplane.eventlog import scan
from controlplane.events import decode, encode
from controlplane.recorder import rows
from controlplane.service import ServiceShell

from .samples import sample
from .test_recorder import record


def _infinite_plan() -> bytes:
    """The ~60-byte message that crashed the recorder: a plan whose size is infinite."""
    return msgpack.packb({"v": 1, "id": "x", "subject": "metrics.iteration", "time": 1.0, "source": "s",
                          "data": {"plan": {"dp": float("inf")}}})


async def test_the_recorder_keeps_an_infinite_plan_and_everything_after_it(js_bus, tmp_path):
    await js_bus.publish("metrics.iteration", _infinite_plan(), "poison")
    for i in range(3):
        await js_bus.publish("metrics.iteration", encode(sample("metrics.iteration", i)), f"after-{i}")
    await record(js_bus, tmp_path / "log", 4)
    frame = scan(tmp_path / "log").frame
    assert frame["seq"].to_list() == [1, 2, 3, 4]
    poison = frame.row(0, named=True)
    assert poison["data"] == _infinite_plan() and poison["plan"] is None and poison["event_id"] == "x"
    assert frame["plan"].to_list()[1:] == ["dp2-tp1-pp1-z2-ga2"] * 3


async def test_a_message_the_row_builder_fails_on_gets_a_row_naming_the_failure(js_bus, tmp_path, monkeypatch):
    real = rows._row_of

    def failing(seq, subject, data, msg_id, stored):
        if b"boom" in data:
            raise RuntimeError("planted")
        return real(seq, subject, data, msg_id, stored)

    monkeypatch.setattr(rows, "_row_of", failing)
    await js_bus.publish("job.submitted", b"\x91\xa4boom", "boom")
    await js_bus.publish("clock.tick", encode(sample("clock.tick")), "tick")
    await record(js_bus, tmp_path / "log", 2)
    frame = scan(tmp_path / "log").frame.sort("seq")
    assert frame["error"].to_list() == ["row builder failed (RuntimeError: planted)", None]
    assert frame["data"][0] == b"\x91\xa4boom" and frame["subject"][0] == "job.submitted"


class FailsOnSecond(AdmissionCore):
    """The admission core with a planted bug: it raises on the job it sees second."""

    def __init__(self) -> None:
        super().__init__(known_models=["gpt2"])
        self.seen = 0

    def handle(self, event):
        if event.base == "job.submitted":
            self.seen += 1
            if self.seen == 2:
                raise ZeroDivisionError("planted")
        return super().handle(event)


async def _run_shell(shell: ServiceShell, bus, until) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(shell.run(stop))
    for _ in range(100):
        await asyncio.sleep(0.05)
        if shell.ready.is_set() and await until():
            break
    stop.set()
    await task


def _true_when(condition):
    async def check() -> bool:
        return condition()
    return check


async def test_a_core_failure_is_answered_acknowledged_and_never_handled_again(js_bus, caplog):
    caplog.set_level(logging.ERROR, "controlplane.service")
    for i in range(3):
        job = sample("job.submitted", i)
        job = job.__class__(**{**job.__dict__, "payload": job.payload.__class__(
            **{**job.payload.__dict__, "job_id": f"gpt2-{i}"}), "id": f"sub-{i}"})
        await js_bus.publish("job.submitted", encode(job), job.id)
    shell = ServiceShell(FailsOnSecond(), js_bus, rejects=True)
    await _run_shell(shell, js_bus, _true_when(lambda: shell.handled >= 4))
    assert (shell.handled, shell.failed) == (4, 1)  # three submissions and its own answer
    assert "handler failed on seq 2" in caplog.text
    answers = [d async for d in js_bus.read(("job.rejected",), 1, await js_bus.last_seq())]
    [answer] = [decode(d.data, d.subject) for d in answers]
    assert answer.id == "fail-admission-2" and answer.source == "admission"
    assert answer.payload.reason == "the admission service failed on it (ZeroDivisionError: planted)"
    assert (answer.payload.event_id, answer.payload.job_id, answer.payload.stream_seq) == ("sub-1", "gpt2-1", 2)
    # a restarted shell rebuilds its state past the failure and gets nothing again
    again = ServiceShell(FailsOnSecond(), js_bus, rejects=True)
    await _run_shell(again, js_bus, _true_when(lambda: True))
    assert again.handled == 0 and again.restored == 4  # three submissions and the answer


async def test_an_event_time_past_the_bound_is_refused_by_admission(js_bus):
    env = msgpack.unpackb(encode(sample("job.submitted")))
    env["time"] = 1e300
    await js_bus.publish("job.submitted", msgpack.packb(env), "far-future")
    shell = ServiceShell(AdmissionCore(known_models=["gpt2"]), js_bus, rejects=True)

    async def answered() -> bool:
        return await js_bus.last_seq() >= 2

    await _run_shell(shell, js_bus, answered)
    answers = [decode(d.data, d.subject) for d in [d async for d in js_bus.read(("job.rejected",), 1,
                                                                               await js_bus.last_seq())]]
    assert [a.payload.field for a in answers] == ["time"]
    assert "before the year 10000" in answers[0].payload.reason
