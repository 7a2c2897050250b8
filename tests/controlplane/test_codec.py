"""The envelope codec: round trips, stable bytes, precise refusals, and no crash on any input."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.events import (SUBJECTS, Invalid, JobSubmitted, Plan, Resources, decode, encode, make,
                                 rejection_subject)
from controlplane.events.schema import to_plain

from .samples import PAYLOADS, sample


def test_every_subject_has_a_sample():
    assert sorted(PAYLOADS) == sorted(s for s in SUBJECTS if not s.endswith(".rejected") or s == "job.rejected")


@pytest.mark.parametrize("subject", sorted(PAYLOADS))
def test_round_trip_and_stable_bytes(subject):
    event = sample(subject)
    wire = encode(event)
    assert decode(wire, subject) == event
    assert encode(decode(wire)) == wire  # byte-identical re-encoding: what replay compares


def _mutated(subject: str, path: list, value) -> bytes:
    obj = msgpack.unpackb(encode(sample(subject)))
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return msgpack.packb(obj)


_DELETE = object()


@pytest.mark.parametrize("path,value,field,reason", [
    (["data", "resources", "gpus"], 0, "data.resources.gpus", "out of range"),
    (["data", "resources", "gpus"], 10**6, "data.resources.gpus", "out of range"),
    (["data", "resources", "gpus"], -4, "data.resources.gpus", "out of range"),
    (["data", "resources", "gpus"], "2", "data.resources.gpus", "wrong type"),
    (["data", "resources", "mem_gb"], float("nan"), "data.resources.mem_gb", "number must be finite"),
    (["data", "plan", "zero_stage"], 5, "data.plan.zero_stage", "value not allowed"),
    (["data", "surprise"], 1, "data.surprise", "unknown field"),
    (["data", "tenant"], _DELETE, "data.tenant", "missing required field"),
    (["data", "job_id"], "a b/c", "data.job_id", "string does not match the pattern"),
    (["data", "guaranteed"], 1, "data.guaranteed", "wrong type"),
    (["v"], 2, "v", "unknown schema version"),
    (["v"], 0, "v", "unknown schema version"),
    (["subject"], "job.exploded", "subject", "unknown subject"),
    (["extra"], 1, "extra", "unknown envelope field"),
    (["time"], -1.0, "time", "event time must be seconds since the epoch, before the year 10000"),
    (["time"], 1e300, "time", "event time must be seconds since the epoch, before the year 10000"),
    (["time"], 253_402_300_800, "time", "event time must be seconds since the epoch, before the year 10000"),
    (["time"], float("nan"), "time", "event time must be seconds since the epoch, before the year 10000"),
    (["id"], "", "id", "event id must be a string of 1 to 128 characters"),
])
def test_precise_reasons(path, value, field, reason):
    with pytest.raises(Invalid) as err:
        decode(_mutated("job.submitted", path, value))
    assert err.value.field == field
    assert err.value.reason == reason


@pytest.mark.parametrize("subject,path,value,field,reason", [
    ("plan.decided", ["data", "decisions", 0, "allocation", 0, "gpus"], "8", "data.decisions[0].allocation[0].gpus",
     "wrong type"),
    ("plan.decided", ["data", "decisions", 0, "allocation", 0, "gpus"], True, "data.decisions[0].allocation[0].gpus",
     "wrong type"),
    ("plan.decided", ["data", "decisions", 1, "plan"], 3, "data.decisions[1].plan", "wrong type"),
    ("plan.decided", ["data", "decisions", 0, "allocation"], {"n": 1}, "data.decisions[0].allocation", "wrong type"),
    ("plan.decided", ["data", "decisions", 0, "job_id"], None, "data.decisions[0].job_id", "wrong type"),
    ("plan.decided", ["data", "decisions", 0, "detail", "gpu_slope"], 0.31, "data.decisions[0].detail.gpu_slope",
     "wrong type"),
    ("plan.decided", ["data", "decisions", 0, "predicted_throughput"], float("inf"),
     "data.decisions[0].predicted_throughput", "number must be finite"),
    ("model.updated", ["data", "params", "k_bwd"], "2.0", "data.params.k_bwd", "wrong type"),
    ("model.updated", ["data", "params", 7], 1.0, "data.params.7", "wrong key type"),
    ("model.updated", ["data", "params"], [1.0], "data.params", "wrong type"),
])
def test_precise_reasons_in_nested_values(subject, path, value, field, reason):
    """Sequences, maps and optional values name the element that is wrong, as fields do."""
    with pytest.raises(Invalid) as err:
        decode(_mutated(subject, path, value))
    assert (err.value.field, err.value.reason) == (field, reason)


def test_cross_field_rules():
    base = PAYLOADS["job.submitted"]
    obj = to_plain(base)
    obj["resources"]["gpus"] = 4  # plan dp*tp*pp = 2
    wire = msgpack.packb({"v": 1, "id": "x", "subject": "job.submitted", "time": 1.0, "source": "t", "data": obj})
    with pytest.raises(Invalid, match="plan dp\\*tp\\*pp must equal the requested GPUs"):
        decode(wire)
    with pytest.raises(Invalid, match="ZeRO-Offload needs a ZeRO stage"):
        decode(msgpack.packb({"v": 1, "id": "x", "subject": "job.submitted", "time": 1.0, "source": "t",
                              "data": {**to_plain(base), "plan": {"dp": 2, "offload": True, "ga_steps": 2}}}))


def test_subject_must_match_wire_subject():
    with pytest.raises(Invalid, match="differs from the subject"):
        decode(encode(sample("job.completed")), "job.failed")


def test_malformed_msgpack():
    for data in (b"", b"\xc1", b"\x93\x01", encode(sample("clock.tick")) + b"\x00", b"not msgpack at all"):
        with pytest.raises(Invalid) as err:
            decode(data)
        assert err.value.reason in {"malformed msgpack", "wrong type"}


def test_routing_suffix_and_rejection_subjects():
    event = make("plan.decided.node-3", PAYLOADS["plan.decided"], time=1.0, id="p", source="t")
    assert decode(encode(event), "plan.decided.node-3").base == "plan.decided"
    assert rejection_subject("job.submitted") == "job.rejected"
    assert rejection_subject("metrics.iteration") == "metrics.rejected"
    assert rejection_subject("plan.decided.node-3") == "plan.rejected"
    assert rejection_subject("job.frobnicated") == "job.rejected"
    assert rejection_subject("job.rejected") is None
    assert rejection_subject("plan.rejected") is None


def test_make_checks_payload_type():
    with pytest.raises(TypeError):
        make("job.submitted", PAYLOADS["clock.tick"], time=0, id="x", source="t")


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_crash_the_decoder(data):
    try:
        decode(data)
    except Invalid as exc:
        assert exc.reason


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(PAYLOADS)), st.dictionaries(st.sampled_from(
    ["job_id", "tenant", "plan", "resources", "node", "gpus", "iteration", "iter_time_s", "decisions", "seq",
     "period_s", "model", "reason", "params", "allocation", "jobs"]), json_like, max_size=8))
def test_random_payloads_are_refused_or_valid(subject, data):
    wire = msgpack.packb({"v": 1, "id": "r", "subject": subject, "time": 1.0, "source": "h", "data": data},
                         use_bin_type=True)
    try:
        event = decode(wire, subject)
    except Invalid as exc:
        assert exc.reason and (exc.field.startswith("data") or exc.field == "")
    else:
        assert encode(event)  # whatever is accepted can be re-encoded


def test_job_plan_must_divide_batch():
    with pytest.raises(Invalid, match="divisible by dp \\* ga_steps"):
        JobSubmitted.check(JobSubmitted(job_id="j", tenant="t", guaranteed=False,
                                        model=PAYLOADS["job.submitted"].model, global_batch_size=10,
                                        plan=Plan(dp=4), resources=Resources(gpus=4), target_iterations=1))


def _bounded_fields():
    """(class, field name, type, metadata) of every int, str and float field of the catalogue's payloads (and the
    dataclasses they hold) that carries bounds."""
    import dataclasses

    from controlplane.events.schema import _BOUND_KEYS, hints

    seen, out, todo = set(), [], [type(sample(s).payload) for s in sorted(PAYLOADS)]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        th = hints(cls)
        for f in dataclasses.fields(cls):
            tp = th[f.name]
            for inner in (tp, *getattr(tp, "__args__", ())):
                if dataclasses.is_dataclass(inner):
                    todo.append(inner)
                for deeper in getattr(inner, "__args__", ()):
                    if dataclasses.is_dataclass(deeper):
                        todo.append(deeper)
            if tp in (int, str, float) and any(f.metadata.get(k) is not None for k in _BOUND_KEYS):
                out.append((cls, f.name, tp, f.metadata))
    return out


def test_bounded_fields_refuse_as_the_type_check_and_the_bounds_do():
    """A bounded int, str or float field is checked in one call (`_bounded_plain`, `_bounded_number`); it must accept
    and refuse exactly what the plain type check followed by `_bounds` does, with the same reason, field, expected
    and got, for values inside, at and past every bound, of the wrong type, booleans, NaN and infinities."""
    import math

    from controlplane.events.schema import _bounds, _got, _short, converter

    def reference(tp, meta, value, path):
        if tp is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise Invalid("wrong type", path, "number", _got(value))
            value = float(value)
            if not math.isfinite(value):
                raise Invalid("number must be finite", path, "a finite number", _short(value))
        elif not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise Invalid("wrong type", path, {int: "integer", str: "string"}[tp], _got(value))
        _bounds(meta)(value, path)
        return value

    fields = _bounded_fields()
    assert len(fields) > 20
    checked = 0
    for cls, name, tp, meta in fields:
        edges = [meta.get(k) for k in ("ge", "gt", "le") if meta.get(k) is not None]
        values = [None, True, False, "x", "", 0, 1, -1, 0.5, -0.0, math.nan, math.inf, -math.inf, 10 ** 12, [1], {}]
        values += [e + d for e in edges for d in (-1, -0.5, 0, 0.5, 1)]
        values += list(meta.get("choices") or ()) + ["not-a-choice", "a" * (1 + (meta.get("max_len") or 64)),
                                                      "has space", "ok-name_1.2"]
        conv = converter(tp, meta)
        for value in values:
            path = f"data.{name}"
            try:
                want = ("ok", reference(tp, meta, value, path))
            except Invalid as exc:
                want = ("refused", exc.reason, exc.field, exc.expected, exc.got)
            try:
                got = ("ok", conv(value, path))
            except Invalid as exc:
                got = ("refused", exc.reason, exc.field, exc.expected, exc.got)
            assert got == want, (cls.__name__, name, value)
            checked += 1
    assert checked > 500


def _checks_alone(monkeypatch) -> None:
    """From now on every payload is built by `schema.build`'s field-by-field checks: no builder written out."""
    from controlplane.events import schema

    class Checks(dict):
        def get(self, cls, default=None):
            def leave(data, path):
                raise schema._FALLBACK
            return leave

    monkeypatch.setattr(schema, "_FAST", Checks())


