"""The fault matrix: kill -9 of the policy, the modeler, admission, the recorder, the node agent, every
service's active replica, and one server of a three-server NATS cluster, each in the middle of a bounded
stream of acknowledged submissions and measured iterations, against separate `rubick service` processes on
real nats-servers on 127.0.0.1 (open servers: authorisation is tested in tests/security). After the restart
or take-over: every acknowledged event is in the Parquet log exactly once with no sequence missing, the
cluster state folded from the log equals the one folded from the live stream, and `rubick replay` verifies
the log (harness.py)."""

from __future__ import annotations

import pytest

from controlplane.bus.nats import JetStreamBus

from .harness import FAULTS, Nats, connect, run_fault

pytestmark = pytest.mark.timeout(300)

SLOW = {"agent", "nats server", "active replica"}


@pytest.mark.parametrize("fault", [pytest.param(f, marks=[pytest.mark.slow] if f in SLOW else [], id=f.replace(" ", "-"))
                                   for f in FAULTS])
async def test_kill_9_mid_stream_loses_nothing_and_replays(fault, tmp_path):
    outcome = await run_fault(fault, tmp_path)
    assert outcome.acked > 0
    assert outcome.settled, outcome.notes
    assert outcome.lost == 0, outcome
    assert outcome.duplicates == 0 and outcome.gaps == 0, outcome
    assert outcome.state_equal, outcome.notes
    assert outcome.replay_rc == 0, outcome
    assert outcome.survived


async def test_an_unknown_fault_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="unknown fault 'disk'"):
        await run_fault("disk", tmp_path)


@pytest.mark.slow
async def test_a_three_server_cluster_keeps_three_copies_when_a_service_connects_with_the_default(tmp_path):
    """A client URL listing the three servers connects, and a service connecting with the default (one
    replica) neither fails nor takes the stream's copies away."""
    nats = Nats(tmp_path, 3)
    try:
        bus = await connect(nats.url, replicas=3)
        service = await JetStreamBus.connect(nats.url)  # what `rubick service` does on an open server
        info = await service.js.stream_info(service.stream)
        assert info.config.num_replicas == 3
        assert len(info.cluster.replicas or []) == 2  # the leader and two followers
        await service.close()
        await bus.close()
    finally:
        nats.stop()
