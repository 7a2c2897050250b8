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
    event_id = v = time = source = job_id = node = model_type = iter_time = plan = error = None
    jobs: str | None = None  # joined by _SEP, split into a list column by frame()
    try:
        env = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:
        env = None
        error = f"malformed msgpack ({type(exc).__name__})"
    if env is not None and not isinstance(env, dict):
        error = "not a msgpack map"
    elif isinstance(env, dict):
        event_id, source = _s(env.get("id")), _s(env.get("source"))
        v = env.get("v") if isinstance(env.get("v"), int) and -2**31 <= env.get("v") < 2**31 else None
        time = _us(env.get("time"))
        payload = env.get("data")
        if not isinstance(payload, dict):
            error = "envelope without a data map"
        else:
            job_id = _s(payload.get("job_id"))
            node = _s(payload.get("node"))
            model_type = _s(payload.get("model_type"))
            model = payload.get("model")
            if model_type is None and isinstance(model, dict):
                model_type = _s(model.get("type"))
            it = payload.get("iter_time_s")
            iter_time = float(it) if isinstance(it, (int, float)) and not isinstance(it, bool) else None
            plan = plan_code(payload.get("plan"))
            decisions = payload.get("decisions")
            if isinstance(decisions, list):
                jobs = _SEP.join(d["job_id"] for d in decisions
                                 if isinstance(d, dict) and isinstance(d.get("job_id"), str))
            elif isinstance(payload.get("jobs"), list):
                jobs = _SEP.join(j for j in payload["jobs"] if isinstance(j, str))
            elif job_id is not None:
                jobs = job_id
            jobs = jobs or None
    return (seq, _us(stored), subject, event_id, v, time, source, job_id, jobs, node, model_type, iter_time,
            plan, msg_id, error, bytes(data))


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
