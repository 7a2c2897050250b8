"""The event log's file manifest: the recorder lists each file as it writes it, and `rubick log` and
`rubick replay` name a changed, truncated, missing or extra file even with no run.json."""

from __future__ import annotations

import json
import shutil

import pytest

from controlplane.cli import main
from controlplane.eventlog import check
from controlplane.events import encode
from controlplane.recorder import manifest

from .samples import sample
from .test_recorder import record


@pytest.fixture
async def recorded(js_bus, tmp_path):
    """A log of 30 events in three files, as the recorder wrote it (rolled by rows only: a slow
    machine must not add a time-rolled fourth file)."""
    log_dir = tmp_path / "log"
    await js_bus.publish_many([("clock.tick", encode(sample("clock.tick", i)), None) for i in range(30)])
    rec = await record(js_bus, log_dir, 30, roll_rows=10, roll_seconds=120)
    return log_dir, rec.stream


def _lines(log_dir, stream):
    return [json.loads(line) for line in (log_dir / manifest.manifest_name(stream)).read_text().splitlines()]


async def test_the_recorder_lists_every_file_it_writes(recorded):
    log_dir, stream = recorded
    files = sorted(p.name for p in log_dir.glob("events-*.parquet"))
    entries = _lines(log_dir, stream)
    assert [e["name"] for e in entries] == files
    # three files of 10 rows; a fetch again after messages lost in flight (a loaded machine) writes what came
    # before first, so a file may be shorter: the files still cover 1..30 in order, none over 10 rows
    spans = [(e["first_seq"], e["last_seq"], e["rows"]) for e in entries]
    assert spans[0][0] == 1 and spans[-1][1] == 30 and len(spans) >= 3
    assert all(b[0] == a[1] + 1 for a, b in zip(spans, spans[1:]))
    assert all(rows == last - first + 1 <= 10 for first, last, rows in spans)
    assert all(e["bytes"] == (log_dir / e["name"]).stat().st_size for e in entries)
    assert check(log_dir) == []


async def test_changed_truncated_missing_and_extra_files_are_named(recorded, capsys):
    log_dir, stream = recorded
    # at least three files (a loaded machine may split one): change the first, cut the second, move the last
    entries = _lines(log_dir, stream)
    first, second, third = (log_dir / entries[i]["name"] for i in (0, 1, -1))
    span = f"{entries[-1]['first_seq']}..{entries[-1]['last_seq']}"
    raw = bytearray(first.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    first.write_bytes(bytes(raw))
    second.write_bytes(second.read_bytes()[:100])
    shutil.copy(third, log_dir / third.name.replace("000000000030", "000000000031"))
    third.unlink()
    why = {p.name: w for p, w in check(log_dir)}
    label = f"the log's manifest ({manifest.manifest_name(stream)})"
    assert why[first.name] == f"its bytes differ from {label} (changed or corrupt)"
    assert why[second.name].startswith(f"its bytes differ from {label} (truncated: 100 of its ")
    assert why[third.name] == f"missing (events {span} in {label})"
    assert why[third.name.replace("000000000030", "000000000031")] == f"not in {label}: an extra file"
    assert len(why) == 4

    assert main(["log", "stats", str(log_dir)]) == 0
    err = capsys.readouterr().err
    assert all(name in err for name in why)
    assert main(["replay", str(log_dir)]) == 2  # no run.json: still names every file
    out = capsys.readouterr().out
    assert "run.json: missing" in out and all(f"problem: {name}: {w}" in out for name, w in why.items())


async def test_an_interrupted_write_leaves_no_stale_line(js_bus, recorded):
    """A crash after a file's line is written and before the file is renamed into place: the recorder
    drops the line when it starts, and records those messages again."""
    log_dir, stream = recorded
    last = sorted(log_dir.glob("events-*.parquet"))[-1]
    last.rename(log_dir / f".tmp-{last.name}")  # as if the rename never happened
    with open(log_dir / manifest.manifest_name(stream), "a") as f:
        f.write('{"name": "torn')  # and a line torn on top
    assert check(log_dir) == []  # a listed file whose temporary is there is being written
    await record(js_bus, log_dir, 30, durable="recorder-again")
    entries = _lines(log_dir, stream)
    assert entries[-1]["last_seq"] == 30 and all(b["first_seq"] == a["last_seq"] + 1 for a, b in zip(entries, entries[1:]))
    assert check(log_dir) == []


async def test_a_simulated_run_and_its_run_json_list_the_same_files(tmp_path):
    from replay.record import write_log

    records = [("clock.tick", encode(sample("clock.tick", i)), float(i)) for i in range(25)]
    write_log(tmp_path, records, config={"a": 1}, params={}, sources={}, roll_rows=10)
    run = json.loads((tmp_path / "run.json").read_text())
    [stream] = manifest.streams(tmp_path)
    assert run["files"] == _lines(tmp_path, stream) and len(run["files"]) == 3
    write_log(tmp_path, records[:5], config={"a": 1}, params={}, sources={}, roll_rows=10)  # the same folder again
    assert len(_lines(tmp_path, stream)) == 1 and check(tmp_path) == []
