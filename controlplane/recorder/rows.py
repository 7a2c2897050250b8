"""The recorder's pure core: one stored message -> one event-log row.

It keeps the wire bytes exactly and pulls out the typed query columns without
validating the payload (validation and `*.rejected` answers belong to the
admission service); a message that is not even a msgpack envelope still gets a
row, with `error` saying why, so nothing is ever lost. `row_of` never raises:
should pulling out a column fail in a way not foreseen, the message still gets
a row, with its bytes, its subject and the failure in `error`.
"""

from __future__ import annotations

from typing import Any

import msgpack
import polars as pl

SCHEMA: dict[str, pl.DataType] = {
    "seq": pl.UInt64(),
    "stored": pl.Datetime("us", "UTC"),
    "subject": pl.Utf8(),
    "event_id": pl.Utf8(),
    "v": pl.Int32(),
    "time": pl.Datetime("us", "UTC"),
    "source": pl.Utf8(),
    "job_id": pl.Utf8(),
    "jobs": pl.List(pl.Utf8()),
    "node": pl.Utf8(),
    "model_type": pl.Utf8(),
    "iter_time_s": pl.Float64(),
    "plan": pl.Utf8(),
    "msg_id": pl.Utf8(),
    "error": pl.Utf8(),
    "data": pl.Binary(),
}
"""The event-log schema (docs/eventlog.md). `time` is the event time, `stored` when the stream stored it."""

COLUMNS = tuple(SCHEMA)

MAX_US = 253_402_300_800_000_000
"""Datetime columns hold times before the year 10000 (UTC), in microseconds since the epoch."""

_PLAN_DEFAULTS = {"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0, "offload": False, "ga_steps": 1, "gc": False,
                  "micro_batches": 1}


def plan_code(plan: Any) -> str | None:
    """The `Plan.code()` text of a plan given as a decoded map (None if it is not one)."""
    if not isinstance(plan, dict):
        return None
    try:  # most messages of a run carry one of a few plans: their codes are kept, by the plan's items
        key = tuple(plan.items())
        code = _PLAN_CODES.get(key, _UNKNOWN)
    except TypeError:  # a value that cannot be a key (a list, a map): worked out each time
        return _plan_code(plan)
    if code is _UNKNOWN:
        code = _plan_code(plan)
        if len(_PLAN_CODES) >= _PLAN_CODES_KEPT:
            _PLAN_CODES.clear()
        _PLAN_CODES[key] = code
    return code


_UNKNOWN = object()
_PLAN_CODES: dict[tuple, str | None] = {}
"""Codes by a plan's items. Items that compare equal give the same code: it reads each size through
`int()` and each flag by its truth, which agree on equal numbers (1, 1.0, True)."""
_PLAN_CODES_KEPT = 4096


