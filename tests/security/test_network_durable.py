"""The network scheduler's durable consumer (`svc-network`): the policy identity works it (the policy service
runs the network core beside the policy, `rubick service policy --network`), no other role does, and every
other role's permissions are as they were. Against a real nats-server configured from the credentials
folder."""

from __future__ import annotations

import json

import nats.errors
import pytest

from controlplane.auth import Identity, may_publish, permissions
from controlplane.auth.roles import ROLES
from tests.deliveries import fetch_all

from .test_permissions import connect, secured  # noqa: F401  (the fixture)

STREAM = "RUBICK"
CREATE = f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.svc-network"
DELETE = f"$JS.API.CONSUMER.DELETE.{STREAM}.svc-network"


def identity(name: str) -> Identity:
    role, _, node = name.partition("-")
    return Identity(role, node or None)


def test_the_policy_works_two_durables_and_every_other_role_one_as_before():
    assert Identity("policy").durables == ("svc-policy", "svc-network")
    assert Identity("policy").durable == "svc-policy"
    expected = {"recorder": ("recorder",), "admission": ("svc-admission",), "modeler": ("svc-modeler",),
                "agent": ("agent-n1",), "clock": (), "reporter": (), "submitter": (), "admin": ()}
    for role in ROLES:
        if role == "policy":
            continue
        who = Identity(role, "n1" if role in ("agent", "reporter") else None)
        assert who.durables == expected[role], role
        allowed = permissions(who, "U" * 56)["publish"]["allow"]
        assert role == "admin" or not any("svc-network" in s for s in allowed), role
    policy = permissions(Identity("policy"), "U" * 56)["publish"]["allow"]
    for durable in ("svc-policy", "svc-network"):
        assert f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{durable}" in policy
        assert f"$JS.API.CONSUMER.DELETE.{STREAM}.{durable}" in policy
        assert f"$JS.ACK.{STREAM}.{durable}.>" in policy


@pytest.mark.parametrize("name, allowed", [("policy", True), ("modeler", False), ("admission", False),
                                           ("recorder", False), ("agent-n1", False), ("submitter", False)])
def test_who_may_create_delete_and_acknowledge_the_network_durable(name, allowed):
    who = identity(name)
    for subject in (CREATE, DELETE, f"$JS.ACK.{STREAM}.svc-network.1.2.3.4.5"):
        assert may_publish(who, subject) is allowed, (name, subject)


async def test_the_policy_identity_creates_works_and_deletes_svc_network_and_the_modeler_may_not(secured):  # noqa: F811
    store, server = secured
    admin = await connect(server, store, Identity("admin"))  # the bootstrap identity creates the stream
    policy = await connect(server, store, Identity("policy"))
    modeler = await connect(server, store, Identity("modeler"))
    try:
        for i in range(3):
            await admin.publish("clock.tick", b"\x80", f"tick-{i}")
        request = json.dumps({"stream_name": STREAM, "config": {"durable_name": "svc-network",
                                                                "ack_policy": "explicit"}}).encode()

        # another role: the server drops the request (no answer) and reports a violation
        for subject in (CREATE, DELETE):
            with pytest.raises(nats.errors.TimeoutError):
                await modeler.nc.request(subject, request, timeout=0.5)
            assert any(subject.lower() in v.lower() for v in modeler.violations), modeler.violations

        # the policy: created (the legacy subject too), worked, acknowledged, deleted and created again
        reply = json.loads((await policy.nc.request(CREATE, request, timeout=5.0)).data)
        assert reply.get("name") == "svc-network" and "error" not in reply, reply
        reply = json.loads((await policy.nc.request(DELETE, b"", timeout=5.0)).data)
        assert reply.get("success") is True, reply
        consumer = await policy.consumer("svc-network", ("clock.tick",))
        got = await fetch_all(consumer, 3)
        assert [d.seq for d in got] == [1, 2, 3]
        for d in got:
            await d.ack()
        await policy.nc.flush()
        for _ in range(50):
            info = await admin.js.consumer_info(STREAM, "svc-network")
            if info.ack_floor.stream_seq == 3:
                break
            await consumer.fetch(1, timeout=0.1)
        assert info.ack_floor.stream_seq == 3
        await consumer.close()
        again = await policy.consumer("svc-network", ("clock.tick",))  # a restart: deleted and re-created
        assert again.base_floor == 3 and await again.ack_floor() == 3
        await again.close()
        assert not [v for v in policy.violations if "svc-network" in v], policy.violations

        # another role's acknowledgements of it are refused: its position does not move
        await admin.publish("clock.tick", b"\x80", "tick-3")
        stolen = await modeler.js.pull_subscribe_bind(durable="svc-network", stream=STREAM)
        [msg] = await stolen.fetch(1, timeout=2.0)
        await msg.ack()
        await modeler.nc.flush()
        for _ in range(20):
            if any("$js.ack.rubick.svc-network" in v.lower() for v in modeler.violations):
                break
            await modeler.nc.flush()
        assert any("$js.ack.rubick.svc-network" in v.lower() for v in modeler.violations), modeler.violations
        assert (await admin.js.consumer_info(STREAM, "svc-network")).ack_floor.stream_seq == 3
    finally:
        for bus in (modeler, policy, admin):
            await bus.close()
