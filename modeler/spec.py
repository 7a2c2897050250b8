"""Model specs: the wire `ModelSpec` plus the few facts only the modeler needs.

A spec file (`examples/models/<key>.yaml`) holds the `ModelSpec` fields (name, num_params,
num_layers, hidden_size, num_heads, seq_len, global_batch_size, fwd_time_s) and optionally
`vocab_size` (for the memory of the output layer), `allow_tp_across_nodes` (default false:
tensor-parallel groups must stay inside a node) and `b_pcie_gbps` (the host <-> GPU bandwidth this
model's offload traffic achieves, GB/s, in place of the environment's; the artifact profiles one per
model, e.g. 0.96 GB/s for LLaMA-2-7B whose pinned-memory copies are small and many) and
`tensor_pipeline` (default true; false for a model with no tensor/pipeline-parallel implementation,
which then runs only under DP-family plans).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .yamlfile import read_yaml

from controlplane.events import Invalid, ModelSpec, build

EXTRA_KEYS = ("vocab_size", "allow_tp_across_nodes", "b_pcie_gbps", "tensor_pipeline")


class SpecError(ValueError):
    """A spec file that cannot be used."""


@dataclass(frozen=True)
class ModelType:
    """A model type as the modeler sees it."""

    spec: ModelSpec
    vocab_size: int = 32000
    allow_tp_across_nodes: bool = False
    b_pcie_gbps: float | None = None
    tensor_pipeline: bool = True
    """False: the model has no tensor/pipeline-parallel implementation (only DP-family plans)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def fwd_time_s(self) -> float:
        if self.spec.fwd_time_s is None:
            raise SpecError(f"model {self.name}: the spec has no profiled forward time (fwd_time_s)")
        return self.spec.fwd_time_s


def model_from_mapping(data: Any, where: str = "spec") -> ModelType:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping of spec fields")
    core = {k: v for k, v in data.items() if k not in EXTRA_KEYS}
    try:
        spec = build(ModelSpec, core, "")
    except Invalid as exc:
        raise SpecError(f"{where}: {exc}") from None
    vocab = data.get("vocab_size", 32000)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise SpecError(f"{where}: vocab_size must be a whole number >= 1, got {vocab!r}")
    allow = data.get("allow_tp_across_nodes", False)
    if not isinstance(allow, bool):
        raise SpecError(f"{where}: allow_tp_across_nodes must be true or false, got {allow!r}")
    pcie = data.get("b_pcie_gbps")
    if pcie is not None and (isinstance(pcie, bool) or not isinstance(pcie, (int, float)) or not pcie > 0
                             or pcie == float("inf")):
        raise SpecError(f"{where}: b_pcie_gbps must be a number > 0 (GB/s), got {pcie!r}")
    tp_pp = data.get("tensor_pipeline", True)
    if not isinstance(tp_pp, bool):
        raise SpecError(f"{where}: tensor_pipeline must be true or false, got {tp_pp!r}")
    return ModelType(spec=spec, vocab_size=vocab, allow_tp_across_nodes=allow,
                     b_pcie_gbps=None if pcie is None else float(pcie), tensor_pipeline=tp_pp)


def load_model(path: str | Path) -> ModelType:
    return model_from_mapping(read_yaml(path, SpecError, "spec file"), str(Path(path)))


MODELS_DIR = Path(__file__).resolve().parent.parent / "examples" / "models"
