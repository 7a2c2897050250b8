"""The question the policy asks, and the modeler's answer.

The protocol is deliberately small::

    class Predictor(Protocol):
        def predict(self, model_type: str, batch: ConfigBatch) -> Prediction: ...

`batch` is a `modeler.configs.ConfigBatch` (build it with `ConfigBatch.from_configs([...])`);
the answer holds, for every configuration of the batch in order:

- `iter_time_s`: predicted seconds per training iteration (one global batch), float64;
  `inf` where the configuration is not feasible;
- `feasible`: False where the plan does not fit in GPU or host memory (bool).

Throughput is `global_batch_size / iter_time_s`. A predictor raises `KeyError` for a model type it
does not know. Implementations must be pure (no I/O) and cheap: the policy calls them thousands
of times per scheduling round.

`ModelPredictor` is the implementation backed by fitted performance-model parameters and the
memory estimator. Another implementation may answer from measured tables; it only has to keep
this contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from .configs import ConfigBatch
from .env import Environment
from .memory import resolve_feasible
from .perf_model import PerfParams, t_iter
from .spec import ModelType


@dataclass(frozen=True)
class Prediction:
    """Per-configuration answer: iteration time (s, `inf` if infeasible) and memory feasibility."""

    iter_time_s: np.ndarray
    feasible: np.ndarray


@runtime_checkable
class Predictor(Protocol):
    def predict(self, model_type: str, batch: ConfigBatch) -> Prediction: ...


@dataclass
class ModelPredictor:
    """Predicts from fitted parameters per model type, on one cluster environment."""

    env: Environment
    models: dict[str, ModelType] = field(default_factory=dict)
    params: dict[str, PerfParams] = field(default_factory=dict)

    def set_model(self, model: ModelType, params: PerfParams) -> None:
        self.models[model.name] = model
        self.params[model.name] = params

    def update_params(self, updates: Mapping[str, PerfParams]) -> None:
        self.params.update(updates)

    def predict(self, model_type: str, batch: ConfigBatch) -> Prediction:
        model = self.models[model_type]
        params = self.params[model_type]
        batch, ok = resolve_feasible(model, self.env, batch)
        times = t_iter(model, self.env, params, batch)
        return Prediction(iter_time_s=np.where(ok, times, np.inf), feasible=ok)
