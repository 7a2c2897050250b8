"""Writes docs/events.md from the schema itself, so the documentation cannot drift from the code.

    python -m controlplane.events.docgen > docs/events.md
"""

from __future__ import annotations

import dataclasses
import json
import types
from typing import Any, Union, get_args, get_origin

from .catalog import ROUTED, STREAM_SUBJECTS, SUBJECTS
from .codec import Event, encode, make
from .schema import _type_name, hints

INTRO = """\
# Events: the subject catalogue

Every control-plane component talks only through these NATS subjects; every message is kept in the
event log. This page is generated from the schema in `controlplane/events/` (`python -m
controlplane.events.docgen > docs/events.md`; a test fails when it is out of date).
`rubick schema <subject>` prints the same contract as JSON Schema.

## Transport

- One JetStream stream, `RUBICK`, captures the subjects `{stream_subjects}`.
- Publish with JetStream (a request that is answered with a publish acknowledgement) and set the
  header `Nats-Msg-Id` to the event's `id`: a publish retried after a timeout is then stored once
  (the stream drops duplicates within its 2-minute window).
- Subjects that may carry a suffix: {routed} (for example `plan.decided.node-3`); the
  envelope's `subject` is then the full subject published on. A node agent (and a training process
  on its node) publishes its node's events with the node id as that suffix (`job.started.node-3`,
  `metrics.iteration.node-3`): the server lets it publish only its own node's subjects, and an event
  whose payload speaks for another node (its `node`, or a job not placed on that node) is refused
  (docs/security.md).

## Encoding

Each message is one [msgpack](https://msgpack.org) map, the *envelope*, with exactly these keys:

| key | type | meaning |
| --- | --- | --- |
| `v` | integer | schema version of the payload (see versioning) |
| `id` | string, 1-128 chars | event id, unique; also the `Nats-Msg-Id` header |
| `subject` | string | the subject the message is published on |
| `time` | number (float64) | event time, seconds since the Unix epoch (virtual time in simulation); 0 <= time < 253402300800 (before the year 10000) |
| `source` | string, <= 128 chars | who published it (`rubick-submit`, `agent-node-3`, `policy`, ...) |
| `data` | map | the payload, as documented per subject below |

Strings are msgpack str (UTF-8), binary data msgpack bin, floats float64, integers any msgpack int.
Optional fields may be left out or sent as nil. Unknown keys are refused, in the envelope and in
every payload map. Times are seconds, sizes GB (10^9 bytes), bandwidths GB/s, throughput samples/s.
Names of jobs, tenants and nodes match `[A-Za-z0-9][A-Za-z0-9._-]*` (at most 128 characters).

## Versioning

`v` is an integer per subject, starting at 1. A change that adds, removes or changes a field raises
it by one (receivers refuse unknown fields, so even an added field is a new version). Receivers
accept every version from 1 up to the newest they know and refuse higher ones as
`unknown schema version`; senders send the newest version the receivers are known to accept.

## Refusals

A message that cannot be accepted is never fatal and never lost: it stays in the event log and the
admission service answers it on `<namespace>.rejected` (`job.submitted` -> `job.rejected`,
`metrics.iteration` -> `metrics.rejected`, `plan.decided.<node>` -> `plan.rejected`, an unknown
`job.x` -> `job.rejected`), with the reason, the offending field (a dotted path such as
`data.resources.gpus`), what was expected and what came, and the stream sequence of the refused
message. The answer's id is `rej-seq-<seq>` (or `rej-<event id>` for a refusal on the merits, such
as a reused job id), so replicas never double it. A message on a `*.rejected` subject is never
answered. Reasons given:

- `malformed msgpack`, `wrong type` (not a map), `message too large` (over 1 MiB)
- `unknown envelope field`, `missing envelope field`, `unknown subject`, `unknown schema version`,
  `envelope subject differs from the subject it was published on`,
  `event time must be seconds since the epoch, before the year 10000` (a fixed bound, so a replay
  refuses exactly what the run refused; clocks of simulated runs start near 0 and are inside it)
- `unknown field`, `missing required field`, `wrong type`, `out of range`, `value not allowed`,
  `number must be finite`, `string does not match the pattern`, `string too long`
- cross-field rules, e.g. `plan dp*tp*pp must equal the requested GPUs`,
  `global_batch_size must be divisible by dp * ga_steps`, `ZeRO-Offload needs a ZeRO stage of 1 or more`
- on the merits (`job.submitted` only): `job id reused`, `unknown model type (give its full spec to add
  a new type)`, `more GPUs than the cluster has` (likewise CPUs, host memory),
  `tensor parallelism must stay inside one node`
- a service failing on a message it accepted: `the <service> service failed on it (<error>)`. The
  service's shell answers it (id `fail-<service>-<seq>`, the event's time), acknowledges it and goes
  on; the message is never handled again, and replay rebuilds the same answer

## Subjects
"""


