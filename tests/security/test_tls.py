"""TLS with a real nats-server and real X.509 certificates: a client that verifies the server gets in,
one that cannot verify it (unknown CA, a certificate for another host, an expired one) is told so at
start; with client verification on, a client without a certificate is refused."""

from __future__ import annotations

import pytest

from controlplane.auth import AuthError, AuthStore, Credentials, Identity, ServerTls
from controlplane.bus.nats import JetStreamBus
from controlplane.natsserver import NatsServer

from .certs import make_ca, make_cert


def serve(tmp_path, tls: ServerTls, name: str = "nats") -> tuple[NatsServer, AuthStore]:
    store = AuthStore(tmp_path / f"auth-{name}")
    store.init()
    return NatsServer(tmp_path / name, config_file=store.write_server_config(tls)).start(), store


async def test_nkeys_over_tls_connect_and_the_wrong_certificates_fail_at_start(tmp_path):
    pki = tmp_path / "pki"
    ca = make_ca(pki)
    cert, key = make_cert(pki, ca, "server")
    server, store = serve(tmp_path, ServerTls(cert, key))
    try:
        admin = Credentials(store.seed_file(Identity("admin")), tls_ca=pki / "ca.pem")
        bus = await JetStreamBus.connect(server.url, credentials=admin)
        assert (await bus.publish("job.submitted", b"\x80")).seq == 1
        assert bus.nc.connected_url is not None and bus.nc._server_info.get("tls_required")
        await bus.close()
        # no CA to verify the server with: the system's CAs do not know ours
        with pytest.raises(AuthError, match="(?i)certificate"):
            await JetStreamBus.connect(server.url, create_stream=False,
                                       credentials=Credentials(store.seed_file(Identity("admin")),
                                                               tls_cert=None, tls_ca=make_ca(tmp_path / "other") and
                                                               tmp_path / "other" / "ca.pem"))
        # TLS required, but the client brought none
        with pytest.raises(AuthError):
            await JetStreamBus.connect(server.url, create_stream=False, connect_timeout=2.0,
                                       credentials=Credentials(store.seed_file(Identity("admin"))))
    finally:
        server.stop()


@pytest.mark.parametrize("case", ["wrong host", "expired"])
async def test_a_server_certificate_for_the_wrong_host_or_expired_is_refused(tmp_path, case):
    pki = tmp_path / "pki"
    ca = make_ca(pki)
    cert, key = make_cert(pki, ca, "server", hosts=("nats.example.org",) if case == "wrong host" else ("127.0.0.1",),
                          expired=case == "expired")
    server, store = serve(tmp_path, ServerTls(cert, key))
    try:
        with pytest.raises(AuthError, match="(?i)certificate|hostname|expired"):
            await JetStreamBus.connect(server.url, create_stream=False,
                                       credentials=Credentials(store.seed_file(Identity("admin")), pki / "ca.pem"))
    finally:
        server.stop()


async def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path):
    pki = tmp_path / "pki"
    ca = make_ca(pki)
    cert, key = make_cert(pki, ca, "server")
    client_cert, client_key = make_cert(pki, ca, "policy", client=True)
    server, store = serve(tmp_path, ServerTls(cert, key, pki / "ca.pem"))
    try:
        seed = store.seed_file(Identity("admin"))
        bus = await JetStreamBus.connect(server.url, credentials=Credentials(seed, pki / "ca.pem", client_cert, client_key))
        await bus.close()
        with pytest.raises(AuthError):
            await JetStreamBus.connect(server.url, create_stream=False, connect_timeout=2.0,
                                       credentials=Credentials(seed, pki / "ca.pem"))
    finally:
        server.stop()
