"""What a node offers: device slots, CPU cores, host memory (discovered, or given)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from controlplane.events import NodeRegistered


@dataclass(frozen=True)
class NodeCapacity:
    node: str
    gpus: int
    """Device slots: GPUs, or CPU worker slots under --cpu-devices."""
    cpus: int
    mem_gb: float
    gpu_mem_gb: float = 0.0
    gpu_type: str = ""
    cpu_devices: bool = False
    nvlink_gbps: float | None = None
    pcie_gbps: float | None = None
    network_gbps: float | None = None

    def registered(self) -> NodeRegistered:
        return NodeRegistered(node=self.node, gpus=self.gpus, gpu_mem_gb=self.gpu_mem_gb, cpus=self.cpus,
                              mem_gb=self.mem_gb, gpu_type=self.gpu_type, nvlink_gbps=self.nvlink_gbps,
                              pcie_gbps=self.pcie_gbps, network_gbps=self.network_gbps)


def host_mem_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return 1.0


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def nvidia_gpus() -> tuple[int, float, str]:
    """(count, memory of one GPU in GB, model name) from nvidia-smi; (0, 0, "") without one."""
    if not shutil.which("nvidia-smi"):
        return 0, 0.0, ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0, 0.0, ""
    rows = [r.split(",") for r in out.strip().splitlines() if r.strip()]
    if not rows:
        return 0, 0.0, ""
    return len(rows), float(rows[0][1]) * 1024**2 / 1e9, rows[0][0].strip()


def discover(node: str, *, cpu_devices: int | None = None, cpus: int | None = None,
             mem_gb: float | None = None) -> NodeCapacity:
    """This machine's capacity; `cpu_devices` N makes N CPU worker slots its devices."""
    cpus = cpus or usable_cpus()
    mem_gb = mem_gb or round(host_mem_gb(), 1)
    if cpu_devices:
        return NodeCapacity(node=node, gpus=cpu_devices, cpus=cpus, mem_gb=mem_gb, gpu_type="cpu",
                            cpu_devices=True)
    count, gpu_mem, name = nvidia_gpus()
    return NodeCapacity(node=node, gpus=count, cpus=cpus, mem_gb=mem_gb, gpu_mem_gb=round(gpu_mem, 1),
                        gpu_type=name)
