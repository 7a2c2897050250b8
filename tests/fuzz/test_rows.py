"""The recorder's row builder under fuzzing: every message gets a row of the log's schema, with its bytes,
whatever it holds; and a file of such rows reads back the same."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from controlplane.eventlog import events, scan
import msgpack

from controlplane.recorder.rows import COLUMNS, _us, frame, plan_code, row_of
from controlplane.recorder.writer import write_atomic

from .strategies import SPECIAL_FLOATS, SUBJECTS, VALUES, fuzz, mutated, pack


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


# The row builder as it was written first, plainly (no kept codes, no early returns): the recorder's fast
# path must give the same row for every message. One change: a message that is msgpack's nil was taken for an
# envelope with nothing in it (no error); it is not a map, and its row now says so.
def _reference_plan_code(plan):
    if not isinstance(plan, dict):
        return None
    try:
        p = {"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0, "offload": False, "ga_steps": 1, "gc": False,
             "micro_batches": 1, **plan}
        mb = int(p["micro_batches"])
        return (f"dp{int(p['dp'])}-tp{int(p['tp'])}-pp{int(p['pp'])}-z{int(p['zero_stage'])}"
                f"{'-off' if p['offload'] else ''}-ga{int(p['ga_steps'])}{'-gc' if p['gc'] else ''}"
                f"{f'-mb{mb}' if mb != 1 else ''}")
    except (TypeError, ValueError, OverflowError):
        return None


def _reference_row(seq, subject, data, msg_id, stored):
    s = lambda value: value if isinstance(value, str) else None  # noqa: E731
    event_id = v = time = source = job_id = node = model_type = iter_time = plan = error = jobs = None
    try:
        env = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:
        env = None
        error = f"malformed msgpack ({type(exc).__name__})"
    if error is None and not isinstance(env, dict):
        error = "not a msgpack map"
    elif isinstance(env, dict):
        event_id, source = s(env.get("id")), s(env.get("source"))
        v = env.get("v") if isinstance(env.get("v"), int) and -2**31 <= env.get("v") < 2**31 else None
        time = _us(env.get("time"))
        payload = env.get("data")
        if not isinstance(payload, dict):
            error = "envelope without a data map"
        else:
            job_id, node, model_type = s(payload.get("job_id")), s(payload.get("node")), s(payload.get("model_type"))
            model = payload.get("model")
            if model_type is None and isinstance(model, dict):
                model_type = s(model.get("type"))
            it = payload.get("iter_time_s")
            iter_time = float(it) if isinstance(it, (int, float)) and not isinstance(it, bool) else None
            plan = _reference_plan_code(payload.get("plan"))
            decisions = payload.get("decisions")
            if isinstance(decisions, list):
                jobs = "\x1f".join(d["job_id"] for d in decisions if isinstance(d, dict)
                                   and isinstance(d.get("job_id"), str))
            elif isinstance(payload.get("jobs"), list):
                jobs = "\x1f".join(j for j in payload["jobs"] if isinstance(j, str))
            elif job_id is not None:
                jobs = job_id
            jobs = jobs or None
    return (seq, _us(stored), subject, event_id, v, time, source, job_id, jobs, node, model_type, iter_time, plan,
            msg_id, error, bytes(data))


def test_a_message_that_is_not_a_map_says_so():
    for value in (None, 7, "text", [1, 2], b"bytes"):
        assert row_of(1, "job.submitted", pack(value), None, 1.0)[COLUMNS.index("error")] == "not a msgpack map"


def _same(a: tuple, b: tuple) -> bool:
    """Equal rows, a NaN equal to a NaN."""
    return len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b))


PAYLOADS = st.dictionaries(st.sampled_from(["job_id", "node", "model_type", "model", "iter_time_s", "plan", "decisions",
                                           "jobs"]),
                           st.one_of(SPECIAL_FLOATS, st.booleans(), VALUES,
                                     st.dictionaries(st.sampled_from(["type", "job_id"]), VALUES),
                                     st.lists(st.one_of(VALUES, st.fixed_dictionaries({"job_id": VALUES})), max_size=3)),
                           max_size=6)
ENVELOPES = st.dictionaries(st.sampled_from(["v", "id", "source", "time", "data"]),
                            st.one_of(st.integers(-2**63, 2**64 - 1), st.sampled_from([2**31 - 1, 2**31, -2**31, -2**31 - 1]),
                                      SPECIAL_FLOATS, VALUES, PAYLOADS), max_size=5)


@fuzz(400)
@given(st.lists(st.one_of(mutated(), st.tuples(st.sampled_from(SUBJECTS), st.one_of(VALUES, ENVELOPES)),
                          st.tuples(st.just("job.submitted"), st.binary(max_size=40))), min_size=1, max_size=6),
       st.one_of(st.none(), st.text(max_size=6)), st.one_of(st.floats(), SPECIAL_FLOATS))
def test_every_row_is_the_plainly_built_one(cases, msg_id, stored):
    for i, (wire, env) in enumerate(cases):
        data = env if isinstance(env, bytes) else pack(env)
        row, reference = row_of(i + 1, wire, data, msg_id, stored), _reference_row(i + 1, wire, data, msg_id, stored)
        assert _same(row, reference), (row, reference)


SIZES = st.one_of(st.integers(-3, 70), st.sampled_from([1.0, 8.0, 2.5, -0.0, float("nan"), float("inf"), 1e300]),
                  st.booleans(), st.sampled_from(["8", " 2", "x"]), st.none(), VALUES)


@fuzz(300)
@given(st.lists(st.dictionaries(st.sampled_from(["dp", "tp", "pp", "zero_stage", "offload", "ga_steps", "gc",
                                                 "micro_batches", "extra", 1]), SIZES, max_size=9),
                min_size=1, max_size=12))
def test_kept_plan_codes_are_the_codes(plans):
    """Codes kept by a plan's items: plans whose items compare equal (8, 8.0; 1, True) get the same code, and
    any plan asked after others gets the code worked out afresh."""
    plans = plans + [dict(p) for p in plans]  # each asked again, its code then kept
    for plan in plans:
        assert plan_code(plan) == _reference_plan_code(plan), plan


@fuzz(400)
@given(ENVELOPES, PAYLOADS)
def test_every_payload_gets_the_plainly_built_row(env, payload):
    data = pack({**env, "data": payload})
    row, reference = row_of(1, "job.submitted", data, None, 1.0), _reference_row(1, "job.submitted", data, None, 1.0)
    assert _same(row, reference), (row, reference)