def example(tp: Any, meta: dict | None = None) -> Any:
    """An example value for a type, from the fields' `example` metadata."""
    meta = meta or {}
    if meta.get("example") is not None:
        return meta["example"]
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)][0]
        return example(inner, meta) if dataclasses.is_dataclass(inner) else None
    if origin in (tuple, list):
        return (example(get_args(tp)[0]),)
    if origin is dict:
        return {}
    if dataclasses.is_dataclass(tp):
        th = hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            value = example(th[f.name], f.metadata)
            if value is None and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING):
                continue
            kwargs[f.name] = value
        return tp(**kwargs)
    return {str: "text", int: 1, float: 1.0, bool: False}.get(tp)


def example_event(subject: str) -> Event:
    cls, _ = SUBJECTS[subject]
    return make(subject, example(cls), time=1_763_800_000.0, id=f"example-{subject}", source="docs")


def _fields_table(cls: type, prefix: str = "", seen: set | None = None) -> list[str]:
    seen = seen if seen is not None else set()
    rows, nested = [], []
    th = hints(cls)
    for f in dataclasses.fields(cls):
        tp, meta = th[f.name], f.metadata
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        rules = []
        for key, text in (("ge", ">= {}"), ("gt", "> {}"), ("le", "<= {}")):
            if meta.get(key) is not None:
                rules.append(text.format(meta[key]))
        if meta.get("choices") is not None:
            rules.append("one of " + ", ".join(map(str, meta["choices"])))
        if meta.get("max_len") is not None and meta.get("pattern") is None:
            rules.append(f"<= {meta['max_len']} chars")
        default = "" if required else f"default `{json.dumps(_plain(f.default if f.default is not dataclasses.MISSING else f.default_factory()))}`"
        rows.append(f"| `{prefix}{f.name}` | {_type_name(tp)} | {meta.get('unit') or ''} | "
                    f"{'yes' if required else 'no'} | {meta.get('doc', '')}{'; ' if rules else ''}{', '.join(rules)}"
                    f"{'; ' + default if default else ''} |")
        for inner in _dataclasses_in(tp):
            if inner not in seen:
                seen.add(inner)
                nested.append(inner)
    out = ["| field | type | unit | required | meaning |", "| --- | --- | --- | --- | --- |", *rows]
    for inner in nested:
        out += ["", f"`{inner.__name__}`: {' '.join((inner.__doc__ or '').split())}", ""]
        out += _fields_table(inner, "", seen)
    return out


def _dataclasses_in(tp: Any) -> list[type]:
    if dataclasses.is_dataclass(tp):
        return [tp]
    return [c for a in get_args(tp) for c in _dataclasses_in(a)]


def _plain(value: Any) -> Any:
    from .schema import to_plain
    return to_plain(value)


def render() -> str:
    parts = [INTRO.format(stream_subjects="`, `".join(STREAM_SUBJECTS),
                          routed=", ".join(f"`{s}`" for s in sorted(ROUTED)))]
    parts.append("| subject | payload | version | meaning |\n| --- | --- | --- | --- |")
    for subject in sorted(SUBJECTS):
        cls, version = SUBJECTS[subject]
        parts.append(f"| [`{subject}`](#{subject.replace('.', '')}) | `{cls.__name__}` | {version} | "
                     f"{' '.join((cls.__doc__ or '').split())} |")
    documented: set[type] = set()
    for subject in sorted(SUBJECTS):
        cls, version = SUBJECTS[subject]
        parts.append(f"\n### {subject}\n\nPayload `{cls.__name__}`, schema version {version}. "
                     f"{' '.join((cls.__doc__ or '').split())}\n")
        if cls in documented:
            parts.append(f"Fields as under `{_first_subject(cls)}`.\n")
        else:
            documented.add(cls)
            parts.append("\n".join(_fields_table(cls)) + "\n")
        event = example_event(subject)
        wire = encode(event)
        view = {"v": event.v, "id": event.id, "subject": event.subject, "time": event.time,
                "source": event.source, "data": _plain(event.payload)}
        parts.append(f"Example (the map, shown as JSON; {len(wire)} bytes of msgpack):\n\n```json\n"
                     f"{json.dumps(view, indent=2)}\n```\n\nThe same message as msgpack, in hex:\n\n```\n"
                     f"{_hex(wire)}\n```")
    return "\n".join(parts) + "\n"


def _first_subject(cls: type) -> str:
    return next(s for s in sorted(SUBJECTS) if SUBJECTS[s][0] is cls)


def _hex(data: bytes, width: int = 32) -> str:
    return "\n".join(data[i:i + width].hex(" ") for i in range(0, len(data), width))


if __name__ == "__main__":
    print(render(), end="")
