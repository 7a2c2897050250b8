"""Component roles and their NATS permissions (pure: no keys, no files, no I/O).

Each component connects as one NATS user of its role, authenticated by an nkey. A role's permissions
say which subjects it may publish and which it may subscribe to, in NATS's own terms (allow lists with
`*` and `>` wildcards), so the server refuses everything else:

- submitters publish only `job.submitted` and their requests about jobs (`job.cancel`, `job.suspend`,
  `job.resume`; admission checks the tenant named in them);
- a node agent publishes only its own node's subjects (`job.started.<node>`, `node.heartbeat.<node>`,
  ...; the node id is the subject's last part) and a training process on the node (the reporter) only
  `metrics.iteration.<node>`;
- only the policy publishes `plan.decided`, `plan.pending` and `network.decided` (the network
  scheduler publishes with the policy's identity), only the modeler `model.updated`, only the clock
  `clock.tick`; admission answers bad messages on the `*.rejected` subjects (and so may the modeler's
  and the policy's shells, for a message their core fails on); admission, the modeler and the policy
  describe their cores on `run.described`;
- the recorder reads everything and publishes nothing;
- only the bootstrap identity (`admin`) creates or changes streams and key-value buckets.

Every role may read the stream (JetStream consumers deliver to the reader's own inbox,
`_INBOX.<key>.>`, which no other identity may subscribe to) and work its own durable consumers (the
policy's two: `svc-policy`, and `svc-network` for the network scheduler its service runs beside the
policy); no role but `admin` may create, change, purge or delete a stream, or delete another role's
consumer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..events.catalog import CONTROL, NODE_SCOPED, STREAM_NAME

ROLES = ("admin", "recorder", "admission", "clock", "modeler", "policy", "agent", "reporter", "submitter")
NODE_ROLES = frozenset({"agent", "reporter"})
"""Roles that speak for one node: their identity is per node."""

LEASE_BUCKET = "rubick-leases"
"""The key-value bucket in which replicas of a service hold their lease (`controlplane.lease`)."""
RUN_SUBJECTS = ("run.described",)
"""Subjects of the run description (published by admission, the modeler and the policy when active)."""

_DURABLES = {"recorder": ("recorder",), "admission": ("svc-admission",), "modeler": ("svc-modeler",),
             "policy": ("svc-policy", "svc-network")}
"""The durable consumers each service role works: the policy service's active replica also runs the network
scheduler (`rubick service policy --network`), whose shell has its own consumer."""
_SERVICE_LEASE = {"recorder", "admission", "clock", "modeler", "policy"}
_REJECTIONS = ("job.rejected", "node.rejected", "metrics.rejected", "model.rejected", "plan.rejected",
               "clock.rejected", "run.rejected", "quota.rejected", "network.rejected")
"""A service's shell answers a message its core failed on with `<namespace>.rejected` (controlplane.service)."""


class RoleError(ValueError):
    pass


@dataclass(frozen=True)
class Identity:
    """Who a component is: its role, and for node roles the node it speaks for."""

    role: str
    node: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise RoleError(f"unknown role {self.role!r}: one of {', '.join(ROLES)}")
        if (self.role in NODE_ROLES) != (self.node is not None):
            raise RoleError(f"role {self.role} {'needs' if self.role in NODE_ROLES else 'takes no'} node")
        if self.node is not None and (not self.node or any(c in self.node for c in " *>\t\n")):
            raise RoleError(f"node {self.node!r} cannot be a subject token")

    @property
    def name(self) -> str:
        """File and user name: `policy`, `agent-node-3`."""
        return self.role if self.node is None else f"{self.role}-{self.node}"

    @property
    def durable(self) -> str | None:
        """The (first) durable consumer this identity works (creates, reads, acknowledges, deletes)."""
        durables = self.durables
        return durables[0] if durables else None

    @property
    def durables(self) -> tuple[str, ...]:
        """Every durable consumer this identity works: one per role, two for the policy."""
        if self.role == "agent":
            return (f"agent-{self.node}",)
        return _DURABLES.get(self.role, ())


def inbox_prefix(public_key: str) -> str:
    """Replies to a user (JetStream acks, consumer deliveries) go under this prefix, which only that user
    may subscribe to."""
    return f"_INBOX.{public_key[:16]}"


def publish_subjects(identity: Identity) -> list[str]:
    """Event subjects an identity may publish (the catalogue's, routing suffixes included)."""
    role, node = identity.role, identity.node
    if role == "admin":
        return [">"]
    if role == "submitter":
        return ["job.submitted", *sorted(CONTROL)]
    if role == "agent":
        return [f"{s}.{node}" for s in sorted(NODE_SCOPED)]
    if role == "reporter":
        return [f"metrics.iteration.{node}"]
    if role == "admission":
        return [*_REJECTIONS, *RUN_SUBJECTS]
    if role == "clock":
        return ["clock.tick"]
    if role == "modeler":
        return ["model.updated", *_REJECTIONS, *RUN_SUBJECTS]
    if role == "policy":
        return ["plan.decided", "plan.decided.>", "network.decided", "network.decided.>", "plan.pending", "node.lost",
                *_REJECTIONS, *RUN_SUBJECTS]
    return []  # recorder


def permissions(identity: Identity, public_key: str, *, stream: str = STREAM_NAME) -> dict:
    """The `permissions` block of the server's user entry for `identity`."""
    if identity.role == "admin":
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    api = "$JS.API"
    pub = publish_subjects(identity) + [
        f"{api}.INFO", f"{api}.STREAM.INFO.{stream}", f"{api}.CONSUMER.INFO.{stream}.*",
        # reading the stream: an ephemeral consumer of a random name, pulled, never acknowledged
        f"{api}.CONSUMER.CREATE.{stream}", f"{api}.CONSUMER.CREATE.{stream}.*", f"{api}.CONSUMER.CREATE.{stream}.*.>",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.*",
    ]
    for durable in identity.durables:
        pub += [f"{api}.CONSUMER.DURABLE.CREATE.{stream}.{durable}", f"{api}.CONSUMER.DELETE.{stream}.{durable}",
                f"$JS.ACK.{stream}.{durable}.>"]
    if identity.role in _SERVICE_LEASE:
        kv = f"KV_{LEASE_BUCKET}"
        pub += [f"$KV.{LEASE_BUCKET}.{identity.role}", f"{api}.STREAM.INFO.{kv}", f"{api}.DIRECT.GET.{kv}.>",
                f"{api}.STREAM.MSG.GET.{kv}", f"{api}.CONSUMER.CREATE.{kv}.*.>", f"{api}.CONSUMER.CREATE.{kv}.*",
                f"{api}.CONSUMER.MSG.NEXT.{kv}.*", f"{api}.CONSUMER.DELETE.{kv}.*"]
    sub = [f"{inbox_prefix(public_key)}.>"]
    if identity.role == "submitter":
        sub.append("job.rejected")
    return {"publish": {"allow": pub}, "subscribe": {"allow": sub}}


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match: `*` one token, `>` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def may_publish(identity: Identity, subject: str, public_key: str = "U" * 56) -> bool:
    return any(subject_matches(p, subject) for p in permissions(identity, public_key)["publish"]["allow"])
