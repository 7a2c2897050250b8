"""The network scheduler in a deployment of separate `rubick service` processes (`rubick service policy
--network MODE`), and its replay from the log alone.

The end-to-end test runs, on a real nats-server that requires credentials (as the Helm chart's NATS does),
a recorder and two replicas of `rubick service policy --network echelonflow`, each with its own role's
seed. Two guaranteed jobs of 16 GPUs on four 8-GPU nodes span two nodes each, so the network core
publishes `network.decided`. kill -9 of the active policy replica moves both cores to the standby (one
lease); it rebuilds both from the stream and answers a job's completion by clearing its class. The log
holds every `network.decided` once and `rubick replay` rebuilds the network core from the policy's
`run.described` and reproduces every one of them byte for byte.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import replace

import msgpack
import pytest

from controlplane.auth import AuthStore, Credentials, Identity
from controlplane.bus.nats import JetStreamBus
from controlplane.cli import main
from controlplane.eventlog import scan
from controlplane.events import JobCompleted, Plan, decode, encode, make, to_plain
from controlplane.lease import Lease, bucket_terms, ensure_lease_bucket
from controlplane.natsserver import NatsServer
from replay.config import NETWORK_KEYS, RUN_FILE, RunConfig
from replay.live import describe, description_event, rebuilt_cores, run_from_log
from replay.record import read_run, write_log
from replay.verify import verify

from ..policy.helpers import job, node
from .test_replicas import Replica, active, settled

TTL = 2.0
T0 = time.time()
NETWORK = ("network.decided", "network.decided.>")


async def network_decisions(bus: JetStreamBus) -> list:
    return [decode(d.data, d.subject) async for d in bus.read(NETWORK, 1)]


async def until(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_the_policy_service_runs_the_network_scheduler_and_the_log_replays_it(tmp_path, capsys):
    store = AuthStore(tmp_path / "auth")
    store.init()
    server = NatsServer(tmp_path / "nats", config_file=store.write_server_config()).start()
    log = tmp_path / "events"
    admin = await JetStreamBus.connect(server.url, credentials=Credentials(store.seed_file(Identity("admin"))),
                                       create_stream=True)  # the deployment's bootstrap
    replicas: list[Replica] = []
    try:
        kv = await ensure_lease_bucket(admin.js, TTL)
        lease = Lease(kv, "policy", "test", await bucket_terms(kv))
        creds = {name: str(store.seed_file(Identity(name))) for name in ("recorder", "policy")}
        replicas.append(Replica(server.url, "recorder", "--creds", creds["recorder"], "--log-dir", str(log),
                                "--roll-seconds", "0.2"))
        policies = [Replica(server.url, "policy", "--creds", creds["policy"], "--network", "echelonflow")
                    for _ in range(2)]
        replicas += policies
        for r in replicas:
            await r.said("ready", "standby")
        first = await active(lease, policies)
        line = await first.said("ready")
        assert "with the network scheduler (echelonflow, 4 traffic classes)" in line, line

        for i in range(4):
            n = make("node.registered", node(f"n{i}"), time=T0, id=f"node-{i}", source=f"agent-n{i}")
            await admin.publish(n.subject, encode(n), n.id)
        for i, (job_id, model) in enumerate((("gpt2-a", "gpt2"), ("bert-b", "bert"))):
            sub = make("job.submitted", job(job_id, model, 32, Plan(dp=16), 16, guaranteed=True), time=T0 + 1 + i,
                       id=f"sub-{job_id}", source="test")
            await admin.publish(sub.subject, encode(sub), sub.id)

        async def both_classed():
            found = await network_decisions(admin)
            classed = {d.job_id for e in found for d in e.payload.decisions}
            return found if {"gpt2-a", "bert-b"} <= classed else None
        before = await until(both_classed, "network.decided for both jobs")
        assert all(e.source == "network" and e.payload.mode == "echelonflow" and e.payload.classes == 4
                   for e in before)

        # kill -9 of the active replica: the standby takes both cores over
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
        second = await active(lease, policies)
        assert second is not first
        await second.said("ready")
        done = make("job.completed", JobCompleted(job_id="gpt2-a", iterations=1000), time=T0 + 10, id="done-a",
                    source="agent-n0")
        await admin.publish(done.subject, encode(done), done.id)

        async def cleared():
            found = await network_decisions(admin)
            return found if any("gpt2-a" in e.payload.cleared for e in found) else None
        after = await until(cleared, "the completed job's class cleared by the replica that took over")
        assert len(after) > len(before)
        for durable in ("svc-policy", "svc-network", "recorder"):
            await settled(admin, durable)
        last = await admin.last_seq()
    finally:
        for r in replicas:
            r.stop()
        await admin.close()
        server.stop()
    assert all(r.proc.returncode in (0, -signal.SIGKILL) for r in replicas), [r.lines[-5:] for r in replicas]

    frame = scan(log, ["subject", "msg_id"]).frame.sort("seq")
    assert frame["seq"].to_list() == list(range(1, last + 1)), "gaps or duplicate rows in the event log"
    ids = frame.filter(frame["subject"].str.starts_with("network.decided"))["msg_id"].to_list()
    assert ids and len(ids) == len(set(ids)), "a network.decided is in the log twice"
    rounds = sorted(int(m.rsplit("-", 1)[1]) for m in ids)
    assert rounds == list(range(1, len(rounds) + 1)), f"a round is missing: {rounds}"
    assert not (log / RUN_FILE).exists()

    run = run_from_log(log)
    assert run["services"]["policy"]["config"]["network"] == "echelonflow"
    assert run["sources"] == {"policy": ["policy"], "network": ["network"]}
    result = verify(log)
    assert result.ok, (result.problems, result.divergence)
    assert result.checked["network.decided"] == len(ids)
    assert main(["replay", str(log)]) == 0
    out = capsys.readouterr().out
    assert "OK: every recorded decision was reproduced" in out and f"network.decided {len(ids)}" in out, out


# -- the description: what replay rebuilds from the log -----------------------------------------------------------

def write(tmp_path, events, *, raw: list[bytes] | None = None) -> None:
    rows = [(e.subject, encode(e), e.time) for e in events] + [("run.described", b, 1.0) for b in raw or ()]
    write_log(tmp_path, rows, config={"x": 1}, params={}, sources={})
    (tmp_path / RUN_FILE).unlink()


def without_network(data: bytes) -> bytes:
    """A description as recorded before descriptions could name a network."""
    obj = msgpack.unpackb(data, raw=False)
    obj["data"] = {k: v for k, v in obj["data"].items() if k not in NETWORK_KEYS}
    return msgpack.packb(obj, use_bin_type=True)


def test_the_policys_description_names_the_network_and_replay_rebuilds_the_network_core(tmp_path, parts):
    cfg = RunConfig(policy="rubick", cluster="", network="coflow", network_classes=6)
    policy = describe("policy", cfg, parts)
    assert (policy.network, policy.network_classes, policy.rack_size, policy.oversubscription) == ("coflow", 6, 0, 1.0)
    assert describe("modeler", cfg, parts).network == "none", "only the policy's service runs the network core"
    write(tmp_path, [description_event(describe("modeler", cfg, parts), 100.0), description_event(policy, 101.0)])

    run = read_run(tmp_path)
    assert run["config"]["network"] == "coflow" and run["config"]["network_classes"] == 6
    assert run["sources"] == {"modeler": ["modeler"], "policy": ["policy"], "network": ["network"]}
    modeler, rebuilt_policy, network = rebuilt_cores(run)
    assert (modeler.name, rebuilt_policy.name, network.name) == ("modeler", "policy", "network")
    assert (network.mode, network.classes, network.rack_size, network.oversubscription) == ("coflow", 6, 0, 1.0)
    assert sorted(network.models) == sorted(parts.models)


def test_descriptions_recorded_before_the_network_fields_replay_as_before(tmp_path, parts):
    cfg = RunConfig(policy="rubick", cluster="", quotas={"team-a": 8})
    event = description_event(describe("policy", cfg, parts), 100.0)
    old = without_network(encode(event))
    decoded = decode(old, "run.described").payload
    assert decoded == describe("policy", cfg, parts) and decoded.network == "none"
    assert (decoded.network_classes, decoded.rack_size, decoded.oversubscription) == (4, 0, 1.0)
    write(tmp_path, [], raw=[old])

    run = read_run(tmp_path)
    assert "network" not in run["config"] and run["sources"] == {"policy": ["policy"]}
    assert [c.name for c in rebuilt_cores(run)] == ["policy"]
    # a description without a network keeps the id it had before descriptions could name one
    import hashlib
    import json

    plain = {k: v for k, v in to_plain(event.payload).items() if k not in NETWORK_KEYS}
    assert event.id == f"run-policy-{hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]}"
    with_network = description_event(describe("policy", replace(cfg, network="fair"), parts), 100.0)
    assert with_network.id != event.id


def test_only_the_policy_service_takes_network_options(capsys):
    for name in ("modeler", "admission", "recorder"):
        assert main(["service", name, "--network", "fair"]) == 2
        assert "--network and --network-classes are the policy service's" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["service", "policy", "--network", "ring"])
    with pytest.raises(SystemExit):
        main(["service", "policy", "--network", "fair", "--network-classes", "9"])


async def test_the_two_shells_of_a_term_stop_together():
    """`together`: when one shell ends (here: its lease is lost), the other is told to stop, and the term
    ends with the first failure; when the term is stopped, both stop and nothing is raised."""
    from controlplane.cli.service import together
    from controlplane.lease import LeaseLost

    stopped: list[str] = []

    def runs(fail: bool):
        async def steady(stop: asyncio.Event) -> None:
            await stop.wait()
            stopped.append("steady")

        async def losing(stop: asyncio.Event) -> None:
            await asyncio.sleep(0.05)
            if fail:
                raise LeaseLost("lost")
            await stop.wait()
            stopped.append("losing")
        return [steady, losing]

    with pytest.raises(LeaseLost):
        await asyncio.wait_for(together(runs(True), asyncio.Event()), 5)
    assert stopped == ["steady"]
    stopped.clear()
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.1, stop.set)
    await asyncio.wait_for(together(runs(False), stop), 5)
    assert sorted(stopped) == ["losing", "steady"]
