"""The training lease: training processes end when no agent has looked after them for a while.

Training processes outlive their agent by design (a restarted agent adopts them). So that they do not
run for ever when no agent comes back, the agent renews a lease per job, the modification time of
`JOB_DIR/control/lease`: at launch, and at every poll of the job's processes (a restarted agent's
first poll after adopting them included). The trainer calls `lease_expired(job_dir)` between
iterations; once the lease has not been renewed for `RUBICK_AGENT_LEASE_S` seconds (the agent sets it
in the job's environment; default 300), it checkpoints and exits as if asked to stop, and a later
agent resumes the job from that checkpoint. A job with no lease file (started by hand) has no lease;
`RUBICK_AGENT_LEASE_S=0` turns the lease off.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

LEASE_FILE = "control/lease"
LEASE_ENV = "RUBICK_AGENT_LEASE_S"
DEFAULT_LEASE_S = 300.0


def lease_seconds(env: dict[str, str] | None = None) -> float:
    """The lease time from `RUBICK_AGENT_LEASE_S` (0: no lease); the default when unset or unreadable."""
    raw = (os.environ if env is None else env).get(LEASE_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_LEASE_S
    return value if value >= 0 and value == value and value != float("inf") else DEFAULT_LEASE_S


def renew(job_dir: Path, now: float | None = None) -> None:
    """Renew the lease of the job in `job_dir` (creates it at launch)."""
    path = Path(job_dir) / LEASE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    now = time.time() if now is None else now
    try:
        os.utime(path, (now, now))
    except FileNotFoundError:
        path.write_text("")
        os.utime(path, (now, now))


def lease_age(job_dir: Path, now: float | None = None) -> float | None:
    """Seconds since the lease was last renewed (None: no lease file)."""
    try:
        renewed = (Path(job_dir) / LEASE_FILE).stat().st_mtime
    except OSError:
        return None
    return (time.time() if now is None else now) - renewed


def lease_expired(job_dir: Path, lease_s: float | None = None, now: float | None = None) -> bool:
    """Whether the job's agent has not renewed its lease for `lease_s` seconds (default: from the
    environment). False when the job has no lease file or the lease is off."""
    lease_s = lease_seconds() if lease_s is None else lease_s
    if lease_s <= 0:
        return False
    age = lease_age(job_dir, now)
    return age is not None and age > lease_s
