"""Who a node-scoped message speaks for (pure).

A node agent publishes its node's events with the node id as the subject's last part
(`job.started.<node>`, `metrics.iteration.<node>`; see `catalog.NODE_SCOPED`). NATS permissions make
sure an agent can publish only on its own node's subjects; this check makes sure the payload cannot
speak for another node than its subject: a node's registration, heartbeat or loss must name that
node, a measured iteration must come from it, and a job started or reconfigured there must be placed
on it. What needs the cluster state (a job completed, failed or preempted on a node that does not run
it) is refused by the state fold (`controlplane.state.ClusterState.refusal`).
"""

from __future__ import annotations

from typing import Any

from .catalog import base_subject, subject_node
from .schema import Invalid


def check_subject_node(subject: str, payload: Any) -> None:
    """Raise Invalid when a node-scoped subject's node differs from the node its payload speaks for."""
    node = subject_node(subject)
    if node is None:
        return
    base = base_subject(subject)
    if base in ("node.registered", "node.heartbeat", "node.lost", "metrics.iteration"):
        if payload.node != node:
            raise Invalid("the subject's node differs from the payload's", "node", node, payload.node or "''")
    elif base in ("job.started", "job.reconfigured"):
        placed = sorted({share.node for share in payload.allocation})
        if node not in placed:
            raise Invalid("a node can only report jobs placed on it", "allocation",
                          f"a share on {node}", ", ".join(placed) or "no share")
