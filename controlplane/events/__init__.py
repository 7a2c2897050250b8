"""Events: the subject catalogue, payload dataclasses, the envelope and its msgpack codec."""

from .catalog import (STREAM_NAME, STREAM_SUBJECTS, SUBJECTS, UnknownSubject, all_subjects, base_subject,
                      is_rejection, payload_type, rejection_subject)
from .codec import Event, decode, decode_obj, encode, make, new_id, unpack
from .payloads import (ClockTick, Decision, JobCompleted, JobFailed, JobPreempted, JobReconfigured,
                       JobStarted, JobSubmitted, MetricsIteration, ModelRef, ModelSpec, ModelUpdated,
                       NodeHeartbeat, NodeLost, NodeRegistered, NodeShare, Plan, PlanDecided, Rejected,
                       Resources)
from .schema import Invalid, build, object_schema, to_plain

__all__ = [
    "STREAM_NAME", "STREAM_SUBJECTS", "SUBJECTS", "UnknownSubject", "all_subjects", "base_subject",
    "is_rejection", "payload_type", "rejection_subject", "Event", "decode", "decode_obj", "encode", "make",
    "new_id", "unpack", "ClockTick", "Decision", "JobCompleted", "JobFailed", "JobPreempted",
    "JobReconfigured", "JobStarted", "JobSubmitted", "MetricsIteration", "ModelRef", "ModelSpec",
    "ModelUpdated", "NodeHeartbeat", "NodeLost", "NodeRegistered", "NodeShare", "Plan", "PlanDecided",
    "Rejected", "Resources", "Invalid", "build", "object_schema", "to_plain",
]
