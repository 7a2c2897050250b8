"""The envelope and its msgpack codec (pure functions, no I/O).

Wire format of every message: a msgpack map with exactly these keys, in this order::

    {"v": int, "id": str, "subject": str, "time": float, "source": str, "data": {...payload...}}

`encode` is deterministic: the same event gives the same bytes (keys in field
order, floats as float64), which is what lets replay compare decisions byte for
byte. `decode` validates everything and raises `Invalid` with the field, the
expected and the received value.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

import msgpack

from .catalog import UnknownSubject, base_subject, payload_type
from .identity import check_subject_node
from .schema import Invalid, build, to_plain

ENVELOPE_KEYS = ("v", "id", "subject", "time", "source", "data")
_ENVELOPE_SET = frozenset(ENVELOPE_KEYS)
DECODER_FAILED = "the decoder failed on it"
MAX_MESSAGE_BYTES = 1024 * 1024
"""NATS's default max_payload; larger messages are refused."""
MAX_EVENT_TIME = 253_402_300_800.0
"""Event times are seconds since the epoch in [0, MAX_EVENT_TIME): before 10000-01-01 UTC, the end of the
event log's datetime columns. A fixed bound, never the wall clock, so a replay refuses exactly what the
run refused; simulated and replayed clocks that start near 0 are inside it."""


@dataclass(frozen=True)
class Event:
    """One message: envelope fields plus the typed payload."""

    subject: str
    payload: Any
    time: float
    id: str
    source: str
    v: int = 1

    @property
    def base(self) -> str:
        return base_subject(self.subject)


def new_id(prefix: str = "") -> str:
    """A random event id for shells (cores derive ids from their input instead)."""
    return f"{prefix}{uuid.uuid4().hex}"


def make(subject: str, payload: Any, *, time: float, id: str, source: str) -> Event:
    """Build an event, checking that the payload is the subject's type."""
    cls, version = payload_type(subject)
    if not isinstance(payload, cls):
        raise TypeError(f"{subject} carries {cls.__name__}, not {type(payload).__name__}")
    return Event(subject, payload, float(time), id, source, version)  # by position: a call by keyword costs twice


def encode(event: Event) -> bytes:
    cls, _ = payload_type(event.subject)
    if not isinstance(event.payload, cls):
        raise TypeError(f"{event.subject} carries {cls.__name__}, not {type(event.payload).__name__}")
    return msgpack.packb(
        {"v": event.v, "id": event.id, "subject": event.subject, "time": float(event.time),
         "source": event.source, "data": to_plain(event.payload)},
        use_bin_type=True,
    )


def unpack(data: bytes) -> Any:
    """msgpack bytes -> Python value, or Invalid('malformed msgpack')."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise Invalid("not bytes", "", "msgpack bytes", type(data).__name__)
    if len(data) > MAX_MESSAGE_BYTES:
        raise Invalid("message too large", "", f"at most {MAX_MESSAGE_BYTES} bytes", f"{len(data)} bytes")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types (ExtraData, FormatError, ValueError, ...)
        raise Invalid("malformed msgpack", "", "one msgpack map", f"{len(data)} bytes ({type(exc).__name__}: {exc})") from None


def decode(data: bytes, wire_subject: str | None = None) -> Event:
    """Validate and decode wire bytes. `wire_subject` is the NATS subject it arrived on. Raises nothing but
    `Invalid`: should a check fail in a way not foreseen, that is `Invalid` too (reason `DECODER_FAILED`),
    so no message can stop a service or a replay."""
    obj = unpack(data)
    try:
        return decode_obj(obj, wire_subject)
    except Invalid:
        raise
    except Exception as exc:
        raise Invalid(DECODER_FAILED, "", "a valid event", f"{type(exc).__name__}: {exc}"[:200]) from exc


def decode_obj(obj: Any, wire_subject: str | None = None) -> Event:
    if not isinstance(obj, dict):
        raise Invalid("wrong type", "", "a msgpack map (the envelope)", type(obj).__name__)
    if obj.keys() != _ENVELOPE_SET:  # the field-by-field checks say which key is wrong
        for key in obj:
            if key not in ENVELOPE_KEYS:
                raise Invalid("unknown envelope field", str(key)[:60], ", ".join(ENVELOPE_KEYS), "")
        for key in ENVELOPE_KEYS:
            if key not in obj:
                raise Invalid("missing envelope field", key, "present", "nothing")
    v, eid, subject, time, source = obj["v"], obj["id"], obj["subject"], obj["time"], obj["source"]
    if not isinstance(subject, str):
        raise Invalid("wrong type", "subject", "string", type(subject).__name__)
    if wire_subject is not None and wire_subject != subject:
        raise Invalid("envelope subject differs from the subject it was published on", "subject",
                      wire_subject, subject)
    try:
        cls, version = payload_type(subject)
    except UnknownSubject:
        raise Invalid("unknown subject", "subject", "a subject of docs/events.md", subject) from None
    if not isinstance(v, int) or isinstance(v, bool):
        raise Invalid("wrong type", "v", "integer", type(v).__name__)
    if not 1 <= v <= version:
        raise Invalid("unknown schema version", "v", f"1..{version}", str(v))
    if not isinstance(eid, str) or not 0 < len(eid) <= 128:
        raise Invalid("event id must be a string of 1 to 128 characters", "id", "string", repr(eid)[:60])
    if (isinstance(time, bool) or not isinstance(time, (int, float)) or not math.isfinite(time)
            or not 0 <= time < MAX_EVENT_TIME):
        raise Invalid("event time must be seconds since the epoch, before the year 10000", "time",
                      f"0 <= time < {MAX_EVENT_TIME:.0f}", repr(time)[:60])
    if not isinstance(source, str) or len(source) > 128:
        raise Invalid("source must be a string of at most 128 characters", "source", "string",
                      repr(source)[:60])
    payload = build(cls, obj["data"], "data")
    check_subject_node(subject, payload)
    return Event(subject, payload, float(time), eid, source, v)  # by position, as in `make`
