"""`KubernetesLauncher`: the `agents.launcher.Launcher` whose training processes are pods.

The same semantics as `LocalLauncher`, with pods for process groups (`agents.kube.manifests` builds
them):

- `launch`: the workload needs an image; the Node must exist; then the rendezvous Service (multi-node
  jobs, by the first node's agent) and the pod are created. An API refusal (RBAC's 403, an invalid
  object's 422, a missing namespace's 404) is a `LaunchError` with the API's own words. A pod of the same
  attempt already there (an agent restarted between create and record) is adopted, never doubled.
- `request_stop`: the pod annotation `rubick.io/stop` (the trainer sees it through its downward-API
  file); after `stop_timeout_s` the pod is deleted (its ranks get SIGTERM and the grace period), and its
  end shows up as an exit without a checkpoint.
- `poll`: memory only (`agents.kube.watch` keeps the node's pods and the Node current from a thread, so
  the agent's event loop never waits on the API for it). Ready becoming True is the first iteration;
  Succeeded/Failed is the exit, with the code and the trainer's final status from the container's
  termination message and, for a failure, the log's tail; Pending past `pending_timeout_s`, or waiting
  for a reason nothing cures (an invalid image name, a missing Secret), is a failed launch; a pod deleted
  by someone else is an exit with nothing known. The Node NotReady for longer than `node_grace_s` is a
  `NodeCondition` fact (the core reports `node.lost` for this node).
- `kill`: delete the job's pods at once (grace 0) and its Service; `forget`: delete the ended ones.
- `find`: after a restart, the node's pods read back from their annotations; live ones are adopted.

The few calls that do go to the API from the agent's loop (create, patch, delete, a failed pod's log)
carry a request timeout (`request_timeout_s`), so an API server that does not answer holds the agent
for seconds, not for ever.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from controlplane.events import NodeShare, Plan, build

from .. import contract
from ..core import Exited, Fact, FirstIteration, Found, Launch, LaunchFailed, NodeCondition
from ..launcher import LOG_TAIL_LINES, LaunchError
from ..plan_config import PlanError
from . import manifests as m
from .watch import Watcher

log = logging.getLogger(__name__)

ALIVE = ("Pending", "Running")
ENDED = ("Succeeded", "Failed")


@dataclass
class _Pod:
    job_id: str
    attempt: int
    name: str
    service: str | None
    created_at: float
    """monotonic"""
    first_iteration_seen: bool = False
    stop_asked_at: float | None = None
    deleted_at: float | None = None
    deleted_why: str = ""


def api_reason(exc: Exception) -> str:
    """The API's own words for a failed call: `403 Forbidden: pods is forbidden: ...`."""
    if isinstance(exc, ApiException):
        message = ""
        try:
            body = json.loads(exc.body) if exc.body else {}
            message = body.get("message", "") if isinstance(body, dict) else ""
        except (ValueError, TypeError):
            message = str(exc.body or "")[:300]
        head = f"{exc.status} {exc.reason or ''}".strip()
        return f"{head}: {message}" if message else head
    return f"{type(exc).__name__}: {exc}"


def ready_time(stamp: Any, seen_at: float) -> float:
    """When a pod became Ready. Its condition's time has whole seconds (the transition happened within the
    second after it); the watch saw it a few milliseconds after the fact, or much later for a pod adopted
    after a restart: the earlier of the two bounds."""
    t = parse_time(stamp)
    return seen_at if t is None else min(seen_at, t + 1.0) if seen_at >= t else t


