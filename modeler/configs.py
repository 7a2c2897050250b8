"""Configurations: an execution plan on a placement, one at a time or as a numpy batch.

A `Config` is what the policy asks about: a `Plan` (DP/TP/PP sizes, ZeRO stage, offload, GA, GC,
micro-batches), the GPUs used on each node, the CPU threads per GPU and the job's global batch.
A `ConfigBatch` holds many of them as parallel numpy arrays so the performance model and the
memory estimator evaluate them in one vectorised pass.

Ranks are laid out the Megatron way: tensor-parallel innermost, then data-parallel, pipeline
outermost, filling the nodes in the order given. From that layout each batch records whether
the DP, TP and PP groups cross a node boundary, which decides the bottleneck bandwidth.

Configuration tables use the columns of `data/rubick-artifact/fit_points.csv`; `batch_from_frame`
reads them and names the row of any value it cannot accept. Pure code: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Sequence

import numpy as np

from controlplane.events import Plan

CONFIG_COLUMNS = ("model", "dp", "tp", "pp", "zero_stage", "offload", "gc", "ga_steps", "gpus_per_node",
                  "cpu_threads", "global_batch_size")
"""Columns of a configuration table (`iter_time_s` is added for measured rows)."""
OPTIONAL_COLUMNS = ("model", "ga_steps", "cpu_threads", "micro_batches")
"""Columns that may be absent; empty or absent means 1 GA step, the default CPUs, 1 micro-batch."""


class ConfigError(ValueError):
    """A configuration that cannot be evaluated, naming the row where it came from a table."""

    def __init__(self, message: str, row: int | None = None) -> None:
        self.row = row
        self.detail = message
        super().__init__(f"row {row}: {message}" if row is not None else message)


@dataclass(frozen=True)
class Config:
    """One execution plan on one placement."""

    plan: Plan
    gpus_per_node: tuple[int, ...]
    cpus_per_gpu: int | None
    global_batch_size: int
    ga_auto: bool = False
    """True: GA steps not given; the modeler uses the fewest that fit in GPU memory (plan.ga_steps ignored)."""


@dataclass(frozen=True)
class Layout:
    """Which parallel groups of a plan span more than one node, and how many nodes it uses."""

    dp_inter: bool
    tp_inter: bool
    pp_inter: bool
    nodes: int
    min_node_gpus: int


@lru_cache(maxsize=1 << 12)
def divisors(n: int) -> tuple[int, ...]:
    """Every divisor of `n` (>= 1), lowest first: the degrees of parallelism a count of GPUs splits into, and the GA
    steps a per-rank batch splits into."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(low + [n // d for d in reversed(low) if d * d != n])


@lru_cache(maxsize=1 << 16)
def layout(gpus_per_node: tuple[int, ...], dp: int, tp: int, pp: int) -> Layout:
    """Place ranks (TP innermost, then DP, then PP) on the nodes in order; see which groups cross.

    Rank r = (i_pp * dp + i_dp) * tp + i_tp fills the nodes in order, so the node of a rank never decreases with it: a
    group (a TP group: `tp` ranks in a row; a DP group: `dp` ranks `tp` apart; a PP group: `pp` ranks `dp * tp`
    apart) crosses nodes exactly where its first and last ranks are on different nodes. Plain integers: the policy
    asks this of every placement its searches trim to (most of them new), and arrays cost more than the walk."""
    node_of: list[int] = []
    for n, g in enumerate(gpus_per_node):
        if g < 0:
            raise ValueError(f"a node cannot hold {g} GPUs")
        node_of.extend([n] * g)
    total, block = len(node_of), dp * tp
    if total != block * pp or total == 0:
        raise ValueError(f"dp*tp*pp = {dp}*{tp}*{pp} ranks do not fill a placement of {total} GPUs")
    tp_inter = tp > 1 and any(node_of[s] != node_of[s + tp - 1] for s in range(0, total, tp))
    dp_inter = dp > 1 and any(node_of[s + j] != node_of[s + j + (dp - 1) * tp]
                              for s in range(0, total, block) for j in range(tp))
    pp_inter = pp > 1 and any(node_of[j] != node_of[j + (pp - 1) * block] for j in range(block))
    return Layout(dp_inter=bool(dp_inter), tp_inter=bool(tp_inter), pp_inter=bool(pp_inter), nodes=len(gpus_per_node),
                  min_node_gpus=min(gpus_per_node))


