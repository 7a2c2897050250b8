"""The event decoder under fuzzing: nothing but `Invalid` for any input, and what it accepts goes back
to the same bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.events import Invalid, decode, decode_obj, encode
from controlplane.events.codec import DECODER_FAILED, MAX_EVENT_TIME

from .strategies import SUBJECTS, VALUES, examples, fuzz, mutated, pack, plain


def _check(obj, wire: str | None) -> None:
    try:
        event = decode_obj(obj, wire)  # the checks themselves, without decode()'s last resort
    except Invalid as exc:
        assert exc.reason != DECODER_FAILED
        return
    assert 0 <= event.time < MAX_EVENT_TIME
    data = encode(event)  # an accepted event can always be sent on, and reads back the same
    assert encode(decode(data, event.subject)) == data


@fuzz(300)
@given(mutated())
def test_changed_events_are_refused_or_read_back_the_same(case):
    wire, env = case
    _check(env, wire)
    try:
        decode(pack(env), wire)
    except Invalid as exc:
        assert exc.reason != DECODER_FAILED


@fuzz(200)
@given(st.binary(max_size=200))
def test_any_bytes_are_refused_with_a_reason(data):
    try:
        decode(data)
    except Invalid as exc:
        assert exc.reason and exc.reason != DECODER_FAILED


@fuzz(200)
@given(VALUES, st.sampled_from(SUBJECTS))
def test_any_msgpack_value_is_refused_or_valid(value, subject):
    _check(value, subject)
    _check({**plain(subject), "data": value}, subject)


@pytest.mark.parametrize("field", ["dp", "tp", "pp", "zero_stage", "ga_steps", "micro_batches"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e300])
def test_a_plan_with_an_infinite_size_is_refused(field, value):
    env = plain("metrics.iteration")
    env["data"]["plan"][field] = value
    with pytest.raises(Invalid) as err:
        decode(pack(env), "metrics.iteration")
    assert err.value.field == f"data.plan.{field}"


@pytest.mark.parametrize("t", [0, 0.0, 1e-9, 3600.0, 1_700_000_000.0, MAX_EVENT_TIME - 1])
def test_event_times_from_0_to_the_bound_are_accepted(t):
    env = {**plain("clock.tick"), "time": t}
    assert decode(pack(env), "clock.tick").time == t


@pytest.mark.slow
@fuzz(3000)
@given(mutated())
def test_changed_events_long_run(case):
    wire, env = case
    _check(env, wire)


def test_the_example_count_can_be_raised(monkeypatch):
    monkeypatch.setenv("RUBICK_FUZZ_EXAMPLES", "12345")
    assert examples(10) == 12345
    monkeypatch.delenv("RUBICK_FUZZ_EXAMPLES")
    assert examples(10) == 10


@pytest.mark.parametrize("subject", SUBJECTS)
def test_deeply_nested_values_are_refused_with_a_reason(subject):
    deep: object = 0
    for i in range(1000):
        deep = [deep] if i % 2 else {"a": deep}
    env = plain(subject)
    for key in list(env["data"]) + ["surprise"]:
        changed = {**env, "data": {**env["data"], key: deep}}
        _check(changed, subject)
    _check({**env, "data": deep}, subject)