def test_the_fast_builder_builds_and_refuses_as_the_checks_do(monkeypatch):
    """`schema.build` first tries a builder written out for the class, and hands anything it does not take to its
    field-by-field checks. Every sample event, and every sample with one field removed, renamed, or set to a value of
    another type, must decode to the same event, or be refused with the same reason, field, expected and got, as the
    checks alone give."""

    def decoded(wire: bytes, subject: str):
        try:
            return ("ok", decode(wire, subject))
        except Invalid as exc:
            return ("refused", exc.reason, exc.field, exc.expected, exc.got)

    cases = []
    for subject in sorted(PAYLOADS):
        cases.append((encode(sample(subject)), subject))
        obj = msgpack.unpackb(encode(sample(subject)))
        for key in sorted(obj["data"]):
            for change in ("drop", "rename", "retype"):
                data = dict(obj["data"])
                value = data.pop(key)
                if change == "rename":
                    data[key + "_x"] = value
                elif change == "retype":
                    data[key] = "text" if not isinstance(value, str) else 7
                cases.append((msgpack.packb({**obj, "data": data}), subject))
    fast = [decoded(wire, subject) for wire, subject in cases]

    _checks_alone(monkeypatch)
    checked = [decoded(wire, subject) for wire, subject in cases]
    assert fast == checked
    assert sum(1 for r in fast if r[0] == "ok") >= len(PAYLOADS) and sum(1 for r in fast if r[0] == "refused") > 100


