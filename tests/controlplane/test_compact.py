"""Compaction of the event log: small files merged, every row once and in order, at every step of the
protocol and after a crash at any of them; `rubick log compact` and the recorder's background merges."""

from __future__ import annotations

import asyncio
import json

import pytest

from controlplane.cli import main
from controlplane.eventlog import check, scan
from controlplane.events import encode
from controlplane.recorder import compact, locks, manifest
from controlplane.recorder.writer import FILE_RE

from .samples import sample
from .test_recorder import record

ROWS = 95


class Crash(Exception):
    pass


@pytest.fixture
def log(tmp_path):
    """A simulated run's log: 95 events in files of 10 rows (the last of 5), with run.json."""
    from replay.record import write_log

    records = [("clock.tick", encode(sample("clock.tick", i)), float(i)) for i in range(ROWS)]
    write_log(tmp_path, records, config={"a": 1}, params={}, sources={}, roll_rows=10)
    [stream] = manifest.streams(tmp_path)
    return tmp_path, stream


def _entries(log_dir, stream):
    return manifest.read(log_dir, stream).entries


def _run_files(log_dir):
    return json.loads((log_dir / "run.json").read_text())["files"]


def _rows(log_dir):
    frame = scan(log_dir).frame
    return frame["seq"].to_list(), frame["data"].to_list()


def _event_files(log_dir):
    return sorted(p.name for p in log_dir.glob("events-*.parquet"))


def test_plan_groups_consecutive_small_files_up_to_the_target():
    def e(first, last, name=None):
        return {"name": name or f"f{first}", "rows": last - first + 1, "first_seq": first, "last_seq": last}

    entries = [e(1, 10), e(11, 20), e(21, 30), e(31, 130), e(131, 140), e(141, 150), e(151, 160), e(161, 170)]
    present = {x["name"] for x in entries} - {"f151"}  # being written: listed, not in place yet
    groups = compact.plan(entries, 25, present)
    assert [[x["name"] for x in g] for g in groups] == [["f1", "f11"], ["f131", "f141"]]
    # a file already at the target and a file being written break a run; a lone small file is left alone
    assert compact.plan(entries, 1000, present)[0][-1]["name"] == "f141"
    assert compact.plan([e(1, 10)], 100, {"f1"}) == []


def test_merging_keeps_every_row_once_and_in_order(log):
    log_dir, stream = log
    seqs, data = _rows(log_dir)
    before = _event_files(log_dir)
    merges = compact.compact(log_dir, stream, 40)
    assert [len(m.sources) for m in merges] == [4, 4, 2] and sum(m.rows for m in merges) == ROWS
    after = _event_files(log_dir)
    assert after == [m.name for m in merges] and not set(after) & set(before)
    assert _rows(log_dir) == (seqs, data) and seqs == list(range(1, ROWS + 1))
    entries = _entries(log_dir, stream)
    assert [e["name"] for e in entries] == after and all("merged" not in e for e in entries)
    assert _run_files(log_dir) == entries  # run.json's manifest follows
    assert check(log_dir) == []
    assert not [p for p in log_dir.iterdir() if p.name.startswith(".tmp-")]
    assert compact.compact(log_dir, stream, 40) == []  # nothing left to merge


@pytest.mark.parametrize("step", compact.STEPS)
def test_a_crash_at_any_step_loses_and_doubles_nothing(log, step):
    log_dir, stream = log
    seqs, data = _rows(log_dir)
    before = _event_files(log_dir)

    def hook(at):
        if at == step:
            raise Crash(at)

    with pytest.raises(Crash):
        compact.compact(log_dir, stream, 40, hook=hook)
    # the state the crash left is read as the whole log, once, and matches its manifests
    assert _rows(log_dir) == (seqs, data)
    assert check(log_dir) == []
    assert check(log_dir, _run_files(log_dir)) == []
    committed = compact.STEPS.index(step) > compact.STEPS.index("commit")
    notes = compact.recover(log_dir, stream)
    if step == "write":  # stopped before anything was written
        assert notes == []
    else:
        assert len(notes) == 1 and ("finished" in notes[0] if committed else "never committed" in notes[0])
    assert _rows(log_dir) == (seqs, data) and check(log_dir) == []
    entries = _entries(log_dir, stream)
    assert all("merged" not in e for e in entries) and _run_files(log_dir) == entries
    assert [e["name"] for e in entries] == _event_files(log_dir)
    assert len(entries) == (len(before) - 3 if committed else len(before))
    assert not [p for p in log_dir.iterdir() if p.name.startswith(".tmp-")]
    assert compact.recover(log_dir, stream) == []
    compact.compact(log_dir, stream, 40)  # and the next compaction goes on
    assert _rows(log_dir) == (seqs, data) and check(log_dir) == [] and len(_event_files(log_dir)) == 3


