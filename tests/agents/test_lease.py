"""The training lease and the loopback rendezvous, with real CPU training launched by the agent's launcher:
a job on one node listens on 127.0.0.1 only; while its launcher polls it trains on; once nothing renews its
lease it checkpoints and exits cleanly, leaving what a later agent resumes from (the agent's reconcile and
the trainer's resume from a checkpoint are tested in test_core and test_faults)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agents.launcher import LocalLauncher
from agents import checkpoint

from .helpers import launch, poll_until, status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEASE_S = 2.0


def listening(pids: set[int]) -> list[str]:
    """The addresses (host:port) the given processes listen on, from /proc (TCP over IPv4 and IPv6)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                host, port = f[1].split(":")
                out.append(f"{_address(host)}:{int(port, 16)}")
    return sorted(out)


def _address(hex_host: str) -> str:
    raw = bytes.fromhex(hex_host)
    if len(raw) == 4:
        return ".".join(str(b) for b in raw[::-1])
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
    import ipaddress
    return str(ipaddress.IPv6Address(b"".join(words)))


def group_pids(pgid: int) -> set[int]:
    pids = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid:
                    pids.add(int(name))
            except OSError:
                continue
    return pids


def test_a_job_left_alone_checkpoints_when_its_lease_runs_out_and_a_later_launch_resumes(tmp_path):
    first = LocalLauncher(tmp_path, "n0", None, lease_s=LEASE_S, run_extra={"size": "tiny"})
    launch(first, 1)
    pid = first.procs["lease-job"].pid
    try:
        poll_until(first, lambda s: s.get("iteration", 0) >= 2)
        addresses = listening(group_pids(pid))
        assert addresses, "the job listens on nothing"
        assert all(a.startswith(("127.", "::ffff:127.", "::1:")) for a in addresses), addresses

        until = time.monotonic() + 2 * LEASE_S  # the agent looks after the job: it trains on
        while time.monotonic() < until:
            assert not first.poll(), "the job ended while its lease was renewed"
            time.sleep(0.2)
        assert status(first)["state"] == "running"

        left_at = time.time()  # the agent is gone: nothing renews the lease any more
        st = poll_until(first, lambda s: s.get("state") == "checkpointed", timeout=60, polling=False)
        assert st["stopped_by"] == "lease expired"
        assert st["checkpointed_at"] - left_at >= LEASE_S - 1.1  # renewed at most a second before leaving
        popen = first.procs["lease-job"].popen
        assert popen.wait(60) == 0
        assert (first.job_dir("lease-job") / "checkpoint.pt").exists()
    finally:
        first.kill("lease-job")

    # what a later agent finds: a job that ended checkpointed, which it relaunches from its checkpoint
    found = LocalLauncher(tmp_path, "n0", None).find()
    assert [(f.alive, f.state, f.iterations) for f in found] == [(False, "checkpointed", st["iteration"])]
    assert checkpoint.read(first.job_dir("lease-job") / "checkpoint.pt")["iteration"] == st["iteration"]