def parse_time(text: Any) -> float | None:
    """RFC 3339 as the API writes it (`2024-05-01T10:00:00Z`) as a Unix time; None when unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    return t.timestamp()


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in _get(obj, "status", "conditions") or ():
        if isinstance(c, dict) and c.get("type") == kind:
            return c
    return None


def _container(obj: dict[str, Any], name: str, key: str = "containerStatuses") -> dict[str, Any]:
    for c in _get(obj, "status", key) or ():
        if isinstance(c, dict) and c.get("name") == name:
            return c
    return {}


def _ours(node_label: str):
    def keep(pod: dict[str, Any]) -> bool:
        labels = _get(pod, "metadata", "labels") or {}
        return labels.get(m.MANAGED_BY) == m.MANAGER and labels.get(m.NODE_LABEL) == node_label
    return keep


@dataclass
class KubernetesLauncher:
    api: k8s.ApiClient
    node: str
    settings: m.PodSettings = field(default_factory=m.PodSettings)
    stop_timeout_s: float = 300.0
    pending_timeout_s: float = 600.0
    node_grace_s: float = 40.0
    request_timeout_s: float = 10.0
    pods: dict[str, _Pod] = field(default_factory=dict)
    """Attempts watched, by job (at most one per job, as in `LocalLauncher`)."""
    ended: dict[str, list[_Pod]] = field(default_factory=dict)
    """Attempts whose end was reported, by job: their pods go at the next launch, `forget` or `kill`."""
    _pod_watch: Watcher | None = field(default=None, init=False, repr=False)
    _node_watch: Watcher | None = field(default=None, init=False, repr=False)
    _not_ready_seen: float | None = field(default=None, init=False)
    _lost_reported: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.v1 = k8s.CoreV1Api(self.api)

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    # --- the watches -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start watching the node's pods and the Node (idempotent; `poll` and `find` call it)."""
        if self._pod_watch is None:
            self._pod_watch = Watcher(self.v1.list_namespaced_pod, _ours(m.label_value(self.node)), "pods",
                                      namespace=self.namespace, label_selector=m.node_selector(self.node))
            self._pod_watch.start()
        if self._node_watch is None:
            self._node_watch = Watcher(self.v1.list_node, lambda n: _get(n, "metadata", "name") == self.node,
                                       "node", field_selector=f"metadata.name={self.node}")
            self._node_watch.start()

    def close(self) -> None:
        for w in (self._pod_watch, self._node_watch):
            if w is not None:
                w.stop()

    @property
    def pod_watch(self) -> Watcher:
        self.start()
        assert self._pod_watch is not None
        return self._pod_watch

    @property
    def node_watch(self) -> Watcher:
        self.start()
        assert self._node_watch is not None
        return self._node_watch

    def _timeout(self) -> tuple[float, float]:
        return (min(5.0, self.request_timeout_s), self.request_timeout_s)

    # --- launching -------------------------------------------------------------------------------
    def launch(self, a: Launch) -> None:
        job_id = a.job.job_id
        if job_id in self.pods:
            raise LaunchError(f"job {job_id} still has a pod here ({self.pods[job_id].name})")
        try:
            pod = m.pod_manifest(a, self.node, self.settings)
            service = m.service_manifest(a, self.node, self.settings)
        except (PlanError, ValueError) as exc:
            raise LaunchError(str(exc)) from None
        self.start()
        self._delete_ended(job_id)
        try:
            self.v1.read_node(self.node, _preload_content=False, _request_timeout=self._timeout())
        except ApiException as exc:
            if exc.status == 404:
                raise LaunchError(f"node {self.node} is not a node of the Kubernetes cluster") from None
            raise LaunchError(f"reading node {self.node}: {api_reason(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - unreachable API, timeout
            raise LaunchError(f"reading node {self.node}: {api_reason(exc)}") from None
        name = pod["metadata"]["name"]
        if service is not None:
            try:
                self.v1.create_namespaced_service(self.namespace, service, _preload_content=False,
                                                  _request_timeout=self._timeout())
            except ApiException as exc:
                if exc.status != 409:  # 409: made already (an agent restarted between the two creates)
                    raise LaunchError(f"creating service {service['metadata']['name']} in namespace "
                                      f"{self.namespace}: {api_reason(exc)}") from None
            except Exception as exc:  # noqa: BLE001
                raise LaunchError(f"creating service {service['metadata']['name']}: {api_reason(exc)}") from None
        try:
            self.v1.create_namespaced_pod(self.namespace, pod, _preload_content=False, _request_timeout=self._timeout())
        except ApiException as exc:
            if exc.status != 409 or not self._same_attempt(name, a):
                self._delete_service(service["metadata"]["name"] if service else None)
                raise LaunchError(f"creating pod {name} in namespace {self.namespace}: {api_reason(exc)}") from None
            log.info("pod %s of %s attempt %d exists already: adopted", name, job_id, a.attempt)
        except Exception as exc:  # noqa: BLE001
            self._delete_service(service["metadata"]["name"] if service else None)
            raise LaunchError(f"creating pod {name}: {api_reason(exc)}") from None
        self.pods[job_id] = _Pod(job_id, a.attempt, name, service["metadata"]["name"] if service else None,
                                 time.monotonic())

    def _same_attempt(self, name: str, a: Launch) -> bool:
        try:
            resp = self.v1.read_namespaced_pod(name, self.namespace, _preload_content=False,
                                               _request_timeout=self._timeout())
            ann = _get(json.loads(resp.data), "metadata", "annotations") or {}
        except Exception:  # noqa: BLE001 - cannot tell: not adopted
            return False
        return ann.get(m.JOB_ID_ANN) == a.job.job_id and ann.get(m.ATTEMPT_ANN) == str(a.attempt)

    def request_stop(self, job_id: str, attempt: int) -> None:
        """Ask for checkpoint-and-exit: the stop annotation (its time), seen by the trainer through the
        downward-API file."""
        p = self.pods.get(job_id)
        if p is None or p.attempt != attempt:
            return
        p.stop_asked_at = time.monotonic()
        body = {"metadata": {"annotations": {contract.STOP_ANNOTATION: f"{time.time():.3f}"}}}
        try:
            self.v1.patch_namespaced_pod(p.name, self.namespace, body, _preload_content=False,
                                         _request_timeout=self._timeout())
        except Exception as exc:  # noqa: BLE001 - the stop timeout deletes it all the same
            log.warning("asking pod %s to stop failed (%s); it is deleted after %.0f s", p.name, api_reason(exc),
                        self.stop_timeout_s)

    def kill(self, job_id: str) -> None:
        """Delete the job's pods on this node at once, and its Service."""
        p = self.pods.pop(job_id, None)
        records = ([p] if p else []) + self.ended.pop(job_id, [])
        names = {r.name for r in records} | set(self._job_pods(job_id))
        for name in sorted(names):
            self._delete_pod(name, grace=0)
        for svc in sorted({r.service for r in records if r.service}):
            self._delete_service(svc)

    def forget(self, job_id: str) -> None:
        """Delete the pods of the job's ended attempts and their Service (a live attempt stays)."""
        live = self.pods.get(job_id)
        records = self.ended.pop(job_id, [])
        names = ({r.name for r in records} | set(self._job_pods(job_id))) - ({live.name} if live else set())
        for name in sorted(names):
            self._delete_pod(name, grace=0)
        for svc in sorted({r.service for r in records if r.service} - ({live.service} if live else set())):
            self._delete_service(svc)

    def _delete_ended(self, job_id: str) -> None:
        records = self.ended.pop(job_id, [])
        for r in records:
            self._delete_pod(r.name, grace=0)
            if r.service:
                self._delete_service(r.service)

    def _job_pods(self, job_id: str) -> list[str]:
        """Names of the job's pods on this node that the watch knows of."""
        objects, _ = self.pod_watch.snapshot()
        return [name for name, pod in objects.items() if (_get(pod, "metadata", "annotations") or {}).get(
            m.JOB_ID_ANN) == job_id]

    def _delete_pod(self, name: str, grace: int) -> None:
        try:
            self.v1.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace, _preload_content=False,
                                          _request_timeout=self._timeout())
        except ApiException as exc:
            if exc.status != 404:
                log.warning("deleting pod %s failed: %s", name, api_reason(exc))
        except Exception as exc:  # noqa: BLE001 - logged; the next kill or forget tries again
            log.warning("deleting pod %s failed: %s", name, api_reason(exc))

    def _delete_service(self, name: str | None) -> None:
        if not name:
            return
        try:
            self.v1.delete_namespaced_service(name, self.namespace, _preload_content=False,
                                              _request_timeout=self._timeout())
        except ApiException as exc:
            if exc.status != 404:
                log.warning("deleting service %s failed: %s", name, api_reason(exc))
        except Exception as exc:  # noqa: BLE001
            log.warning("deleting service %s failed: %s", name, api_reason(exc))

    # --- watching --------------------------------------------------------------------------------
    def poll(self) -> list[Fact]:
        facts: list[Fact] = self._node_facts()
        objects, gone = self.pod_watch.snapshot()
        mono = time.monotonic()
        for job_id in sorted(self.pods):
            p = self.pods[job_id]
            try:
                facts += self._pod_facts(p, objects.get(p.name), gone.get(p.name), mono)
            except Exception:  # noqa: BLE001 - a pod object the launcher cannot read: next poll
                log.exception("reading pod %s failed", p.name)
        return facts

    def _pod_facts(self, p: _Pod, pod: dict[str, Any] | None, tomb: dict[str, Any] | None,
                   mono: float) -> list[Fact]:
        now = time.time()
        if pod is None and tomb is None:  # not seen yet (the watch lags the create), or the watch fails
            if mono - p.created_at > self.pending_timeout_s:
                return self._launch_failed(p, now, f"pod {p.name} not seen for {self.pending_timeout_s:g} s "
                                                   f"({self.pod_watch.error or 'no watch event'})")
            return []
        if pod is None:
            return self._ended(p, tomb or {}, now, vanished=True)
        facts: list[Fact] = []
        ready = _condition(pod, "Ready")
        if not p.first_iteration_seen and ready and ready.get("status") == "True":
            p.first_iteration_seen = True
            facts.append(FirstIteration(p.job_id, p.attempt, ready_time(ready.get("lastTransitionTime"), now)))
        phase = _get(pod, "status", "phase")
        if phase in ENDED:
            return facts + self._ended(p, pod, now)
        if p.stop_asked_at is not None and p.deleted_at is None and mono - p.stop_asked_at > self.stop_timeout_s:
            p.deleted_at, p.deleted_why = mono, (f"deleted by the agent: no checkpoint within "
                                                 f"{self.stop_timeout_s:g} s of the stop request")
            self._delete_pod(p.name, grace=self.settings.termination_grace_s)
            return facts
        if phase in (None, "Pending"):
            waiting = [(_get(c, "state", "waiting") or {}) for c in
                       (_container(pod, m.INIT, "initContainerStatuses"), _container(pod, m.TRAIN))]
            for w in waiting:
                if w.get("reason") in m.FATAL_WAITING:
                    return facts + self._launch_failed(p, now, f"{w['reason']}: {w.get('message') or ''}".strip(": "))
            if mono - p.created_at > self.pending_timeout_s:
                why = next((f"{w.get('reason')}: {w.get('message') or ''}".strip(": ") for w in waiting
                            if w.get("reason")), None)
                sched = _condition(pod, "PodScheduled")
                if why is None and sched and sched.get("status") != "True":
                    why = f"{sched.get('reason') or 'not scheduled'}: {sched.get('message') or ''}".strip(": ")
                facts += self._launch_failed(p, now, f"pod {p.name} pending for more than {self.pending_timeout_s:g} s"
                                                     + (f" ({why})" if why else ""))
        return facts

    def _launch_failed(self, p: _Pod, now: float, reason: str) -> list[Fact]:
        self._end(p)
        return [LaunchFailed(p.job_id, p.attempt, now, reason[:2000])]

    def _end(self, p: _Pod) -> None:
        self.pods.pop(p.job_id, None)
        self.ended.setdefault(p.job_id, []).append(p)

    def _ended(self, p: _Pod, pod: dict[str, Any], now: float, vanished: bool = False) -> list[Fact]:
        """The attempt's end: code and final status from the terminated container."""
        self._end(p)
        facts: list[Fact] = []
        main = _get(_container(pod, m.TRAIN), "state", "terminated") or {}
        init = _get(_container(pod, m.INIT, "initContainerStatuses"), "state", "terminated") or {}
        term, container = (main, m.TRAIN) if main or not init or init.get("exitCode") in (0, None) else (init, m.INIT)
        message = term.get("message") if isinstance(term.get("message"), str) else ""
        status = contract.parse_status(message)
        if not p.first_iteration_seen and status.get("first_iteration_at"):
            p.first_iteration_seen = True
            try:
                facts.append(FirstIteration(p.job_id, p.attempt, float(status["first_iteration_at"])))
            except (TypeError, ValueError):
                pass
        code = term.get("exitCode") if isinstance(term.get("exitCode"), int) else None
        state = status.get("state")
        tail, why = "", ""
        if vanished and not term:
            tail = why = p.deleted_why or f"pod {p.name} was deleted before it ended"
        elif state not in ("completed", "checkpointed") or code not in (0, None):
            tail = self._log_tail(p.name, container) if not vanished else ""
            if not tail:
                tail = message if message and not status else ""
            reason = " ".join(x for x in (_get(pod, "status", "reason"), _get(pod, "status", "message"),
                                          term.get("reason")) if isinstance(x, str) and x)
            if reason and reason not in tail:
                tail = f"{tail}\n[{reason}]" if tail else f"[{reason}]"
            if reason and not isinstance(term.get("exitCode"), int):
                why = f"pod {p.name} ended with no exit code: {reason}"
        try:
            iterations = int(status.get("iteration") or 0)
        except (TypeError, ValueError):
            iterations = 0
        ended_at = parse_time(term.get("finishedAt")) or now
        facts.append(Exited(p.job_id, p.attempt, ended_at, code, state, iterations, tail, why[:2000]))
        return facts

    def _log_tail(self, name: str, container: str) -> str:
        try:
            text = self.v1.read_namespaced_pod_log(name, self.namespace, container=container, tail_lines=LOG_TAIL_LINES,
                                                   _request_timeout=self._timeout())
        except Exception as exc:  # noqa: BLE001 - forbidden, gone, unreachable: the exit is reported without
            log.info("log of pod %s not read: %s", name, api_reason(exc))
            return ""
        return "\n".join(str(text).splitlines()[-LOG_TAIL_LINES:])

    def _node_facts(self) -> list[Fact]:
        """A NodeCondition when the Node has not been Ready for longer than the grace, and when it is
        Ready again after that."""
        w = self.node_watch
        if not w.synced.is_set():
            return []
        node, gone = w.get(self.node), self.node in w.snapshot()[1]
        now, mono = time.time(), time.monotonic()
        ready_cond = _condition(node, "Ready") if node else None
        ready = bool(ready_cond and ready_cond.get("status") == "True")
        if node is not None and ready:
            self._not_ready_seen = None
            if self._lost_reported:
                self._lost_reported = False
                return [NodeCondition(self.node, now, True, "Ready")]
            return []
        if node is None and not gone:
            return []  # never seen: the launch check reports an unknown node
        if self._not_ready_seen is None:
            self._not_ready_seen = mono
        since = parse_time(ready_cond.get("lastTransitionTime")) if ready_cond else None
        down_for = max(mono - self._not_ready_seen, now - since if since else 0.0)
        if self._lost_reported or down_for < self.node_grace_s:
            return []
        self._lost_reported = True
        if node is None:
            why = "the Node was deleted from the Kubernetes cluster"
        else:
            status = ready_cond.get("status", "Unknown") if ready_cond else "Unknown"
            detail = " ".join(str(ready_cond.get(k)) for k in ("reason", "message")
                              if ready_cond and ready_cond.get(k))
            why = f"Kubernetes reports the node not Ready ({status}) for {down_for:.0f} s" + (
                f": {detail}" if detail else "")
        return [NodeCondition(self.node, now, False, why)]

    # --- after a restart -------------------------------------------------------------------------
    def find(self) -> list[Found]:
        """The node's pods, read back from their annotations (the latest attempt per job); the live ones
        are watched from now on."""
        self.start()
        resp = self.v1.list_namespaced_pod(self.namespace, label_selector=m.node_selector(self.node),
                                           _preload_content=False, _request_timeout=self._timeout())
        doc = json.loads(resp.data)
        keep = _ours(m.label_value(self.node))
        latest: dict[str, tuple[int, dict[str, Any]]] = {}
        older: list[tuple[str, int, dict[str, Any]]] = []
        for pod in doc.get("items") or () if isinstance(doc, dict) else ():
            if not isinstance(pod, dict) or not keep(pod):
                continue
            ann = _get(pod, "metadata", "annotations") or {}
            try:
                job_id, attempt = str(ann[m.JOB_ID_ANN]), int(ann[m.ATTEMPT_ANN])
            except (KeyError, TypeError, ValueError):
                continue
            if job_id in latest and latest[job_id][0] >= attempt:
                older.append((job_id, attempt, pod))
                continue
            if job_id in latest:
                older.append((job_id, *latest[job_id]))
            latest[job_id] = (attempt, pod)
        found: list[Found] = []
        for job_id in sorted(latest):
            attempt, pod = latest[job_id]
            ann = _get(pod, "metadata", "annotations") or {}
            try:
                plan = build(Plan, json.loads(ann[m.PLAN_ANN]))
                allocation = tuple(build(NodeShare, s) for s in json.loads(ann[m.ALLOCATION_ANN]))
                devices = tuple(int(i) for i in json.loads(ann.get(m.DEVICES_ANN, "[]")))
                cores = tuple(int(i) for i in json.loads(ann.get(m.CORES_ANN, "[]")))
            except Exception:  # noqa: BLE001 - unreadable annotations: nothing can be said about it
                continue
            name = _get(pod, "metadata", "name")
            service = m.service_name(job_id, attempt) if _get(pod, "metadata", "labels", m.RANK_LABEL) == "0" and \
                len([s for s in allocation if s.gpus > 0]) > 1 else None
            alive = _get(pod, "status", "phase") in ALIVE or _get(pod, "status", "phase") is None
            term = _get(_container(pod, m.TRAIN), "state", "terminated") or {}
            status = contract.parse_status(term.get("message") if isinstance(term.get("message"), str) else None)
            ready = _condition(pod, "Ready")
            rec = _Pod(job_id, attempt, name, service, time.monotonic(),
                       first_iteration_seen=bool(ready and ready.get("status") == "True"))
            tail = ""
            if not alive and status.get("state") not in ("completed", "checkpointed"):
                tail = self._log_tail(name, m.TRAIN)
            try:
                iterations = int(status.get("iteration") or 0)
            except (TypeError, ValueError):
                iterations = 0
            found.append(Found(job_id, attempt, plan, allocation, devices, cores, alive, status.get("state"),
                               iterations, tail))
            if alive and job_id not in self.pods:
                self.pods[job_id] = rec
            elif not alive:
                self.ended.setdefault(job_id, []).append(rec)
        for job_id, attempt, pod in older:  # earlier attempts' pods: deleted with the job's next forget
            self.ended.setdefault(job_id, []).append(_Pod(job_id, attempt, _get(pod, "metadata", "name"), None,
                                                          time.monotonic()))
        return found
