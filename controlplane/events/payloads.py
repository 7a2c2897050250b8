"""Payload dataclasses, one per subject of the catalogue (docs/events.md).

Every field documents its type and unit through `spec(...)`; `check()` adds the
rules that span several fields. Units: seconds (s), gigabytes (GB, 10^9 bytes),
gigabytes per second (GB/s), samples per second.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Invalid, spec
from .workload import Workload

ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"
"""Job, tenant and node names: usable in NATS subjects and file names."""

MAX_GPUS = 65_536
"""No request or node may name more GPUs than this (the largest clusters are below it)."""
MAX_CPUS = 1_000_000
MAX_MEM_GB = 10_000_000.0
MAX_DEGREE = 65_536


def ident(doc: str, example: str, **kw) -> str:
    return spec(doc, pattern=ID_PATTERN, max_len=128, example=example, **kw)


# --- shared parts ------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """An execution plan: parallel degrees, ZeRO, offload, gradient accumulation, checkpointing."""

    dp: int = spec("data-parallel size", ge=1, le=MAX_DEGREE, default=1, example=2)
    tp: int = spec("tensor-parallel size (kept inside one node)", ge=1, le=MAX_DEGREE, default=1, example=1)
    pp: int = spec("pipeline-parallel size (stages)", ge=1, le=MAX_DEGREE, default=1, example=1)
    zero_stage: int = spec("DeepSpeed ZeRO stage", choices=(0, 1, 2, 3), default=0, example=2)
    offload: bool = spec("ZeRO-Offload: optimizer state and step on the CPU", default=False, example=False)
    ga_steps: int = spec("gradient-accumulation steps per iteration", ge=1, le=1_000_000, default=1, example=1)
    gc: bool = spec("gradient (activation) checkpointing", default=False, example=False)
    micro_batches: int = spec("pipeline micro-batches per iteration (1 without PP)", ge=1, le=1_000_000,
                              default=1, example=1)

    def check(self, path: str = "") -> None:
        if self.offload and self.zero_stage == 0:
            raise Invalid("ZeRO-Offload needs a ZeRO stage of 1 or more", _p(path, "offload"),
                          "zero_stage >= 1", f"zero_stage {self.zero_stage}")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    def code(self) -> str:
        """Compact, stable text form (the event log's `plan` column)."""
        return (f"dp{self.dp}-tp{self.tp}-pp{self.pp}-z{self.zero_stage}"
                f"{'-off' if self.offload else ''}-ga{self.ga_steps}{'-gc' if self.gc else ''}"
                f"{f'-mb{self.micro_batches}' if self.micro_batches != 1 else ''}")


@dataclass(frozen=True)
class Resources:
    """A resource request: GPUs, CPU cores and host memory for the whole job."""

    gpus: int = spec("GPUs", ge=1, le=MAX_GPUS, example=2)
    cpus: int = spec("CPU cores (0 = policy decides)", ge=0, le=MAX_CPUS, default=0, example=16)
    mem_gb: float = spec("host memory (0 = policy decides)", unit="GB", ge=0, le=MAX_MEM_GB, default=0.0,
                         example=64.0)


@dataclass(frozen=True)
class NodeShare:
    """The part of a job's allocation on one node."""

    node: str = ident("node name", "node-0")
    gpus: int = spec("GPUs on this node", ge=0, le=MAX_GPUS, example=2)
    cpus: int = spec("CPU cores on this node", ge=0, le=MAX_CPUS, default=0, example=16)
    mem_gb: float = spec("host memory on this node", unit="GB", ge=0, le=MAX_MEM_GB, default=0.0, example=64.0)


@dataclass(frozen=True)
class ModelSpec:
    """The architecture of a model type, enough for the performance and memory models."""

    name: str = ident("model type this spec describes", "gpt2")
    num_params: int = spec("parameter count", ge=1, le=10**14, example=1_557_686_400)
    num_layers: int = spec("transformer layers", ge=1, le=100_000, example=48)
    hidden_size: int = spec("hidden size", ge=1, le=10**7, example=1600)
    num_heads: int = spec("attention heads", ge=1, le=100_000, example=25)
    seq_len: int = spec("sequence length", unit="tokens", ge=1, le=10**8, example=1024)
    global_batch_size: int = spec("global batch the forward time was profiled at", ge=1, le=10**8, example=32)
    fwd_time_s: float | None = spec("profiled forward time of one GPU at that batch", unit="s", gt=0,
                                    le=86_400, default=None, example=0.21)

    def check(self, path: str = "") -> None:
        if self.hidden_size % self.num_heads:
            raise Invalid("hidden_size must be divisible by num_heads", _p(path, "hidden_size"),
                          f"a multiple of {self.num_heads}", str(self.hidden_size))


@dataclass(frozen=True)
class ModelRef:
    """A model type by name, with its full spec when the type is new to the cluster."""

    type: str = ident("model type (see examples/models)", "gpt2")
    spec: ModelSpec | None = spec("full architecture, required for a type the cluster does not know",
                                  default=None)

    def check(self, path: str = "") -> None:
        if self.spec is not None and self.spec.name != self.type:
            raise Invalid("spec.name must equal type", _p(path, "spec.name"), self.type, self.spec.name)


def _p(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# --- jobs -----------------------------------------------------------------------

MIN_PRIORITY, MAX_PRIORITY = -1000, 1000
"""A job's priority range (0 by default): higher runs first and may shrink lower ones (docs/policy.md)."""


@dataclass(frozen=True, kw_only=True)
class JobSubmitted:
    """A new training job. Give `resources` or `plan` or both: without a plan the owner's plan is plain data
    parallelism over the requested GPUs; without resources, the plan's GPUs."""

    job_id: str = ident("job id, unique in the cluster for ever", "gpt2-0007")
    tenant: str = ident("tenant (team) that owns the job and whose quota it uses", "team-a")
    guaranteed: bool = spec("true: must get at least the performance of the requested plan and resources",
                            default=False, example=True)
    model: ModelRef = spec("model type")
    global_batch_size: int = spec("samples per iteration; never changed by reconfiguration", ge=1, le=10**8,
                                  example=32)
    plan: Plan | None = spec("the owner's execution plan; nil: `dp` = the requested GPUs, nothing else",
                             default=None)
    resources: Resources | None = spec("the owner's requested resources; nil: the plan's GPUs (dp*tp*pp), the "
                                       "CPUs and memory the policy decides", default=None)
    target_iterations: int = spec("iterations to run before the job is complete", ge=1, le=10**12,
                                  example=1000)
    workload: Workload | None = spec("the job's own training code (docs/workloads.md); nil: the example "
                                     "trainer", default=None)
    priority: int = spec("higher runs first and may take GPUs from lower-priority jobs; a guarantee comes first "
                         "whatever the priority", ge=MIN_PRIORITY, le=MAX_PRIORITY, default=0, example=0)

    def __post_init__(self) -> None:
        if self.plan is None and self.resources is not None:
            object.__setattr__(self, "plan", Plan(dp=self.resources.gpus))
        elif self.resources is None and self.plan is not None:
            object.__setattr__(self, "resources", Resources(gpus=self.plan.gpus))

    def check(self, path: str = "") -> None:
        if self.plan is None or self.resources is None:
            raise Invalid("give resources (at least gpus) or a plan", _p(path, "resources"),
                          "resources.gpus or plan", "neither")
        if self.plan.gpus != self.resources.gpus:
            raise Invalid("plan dp*tp*pp must equal the requested GPUs", _p(path, "plan"),
                          f"{self.resources.gpus} GPUs", f"dp*tp*pp = {self.plan.gpus}")
        per_step = self.plan.dp * self.plan.ga_steps
        if self.global_batch_size % per_step:
            raise Invalid("global_batch_size must be divisible by dp * ga_steps", _p(path, "global_batch_size"),
                          f"a multiple of {per_step}", str(self.global_batch_size))


@dataclass(frozen=True)
class Rejected:
    """A message refused, with the reason. Published on `<namespace>.rejected` (`job.rejected` for
    `job.submitted`, `metrics.rejected` for `metrics.iteration`, ...); never itself refused in turn."""

    subject: str = spec("subject of the refused message", example="job.submitted")
    reason: str = spec("why, in words", example="out of range")
    field: str = spec("the offending field, dotted path", default="", example="data.resources.gpus")
    expected: str = spec("what the field should have been", default="", example="<= 65536")
    got: str = spec("what it was", default="", example="1000000")
    event_id: str = spec("id of the refused event, where it could be read", default="", example="cli-1f3a")
    job_id: str | None = spec("job the message was about, where it could be read", default=None,
                              example="gpt2-0007")
    stream_seq: int | None = spec("stream sequence of the refused message in the event log, set where its bytes "
                                  "could not be read as an event (no `event_id`); nil otherwise", ge=0,
                                  default=None, example=41)


@dataclass(frozen=True)
class JobStarted:
    """A job's processes started under a plan and placement."""

    job_id: str = ident("job id", "gpt2-0007")
    allocation: tuple[NodeShare, ...] = spec("resources per node in force")
    plan: Plan = spec("plan in force")
    attempt: int = spec("launch count of this job, 1 for the first", ge=1, default=1, example=1)


@dataclass(frozen=True)
class JobReconfigured:
    """A job was checkpointed and relaunched under a new plan or placement."""

    job_id: str = ident("job id", "gpt2-0007")
    allocation: tuple[NodeShare, ...] = spec("resources per node now in force")
    plan: Plan = spec("plan now in force")
    restart_cost_s: float = spec("measured checkpoint + relaunch + first-iteration time", unit="s", ge=0,
                                 le=86_400, example=78.0)


@dataclass(frozen=True)
class JobControl:
    """An owner's request about a job (`job.cancel`, `job.suspend`, `job.resume`): admission refuses it
    with `job.rejected` when the job is unknown, over, not in a state it applies to, or another tenant's."""

    job_id: str = ident("job id", "gpt2-0007")
    tenant: str | None = spec("the requester's tenant; when given it must be the job's owner", pattern=ID_PATTERN,
                              max_len=128, default=None, example="team-a")
    reason: str = spec("why, in the requester's words", max_len=500, default="", example="wrong dataset")


@dataclass(frozen=True)
class JobPriority:
    """An owner's request to change a job's priority (`job.priority`): admission refuses it with `job.rejected`
    when the job is unknown, over or another tenant's; the policy applies it at once."""

    job_id: str = ident("job id", "gpt2-0007")
    priority: int = spec("the new priority", ge=MIN_PRIORITY, le=MAX_PRIORITY, example=100)
    tenant: str | None = spec("the requester's tenant; when given it must be the job's owner", pattern=ID_PATTERN,
                              max_len=128, default=None, example="team-a")
    reason: str = spec("why, in the requester's words", max_len=500, default="", example="deadline moved up")


@dataclass(frozen=True)
class QuotaSet:
    """An operator sets a tenant's quota: the GPUs its guaranteed jobs may hold (their minimum demand is
    charged to it), as a number of GPUs or as a share of the cluster (exactly one of `gpus`, `share`). The
    policy applies it at once. The first quota set on a cluster with none (every tenant unlimited) starts the
    table: a tenant with no quota then runs its guaranteed jobs best-effort."""

    tenant: str = ident("tenant", "team-a")
    gpus: int | None = spec("guaranteed GPUs of the tenant", ge=0, le=MAX_GPUS, default=None, example=32)
    new_tenant: bool = spec("true: the tenant has no job and no quota yet (otherwise such a name is refused "
                            "as a likely typo)", default=False, example=False)
    reason: str = spec("why, in the operator's words", max_len=500, default="", example="quarterly plan")
    share: float | None = spec("guaranteed share of the GPUs of the live nodes, 0..1 (rounded down to whole "
                               "GPUs; it follows the cluster as nodes come and go)", ge=0, le=1, default=None,
                               example=None)

    def check(self, path: str = "") -> None:
        if (self.gpus is None) == (self.share is None):
            raise Invalid("give the quota as gpus or as a share of the cluster, not both or neither",
                          _p(path, "gpus"), "exactly one of gpus, share", "both" if self.gpus is not None else "neither")


@dataclass(frozen=True)
class JobCompleted:
    """A job ran its target iterations."""

    job_id: str = ident("job id", "gpt2-0007")
    iterations: int = spec("iterations run", ge=0, example=1000)


@dataclass(frozen=True)
class JobFailed:
    """A job's processes failed; its resources are released."""

    job_id: str = ident("job id", "gpt2-0007")
    reason: str = spec("why", example="exit code 137")
    exit_code: int | None = spec("exit code of the failing process", default=None, example=137)
    log_tail: str = spec("last lines of the process log", default="", max_len=16_384, example="")


@dataclass(frozen=True)
class JobPreempted:
    """A job was stopped to free its resources; it keeps its checkpoint and waits."""

    job_id: str = ident("job id", "gpt2-0007")
    reason: str = spec("why", example="shrunk to zero by the policy")
    iterations_done: int = spec("iterations done when stopped", ge=0, example=420)


# --- nodes ----------------------------------------------------------------------

@dataclass(frozen=True)
class NodeRegistered:
    """A node and its capacity."""

    node: str = ident("node name", "node-0")
    gpus: int = spec("GPUs", ge=0, le=1024, example=8)
    gpu_mem_gb: float = spec("memory of one GPU", unit="GB", ge=0, le=100_000, example=80.0)
    cpus: int = spec("CPU cores", ge=1, le=MAX_CPUS, example=96)
    mem_gb: float = spec("host memory", unit="GB", gt=0, le=MAX_MEM_GB, example=1600.0)
    gpu_type: str = spec("GPU model name", default="", max_len=128, example="A800-80GB")
    nvlink_gbps: float | None = spec("GPU-to-GPU bandwidth inside the node", unit="GB/s", gt=0, default=None,
                                     example=400.0)
    pcie_gbps: float | None = spec("host-to-GPU bandwidth", unit="GB/s", gt=0, default=None, example=32.0)
    network_gbps: float | None = spec("node-to-node bandwidth", unit="GB/s", gt=0, default=None, example=100.0)


@dataclass(frozen=True)
class NodeHeartbeat:
    """A node is alive; the jobs it runs now."""

    node: str = ident("node name", "node-0")
    jobs: tuple[str, ...] = spec("ids of the jobs running on the node", default=())


@dataclass(frozen=True)
class NodeLost:
    """A node stopped answering or left; its jobs are gone."""

    node: str = ident("node name", "node-0")
    reason: str = spec("why", example="no heartbeat for 30 s")


# --- metrics, model, plans, clock ----------------------------------------------------

@dataclass(frozen=True)
class MetricsIteration:
    """One measured training iteration of a job under a plan and placement."""

    job_id: str = ident("job id", "gpt2-0007")
    model_type: str = ident("model type", "gpt2")
    iteration: int = spec("iteration number, from 0", ge=0, example=42)
    iter_time_s: float = spec("wall time of the iteration (one global batch)", unit="s", gt=0, le=86_400,
                              example=1.05)
    plan: Plan = spec("plan in force")
    gpus_per_node: tuple[int, ...] = spec("GPUs used on each node of the placement", example=(2,))
    node: str = spec("node that reported (rank 0's node)", default="", example="node-0")
    cpus_per_gpu: int | None = spec("CPU threads per GPU", ge=1, default=None, example=4)
    fwd_s: float | None = spec("forward time", unit="s", ge=0, default=None, example=0.3)
    bwd_s: float | None = spec("backward + gradient sync time", unit="s", ge=0, default=None, example=0.6)
    opt_s: float | None = spec("optimizer step (with offload traffic)", unit="s", ge=0, default=None,
                               example=0.15)

    def check(self, path: str = "") -> None:
        if not self.gpus_per_node or any(g < 1 for g in self.gpus_per_node):
            raise Invalid("every node of the placement needs at least one GPU", _p(path, "gpus_per_node"),
                          "a non-empty list of positive counts", str(list(self.gpus_per_node)))
        if sum(self.gpus_per_node) != self.plan.gpus:
            raise Invalid("plan dp*tp*pp must equal the GPUs of the placement", _p(path, "plan"),
                          f"{sum(self.gpus_per_node)} GPUs", f"dp*tp*pp = {self.plan.gpus}")


@dataclass(frozen=True)
class ModelUpdated:
    """New fitted performance-model parameters for a model type."""

    model_type: str = ident("model type", "gpt2")
    version: int = spec("increases by one with every refit of this type", ge=1, example=3)
    params: dict[str, float] = spec("fitted performance-model parameters: the seven of the paper (k_bwd, "
                                    "k_sync, k_opt, k_opt_off, k_off, k_swap, k_const) and the extensions "
                                    "k_3d, k_tp, k_pp; units in docs/modeler.md",
                                    example={"k_bwd": 2.0, "k_sync": 1.5, "k_opt": 0.9, "k_opt_off": 3.1,
                                             "k_off": 1.2, "k_swap": 1.1, "k_const": 0.005, "k_3d": 1.0,
                                             "k_tp": 1.0, "k_pp": 0.0})
    n_points: int = spec("measured points the fit used", ge=0, example=12)
    rmsle: float = spec("root mean squared log error of the fit on those points", ge=0, example=0.031)
    reason: str = spec("why it was refitted", default="", example="rolling error 12% > 10%")
    error_bounds: dict[str, float] | None = spec(
        "how much the new parameters' predictions may be too fast, exp(1.645 sigma) - 1 with sigma their "
        "out-of-fold log error on the points (docs/modeler.md): under `all` the type's, and per plan family "
        "(DP, GC, ZeRO, ZeRO-Offload, 3D) where points of it were fitted; the policy's guarantee margins for "
        "the type; nil: not estimated", default=None, example={"all": 0.12, "DP": 0.04, "3D": 0.2})


@dataclass(frozen=True)
class Decision:
    """The policy's decision for one job."""

    job_id: str = ident("job id", "gpt2-0007")
    allocation: tuple[NodeShare, ...] = spec("resources per node; empty = queued or preempted")
    plan: Plan | None = spec("execution plan; nil when the job gets nothing", default=None)
    predicted_throughput: float = spec("predicted samples per second under this plan", unit="samples/s",
                                       ge=0, default=0.0, example=28.4)
    reason: str = spec("machine-readable reason code", default="", max_len=64, example="slope")
    detail: dict[str, str] = spec("reason details (which slope won, which job was shrunk, ...)",
                                  default_factory=dict, example={"gpu_slope": "0.31"})


@dataclass(frozen=True)
class PlanDecided:
    """One scheduling round's decisions for the jobs it changed."""

    round: int = spec("scheduling round number", ge=0, example=17)
    policy: str = spec("policy that decided", max_len=64, example="rubick")
    decisions: tuple[Decision, ...] = spec("one entry per affected job")


PENDING_REASONS = ("no-gpus", "quota", "no-fit", "held", "batch")
"""Why a job waits or runs short (docs/policy.md, "Why a job waits"): `no-gpus` not enough GPUs free, nor
held by jobs that would gain less from them, for its minimum; `quota` its tenant's guaranteed quota is used
up, so it competes as best-effort; `no-fit` GPUs are free but no plan of it fits in GPU memory, CPUs or host
memory on the free nodes; `held` the GPUs it needs belong to a job changed too recently to restart again, or
the gain of a change would not pay the restart (the restart rule); `batch` its submission waits for the next
batched round. A job that cannot run at any size is not pending: it is refused with `job.rejected`."""


@dataclass(frozen=True)
class Pending:
    """Why one job holds no GPUs, or fewer than it asked for and could use, after a round."""

    job_id: str = ident("job id", "gpt2-0007")
    reason: str = spec("reason code", choices=PENDING_REASONS, example="no-gpus")
    gpus: int = spec("GPUs it holds after the round (0 = queued)", ge=0, le=MAX_GPUS, default=0, example=0)
    needs_gpus: int = spec("the fewest GPUs it can start on: its guarantee's minimum demand, else the fewest on "
                           "which a plan of it fits in memory", ge=0, le=MAX_GPUS, default=0, example=2)
    detail: dict[str, str] = spec("reason details: `quota` and `quota_used` (GPUs) for `quota`",
                                  default_factory=dict, example={})


@dataclass(frozen=True)
class PlanPending:
    """What changed in the policy's pending reasons: published when a round (or a batched submission)
    changes why a job waits or runs short. `pending` lists the jobs whose reason is new or changed, `cleared`
    those no longer waiting or short (a suspended job among them); a job that ends (completes, fails or is
    cancelled) leaves the set without a word."""

    round: int = spec("the policy's latest `plan.decided` round at the time", ge=0, example=17)
    policy: str = spec("policy that decided", max_len=64, example="rubick")
    pending: tuple[Pending, ...] = spec("jobs whose pending reason is new or changed", default=())
    cleared: tuple[str, ...] = spec("jobs that no longer wait or run short", default=())


NETWORK_MODES = ("fair", "coflow", "echelonflow")
NETWORK_SETTINGS = ("none", *NETWORK_MODES)
"""What `--network` accepts: no network scheduler, or one of its modes."""
MAX_TRAFFIC_CLASSES = 8
MAX_REFIT_BACKOFF = 20
"""The most doublings of the modeler's wait between a model type's unpaid refits (`RunDescribed.refit_backoff`)."""
DEFAULT_REFIT_BACKOFF = 3
"""The refit backoff of new simulations and deployments (`replay.config.RunConfig.refit_backoff`, `rubick simulate
--refit-backoff`); runs recorded before it had none (0)."""


@dataclass(frozen=True)
class JobNetwork:
    """One job's share of the network: the traffic class its flows are sent in (0 is served first)."""

    job_id: str = ident("job id", "gpt2-0007")
    traffic_class: int = spec("traffic class, 0 first (strict priority between classes)", ge=0,
                              le=MAX_TRAFFIC_CLASSES - 1, example=0)
    rank: int = spec("the job's place in the scheduler's order, 0 first", ge=0, le=MAX_GPUS, example=0)
    bytes_per_iteration: float = spec("bytes one iteration sends between nodes", unit="bytes", ge=0, le=1e18,
                                      example=6.2e9)
    tardiness_s: float = spec("the smallest tardiness its EchelonFlows can reach alone on the network, summed",
                              unit="s", ge=0, le=1e9, example=0.15)


@dataclass(frozen=True)
class NetworkDecided:
    """The network scheduler's decision (docs/network.md): the traffic class of every job whose iteration sends
    flows between nodes. Published only when a job's class or rank changes; `cleared` lists the jobs that no
    longer send any (finished, preempted, or now inside one node)."""

    mode: str = spec("network scheduling mode", choices=NETWORK_MODES, example="echelonflow")
    round: int = spec("decision number, from 1", ge=1, example=3)
    classes: int = spec("traffic classes the fabric offers", ge=1, le=MAX_TRAFFIC_CLASSES, example=4)
    decisions: tuple[JobNetwork, ...] = spec("jobs whose class or rank is new or changed", default=())
    cleared: tuple[str, ...] = spec("jobs that no longer send flows between nodes", default=())


@dataclass(frozen=True)
class ClockTick:
    """Drives periodic work; recorded like every other event."""

    seq: int = spec("tick number, from 0", ge=0, example=120)
    period_s: float = spec("time between ticks", unit="s", gt=0, le=86_400, example=60.0)


# --- the run description -------------------------------------------------------------

_spec = spec

@dataclass(frozen=True)
class ModelDescription:
    """A model type as the modeler and the policy use it: its spec and the modeler's extra facts."""

    spec: ModelSpec = _spec("the model's architecture")  # the field's name hides `spec` below it
    vocab_size: int = _spec("vocabulary size (memory of the output layer)", ge=1, le=10**9, default=32000,
                           example=50257)
    allow_tp_across_nodes: bool = _spec("tensor-parallel groups may span nodes", default=False, example=False)
    b_pcie_gbps: float | None = _spec("host <-> GPU bandwidth of this model's offload traffic", unit="GB/s", gt=0,
                                      le=100_000, default=None, example=None)
    tensor_pipeline: bool = _spec("the model has a tensor/pipeline-parallel implementation", default=True,
                                 example=True)


@dataclass(frozen=True)
class RunDescribed:
    """What a replay needs to rebuild a control-plane service's core: its settings, the model specs and
    the performance-model parameters it starts from. Published by the admission, modeler and policy
    services each time one of their replicas becomes active, so a deployment replays from its log alone.
    The policy's also names the network scheduler its service runs (`network`; none in descriptions
    recorded before it existed)."""

    service: str = spec("the service that describes itself", choices=("admission", "modeler", "policy"),
                        example="policy")
    policy: str = spec("scheduling policy", max_len=64, example="rubick")
    restart_cost_s: float = spec("assumed cost of one reconfiguration", unit="s", ge=0, le=86_400, example=78.0)
    batch_s: float = spec("how long a best-effort submission on a full cluster may wait for the next round",
                          unit="s", ge=0, le=86_400, example=60.0)
    refit_min_gain: float = spec("fraction by which a refit must lower the error to be published", ge=0, le=1,
                                 example=0.1)
    models: tuple[ModelDescription, ...] = spec("the model types the cluster knows")
    params: dict[str, dict[str, float]] = spec("fitted performance-model parameters the cores start from, per "
                                               "model type (names as in `model.updated`), each with its error bounds where "
                                               "the fit gave them: `error_bound` (the type's) and "
                                               "`error_bound.<plan family>`",
                                               example={"gpt2": {"k_bwd": 2.0, "k_const": 0.005}})
    cluster: str = spec("`NxG` of a simulated cluster; empty where the nodes register themselves", max_len=64,
                        default="", example="")
    oracle: str = spec("what the policy predicts with", choices=("model", "table"), default="model",
                       example="model")
    quotas: dict[str, int] | None = spec("guaranteed GPUs per tenant; nil: the whole cluster for every tenant",
                                         default=None, example={"team-a": 16})
    hold_s: float | None = spec("how long a job is held on its configuration; nil: twice the restart cost",
                                unit="s", ge=0, le=10**7, default=None, example=None)
    network: str = spec("the network scheduler the policy service runs beside the policy (docs/network.md); "
                        "none: no network scheduler", choices=NETWORK_SETTINGS, default="none",
                        example="echelonflow")
    network_classes: int = spec("traffic classes the network scheduler's fabric offers", ge=1,
                                le=MAX_TRAFFIC_CLASSES, default=4, example=4)
    rack_size: int = spec("nodes per rack behind the core the network scheduler assumes; 0: one non-blocking "
                          "tier", ge=0, le=10**6, default=0, example=0)
    oversubscription: float = spec("rack uplink capacity = the rack's NIC capacity / this", ge=1, le=10**6,
                                   default=1.0, example=1.0)
    refit_folds: int = spec("folds of the out-of-fold error a refit publishes as its error bound; 0: no bound",
                            ge=0, le=100, default=0, example=5)
    hold_backoff_s: float = spec("a job changed n times within this window is held 2^(n-1) times as long; 0: "
                                 "the same hold for every job", unit="s", ge=0, le=10**7, default=0.0,
                                 example=3600.0)
    anchors: str = spec("digest of the agreed fitting points every refit keeps (replay.config.FIT_POINTS); "
                        "empty: refits use the measured points only", max_len=64, default="",
                        example="3f1c2a9b0d4e5f60")
    refit_backoff: int = spec("a model type whose last k refits in a row published nothing waits for "
                              "5 * 2^min(k, this) measurements before its next refit; 0: 5 every time", ge=0,
                              le=MAX_REFIT_BACKOFF, default=0, example=3)