def _plan_code(plan: dict) -> str | None:
    try:
        p = {**_PLAN_DEFAULTS, **plan}
        mb = int(p["micro_batches"])
        return (f"dp{int(p['dp'])}-tp{int(p['tp'])}-pp{int(p['pp'])}-z{int(p['zero_stage'])}"
                f"{'-off' if p['offload'] else ''}-ga{int(p['ga_steps'])}{'-gc' if p['gc'] else ''}"
                f"{f'-mb{mb}' if mb != 1 else ''}")
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite size
        return None


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _us(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        us = int(value * 1_000_000)
    except (OverflowError, ValueError):
        return None
    return us if 0 <= us < MAX_US else None


def row_of(seq: int, subject: str, data: bytes, msg_id: str | None, stored: float) -> tuple:
    """A row in COLUMNS order. Times are microseconds since the epoch. Never raises."""
    try:
        return _row_of(seq, subject, data, msg_id, stored)
    except Exception as exc:  # a message must never stop the recorder: keep its bytes, say what failed
        return failed_row(seq, subject, data, msg_id, _us(stored), f"row builder failed ({_failure(exc)})")


def failed_row(seq: int, subject: Any, data: Any, msg_id: Any, stored_us: int | None, error: str) -> tuple:
    """A row with only the message's bytes, its place in the stream and `error`: for a message whose
    columns could not be pulled out."""
    text = subject if isinstance(subject, str) else None
    stored_us = stored_us if isinstance(stored_us, int) and 0 <= stored_us < MAX_US else None
    return (seq, stored_us, _text(text), None, None, None, None, None, None, None, None, None, None,
            _text(msg_id) if isinstance(msg_id, str) else None, error, bytes(data))


def _text(value: str | None) -> str | None:
    """`value` as text Parquet can hold (lone surrogates replaced)."""
    if value is None:
        return None
    return value.encode("utf-8", "replace").decode("utf-8")


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def _row_of(seq: int, subject: str, data: bytes, msg_id: str | None, stored: float) -> tuple:
    # the hot path of the recorder: one call per message, so lookups are made once and the checks inline
    try:
        env = _unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:
        return _not_an_envelope(seq, subject, data, msg_id, stored, f"malformed msgpack ({type(exc).__name__})")
    if not isinstance(env, dict):
        return _not_an_envelope(seq, subject, data, msg_id, stored, "not a msgpack map")
    get = env.get
    event_id, source, v = get("id"), get("source"), get("v")
    event_id = event_id if isinstance(event_id, str) else None
    source = source if isinstance(source, str) else None
    v = v if isinstance(v, int) and -2**31 <= v < 2**31 else None
    time = _us(get("time"))
    payload = get("data")
    if not isinstance(payload, dict):
        return (seq, _us(stored), subject, event_id, v, time, source, None, None, None, None, None, None, msg_id,
                "envelope without a data map", bytes(data))
    get = payload.get
    job_id, node, model_type = get("job_id"), get("node"), get("model_type")
    job_id = job_id if isinstance(job_id, str) else None
    node = node if isinstance(node, str) else None
    if not isinstance(model_type, str):
        model = get("model")
        model_type = _s(model.get("type")) if isinstance(model, dict) else None
    it = get("iter_time_s")
    iter_time = float(it) if isinstance(it, (int, float)) and not isinstance(it, bool) else None
    plan = get("plan")
    plan = plan_code(plan) if plan is not None else None
    decisions = get("decisions")  # the jobs are joined by _SEP: frame() splits them into the list column
    if isinstance(decisions, list):
        jobs = _SEP.join(d["job_id"] for d in decisions if isinstance(d, dict) and isinstance(d.get("job_id"), str))
    else:
        listed = get("jobs")
        if isinstance(listed, list):
            jobs = _SEP.join(j for j in listed if isinstance(j, str))
        else:
            jobs = job_id
    return (seq, _us(stored), subject, event_id, v, time, source, job_id, jobs or None, node, model_type, iter_time,
            plan, msg_id, None, bytes(data))


def _not_an_envelope(seq: int, subject: str, data: bytes, msg_id: str | None, stored: float, error: str) -> tuple:
    return (seq, _us(stored), subject, None, None, None, None, None, None, None, None, None, None, msg_id, error,
            bytes(data))


_unpackb = msgpack.unpackb
_SEP = "\x1f"  # unit separator: never part of a job id


def frame(rows: list[tuple]) -> pl.DataFrame:
    columns = list(zip(*rows)) if rows else [[] for _ in COLUMNS]
    data = {}
    for name, values in zip(COLUMNS, columns):
        dtype = SCHEMA[name]
        if isinstance(dtype, pl.Datetime):
            data[name] = pl.Series(name, values, dtype=pl.Int64).cast(dtype)
        elif name == "jobs":  # building a list column from Python lists is slow; split joined text instead
            data[name] = pl.Series(name, values, dtype=pl.Utf8).str.split(_SEP)
        else:
            data[name] = pl.Series(name, values, dtype=dtype)
    return pl.DataFrame(data)


def safe_frame(rows: list[tuple]) -> pl.DataFrame:
    """`frame(rows)`; should a row not fit the schema, it is replaced by a `failed_row` naming why, so a
    file of the log can always be written (the message's bytes are kept either way)."""
    try:
        return frame(rows)
    except Exception:
        pass
    fixed = []
    for row in rows:
        try:
            frame([row])
            fixed.append(row)
        except Exception as exc:
            fixed.append(failed_row(row[0], row[2], row[-1], row[13], row[1], f"row not storable ({_failure(exc)})"))
    return frame(fixed)
