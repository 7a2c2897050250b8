"""Adding identities to a running embedded server: write the seed, rewrite the server's authorization
block, ask the server to reload it, and wait until it has (shell-side: files and signals)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Sequence

from .roles import Identity
from .store import AuthError, AuthStore


def provision(store: AuthStore, identities: Sequence[Identity], endpoints: dict | None = None,
              timeout: float = 5.0) -> list[Identity]:
    """Create the identities that are missing; when a running server uses this folder (its pid in
    `endpoints`), reload it and wait until it has taken the new users. Returns the identities created."""
    created = [i for i in identities if store.add(i)]
    if not created:
        return []
    store.write_server_config(store.saved_tls())
    pid = (endpoints or {}).get("server_pid")
    if pid:
        reload_server(int(pid), store.folder.parent / "nats" / "nats-server.log", timeout)
    return created


def reload_server(pid: int, log_file: Path, timeout: float = 5.0) -> None:
    """SIGHUP the server and wait for its log to say it reloaded (or `timeout`)."""
    before = _reloads(log_file)
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise AuthError(f"the nats-server (pid {pid}) is not running: start `rubick up` again") from None
    except PermissionError:
        raise AuthError(f"not allowed to signal the nats-server (pid {pid}): run as the user of `rubick up`") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _reloads(log_file) > before:
            return
        time.sleep(0.02)


def _reloads(log_file: Path) -> int:
    try:
        return log_file.read_bytes().count(b"Reloaded server configuration")
    except FileNotFoundError:
        return 0
