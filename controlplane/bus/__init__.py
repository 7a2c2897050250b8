"""The bus: one contract, two implementations (NATS JetStream and in-memory)."""

from .base import Bus, Consumer, Delivery, PubAck, matches_any, subject_matches
from .memory import MemoryBus

__all__ = ["Bus", "Consumer", "Delivery", "PubAck", "MemoryBus", "matches_any", "subject_matches"]
