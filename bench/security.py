"""Security figures against real nats-server processes:

1. every (identity, subject) publish tried against a server configured from the credentials folder:
   the table of what was stored and what the server refused (every forbidden cell must be refused);
2. the cost of setting up a connection: no authentication, nkey, nkey + TLS (medians of several runs,
   and their ratios to no authentication).

    .venv/bin/python bench/security.py [--connects 40]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.auth import AuthStore, Credentials, Identity, ServerTls, may_publish  # noqa: E402
from controlplane.bus.nats import JetStreamBus  # noqa: E402
from controlplane.events.catalog import NODE_SCOPED, SUBJECTS  # noqa: E402
from controlplane.natsserver import NatsServer  # noqa: E402


def subjects() -> list[str]:
    out = set(SUBJECTS) | {"plan.decided.n1"}
    for base in NODE_SCOPED:
        out |= {f"{base}.n1", f"{base}.n2"}
    return sorted(out)


async def permission_table(tmp: Path) -> tuple[list[str], list[str], dict, int, int]:
    store = AuthStore(tmp / "auth")
    store.init()
    store.add(Identity("agent", "n1"))
    store.add(Identity("reporter", "n1"))
    server = NatsServer(tmp / "nats", config_file=store.write_server_config()).start()
    cells: dict[tuple[str, str], str] = {}
    forbidden = refused = 0
    try:
        admin = await JetStreamBus.connect(server.url, credentials=Credentials(store.seed_file(Identity("admin"))))
        names = [i for i in store.identities() if i.role != "admin"]
        for identity in names:
            bus = await JetStreamBus.connect(server.url, create_stream=False,
                                             credentials=Credentials(store.seed_file(identity)))
            for subject in subjects():
                try:
                    await bus.publish(subject, b"\x80", retries=0)
                    got = "ok"
                except PermissionError:
                    got = "-"
                allowed = may_publish(identity, subject)
                if not allowed:
                    forbidden += 1
                    refused += got == "-"
                cells[identity.name, subject] = got if (got == "ok") == allowed else "WRONG"
            await bus.close()
        await admin.close()
    finally:
        server.stop()
    return [i.name for i in names], subjects(), cells, forbidden, refused


async def connect_costs(tmp: Path, n: int) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from security.certs import make_ca, make_cert

    pki = tmp / "pki"
    ca = make_ca(pki)
    cert, key = make_cert(pki, ca, "server")
    setups = {}
    open_server = NatsServer(tmp / "open").start()
    store = AuthStore(tmp / "auth2")
    store.init()
    auth_server = NatsServer(tmp / "auth", config_file=store.write_server_config()).start()
    tls_store = AuthStore(tmp / "auth3")
    tls_store.init()
    tls_server = NatsServer(tmp / "tls", config_file=tls_store.write_server_config(ServerTls(cert, key))).start()
    seed = Identity("submitter")
    setups["none"] = (open_server, None)
    setups["nkey"] = (auth_server, Credentials(store.seed_file(seed)))
    setups["nkey + TLS"] = (tls_server, Credentials(tls_store.seed_file(seed), pki / "ca.pem"))
    times: dict[str, list[float]] = {k: [] for k in setups}
    try:
        for _ in range(n):  # interleaved, so a noisy moment hits every kind alike
            for kind, (server, creds) in setups.items():
                t0 = time.perf_counter()
                bus = await JetStreamBus.connect(server.url, create_stream=False, credentials=creds)
                await bus.nc.flush()
                times[kind].append(time.perf_counter() - t0)
                await bus.close()
    finally:
        for server, _ in setups.values():
            server.stop()
    return {k: statistics.median(v) for k, v in times.items()}


async def main(connects: int) -> None:
    logging.getLogger("controlplane.bus.nats").setLevel(logging.CRITICAL)  # the refusals are the point here
    with tempfile.TemporaryDirectory(prefix="rubick-security-") as tmp:
        names, subs, cells, forbidden, refused = await permission_table(Path(tmp) / "perm")
        print("Publishes by identity (columns) and subject (rows): ok = stored, - = refused by the server")
        width = max(len(n) for n in names)
        print(f"{'subject':<26}" + " ".join(f"{n[:width]:>{width}}" for n in names))
        for s in subs:
            print(f"{s:<26}" + " ".join(f"{cells[n, s]:>{width}}" for n in names))
        wrong = sum(v == "WRONG" for v in cells.values())
        print(f"\nforbidden (identity, subject) pairs refused: {refused} of {forbidden}; "
              f"cells differing from the permission model: {wrong}")
        costs = await connect_costs(Path(tmp) / "conn", connects)
        base = costs["none"]
        print(f"\nconnection set-up (connect + first flush), median of {connects}:")
        for kind, median in costs.items():
            print(f"  {kind:<12} {median * 1000:7.2f} ms  ({median / base:4.2f}x no authentication)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connects", type=int, default=40)
    asyncio.run(main(parser.parse_args().connects))