def test_a_torn_temporary_is_removed_and_a_merge_whose_temporary_is_gone_is_rolled_back(log):
    log_dir, stream = log
    seqs, data = _rows(log_dir)
    entries = _entries(log_dir, stream)
    torn = log_dir / f"{compact.COMPACT_PREFIX}events-{stream}-000000000001-000000000020.parquet"
    torn.write_bytes(b"PAR1 half a file")  # killed while writing the merged file
    assert _rows(log_dir) == (seqs, data) and check(log_dir) == []
    assert "never committed" in compact.recover(log_dir, stream)[0] and not torn.exists()

    def lose_temporary(at):
        if at == "rename":
            next(log_dir.glob(f"{compact.COMPACT_PREFIX}*")).unlink()  # removed by hand after the commit
            raise Crash(at)

    with pytest.raises(Crash):
        compact.compact(log_dir, stream, 20, hook=lose_temporary)
    assert any("missing" in why for _, why in check(log_dir))  # named, never silent
    assert "rolled back" in compact.recover(log_dir, stream)[0]
    assert _entries(log_dir, stream) == entries and _run_files(log_dir) == entries
    assert _rows(log_dir) == (seqs, data) and check(log_dir) == []


def test_a_changed_source_is_not_merged_and_a_changed_file_being_merged_is_named(log):
    log_dir, stream = log
    first = log_dir / _entries(log_dir, stream)[0]["name"]
    good = first.read_bytes()
    first.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(compact.CompactError, match="differ from the manifest"):
        compact.compact(log_dir, stream, 40)
    assert len(_event_files(log_dir)) == 10 and not list(log_dir.glob(f"{compact.COMPACT_PREFIX}*"))
    first.write_bytes(good)

    def change_source(at):
        if at == "delete":
            first.write_bytes(good[:100])
            raise Crash(at)

    with pytest.raises(Crash):
        compact.compact(log_dir, stream, 40, hook=change_source)
    why = dict((p.name, w) for p, w in check(log_dir))
    assert why == {first.name: why[first.name]} and "truncated" in why[first.name] and "merges it into" in why[first.name]


def test_rubick_log_compact_merges_and_says_what(log, capsys):
    log_dir, stream = log
    seqs, data = _rows(log_dir)
    assert main(["log", "compact", str(log_dir), "--target-rows", "50"]) == 0
    out = capsys.readouterr().out
    assert "(5 files, 50 rows) ->" in out and "(5 files, 45 rows) ->" in out
    assert f"compacted {log_dir}: 10 files -> 2 files" in out
    assert _rows(log_dir) == (seqs, data) and check(log_dir) == []
    assert main(["log", "stats", str(log_dir)]) == 0
    assert "files: 2 " in capsys.readouterr().out
    assert main(["log", "compact", str(log_dir), "--target-rows", "50"]) == 0
    assert "2 files -> 2 files" in capsys.readouterr().out


def _snapshot(log_dir):
    return {p.name: p.read_bytes() for p in log_dir.iterdir() if p.is_file() and p.name != locks.RECORDING_LOCK}


