"""Time from launching `rubick up` to its ready line, and the bare nats-server start, median of runs.

    python bench/up_ready.py [--runs 5]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.natsserver import NatsServer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    wall, internal, bare = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="rubick-up-") as tmp:
            server = NatsServer(Path(tmp) / "bare").start()
            bare.append(server.ready_s)
            server.stop()
            t0 = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "up", "--data-dir", tmp, "--port", "0",
                                     "--metrics-port", "0"], stdout=subprocess.PIPE, text=True)
            line = proc.stdout.readline()
            wall.append(time.perf_counter() - t0)
            internal.append(float(line.split("ready in ")[1].split(" ms")[0]) / 1000)
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    print(f"bare nats-server ready: median {statistics.median(bare) * 1000:.0f} ms")
    print(f"rubick up, launch to ready line (Python start-up and imports included): median "
          f"{statistics.median(wall):.2f} s, max {max(wall):.2f} s (target < 2 s)")
    print(f"rubick up, control plane start to ready (as it prints): median {statistics.median(internal) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