_ODD_VALUES = (None, True, False, 0, 1, -1, 2, 0.5, -0.0, 1e300, float("nan"), float("inf"), float("-inf"), 10 ** 12,
               -10 ** 12, "", "x", "has space", "a" * 300, "ok-name_1.2", [], [1, 2], [0, -3], [True], [1.5], ["x"],
               [{}], {}, {"x": 1}, b"raw")


def _hash(event):
    """The event's hash, or None where a field holds a map (a dataclass holding one cannot be hashed)."""
    try:
        return hash(event)
    except TypeError:
        return None


def _odd_cases():
    """Every sample event with one field, or one field of a map it holds (a plan, resources, an allocation's share),
    set to each of `_ODD_VALUES`: values inside, at and past common bounds, of every type, booleans, NaN and
    infinities, arrays of good and bad items."""
    cases = []
    for subject in sorted(PAYLOADS):
        obj = msgpack.unpackb(encode(sample(subject)))
        for key in sorted(obj["data"]):
            for odd in _ODD_VALUES:
                cases.append((msgpack.packb({**obj, "data": {**obj["data"], key: odd}}), subject))
            inner = obj["data"][key]
            maps = [inner] if isinstance(inner, dict) else [x for x in inner if isinstance(x, dict)][:1] \
                if isinstance(inner, list) else []
            for m in maps:
                for sub in sorted(m):
                    for odd in _ODD_VALUES:
                        changed = {**m, sub: odd}
                        value = changed if isinstance(inner, dict) else [changed] + inner[1:]
                        cases.append((msgpack.packb({**obj, "data": {**obj["data"], key: value}}), subject))
    return cases


