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
