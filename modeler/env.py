"""The cluster environment the performance and memory models need: bandwidths, GPU and host memory,
CPUs per node. Loaded from a YAML file such as `examples/envs/a800-8x8.yaml`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from .yamlfile import read_yaml


class EnvError(ValueError):
    """An environment file that cannot be used."""


@dataclass(frozen=True)
class Environment:
    """Bandwidths in GB/s (10^9 bytes/s), memory in GB (10^9 bytes)."""

    name: str
    nodes: int
    gpus_per_node: int
    gpu_mem_gb: float
    cpus_per_node: int
    host_mem_gb: float
    b_intra_gbps: float
    b_inter_gbps: float
    b_pcie_gbps: float
    default_cpus_per_gpu: int = 4
    nics_per_node: int = 1
    """RDMA NICs per node; b_inter_gbps is their sum. The GPUs of a node share them evenly
    (gpus_per_node / nics_per_node GPUs behind each NIC's PCIe switch)."""
    offload_ns_per_param: float = 0.0
    """Host time per model parameter (ns) that every ZeRO-Offload step spends whatever the number
    of GPUs and their placement (docs/modeler.md, "Extensions"); 0 leaves it out."""

    @property
    def b_intra(self) -> float:
        return self.b_intra_gbps * 1e9

    @property
    def b_inter(self) -> float:
        return self.b_inter_gbps * 1e9

    def b_inter_rails(self, min_node_gpus):
        """Bytes/s a ring crossing nodes gets: NCCL runs one ring channel per NIC, and the node with
        the fewest GPUs reaches only the NICs behind those GPUs, ceil(g / GPUs-per-NIC) of them."""
        per_nic = self.b_inter / self.nics_per_node
        gpus_per_nic = max(self.gpus_per_node // self.nics_per_node, 1)
        nics = np.minimum(np.ceil(np.asarray(min_node_gpus, dtype=np.float64) / gpus_per_nic), self.nics_per_node)
        return per_nic * np.maximum(nics, 1.0)

    @property
    def b_pcie(self) -> float:
        return self.b_pcie_gbps * 1e9


def env_from_mapping(data: Any, where: str = "environment") -> Environment:
    if not isinstance(data, dict):
        raise EnvError(f"{where}: expected a mapping of settings")
    names = {f.name: f for f in fields(Environment)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise EnvError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    kwargs: dict[str, Any] = {}
    for name, f in names.items():
        if name not in data:
            if f.default is f.default_factory:  # both MISSING: required
                raise EnvError(f"{where}: missing setting {name}")
            continue
        value = data[name]
        if name == "name":
            kwargs[name] = str(value)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise EnvError(f"{where}: {name} must be a number > 0, got {value!r}")
        kwargs[name] = int(value) if f.type in ("int", int) else float(value)
    return Environment(**kwargs)


def load_env(path: str | Path) -> Environment:
    return env_from_mapping(read_yaml(path, EnvError, "environment file"), str(Path(path)))


DEFAULT_ENV_FILE = Path(__file__).resolve().parent.parent / "examples" / "envs" / "a800-8x8.yaml"
