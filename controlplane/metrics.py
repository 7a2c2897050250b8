"""Prometheus metrics of every service: messages in/out/rejected, handler latency, consumer lag."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .events.catalog import UnknownSubject, base_subject

REGISTRY = CollectorRegistry()

MESSAGES_IN = Counter("rubick_messages_in", "Messages consumed", ["service", "subject"], registry=REGISTRY)
MESSAGES_OUT = Counter("rubick_messages_out", "Messages published", ["service", "subject"], registry=REGISTRY)
MESSAGES_REJECTED = Counter("rubick_messages_rejected", "Messages refused as invalid", ["service", "subject"],
                            registry=REGISTRY)
HANDLER_SECONDS = Histogram("rubick_handler_seconds", "Time in a core's handle() per event", ["service"],
                            registry=REGISTRY,
                            buckets=(1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0))
CONSUMER_LAG = Gauge("rubick_consumer_lag", "Messages stored but not yet acknowledged by the service",
                     ["service"], registry=REGISTRY)
RECORDER_ROWS = Counter("rubick_recorder_rows", "Rows written to the event log", registry=REGISTRY)
RECORDER_FILES = Counter("rubick_recorder_files", "Parquet files written", registry=REGISTRY)
RECORDER_MERGES = Counter("rubick_recorder_merges", "Merges of small event-log files (compaction)",
                          registry=REGISTRY)
RECORDER_BYTES = Counter("rubick_recorder_bytes", "Bytes of Parquet written", registry=REGISTRY)


def subject_label(subject: str) -> str:
    """Catalogue subject for a label (routing suffixes folded, unknown subjects as 'unknown')."""
    try:
        base = base_subject(subject)
    except UnknownSubject:
        return "unknown"
    return base


def serve(port: int, host: str = "127.0.0.1") -> int:
    """Expose /metrics; returns the port (a free one when `port` is 0)."""
    server, _ = start_http_server(port, addr=host, registry=REGISTRY)
    return server.server_address[1]


# --- the scheduler (the policy service; computed by controlplane.scheduler_metrics in the shell) ----------------

ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ERROR_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0)

JOBS_PENDING = Gauge("rubick_jobs_pending", "Jobs waiting for GPUs (queued or preempted)", ["tenant"],
                     registry=REGISTRY)
JOBS_WAITING = Gauge("rubick_jobs_waiting", "Jobs waiting or running short, by the policy's pending reason "
                     "(plan.pending)", ["tenant", "reason"], registry=REGISTRY)
JOBS_RUNNING = Gauge("rubick_jobs_running", "Jobs running", ["tenant"], registry=REGISTRY)
GPUS_TOTAL = Gauge("rubick_gpus_total", "GPUs of the live nodes", registry=REGISTRY)
GPUS_ALLOCATED = Gauge("rubick_gpus_allocated", "GPUs of live nodes the policy's decisions hold", registry=REGISTRY)
GPUS_FREE = Gauge("rubick_gpus_free", "GPUs of live nodes no decision holds", registry=REGISTRY)
QUOTA_GPUS = Gauge("rubick_quota_gpus", "A tenant's quota: GPUs for guaranteed jobs", ["tenant"], registry=REGISTRY)
QUOTA_USED_GPUS = Gauge("rubick_quota_used_gpus", "GPUs held by a tenant's guaranteed jobs that run within its quota",
                        ["tenant"], registry=REGISTRY)
GUARANTEED_JOBS = Gauge("rubick_guaranteed_jobs", "Open guaranteed jobs within their tenant's quota", ["tenant"],
                        registry=REGISTRY)
GUARANTEED_BEHIND = Gauge("rubick_guaranteed_behind", "Guaranteed jobs within quota waiting or running slower "
                          "than their reference throughput", ["tenant"], registry=REGISTRY)
RECONFIGURATIONS = Counter("rubick_reconfigurations", "Jobs checkpointed and relaunched on a new plan or placement",
                           ["tenant"], registry=REGISTRY)
RESTART_COST_SECONDS = Counter("rubick_restart_cost_seconds", "Measured restart cost of the reconfigurations",
                               ["tenant"], registry=REGISTRY)
ROUND_SECONDS = Histogram("rubick_round_seconds", "Wall time of one scheduling round of the policy",
                          registry=REGISTRY, buckets=ROUND_BUCKETS)
MODEL_REFITS = Counter("rubick_model_refits", "Performance-model refits the policy took (model.updated)",
                       ["model_type"], registry=REGISTRY)
MODEL_FIT_RMSLE = Gauge("rubick_model_fit_rmsle", "Root mean squared log error of a type's latest fit",
                        ["model_type"], registry=REGISTRY)
PREDICTION_ERROR = Histogram("rubick_prediction_error_ratio", "|measured - predicted| / predicted throughput of "
                             "the first measured iteration of each decided configuration", ["model_type"],
                             registry=REGISTRY, buckets=ERROR_BUCKETS)
PREDICTION_OVERSHOOT = Gauge("rubick_prediction_overshoot_ratio", "Most a type's measured iteration ran longer "
                             "than predicted (the policy's guarantee margin)", ["model_type"], registry=REGISTRY)
