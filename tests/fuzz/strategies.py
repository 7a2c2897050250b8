"""Inputs for the fuzz tests: any bytes, any msgpack value, and valid events with a few fields changed.

Each fuzz test runs a bounded number of examples (`fuzz(n)`); `RUBICK_FUZZ_EXAMPLES=<n>` runs every one
of them with `n` examples instead (e.g. 20000 for a long run; the `slow` tests run ten times the
default)."""

from __future__ import annotations

import os
from typing import Any, Iterator

import msgpack
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from controlplane.events import encode
from tests.controlplane.samples import PAYLOADS, sample

EXAMPLES_ENV = "RUBICK_FUZZ_EXAMPLES"


def examples(n: int) -> int:
    """`n`, or what `RUBICK_FUZZ_EXAMPLES` asks for."""
    return int(os.environ.get(EXAMPLES_ENV) or n)


def fuzz(n: int):
    return settings(max_examples=examples(n), deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


SPECIAL_FLOATS = st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e300, -1e300, -0.0, 1e-320,
                                  2.0 ** 63, 253_402_300_800.0, 253_402_300_799.999])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), SPECIAL_FLOATS,
                    st.integers(-3, 3), st.text(max_size=12), st.binary(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
"""Any value msgpack can carry (integers within its 64 bits)."""

SUBJECTS = sorted(PAYLOADS)


def plain(subject: str, n: int = 0) -> dict[str, Any]:
    """A valid sample event as the decoded msgpack map."""
    return msgpack.unpackb(encode(sample(subject, n)), raw=False, strict_map_key=False)


def _places(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every place in a nested value: the path of keys/indexes to it."""
    if isinstance(value, dict):
        for k in value:
            yield (*path, k)
            yield from _places(value[k], (*path, k))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield (*path, i)
            yield from _places(item, (*path, i))


def _at(value: Any, path: tuple) -> Any:
    for k in path:
        value = value[k]
    return value


@st.composite
def mutated(draw, subjects: list[str] = SUBJECTS) -> tuple[str, dict[str, Any]]:
    """(wire subject, envelope): a valid sample of a subject with one to three places changed, removed
    or added (a changed place gets any value, often an extreme number)."""
    subject = draw(st.sampled_from(subjects))
    env = plain(subject, draw(st.integers(0, 5)))
    for _ in range(draw(st.integers(1, 3))):
        places = list(_places(env))
        path = draw(st.sampled_from(places))
        parent = _at(env, path[:-1])
        action = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
        if action == "set":
            parent[path[-1]] = draw(st.one_of(SPECIAL_FLOATS, VALUES))
        elif action == "delete":
            if isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent.pop(path[-1])
        else:
            target = _at(env, path)
            if isinstance(target, dict):
                target[draw(st.text(max_size=8))] = draw(VALUES)
            elif isinstance(target, list):
                target.append(draw(VALUES))
    wire = subject if draw(st.booleans()) else f"{subject}.node-0"
    return wire, env


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)