def test_rubick_log_compact_refuses_bad_input_and_changes_nothing(log, tmp_path, capsys):
    log_dir, stream = log
    assert main(["log", "compact", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["log", "compact", str(tmp_path / "empty")]) == 2

    name = _entries(log_dir, stream)[3]["name"]
    (log_dir / name).write_bytes((log_dir / name).read_bytes()[:50])  # a file that differs from the manifest
    state = _snapshot(log_dir)
    assert main(["log", "compact", str(log_dir)]) == 2
    captured = capsys.readouterr()
    assert f"problem: {name}: its bytes differ" in captured.out and "nothing changed" in captured.err
    assert _snapshot(log_dir) == state


def test_rubick_log_compact_refuses_a_file_being_written(log, capsys):
    log_dir, stream = log
    last = log_dir / _entries(log_dir, stream)[-1]["name"]
    last.rename(log_dir / f".tmp-{last.name}")  # listed, not yet renamed into place: a write under way
    state = _snapshot(log_dir)
    assert main(["log", "compact", str(log_dir)]) == 2
    assert "is being written" in capsys.readouterr().err and _snapshot(log_dir) == state


async def test_rubick_log_compact_refuses_a_log_a_live_recorder_writes(js_bus, tmp_path, capsys):
    from controlplane.recorder.service import Recorder, RecorderConfig, stream_token

    log_dir = tmp_path / "log"
    await js_bus.publish_many([("clock.tick", encode(sample("clock.tick", i)), None) for i in range(30)])
    recorder = Recorder(js_bus, RecorderConfig(log_dir, roll_rows=5, roll_seconds=0.1, compact=False),
                        stream_token(await js_bus.stream_created()))
    stop = asyncio.Event()
    task = asyncio.create_task(recorder.run(stop))
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if recorder.rows_written >= 30:
                break
        state = _snapshot(log_dir)
        assert main(["log", "compact", str(log_dir), "--target-rows", "100"]) == 2
        assert "a recorder is recording into it" in capsys.readouterr().err
        assert _snapshot(log_dir) == state
    finally:
        stop.set()
        await task
    assert main(["log", "compact", str(log_dir), "--target-rows", "100"]) == 0  # stopped: now it may
    assert len(_event_files(log_dir)) == 1 and scan(log_dir).frame["seq"].to_list() == list(range(1, 31))


async def test_the_recorder_compacts_closed_files_while_it_records(js_bus, tmp_path):
    log_dir = tmp_path / "log"
    recorder_done = asyncio.Event()
    from controlplane.recorder.service import Recorder, RecorderConfig, stream_token

    recorder = Recorder(js_bus, RecorderConfig(log_dir, roll_rows=100, roll_seconds=0.05, compact_after=3),
                        stream_token(await js_bus.stream_created()))
    task = asyncio.create_task(recorder.run(recorder_done))
    await recorder.ready.wait()
    for burst in range(25):  # a quiet cluster: a few messages per roll interval
        await js_bus.publish_many([("clock.tick", encode(sample("clock.tick", burst * 8 + i)), None)
                                   for i in range(8)])
        await asyncio.sleep(0.12)
    for _ in range(100):
        await asyncio.sleep(0.05)
        if recorder.rows_written >= 200:
            break
    recorder_done.set()
    await task
    assert recorder.rows_written == 200 and recorder.merges
    assert sum(len(m.sources) for m in recorder.merges) > len(recorder.merges)
    assert len(_event_files(log_dir)) < recorder.files_written
    assert scan(log_dir).frame["seq"].to_list() == list(range(1, 201))
    assert check(log_dir) == []
    assert all(FILE_RE.match(e["name"]) and "merged" not in e for e in _entries(log_dir, recorder.stream))


async def test_the_recorder_finishes_an_interrupted_merge_before_it_cleans_temporaries(js_bus, tmp_path):
    """A merge committed and then killed before its rename: the recorder's clean-up of temporaries must
    not throw the merged file away (its sources are no longer listed)."""
    log_dir = tmp_path / "log"
    await js_bus.publish_many([("clock.tick", encode(sample("clock.tick", i)), None) for i in range(40)])
    rec = await record(js_bus, log_dir, 40, roll_rows=5, roll_seconds=120, compact=False)

    def crash(at):
        if at == "rename":
            raise Crash(at)

    with pytest.raises(Crash):
        compact.compact(log_dir, rec.stream, 100, hook=crash)
    await js_bus.publish_many([("clock.tick", encode(sample("clock.tick", 40 + i)), None) for i in range(5)])
    await record(js_bus, log_dir, 45, roll_rows=5, roll_seconds=120, compact=False)
    assert scan(log_dir).frame["seq"].to_list() == list(range(1, 46))
    assert check(log_dir) == []
    names = _event_files(log_dir)
    assert names[0] == f"events-{rec.stream}-000000000001-000000000040.parquet" and len(names) == 2


def test_readers_see_every_row_once_while_a_compaction_runs(tmp_path):
    """`scan` and `check` running beside a compaction, in another thread, at every instant."""
    import threading

    from replay.record import write_log

    records = [("clock.tick", encode(sample("clock.tick", i)), float(i)) for i in range(600)]
    write_log(tmp_path, records, config={"a": 2}, params={}, sources={}, roll_rows=3)
    [stream] = manifest.streams(tmp_path)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (compact.compact(tmp_path, stream, 60), done.set()))
    worker.start()
    reads = 0
    while not done.is_set() or reads == 0:
        result = scan(tmp_path)
        assert result.frame["seq"].to_list() == list(range(1, 601)) and result.problems == []
        assert check(tmp_path) == []
        reads += 1
    worker.join()
    assert len(_event_files(tmp_path)) == 10 and reads >= 1
