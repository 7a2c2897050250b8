"""The event-log readers under fuzzing: a damaged file, or a file of the log's columns holding anything
(nulls included), is named as a problem and never stops `scan`, `events`, `check` or replay's reader."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import polars as pl
from hypothesis import given
from hypothesis import strategies as st

from controlplane.eventlog import check, events, scan
from controlplane.events import encode
from controlplane.recorder.rows import SCHEMA, row_of
from controlplane.recorder.writer import file_name, write_atomic
from replay.verify import VerifyResult, load_recorded
from tests.controlplane.samples import PAYLOADS, sample

from .strategies import fuzz

_GOOD: dict[str, bytes] = {}


def _good_log() -> dict[str, bytes]:
    """A small valid log (two files, the manifest), built once: file name -> bytes."""
    if not _GOOD:
        with tempfile.TemporaryDirectory() as d:
            rows = [row_of(n + 1, s, encode(sample(s, n)), None, 1_700_000_000.0 + n)
                    for n, s in enumerate(sorted(PAYLOADS))]
            write_atomic(Path(d), "fz", rows[:6])
            write_atomic(Path(d), "fz", rows[6:])
            _GOOD.update({p.name: p.read_bytes() for p in Path(d).iterdir()})
    return _GOOD


def _read_everything(d: Path) -> list[str]:
    """Every reader over the folder; what they name as problems."""
    logscan = scan(d)
    events(d)  # reads only the columns it needs: it may still read a file damaged in others
    problems = [why for _, why in check(d)]
    result = VerifyResult()
    load_recorded(d, {}, result, {})
    return [why for _, why in logscan.problems] + problems + result.problems


@fuzz(60)
@given(st.data())
def test_damaged_files_are_named_never_fatal(data):
    good = _good_log()
    names = sorted(n for n in good if n.endswith(".parquet"))
    victim = data.draw(st.sampled_from(names + [n for n in good if n.startswith("manifest-")]))
    raw = bytearray(good[victim])
    how = data.draw(st.sampled_from(["flip", "truncate", "append", "zero"]))
    if how == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        del raw[data.draw(st.integers(0, len(raw) - 1)):]
    elif how == "append":
        raw += data.draw(st.binary(min_size=1, max_size=64))
    else:
        start = data.draw(st.integers(0, len(raw) - 1))
        raw[start:start + data.draw(st.integers(1, 64))] = bytes(min(64, len(raw) - start))[:len(raw[start:start + 64])]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, content in good.items():
            (d / name).write_bytes(content)
        (d / victim).write_bytes(bytes(raw))
        problems = _read_everything(d)
        if bytes(raw) != good[victim] and victim.endswith(".parquet"):
            assert any("differ" in p for p in problems), problems


_CELLS = {
    "seq": st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    "stored": st.one_of(st.none(), st.integers(-2**62, 2**62)),
    "time": st.one_of(st.none(), st.integers(-2**62, 2**62)),
    "v": st.one_of(st.none(), st.integers(-2**31, 2**31 - 1)),
    "iter_time_s": st.one_of(st.none(), st.floats()),
    "jobs": st.one_of(st.none(), st.lists(st.one_of(st.none(), st.text(max_size=5)), max_size=3)),
    "data": st.one_of(st.none(), st.binary(max_size=40), st.sampled_from([encode(sample(s)) for s in sorted(PAYLOADS)])),
    "subject": st.one_of(st.none(), st.text(max_size=20), st.sampled_from(sorted(PAYLOADS))),
}


@fuzz(60)
@given(st.lists(st.fixed_dictionaries({c: _CELLS.get(c, st.one_of(st.none(), st.text(max_size=10))) for c in SCHEMA}),
                min_size=1, max_size=6),
       st.booleans())
def test_a_file_of_the_logs_columns_holding_anything_is_read_or_named(rows, as_text):
    columns = {c: [r[c] for r in rows] for c in SCHEMA}
    frame = pl.DataFrame({c: pl.Series(c, v, dtype=pl.Int64 if isinstance(SCHEMA[c], pl.Datetime) else SCHEMA[c])
                          for c, v in columns.items()})
    if as_text:  # the right names, the wrong types
        frame = frame.with_columns(pl.col("seq").cast(pl.Utf8), pl.col("data").bin.encode("hex"))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        frame.write_parquet(d / file_name("fz", 1, len(rows)))
        _read_everything(d)


def test_a_log_folder_copied_whole_reads_without_problems(tmp_path):
    for name, content in _good_log().items():
        (tmp_path / name).write_bytes(content)
    assert _read_everything(tmp_path) == []
    shutil.rmtree(tmp_path)
