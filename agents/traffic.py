"""A job's traffic class on the fabric, as environment variables of its training processes (pure: no I/O).

The network scheduler (`policy.network`) puts every job whose iterations send flows between nodes in a
traffic class (`network.decided`; 0 is served first, strict priority between classes). A training process
sends all its inter-node traffic through NCCL, which marks its InfiniBand / RoCE queue pairs from two
variables read when a communicator connects (a class is carried out at the job's next launch):

- `NCCL_IB_SL`: the InfiniBand service level of the queue pairs (0-15). On InfiniBand the subnet manager's
  SL-to-VL mapping and VL arbitration tables decide what a service level is worth; on RoCE, NICs generally
  carry it as the 802.1p priority (VLAN PCP) of tagged frames, which matters where switches trust PCP.
- `NCCL_IB_TC`: the traffic class byte of the global route header (0-255). On RoCE v2 it is the IP header's
  traffic-class byte, DSCP << 2 (its two low bits are the ECN field: keep them 0). NCCL applies it on
  RoCE only.

Sockets (NCCL's TCP transport, gloo) read neither, and nothing here marks them.

A table maps each class to the values it sets. `DEFAULT` covers the 8 classes a decision may name, one
priority level per class from high to low and the conventional DSCP of that level (under the usual
DSCP-to-priority mapping, priority = DSCP >> 3), leaving priorities 6 and 7 (congestion notifications,
network control) alone:

| class | NCCL_IB_SL | DSCP | NCCL_IB_TC | priority |
| --- | --- | --- | --- | --- |
| 0 | 5 | 46 (EF) | 184 | 5 |
| 1 | 4 | 34 (AF41) | 136 | 4 |
| 2 | 3 | 26 (AF31) | 104 | 3 |
| 3 | 2 | 18 (AF21) | 72 | 2 |
| 4 | 1 | 10 (AF11) | 40 | 1 |
| 5, 6, 7 | 0 | 0 (best effort) | 0 | 0 |

Classes 5 to 7 share the lowest level (with unmarked traffic): only 5 levels are left for data between
network control above and best effort below. The operator's own table (`rubick agent --traffic-classes`)
replaces it whole, in the text form `parse` reads and `TrafficClasses.text` writes:

    0:sl=5,tc=184;1:sl=4,tc=136;2:sl=3,tc=104

A class missing from the table, or a job with no class, sets nothing; an entry may give only `sl` or only
`tc`. A workload's own `env` wins over all of it (an operator's override for that job).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from controlplane.events.payloads import MAX_TRAFFIC_CLASSES

SL_ENV, TC_ENV = "NCCL_IB_SL", "NCCL_IB_TC"
SL_MAX, TC_MAX = 15, 255
CLASS_MAX = MAX_TRAFFIC_CLASSES - 1


class TrafficClassError(ValueError):
    """A traffic-class table that cannot be used; the message names the entry."""


@dataclass(frozen=True)
class Marking:
    """What one traffic class sets (None: that variable is left alone)."""

    traffic_class: int
    sl: int | None = None
    tc: int | None = None

    def env(self) -> dict[str, str]:
        out = {}
        if self.sl is not None:
            out[SL_ENV] = str(self.sl)
        if self.tc is not None:
            out[TC_ENV] = str(self.tc)
        return out

    def text(self) -> str:
        parts = [f"{k}={v}" for k, v in (("sl", self.sl), ("tc", self.tc)) if v is not None]
        return f"{self.traffic_class}:{','.join(parts)}"


@dataclass(frozen=True)
class TrafficClasses:
    """Traffic class -> the variables it sets, entries in class order."""

    markings: tuple[Marking, ...]

    def __post_init__(self) -> None:
        classes = [m.traffic_class for m in self.markings]
        if classes != sorted(set(classes)):
            raise TrafficClassError("traffic classes must be given once each, in order")

    def marking(self, traffic_class: int | None) -> Marking | None:
        if traffic_class is None:
            return None
        return next((m for m in self.markings if m.traffic_class == traffic_class), None)

    def env(self, traffic_class: int | None) -> dict[str, str]:
        """The training processes' variables for a job of `traffic_class` (empty: none known, or not in the table)."""
        m = self.marking(traffic_class)
        return m.env() if m is not None else {}

    def text(self) -> str:
        return ";".join(m.text() for m in self.markings)


def _dscp(dscp: int) -> int:
    return dscp << 2


DEFAULT = TrafficClasses(tuple(
    Marking(c, sl, _dscp(dscp)) for c, (sl, dscp) in enumerate(
        [(5, 46), (4, 34), (3, 26), (2, 18), (1, 10), (0, 0), (0, 0), (0, 0)])))
"""One priority level per class, high to low (see the module's table)."""


def traffic_env(table: TrafficClasses | None, traffic_class: int | None) -> dict[str, str]:
    """The variables for a job of `traffic_class` under `table` (None: marking is off, nothing is set)."""
    return table.env(traffic_class) if table is not None else {}


def _number(entry: str, key: str, text: str, low: int, high: int) -> int:
    text = text.strip()
    if not re.fullmatch(r"[0-9]{1,6}", text) or not low <= int(text) <= high:
        raise TrafficClassError(f"traffic class entry {entry!r}: {key} must be a whole number {low} to {high}, "
                                f"got {text!r}")
    return int(text)


def parse(text: str) -> TrafficClasses:
    """The table in `CLASS:sl=N,tc=N;CLASS:...` form. TrafficClassError naming the bad entry: a class outside
    0-7 or given twice, an SL outside 0-15, a TC outside 0-255, an unknown or repeated key, an entry with
    neither `sl` nor `tc`."""
    entries = [e.strip() for e in text.split(";")]
    if text.strip().endswith(";"):
        entries = entries[:-1]
    if not text.strip() or not entries:
        raise TrafficClassError("empty traffic class table: give CLASS:sl=N,tc=N entries separated by ';' "
                                "(or --no-traffic-classes)")
    markings: dict[int, Marking] = {}
    for entry in entries:
        if not entry:
            raise TrafficClassError(f"traffic class table {text!r}: an empty entry (two ';' in a row)")
        head, sep, body = entry.partition(":")
        if not sep:
            raise TrafficClassError(f"traffic class entry {entry!r}: expected CLASS:sl=N,tc=N")
        klass = _number(entry, "the class", head, 0, CLASS_MAX)
        if klass in markings:
            raise TrafficClassError(f"traffic class entry {entry!r}: class {klass} is given twice")
        values: dict[str, int] = {}
        for item in body.split(","):
            key, eq, value = item.partition("=")
            key = key.strip().lower()
            if not eq or key not in ("sl", "tc"):
                raise TrafficClassError(f"traffic class entry {entry!r}: expected sl=N or tc=N, got {item.strip()!r}")
            if key in values:
                raise TrafficClassError(f"traffic class entry {entry!r}: {key} is given twice")
            values[key] = _number(entry, key, value, 0, SL_MAX if key == "sl" else TC_MAX)
        markings[klass] = Marking(klass, values.get("sl"), values.get("tc"))
    return TrafficClasses(tuple(markings[c] for c in sorted(markings)))