def test_the_fast_builder_takes_and_leaves_bound_edges_as_the_checks_do(monkeypatch):
    """The fast builder checks common fields inline (a bounded number or name, an array of plain items, a nested map)
    and gives a payload its fields by position where it may. At values inside, at and past the bounds, of other
    types, and in nested maps and arrays, it must decode to the same event, field for field and in the same order, or
    be refused with the same reason, field, expected and got, as the converters alone give."""

    def decoded(wire: bytes, subject: str):
        try:
            event = decode(wire, subject)
        except Invalid as exc:
            return ("refused", exc.reason, exc.field, exc.expected, exc.got)
        return ("ok", event, repr(event), _hash(event), list(vars(event)), list(vars(event.payload)))

    cases = _odd_cases()
    assert len(cases) > 3000
    fast = [decoded(wire, subject) for wire, subject in cases]

    _checks_alone(monkeypatch)
    checked = [decoded(wire, subject) for wire, subject in cases]
    for case, got, want in zip(cases, fast, checked):
        assert got == want, case
    assert sum(1 for r in fast if r[0] == "ok") > 300 and sum(1 for r in fast if r[0] == "refused") > 1000


def test_a_decoded_event_is_the_one_its_constructor_makes():
    """`decode` makes an event and its payload with their fields given by position (by name where a field takes only
    that): the result must equal, hash and print as the one made by name, with its fields in the same order."""
    from controlplane.events.codec import Event

    for subject in sorted(PAYLOADS):
        made = sample(subject)
        got = decode(encode(made), made.subject)
        rebuilt = Event(subject=got.subject, payload=type(got.payload)(**vars(got.payload)), time=got.time, id=got.id,
                        source=got.source, v=got.v)
        assert got == made == rebuilt and _hash(got) == _hash(rebuilt) and repr(got) == repr(rebuilt)
        assert list(vars(got)) == list(vars(rebuilt)) and list(vars(got.payload)) == list(vars(rebuilt.payload))


def _plain_reference(obj):
    """`to_plain` as one generic walk: a dataclass's fields in order, arrays item by item, maps by sorted key."""
    import dataclasses

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain_reference(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if type(obj) in (list, tuple):
        return [_plain_reference(v) for v in obj]
    if type(obj) is dict:
        return {k: _plain_reference(obj[k]) for k in sorted(obj, key=str)}
    return obj


def test_the_written_out_plain_form_is_the_generic_walks_to_the_byte():
    """`to_plain` writes each dataclass's fields out (`_plain_writer`): every sample event, and every odd one the
    decoder accepts, must give the bytes the generic walk gives, keys in the same order."""
    payloads = [sample(s).payload for s in sorted(PAYLOADS)]
    for wire, subject in _odd_cases():
        try:
            payloads.append(decode(wire, subject).payload)
        except Invalid:
            pass
    assert len(payloads) > 300
    for payload in payloads:
        assert msgpack.packb(to_plain(payload), use_bin_type=True) == msgpack.packb(_plain_reference(payload),
                                                                                   use_bin_type=True), payload


def test_the_fast_builder_gives_fields_by_position_and_by_name_as_the_class_takes_them():
    """A dataclass may take some fields only by name, listed before others it takes by position: the builder written
    out for it must give the latter by position, in their order, and the former by name."""
    import dataclasses

    from controlplane.events.schema import build, spec

    @dataclasses.dataclass(frozen=True)
    class Mixed:
        first: int = spec("a field taken by position", ge=0)
        named: str = dataclasses.field(default="x", kw_only=True, metadata={"doc": "taken by name only"})
        second: float = spec("another by position", gt=0, default=1.0)

    got = build(Mixed, {"first": 3, "named": "y", "second": 2.5})
    assert got == Mixed(3, 2.5, named="y") and list(vars(got)) == ["first", "named", "second"]
    assert build(Mixed, {"first": 0}) == Mixed(0)
    with pytest.raises(Invalid, match="out of range"):
        build(Mixed, {"first": 1, "second": 0.0})
