"""The recorder's row builder under fuzzing: every message gets a row of the log's schema, with its bytes,
whatever it holds; and a file of such rows reads back the same."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from controlplane.eventlog import events, scan
from controlplane.recorder.rows import COLUMNS, frame, plan_code, row_of
from controlplane.recorder.writer import write_atomic

from .strategies import VALUES, fuzz, mutated, pack


def _row(seq: int, subject: str, data: bytes) -> tuple:
    row = row_of(seq, subject, data, None, 1_700_000_000.0 + seq)
    assert len(row) == len(COLUMNS) and row[0] == seq and row[-1] == data
    return row


@fuzz(300)
@given(mutated())
def test_changed_events_get_a_row(case):
    wire, env = case
    assert frame([_row(1, wire, pack(env))]).height == 1


@fuzz(200)
@given(VALUES)
def test_any_plan_gives_a_code_or_none(plan):
    code = plan_code(plan)
    assert code is None or code.startswith("dp")


@fuzz(40)
@given(st.lists(st.one_of(mutated(), st.tuples(st.just("job.submitted"), st.binary(max_size=40))), min_size=1,
                max_size=12))
def test_a_file_of_any_messages_reads_back_the_same(cases):
    rows = [_row(i + 1, wire, env if isinstance(env, bytes) else pack(env)) for i, (wire, env) in enumerate(cases)]
    with tempfile.TemporaryDirectory() as d:
        write_atomic(Path(d), "fz", rows)
        logscan = scan(d)
        assert logscan.problems == []
        assert logscan.frame["data"].to_list() == [r[-1] for r in rows]
        decoded = events(d)
        assert len(decoded.events) + len(decoded.undecodable) == len(rows)
