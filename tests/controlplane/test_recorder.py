"""The recorder over a real nats-server: every message once, exact bytes, typed columns, atomic files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import polars as pl

from controlplane.eventlog import scan
from controlplane.events import encode
from controlplane.recorder.service import Recorder, RecorderConfig, stream_token
from controlplane.recorder.writer import recorded_max_seq

from .samples import PAYLOADS, sample


async def record(bus, log_dir: Path, until_seq: int, **cfg) -> Recorder:
    recorder = Recorder(bus, RecorderConfig(log_dir, roll_seconds=cfg.pop("roll_seconds", 0.2), **cfg),
                        stream_token(await bus.stream_created()))
    stop = asyncio.Event()
    task = asyncio.create_task(recorder.run(stop))
    for _ in range(200):
        await asyncio.sleep(0.05)
        if recorded_max_seq(log_dir, recorder.stream) >= until_seq:
            break
    stop.set()
    await task
    return recorder


async def test_every_subject_recorded_with_exact_bytes_and_columns(js_bus, tmp_path):
    wires = {}
    for subject in sorted(PAYLOADS):
        event = sample(subject)
        wires[subject] = encode(event)
        await js_bus.publish(subject, wires[subject], event.id)
    await js_bus.publish("job.submitted", b"\xc1\xc1 garbage", "garbage-1")
    last = await js_bus.last_seq()
    await record(js_bus, tmp_path / "log", last)
    frame = scan(tmp_path / "log").frame
    assert frame.height == len(PAYLOADS) + 1
    assert frame["seq"].to_list() == list(range(1, last + 1))
    by_subject = {r["subject"]: r for r in frame.filter(pl.col("error").is_null()).iter_rows(named=True)}
    for subject, wire in wires.items():
        assert by_subject[subject]["data"] == wire
    m = by_subject["metrics.iteration"]
    assert (m["job_id"], m["node"], m["model_type"], m["iter_time_s"], m["plan"]) == \
        ("gpt2-0007", "node-0", "gpt2", 1.05, "dp2-tp1-pp1-z2-ga2")
    assert by_subject["job.submitted"]["model_type"] == "gpt2"
    assert by_subject["plan.decided"]["jobs"] == ["gpt2-0007", "bert-0002"]
    assert by_subject["job.started"]["time"].timestamp() == sample("job.started").time
    bad = frame.filter(pl.col("error").is_not_null()).row(0, named=True)
    assert bad["data"] == b"\xc1\xc1 garbage" and "malformed msgpack" in bad["error"]


async def test_files_roll_by_rows_and_restart_continues_without_duplicates(js_bus, tmp_path):
    log_dir = tmp_path / "log"
    await js_bus.publish_many([("metrics.iteration", encode(sample("metrics.iteration", i)), None)
                               for i in range(250)])
    rec = await record(js_bus, log_dir, 250, roll_rows=100)
    assert rec.files_written >= 3
    await js_bus.publish_many([("metrics.iteration", encode(sample("metrics.iteration", i)), None)
                               for i in range(250, 400)])
    await record(js_bus, log_dir, 400, roll_rows=100)
    frame = scan(log_dir).frame
    assert frame["seq"].to_list() == list(range(1, 401))
    assert not any(p.name.startswith(".tmp-") for p in log_dir.iterdir())


async def test_redelivered_messages_already_in_a_file_are_skipped(js_bus, tmp_path):
    """A crash between the file rename and the ack: the messages come again and are not doubled."""
    log_dir = tmp_path / "log"
    for i in range(20):
        await js_bus.publish("clock.tick", encode(sample("clock.tick", i)))
    rec = await record(js_bus, log_dir, 20)
    # forget the consumer's acks: a new durable gets everything again
    rec2 = await record(js_bus, log_dir, 20, durable="recorder-b")
    assert rec2.skipped_duplicates == 20 and rec2.rows_written == 0
    assert scan(log_dir).frame.height == 20
    assert rec.rows_written == 20


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from controlplane.recorder.rows import COLUMNS, frame, row_of  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.text(max_size=30), st.one_of(st.none(), st.text(max_size=20)))
def test_recorder_rows_keep_any_bytes(data, subject, msg_id):
    row = row_of(7, subject, data, msg_id, 1_700_000_000.5)
    assert len(row) == len(COLUMNS) and row[-1] == data and row[0] == 7
    written = frame([row])  # any row builds a frame of the log's schema
    assert written.height == 1 and written["data"][0] == data


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["v", "id", "subject", "time", "source", "data"]),
                       st.one_of(st.none(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=10),
                                 st.dictionaries(st.sampled_from(["job_id", "plan", "iter_time_s", "decisions",
                                                                  "jobs", "model", "node"]),
                                                 st.one_of(st.integers(-2**63, 2**64 - 1), st.text(max_size=8), st.floats(),
                                                           st.lists(st.text(max_size=5), max_size=3)),
                                                 max_size=5))))
def test_recorder_rows_of_random_envelopes(env):
    # integers stay within msgpack's 64-bit range: nothing wider can be on the wire
    import msgpack
    data = msgpack.packb(env)
    row = row_of(1, "job.submitted", data, None, 1.0)
    assert frame([row]).height == 1


async def test_messages_delivered_but_never_received_are_fetched_again_not_acknowledged_away(js_bus, tmp_path):
    """A server that dies with a pull reply in flight has counted those messages as delivered; the
    recorder then sees later ones first. It must not take (and with one ack-all, acknowledge) past the
    hole: it goes back for the missing messages. Here a second client on the recorder's durable
    consumer takes the first messages of a batch and never acknowledges them: a hole made on purpose, with the real
    server and client."""
    log_dir = tmp_path / "log"
    for i in range(10):
        await js_bus.publish("clock.tick", encode(sample("clock.tick", i)), f"before-{i}")
    recorder = Recorder(js_bus, RecorderConfig(log_dir, roll_seconds=0.2), stream_token(await js_bus.stream_created()))
    stop = asyncio.Event()
    task = asyncio.create_task(recorder.run(stop))
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if recorded_max_seq(log_dir, recorder.stream) >= 10:
                break
        thief = await js_bus.js.pull_subscribe_bind(durable="recorder", stream=js_bus.stream)
        stolen = asyncio.create_task(thief.fetch(3, timeout=10))
        await asyncio.sleep(1.0)  # the recorder's own pull request expires and queues behind the thief's
        for i in range(10):
            await js_bus.publish("clock.tick", encode(sample("clock.tick", 10 + i)), f"after-{i}")
        taken = [m.metadata.sequence.stream for m in await stolen]
        assert taken and taken == list(range(11, 11 + len(taken)))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if scan(log_dir).frame.height >= 20:
                break
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    frame = scan(log_dir).frame
    assert frame["seq"].to_list() == list(range(1, 21))
    assert sorted(frame["msg_id"].to_list()) == sorted([f"before-{i}" for i in range(10)] + [f"after-{i}" for i in range(10)])


async def test_messages_the_stream_no_longer_holds_are_named_and_the_rest_recorded(js_bus, tmp_path, caplog):
    """A purge (or the stream's limits) removed messages before the recorder came to them: it looks for
    them once more from the first missing one, then goes on without them and says which are gone."""
    for i in range(10):
        await js_bus.publish("clock.tick", encode(sample("clock.tick", i)), f"m-{i}")
    await js_bus.js.purge_stream(js_bus.stream, seq=6)  # removes 1..5
    rec = await record(js_bus, tmp_path / "log", 10)
    assert scan(tmp_path / "log").frame["seq"].to_list() == list(range(6, 11))
    assert rec.holes_refetched == 1 and rec.gone_from_stream == 5
    assert "messages 1..5 are not in the stream any more" in caplog.text
