"""What a Kubernetes node offers, from its `status.allocatable` (what the kubelet leaves to pods)."""

from __future__ import annotations

import math
import re
from typing import Any

from ..node import NodeCapacity

_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?")


def quantity(text: Any) -> float | None:
    """A Kubernetes resource quantity (`96`, `95500m`, `1056Gi`, `1e3`) as a number; None when unreadable."""
    m = _QUANTITY.fullmatch(str(text).strip()) if text is not None else None
    if not m:
        return None
    try:
        value = float(m.group(1)) * _SUFFIX[m.group(2) or ""]
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def node_capacity(node: dict[str, Any], name: str, *, cpu_devices: int | None = None, gpus: int | None = None,
                  cpus: int | None = None, mem_gb: float | None = None) -> NodeCapacity:
    """The node's capacity from its allocatable resources; given values override them. `cpu_devices` N: no
    GPUs, N CPU worker slots as the devices (CPU-only test nodes)."""
    status = node.get("status") if isinstance(node, dict) else None
    alloc = status.get("allocatable") if isinstance(status, dict) else None
    alloc = alloc if isinstance(alloc, dict) else {}
    meta = node.get("metadata") if isinstance(node, dict) else None
    node_labels = meta.get("labels") if isinstance(meta, dict) and isinstance(meta.get("labels"), dict) else {}
    found_cpus = int(quantity(alloc.get("cpu")) or 0)
    found_mem = round((quantity(alloc.get("memory")) or 0) / 1e9, 1)
    cpus = cpus or max(1, found_cpus)
    mem_gb = mem_gb or max(0.1, found_mem)
    if cpu_devices:
        return NodeCapacity(node=name, gpus=cpu_devices, cpus=cpus, mem_gb=mem_gb, gpu_type="cpu", cpu_devices=True)
    count = gpus if gpus is not None else int(quantity(alloc.get("nvidia.com/gpu")) or 0)
    gpu_mem = quantity(node_labels.get("nvidia.com/gpu.memory"))  # MiB, from GPU feature discovery
    return NodeCapacity(node=name, gpus=max(0, count), cpus=cpus, mem_gb=mem_gb,
                        gpu_mem_gb=round(gpu_mem * 2**20 / 1e9, 1) if gpu_mem else 0.0,
                        gpu_type=str(node_labels.get("nvidia.com/gpu.product", "")))