def check_config(cfg: Config, *, allow_tp_across_nodes: bool = True, row: int | None = None) -> Layout:
    """Reject impossible configurations with a precise reason; return the rank layout."""
    p = cfg.plan
    for name in ("dp", "tp", "pp", "ga_steps", "micro_batches"):
        value = getattr(p, name)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a whole number >= 1, got {value!r}", row)
    if p.zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"zero_stage must be 0, 1, 2 or 3, got {p.zero_stage!r}", row)
    if p.offload and p.zero_stage == 0:
        raise ConfigError("offload needs a ZeRO stage of 1 or more, got zero_stage 0", row)
    if not cfg.gpus_per_node or any(g < 1 for g in cfg.gpus_per_node):
        raise ConfigError(f"gpus_per_node needs one positive count per node, got {list(cfg.gpus_per_node)}", row)
    gpus = sum(cfg.gpus_per_node)
    if p.dp * p.tp * p.pp != gpus:
        raise ConfigError(f"dp*tp*pp = {p.dp}*{p.tp}*{p.pp} = {p.dp * p.tp * p.pp} but the placement "
                          f"{';'.join(map(str, cfg.gpus_per_node))} has {gpus} GPUs", row)
    if cfg.cpus_per_gpu is not None and cfg.cpus_per_gpu < 1:
        raise ConfigError(f"cpu_threads must be >= 1 per GPU, got {cfg.cpus_per_gpu}", row)
    if cfg.global_batch_size < 1:
        raise ConfigError(f"global_batch_size must be >= 1, got {cfg.global_batch_size}", row)
    if cfg.global_batch_size % (p.dp * p.ga_steps * p.micro_batches):
        raise ConfigError(f"global_batch_size {cfg.global_batch_size} is not divisible by "
                          f"dp*ga_steps*micro_batches = {p.dp}*{p.ga_steps}*{p.micro_batches}", row)
    lay = layout(tuple(int(g) for g in cfg.gpus_per_node), p.dp, p.tp, p.pp)
    if lay.tp_inter and not allow_tp_across_nodes:
        raise ConfigError(f"tp={p.tp} does not fit inside the nodes of placement "
                          f"{';'.join(map(str, cfg.gpus_per_node))}: TP groups would cross nodes, "
                          "which this model's spec forbids", row)
    return lay


@dataclass(frozen=True)
class ConfigBatch:
    """Configurations as parallel arrays (one entry per configuration).

    `cpus` is NaN where the CPU threads per GPU were not given (the environment's default applies);
    `ga_steps` is 0 where GA is left to the modeler (`modeler.memory.resolve_ga` fills it in).
    """

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    zero_stage: np.ndarray
    offload: np.ndarray
    gc: np.ndarray
    ga_steps: np.ndarray
    micro_batches: np.ndarray
    global_batch: np.ndarray
    cpus: np.ndarray
    gpus: np.ndarray
    nodes: np.ndarray
    min_node_gpus: np.ndarray
    """GPUs on the placement's smallest node: the NICs a group crossing nodes can use (see `perf_model`)."""
    dp_inter: np.ndarray
    tp_inter: np.ndarray
    pp_inter: np.ndarray

    def __len__(self) -> int:
        return int(self.dp.shape[0])

    def take(self, index: Any) -> "ConfigBatch":
        """A sub-batch (boolean mask or index array)."""
        return ConfigBatch(**{k: v[index] for k, v in self.__dict__.items()})

    @staticmethod
    def from_configs(configs: Sequence[Config], *, allow_tp_across_nodes: bool = True) -> "ConfigBatch":
        """Check each configuration (errors name its position) and stack them."""
        return ConfigBatch.from_rows([config_row(cfg, allow_tp_across_nodes=allow_tp_across_nodes, row=i)
                                      for i, cfg in enumerate(configs)])

    @staticmethod
    def from_rows(rows: Sequence[tuple]) -> "ConfigBatch":
        """Stack rows made by `config_row` (checked already)."""
        return _stack(rows)


def config_row(cfg: Config, *, allow_tp_across_nodes: bool = True, row: int | None = None) -> tuple:
    """Check one configuration (`check_config`) and give its entries of a `ConfigBatch`, in field order."""
    lay = check_config(cfg, allow_tp_across_nodes=allow_tp_across_nodes, row=row)
    p = cfg.plan
    return (p.dp, p.tp, p.pp, p.zero_stage, bool(p.offload), bool(p.gc), 0 if cfg.ga_auto else p.ga_steps,
            p.micro_batches, cfg.global_batch_size, math.nan if cfg.cpus_per_gpu is None else cfg.cpus_per_gpu,
            sum(cfg.gpus_per_node), lay.nodes, lay.min_node_gpus, lay.dp_inter, lay.tp_inter, lay.pp_inter)


_DTYPES = (np.int64, np.int64, np.int64, np.int64, np.bool_, np.bool_, np.int64, np.int64, np.float64,
           np.float64, np.int64, np.int64, np.int64, np.bool_, np.bool_, np.bool_)
_FIELDS = ("dp", "tp", "pp", "zero_stage", "offload", "gc", "ga_steps", "micro_batches", "global_batch", "cpus",
           "gpus", "nodes", "min_node_gpus", "dp_inter", "tp_inter", "pp_inter")


def _stack(rows: list[tuple]) -> ConfigBatch:
    if not rows:
        return ConfigBatch(**{f: np.zeros(0, dtype=d) for f, d in zip(_FIELDS, _DTYPES)})
    cols = list(zip(*rows))
    return ConfigBatch(**{f: np.asarray(c, dtype=d) for f, c, d in zip(_FIELDS, cols, _DTYPES)})


