"""The embedded nats-server's life: one server per store, none without its owner, its port kept."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from controlplane.lifetime import pid_alive
from controlplane.natsserver import NatsServer, NatsServerError, last_port, port_in_use, read_owner, servers_on
from controlplane.runtime import UpConfig, embedded_server

OWNER = textwrap.dedent("""
    import sys, time
    from controlplane.natsserver import NatsServer
    server = NatsServer(sys.argv[1], stop_with_owner=sys.argv[2] == "1").start()
    print(server.proc.pid, server.port, flush=True)
    time.sleep(600)
""")


def start_owner(data_dir: Path, stop_with_owner: bool) -> tuple[subprocess.Popen, int]:
    """Another process that runs a server on `data_dir` (as `rubick up` does); returns it and its server's pid."""
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(data_dir), "1" if stop_with_owner else "0"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line, "the owner process did not start its server"
    return proc, int(line.split()[0])


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_store_in_use_by_a_live_owner_is_refused_and_its_server_dies_with_it(tmp_path):
    data = tmp_path / "nats"
    owner, server_pid = start_owner(data, stop_with_owner=True)
    try:
        with pytest.raises(NatsServerError, match=f"in use by pid {owner.pid}"):
            NatsServer(data).start()
        assert servers_on(data / "jetstream") == [server_pid]
    finally:
        owner.kill()  # kill -9 of the owner
        owner.wait()
    assert wait_gone(server_pid), "the server outlived its owner"
    with NatsServer(data) as server:  # the store is free again
        assert servers_on(data / "jetstream") == [server.proc.pid]


def test_an_orphaned_server_is_stopped_before_a_new_one_starts(tmp_path):
    data = tmp_path / "nats"
    owner, orphan = start_owner(data, stop_with_owner=False)  # as an older version left it
    owner.kill()
    owner.wait()
    assert pid_alive(orphan)
    try:
        with NatsServer(data) as server:
            assert server.stopped_orphans == [orphan]
            assert not pid_alive(orphan)
            assert servers_on(data / "jetstream") == [server.proc.pid]
    finally:
        if pid_alive(orphan):
            subprocess.run(["kill", "-9", str(orphan)])


def test_the_same_process_cannot_start_two_servers_on_one_store(tmp_path):
    with NatsServer(tmp_path / "nats"):
        with pytest.raises(NatsServerError, match="this process already runs"):
            NatsServer(tmp_path / "nats").start()


def test_a_port_in_time_wait_is_free_and_a_listened_port_is_an_error(tmp_path):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    with pytest.raises(NatsServerError, match=f"port {port} .* in use"):
        NatsServer(tmp_path / "nats", port=port).start()
    conn.close()  # the side that closes first keeps the port in TIME-WAIT
    client.close()
    listener.close()
    assert not port_in_use(port)
    with NatsServer(tmp_path / "nats", port=port) as server:
        assert server.port == port


def test_up_takes_the_port_its_data_folder_used_last(tmp_path):
    cfg = UpConfig(data_dir=tmp_path)
    first = embedded_server(UpConfig(data_dir=tmp_path, nats_port=0)).start()
    port = first.port
    first.stop()
    assert last_port(tmp_path / "nats") == port and read_owner(tmp_path / "nats")["server_pid"] == first.proc.pid
    again = embedded_server(cfg)
    assert again.preferred_ports[0] == port
    with again:
        assert again.port == port
