"""kill -9 of one server of a three-server JetStream cluster (real nats-servers on 127.0.0.1, stream and lease
bucket with 3 replicas) while a client publishes 2,000 events as fast as the stream acknowledges, and the real
recorder (`rubick service recorder`, given all three URLs) writes them into Parquet; the server killed is a
follower of the stream, its leader, or the publisher's own server. The client fails over,
publishes again what was not acknowledged with the same id, and the log holds every event exactly once and
passes its manifest check (cluster.py). The checks can fail: an event missing from the log, a file written
twice and a file taken out of the log are caught."""

from __future__ import annotations

import os
import shutil

import pytest

from controlplane.recorder.writer import FILE_RE, file_name

from .cluster import KILLS, ClusterOutcome, check_log, published_ids, run_cluster_kill

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

N = 2000
EVERY_KILL = os.environ.get("RUBICK_CLUSTER_KILLS", "") == "all"
"""The stream leader's kill (an election on top of the failover) runs every time; the follower's and the
publisher's server's (20 to 60 s each on a 2-core machine) with RUBICK_CLUSTER_KILLS=all, and in
bench/nats_cluster.py."""


@pytest.mark.parametrize("kill", [k if k == "leader" or EVERY_KILL else
                                  pytest.param(k, marks=pytest.mark.skip(reason="RUBICK_CLUSTER_KILLS=all runs it"))
                                  for k in KILLS])
async def test_kill_9_of_a_cluster_server_mid_stream_loses_and_doubles_nothing(kill, tmp_path):
    outcome = await run_cluster_kill(tmp_path, N, kill)
    assert outcome.killed, outcome
    if kill == "publisher":  # the client failed over to another server
        assert outcome.killed == outcome.connected != outcome.connected_after, outcome
    else:
        assert (outcome.killed == outcome.leader) == (kill == "leader"), outcome
    assert outcome.leader_after != outcome.killed, outcome
    assert outcome.stream_messages == N, outcome  # retried publishes were stored once
    assert outcome.resent > 0 and outcome.resent_duplicates == outcome.resent, outcome  # de-duplicated after the kill
    assert outcome.lost == 0, outcome
    assert outcome.duplicated == 0 and outcome.gaps == 0, outcome
    assert outcome.rows == N, outcome
    assert outcome.manifest_problems == [], outcome
    assert outcome.survived, outcome.notes

    # the same checks catch an event missing from the log, a file written twice, and a file taken away
    first = min(outcome.log.glob("events-*.parquet"))
    m = FILE_RE.match(first.name)
    shutil.copy(first, outcome.log / file_name(m["stream"], 999_998, 999_999))
    broken = check_log(outcome.log, published_ids(N) | {"never-published"}, outcome.last_seq, ClusterOutcome(kill, N))
    assert broken.lost == 1 and broken.gaps == 0, broken
    assert broken.duplicated == int(m["last"]) - int(m["first"]) + 1, broken
    assert any("extra file" in p for p in broken.manifest_problems), broken.manifest_problems
    assert not broken.survived
    first.unlink()
    broken = check_log(outcome.log, published_ids(N), outcome.last_seq, ClusterOutcome(kill, N))
    assert any("missing" in p for p in broken.manifest_problems), broken.manifest_problems
    assert not broken.survived
