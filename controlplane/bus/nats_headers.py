"""A NATS client that reads the common shape of message headers in one pass.

Every message of the stream arrives with a header block: `NATS/1.0`, then lines of
`Name: value`, then an empty line (a JetStream publish carries `Nats-Msg-Id`). nats-py
parses each block line by line and checks every character of every name in Python,
a few microseconds per message: at the recorder's rates that is a tenth of its CPU.
Here a block of exactly that shape (names of printable ASCII, no status line, no
bare CR or LF) is matched by one regular expression and split, giving the same
dict nats-py gives; any other block (a status such as `NATS/1.0 404`, heartbeats,
anything unusual) goes to nats-py's own parser unchanged.
tests/controlplane/test_nats_headers.py checks the two agree, block by block.
"""

from __future__ import annotations

import re

from . import natspy  # noqa: F401  (first: nats-py without aiohttp until it is needed)

# isort: split
from nats.aio.client import Client

_PLAIN = re.compile(rb"NATS/1\.0\r\n((?:[!-9;-~]+:[^\r\n]*\r\n)+)\r\n")
"""the version line, then one or more `Name:value` lines (a name is printable ASCII but `:`), then an empty line"""


def plain_headers(block: bytes) -> dict[str, str] | None:
    """The headers of a block of the plain shape, as nats-py reads them (a repeated name: its last value; values
    stripped of whitespace and decoded as UTF-8 with bad bytes replaced); None for any other block."""
    m = _PLAIN.fullmatch(block)
    if m is None:
        return None
    out = {}
    for line in m[1].split(b"\r\n"):
        if line:
            name, _, value = line.partition(b":")
            out[name.decode("ascii")] = value.strip().decode("utf-8", "replace")
    return out


class HeaderClient(Client):
    """nats-py's client, with headers of the plain shape read by `plain_headers`."""

    async def _process_headers(self, headers):
        if headers:
            found = plain_headers(headers)
            if found is not None:
                return found
        return await super()._process_headers(headers)


async def connect(servers, **options) -> HeaderClient:
    """`nats.connect` with a `HeaderClient`."""
    nc = HeaderClient()
    await nc.connect(servers, **options)
    return nc