# --- configuration tables -------------------------------------------------------------------------

def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and value.strip() == "")


def _int(value: Any, name: str, row: int, *, default: int | None = None) -> int:
    if _blank(value):
        if default is None:
            raise ConfigError(f"{name} is empty", row)
        return default
    try:
        f = float(str(value).strip())
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {value!r}", row) from None
    if not math.isfinite(f) or f != int(f):
        raise ConfigError(f"{name} must be a whole number, got {value!r}", row)
    return int(f)


def _flag(value: Any, name: str, row: int) -> bool:
    if _blank(value):
        return False
    v = _int(value, name, row)
    if v not in (0, 1):
        raise ConfigError(f"{name} must be 0 or 1, got {value!r}", row)
    return bool(v)


def parse_placement(value: Any, row: int | None = None) -> tuple[int, ...]:
    """`"8;8"` -> (8, 8): GPUs on each node, ';'-separated."""
    if _blank(value):
        raise ConfigError("gpus_per_node is empty", row)
    parts = str(value).strip().split(";")
    try:
        counts = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"gpus_per_node must be ';'-separated whole numbers, got {value!r}", row) from None
    if any(c < 1 for c in counts):
        raise ConfigError(f"gpus_per_node needs at least one GPU on every node, got {value!r}", row)
    return counts


def check_columns(columns: Iterable[str]) -> None:
    """Refuse a configuration table that lacks a required column."""
    have = set(columns)
    missing = [c for c in CONFIG_COLUMNS if c not in have and c not in OPTIONAL_COLUMNS]
    if missing:
        raise ConfigError(f"missing column(s) {', '.join(missing)}; a configuration table needs "
                          f"{', '.join(c for c in CONFIG_COLUMNS if c not in OPTIONAL_COLUMNS)}")


def config_from_row(rec: dict[str, Any], row: int) -> Config:
    """One configuration-table row (a dict of column -> value) as a `Config`."""
    missing = [c for c in CONFIG_COLUMNS if c not in rec and c not in OPTIONAL_COLUMNS]
    if missing:
        raise ConfigError(f"missing column(s) {', '.join(missing)}", row)
    zero_stage = _int(rec["zero_stage"], "zero_stage", row, default=0)
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"zero_stage must be 0, 1, 2 or 3, got {rec['zero_stage']!r}", row)
    plan = Plan(dp=_int(rec["dp"], "dp", row), tp=_int(rec["tp"], "tp", row), pp=_int(rec["pp"], "pp", row),
                zero_stage=zero_stage, offload=_flag(rec["offload"], "offload", row),
                ga_steps=_int(rec.get("ga_steps"), "ga_steps", row, default=1),
                gc=_flag(rec["gc"], "gc", row),
                micro_batches=_int(rec.get("micro_batches"), "micro_batches", row, default=1))
    cpu = rec.get("cpu_threads")
    cpus = None if _blank(cpu) else _int(cpu, "cpu_threads", row)
    return Config(plan=plan, gpus_per_node=parse_placement(rec["gpus_per_node"], row), cpus_per_gpu=cpus,
                  global_batch_size=_int(rec["global_batch_size"], "global_batch_size", row),
                  ga_auto=_blank(rec.get("ga_steps")))


def batch_from_records(records: Iterable[dict[str, Any]], *, allow_tp_across_nodes: bool = True,
                       first_row: int = 1) -> ConfigBatch:
    """Rows of a configuration table (dicts) as a batch. Row numbers in errors count data rows
    from `first_row` (1 = the first row under the header)."""
    configs = []
    for i, rec in enumerate(records):
        row = first_row + i
        cfg = config_from_row(rec, row)
        check_config(cfg, allow_tp_across_nodes=allow_tp_across_nodes, row=row)
        configs.append(cfg)
    try:
        return ConfigBatch.from_configs(configs, allow_tp_across_nodes=allow_tp_across_nodes)
    except ConfigError as exc:  # already checked above; keep the table's numbering if it happens
        raise ConfigError(exc.detail, None if exc.row is None else exc.row + first_row) from None


def measured_times(records: Iterable[dict[str, Any]], column: str = "iter_time_s", *,
                   first_row: int = 1) -> np.ndarray:
    """The measured iteration times of a table, refusing NaN, empty, zero or negative values."""
    out = []
    for i, rec in enumerate(records):
        row = first_row + i
        value = rec.get(column)
        try:
            t = float(value) if not _blank(value) else math.nan
        except (TypeError, ValueError):
            raise ConfigError(f"{column} must be a number of seconds, got {value!r}", row) from None
        if not math.isfinite(t) or t <= 0:
            raise ConfigError(f"{column} must be a finite time > 0 s, got {value!r}", row)
        out.append(t)
    return np.asarray(out, dtype=np.float64)
