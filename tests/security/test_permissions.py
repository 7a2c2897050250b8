"""Every (identity, subject) pair against a real nats-server configured from the credentials folder:
what the permission model allows is stored, everything else is refused by the server, at once."""

from __future__ import annotations

import os
import stat

import nats.errors
import pytest

from controlplane.auth import AuthError, AuthStore, Credentials, Identity, may_publish
from controlplane.bus.nats import JetStreamBus
from controlplane.events.catalog import NODE_SCOPED, SUBJECTS
from controlplane.natsserver import NatsServer



def subjects_to_try() -> list[str]:
    out = set(SUBJECTS) | {"run.described", "plan.decided.n1"}
    for base in NODE_SCOPED:
        out |= {f"{base}.n1", f"{base}.n2"}
    return sorted(out)


@pytest.fixture
def secured(tmp_path):
    store = AuthStore(tmp_path / "auth")
    store.init()
    for node in ("n1", "n2"):
        store.add(Identity("agent", node))
        store.add(Identity("reporter", node))
    server = NatsServer(tmp_path / "nats", config_file=store.write_server_config()).start()
    yield store, server
    server.stop()


async def connect(server, store, identity, **kw) -> JetStreamBus:
    return await JetStreamBus.connect(server.url, name=identity.name, credentials=Credentials(store.seed_file(identity)),
                                      create_stream=identity.role == "admin", **kw)


async def test_every_forbidden_publish_is_refused_and_every_allowed_one_stored(secured):
    store, server = secured
    admin = await connect(server, store, Identity("admin"))  # the bootstrap identity creates the stream
    subjects = subjects_to_try()
    mismatches, refused = [], 0
    for identity in store.identities():
        bus = await connect(server, store, identity)
        try:
            for subject in subjects:
                try:
                    await bus.publish(subject, b"\x80", f"{identity.name}-{subject}", timeout=2.0, retries=0)
                    allowed = True
                except PermissionError:
                    allowed = False
                if allowed != may_publish(identity, subject):
                    mismatches.append((identity.name, subject, allowed))
                refused += not allowed
        finally:
            await bus.close()
    await admin.close()
    assert mismatches == []
    assert refused > 200  # most cells are refused: each role publishes only its own few subjects


@pytest.mark.parametrize("name,subject,allowed", [
    ("submitter", "job.submitted", True), ("submitter", "plan.decided", False), ("submitter", "job.completed", False),
    ("agent-n1", "job.completed.n1", True), ("agent-n1", "job.completed.n2", False), ("agent-n1", "job.completed", False),
    ("agent-n1", "node.lost.n2", False), ("agent-n1", "plan.decided", False), ("agent-n1", "model.updated", False),
    ("reporter-n1", "metrics.iteration.n1", True), ("reporter-n1", "metrics.iteration.n2", False),
    ("reporter-n1", "job.completed.n1", False),
    ("policy", "plan.decided", True), ("modeler", "plan.decided", False), ("modeler", "model.updated", True),
    ("policy", "model.updated", False), ("recorder", "job.submitted", False), ("recorder", "plan.decided", False),
    ("clock", "clock.tick", True), ("admission", "plan.decided", False), ("admission", "job.rejected", True),
])
def test_the_issues_rules_hold_in_the_permission_model(name, subject, allowed):
    role, _, node = name.partition("-")
    assert may_publish(Identity(role, node or None), subject) is allowed


async def test_only_the_bootstrap_identity_may_change_the_stream(secured):
    store, server = secured
    admin = await connect(server, store, Identity("admin"))
    policy = await connect(server, store, Identity("policy"))
    for api in ("STREAM.DELETE", "STREAM.PURGE", "STREAM.UPDATE", "CONSUMER.DELETE.RUBICK.svc-policy-x"):
        subject = f"$JS.API.{api}" + ("" if api.startswith("CONSUMER") else ".RUBICK")
        with pytest.raises(nats.errors.TimeoutError):  # the server drops it: no answer comes
            await policy.nc.request(subject, b"{}", timeout=0.5)
        assert any(subject.lower() in v.lower() for v in policy.violations), policy.violations
    assert (await admin.js.stream_info("RUBICK")).config.name == "RUBICK"
    await policy.close()
    await admin.close()


async def test_a_component_without_stream_rights_is_told_when_the_stream_is_missing(secured):
    store, server = secured
    with pytest.raises(PermissionError, match="does not exist and this identity may not create it"):
        await JetStreamBus.connect(server.url, credentials=Credentials(store.seed_file(Identity("policy"))))


async def test_missing_wrong_and_unreadable_credentials_fail_at_start_naming_what_is_missing(secured, tmp_path):
    store, server = secured
    with pytest.raises(AuthError, match="requires credentials"):
        await JetStreamBus.connect(server.url, create_stream=False, connect_timeout=2.0)
    stranger = AuthStore(tmp_path / "other")
    stranger.add(Identity("submitter"))  # a valid seed the server does not know
    with pytest.raises(AuthError, match="[Aa]uthorization"):
        await JetStreamBus.connect(server.url, create_stream=False,
                                   credentials=Credentials(stranger.seed_file(Identity("submitter"))))
    with pytest.raises(AuthError, match="does not exist"):
        await JetStreamBus.connect(server.url, create_stream=False, credentials=Credentials(tmp_path / "nope.nk"))
    junk = tmp_path / "junk.nk"
    junk.write_text("not a seed\n")
    with pytest.raises(AuthError, match="junk.nk"):
        await JetStreamBus.connect(server.url, create_stream=False, credentials=Credentials(junk))


def test_the_credentials_folder_keeps_secrets_private_and_the_server_config_public_keys_only(secured):
    store, _ = secured
    assert stat.S_IMODE(os.stat(store.folder).st_mode) == 0o700
    for path in store.folder.iterdir():
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    config = store.server_config.read_text()
    for identity in store.identities():
        seed = store.seed_file(identity).read_text().strip()
        assert seed.startswith("SU") and seed not in config
        assert store.users()[identity.name] in config
