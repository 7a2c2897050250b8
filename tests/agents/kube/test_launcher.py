"""The Kubernetes launcher against kmock's Kubernetes emulator (an in-memory API server on 127.0.0.1, reached
by the official client over HTTP; no real API server runs on these machines). The tests write pod status
as a kubelet would, and drive the agent core with the launcher (`helpers.Driver`, the shell's wiring), so
the lifecycle events are the real ones."""

from __future__ import annotations

import json
import time

import kubernetes
import pytest

from agents.contract import STOP_ANNOTATION
from agents.core import Exited, FirstIteration, NodeCondition
from agents.kube import manifests as m
from agents.kube.launcher import KubernetesLauncher
from agents.launcher import LaunchError
from controlplane.events.workload import Workload

from .emulator import node_object, now_iso
from .helpers import NS, WORKLOAD, Driver, Kubelet, decided, decision, launcher, registered, submitted, wait


def _make(server, launchers, node="n0", **kw) -> KubernetesLauncher:
    lau = launcher(server, node, **kw)
    launchers.append(lau)
    return lau


def _driver(server, launchers, node="n0", jobs=(("j1", WORKLOAD),), **kw) -> Driver:
    d = Driver(_make(server, launchers, node, **kw))
    d.core.capacity = d.core.capacity.__class__(node=node, gpus=8, cpus=96, mem_gb=1000.0)
    d.handle(registered("n0"), registered("n1"), *(submitted(j, w) for j, w in jobs))
    return d


def _pod_names(kubelet, job_id=None):
    return sorted(n for n, p in kubelet.pods().items()
                  if job_id is None or p["metadata"]["annotations"].get(m.JOB_ID_ANN) == job_id)


# --- launch ------------------------------------------------------------------------------------------

def test_launch_creates_the_pod_pinned_to_the_node_with_the_share_and_the_contract(server, launchers):
    d = _driver(server, launchers)
    d.handle(decided(decision()))
    assert d.subjects() == ["job.started.n0"] and not d.failed_launches
    kubelet = Kubelet(server)
    (name,) = _pod_names(kubelet)
    assert name == m.pod_name("j1", 1, 0) and len(name) <= 63
    pod = kubelet.pods()[name]
    spec = pod["spec"]
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] \
        == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0"]}]}]
    assert "nodeName" not in spec and spec["restartPolicy"] == "Never"
    (main,) = spec["containers"]
    want = {"nvidia.com/gpu": "2", "cpu": "8", "memory": "64G"}
    assert main["resources"] == {"requests": want, "limits": want}
    assert main["image"] == WORKLOAD.image
    assert main["command"][0] == "torchrun" and main["command"][-3:] == ["--no-python", "python", "train.py"]
    assert "--nproc-per-node=2" in main["command"] and main["args"] == ["--lr", "3e-4"]
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["RUBICK_JOB_ID"] == "j1" and env["RUBICK_ATTEMPT"] == "1" and env["HF_HOME"] == "/cache"
    assert env["RUBICK_PODINFO"] == "/etc/rubick/podinfo/annotations"
    assert env["RUBICK_CHECKPOINT_DIR"] == m.CHECKPOINT_MOUNT
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["checkpoint"]["persistentVolumeClaim"] == {"claimName": "gpt2-ckpt"}
    assert volumes["podinfo"]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.annotations"
    labels, ann = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels[m.MANAGED_BY] == "rubick" and labels[m.NODE_LABEL] == "n0" and labels[m.ATTEMPT_LABEL] == "1"
    assert ann[m.JOB_ID_ANN] == "j1" and json.loads(ann[m.ALLOCATION_ANN])[0]["node"] == "n0"
    assert spec["initContainers"][0]["image"] == "registry.example/rubick:1.0"


def test_multi_node_job_gets_a_rendezvous_service_from_its_first_node_only(server, launchers):
    shares = (("n0", 2), ("n1", 2))
    d0 = _driver(server, launchers, "n0")
    d1 = _driver(server, launchers, "n1")
    d0.handle(decided(decision(shares=shares)))
    d1.handle(decided(decision(shares=shares)))
    assert not d0.failed_launches and not d1.failed_launches
    v1 = kubernetes.client.CoreV1Api(server.api())
    services = json.loads(v1.list_namespaced_service(NS, _preload_content=False).data)["items"]
    (svc,) = services
    assert svc["metadata"]["name"] == m.service_name("j1", 1)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"][m.RANK_LABEL] == "0" and svc["spec"]["ports"][0]["port"] == 29400
    pods = Kubelet(server).pods()
    assert sorted(pods) == [m.pod_name("j1", 1, 0), m.pod_name("j1", 1, 1)]
    for rank, name in enumerate(sorted(pods)):
        cmd = pods[name]["spec"]["containers"][0]["command"]
        assert f"--rdzv-endpoint={svc['metadata']['name']}.{NS}.svc:29400" in cmd
        assert f"--node-rank={rank}" in cmd and "--nnodes=2" in cmd
        assert pods[name]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchFields"][0]["values"] == [f"n{rank}"]
    # killing the job takes the first node's service with its pod
    d0.launcher.kill("j1")
    assert json.loads(v1.list_namespaced_service(NS, _preload_content=False).data)["items"] == []


def test_reconfigure_asks_by_annotation_then_relaunches_a_new_attempt(server, launchers):
    d = _driver(server, launchers)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    first = m.pod_name("j1", 1, 0)
    kubelet.ready(first)
    d.until(lambda: d.launcher.pods["j1"].first_iteration_seen)
    d.handle(decided(decision(shares=(("n0", 4),)), t=10.0))
    pod = wait(lambda: (p := kubelet.pods()[first])["metadata"].get("annotations", {}).get(STOP_ANNOTATION) and p)
    assert float(pod["metadata"]["annotations"][STOP_ANNOTATION]) > 0
    kubelet.exit(first, 0, json.dumps({"state": "checkpointed", "iteration": 42, "attempt": 1}))
    second = m.pod_name("j1", 2, 0)
    d.until(lambda: second in kubelet.pods(), message="attempt 2 created")
    assert first not in kubelet.pods(), "the checkpointed pod is deleted before its successor runs"
    assert kubelet.pods()[second]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    kubelet.ready(second)
    d.until(lambda: "job.reconfigured.n0" in d.subjects())
    (rec,) = [e for e in d.events if e.subject == "job.reconfigured.n0"]
    assert rec.payload.allocation[0].gpus == 4 and rec.payload.restart_cost_s >= 0
    assert d.core.local["j1"].iterations == 42


def test_preemption_checkpoints_and_reports_iterations_then_cleans_up(server, launchers):
    d = _driver(server, launchers)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    d.handle(decided(decision(shares=()), t=5.0))
    wait(lambda: STOP_ANNOTATION in kubelet.pods()[name]["metadata"].get("annotations", {}))
    kubelet.exit(name, 0, json.dumps({"state": "checkpointed", "iteration": 7}))
    d.until(lambda: "job.preempted.n0" in d.subjects())
    (pre,) = [e for e in d.events if e.subject == "job.preempted.n0"]
    assert pre.payload.iterations_done == 7
    assert kubelet.pods() == {}, "forget deletes the ended pod"


def test_completed_pod_gives_job_completed(server, launchers):
    d = _driver(server, launchers)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    kubelet.exit(name, 0, json.dumps({"state": "completed", "iteration": 100, "first_iteration_at": time.time()}))
    d.until(lambda: "job.completed.n0" in d.subjects())
    assert [e.payload.iterations for e in d.events if e.subject == "job.completed.n0"] == [100]


def test_failed_pod_reports_exit_code_and_log_tail(server, launchers):
    d = _driver(server, launchers)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    server.set_log(name, "".join(f"line {i}\n" for i in range(100)) + "RuntimeError: CUDA out of memory\n")
    kubelet.exit(name, 1, "")
    d.until(lambda: "job.failed.n0" in d.subjects())
    (failed,) = [e for e in d.events if e.subject == "job.failed.n0"]
    assert failed.payload.exit_code == 1
    assert failed.payload.log_tail.endswith("RuntimeError: CUDA out of memory")
    assert len(failed.payload.log_tail.splitlines()) == 40
    assert "code 1" in failed.payload.reason
    assert kubelet.pods() == {}, "kill and forget delete the failed pod"


def test_failed_pod_whose_log_is_forbidden_still_fails_with_its_termination_message(server, launchers):
    d = _driver(server, launchers)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    server.fail("GET", r"/log$", 403, "Forbidden", "pods \"x\" is forbidden: cannot get resource \"pods/log\"")
    kubelet.exit(name, 137, "Traceback: killed")  # FallbackToLogsOnError: the log's end as the message
    d.until(lambda: "job.failed.n0" in d.subjects())
    (failed,) = [e for e in d.events if e.subject == "job.failed.n0"]
    assert failed.payload.exit_code == 137 and "Traceback: killed" in failed.payload.log_tail


def test_evicted_pod_fails_the_job_naming_the_eviction(server, launchers):
    d = _driver(server, launchers)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    kubelet.running(name)
    kubelet.status(name, {"phase": "Failed", "reason": "Evicted",
                          "message": "The node was low on resource: memory."})
    d.until(lambda: "job.failed.n0" in d.subjects())
    (failed,) = [e for e in d.events if e.subject == "job.failed.n0"]
    assert failed.payload.exit_code is None
    assert failed.payload.reason == f"pod {name} ended with no exit code: Evicted The node was low on resource: memory."


def test_pending_past_the_timeout_is_a_failed_launch(server, launchers):
    d = _driver(server, launchers, pending_timeout_s=0.3)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    kubelet.status(name, {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]})
    d.until(lambda: "job.failed.n0" in d.subjects(), timeout=5)
    (failed,) = [e for e in d.events if e.subject == "job.failed.n0"]
    assert "pending for more than 0.3 s" in failed.payload.reason
    assert "Insufficient nvidia.com/gpu" in failed.payload.reason
    assert kubelet.pods() == {}


def test_image_pull_backoff_fails_after_the_timeout_only(server, launchers):
    d = _driver(server, launchers, pending_timeout_s=0.5)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    kubelet.waiting(name, "ImagePullBackOff", "Back-off pulling image")
    time.sleep(0.2)
    d.watch()
    assert "job.failed.n0" not in d.subjects()
    d.until(lambda: "job.failed.n0" in d.subjects())
    assert "ImagePullBackOff" in [e for e in d.events if e.subject == "job.failed.n0"][0].payload.reason


@pytest.mark.parametrize("reason", ["InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"])
def test_waiting_reasons_nothing_cures_fail_the_launch_at_once(server, launchers, reason):
    d = _driver(server, launchers)  # pending timeout 600 s: only the reason can fail it
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    kubelet.waiting(m.pod_name("j1", 1, 0), reason, "bad")
    d.until(lambda: "job.failed.n0" in d.subjects(), timeout=3)
    assert reason in [e for e in d.events if e.subject == "job.failed.n0"][0].payload.reason


def test_workload_without_image_is_a_launch_error(server, launchers):
    d = _driver(server, launchers, jobs=(("j1", Workload(command=("python", "train.py"))),))
    d.handle(decided(decision()))
    (failed,) = [e for e in d.events if e.subject == "job.failed.n0"]
    assert "needs workload.image" in failed.payload.reason
    assert Kubelet(server).pods() == {}


def test_job_without_workload_runs_the_example_trainer_in_the_agents_image(server, launchers):
    d = _driver(server, launchers, jobs=(("j1", None),))
    d.handle(decided(decision()))
    (pod,) = Kubelet(server).pods().values()
    main = pod["spec"]["containers"][0]
    assert main["image"] == "registry.example/rubick:1.0"
    assert main["command"][-2:] == ["/opt/rubick/src/examples/trainer/train.py", "/var/run/rubick/run.json"]
    assert main["workingDir"] == "/opt/rubick/src"


def test_rbac_forbidden_is_a_launch_error_with_the_apis_reason(server, launchers):
    lau = _make(server, launchers)
    d = _driver(server, launchers)
    d.launcher = lau
    server.fail("POST", r"/namespaces/jobs/pods$", 403, "Forbidden",
                'pods is forbidden: User "system:serviceaccount:rubick:agent" cannot create resource "pods"')
    d.handle(decided(decision()))
    (reason,) = d.failed_launches
    assert "403 Forbidden" in reason and 'cannot create resource "pods"' in reason
    assert [e.subject for e in d.events] == ["job.failed.n0"]
    assert Kubelet(server).pods() == {}


@pytest.mark.parametrize("status,reason,message", [
    (422, "Invalid", 'Pod "x" is invalid: spec.containers[0].image: Required value'),
    (404, "NotFound", 'namespaces "jobs" not found'),
])
def test_other_api_refusals_are_launch_errors(server, launchers, status, reason, message):
    lau = _make(server, launchers)
    server.fail("POST", r"/pods$", status, reason, message)
    d = Driver(lau)
    d.handle(registered(), submitted())
    d.handle(decided(decision()))
    (text,) = d.failed_launches
    assert str(status) in text and message in text


def test_unknown_node_is_a_launch_error_naming_it(server, launchers):
    d = _driver(server, launchers, node="gpu-9")
    d.core.nodes.add("gpu-9")
    d.handle(decided(decision(shares=(("gpu-9", 2),))))
    (reason,) = d.failed_launches
    assert "gpu-9" in reason and "not a node" in reason
    assert Kubelet(server).pods() == {}


def test_node_not_ready_past_the_grace_reports_node_lost_once(server, launchers):
    v1 = kubernetes.client.CoreV1Api(server.api())
    d = _driver(server, launchers, node_grace_s=0.3)
    d.watch()
    v1.patch_node_status("n0", {"status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
         "message": "Kubelet stopped posting node status.", "lastTransitionTime": now_iso()}]}},
        _preload_content=False)
    d.until(lambda: "node.lost.n0" in d.subjects(), timeout=5)
    for _ in range(10):
        d.watch()
        time.sleep(0.05)
    lost = [e for e in d.events if e.subject == "node.lost.n0"]
    assert len(lost) == 1 and lost[0].payload.node == "n0" and "Kubelet stopped posting" in lost[0].payload.reason
    # ready again, then lost again: reported again
    v1.patch_node_status("n0", {"status": {"conditions": [{"type": "Ready", "status": "True",
                                                           "lastTransitionTime": now_iso()}]}}, _preload_content=False)
    d.until(lambda: not d.core.node_lost)
    v1.patch_node_status("n0", {"status": {"conditions": [{"type": "Ready", "status": "False",
                                                           "lastTransitionTime": now_iso()}]}}, _preload_content=False)
    d.until(lambda: len([e for e in d.events if e.subject == "node.lost.n0"]) == 2)


def test_node_not_ready_long_before_the_agent_started_is_reported_at_once(server, launchers):
    v1 = kubernetes.client.CoreV1Api(server.api())
    v1.create_node(node_object("n2", ready="False", since=now_iso(-600)), _preload_content=False)
    lau = _make(server, launchers, "n2")
    facts = wait(lambda: [f for f in lau.poll() if isinstance(f, NodeCondition)], timeout=5)
    assert facts[0].ready is False and "not Ready (False)" in facts[0].reason


def test_agent_restart_adopts_running_pods_and_never_launches_a_second_copy(server, launchers):
    d = _driver(server, launchers)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    kubelet.ready(name)
    d.until(lambda: d.launcher.pods["j1"].first_iteration_seen)
    d.launcher.close()
    # a new agent: replays the stream (facts only), finds the pod, reconciles
    d2 = Driver(_make(server, launchers))
    d2.core.restoring = True
    for e in (registered("n0"), registered("n1"), submitted(), decided(decision())):
        d2.core.handle(e)
    found = d2.launcher.find()
    assert [(f.job_id, f.attempt, f.alive) for f in found] == [("j1", 1, True)]
    assert found[0].allocation == decision().allocation
    d2.events += d2.core.reconcile(found, time.time())
    d2.act()
    assert d2.failed_launches == [] and d2.subjects() == []
    assert _pod_names(kubelet) == [name], "no second pod"
    # the same attempt launched again (a record lost between create and restart): adopted, not doubled
    lau3 = _make(server, launchers)
    from agents.core import Launch
    lj = d2.core.local["j1"]
    lau3.launch(Launch(lj.job, lj.plan, lj.allocation, lj.share, 1, (0, 1), ()))
    assert _pod_names(kubelet) == [name]
    # the adopted pod is watched: its end is reported
    kubelet.exit(name, 0, json.dumps({"state": "completed", "iteration": 100}))
    d2.until(lambda: "job.completed.n0" in d2.subjects())
    assert not any(isinstance(f, FirstIteration) for f in d2.launcher.poll())


def test_find_reports_an_ended_pod_with_its_state(server, launchers):
    d = _driver(server, launchers)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    kubelet.exit(name, 0, json.dumps({"state": "checkpointed", "iteration": 9}))
    d.launcher.close()
    lau = _make(server, launchers)
    (f,) = lau.find()
    assert (f.alive, f.state, f.iterations) == (False, "checkpointed", 9)
    lau.forget("j1")
    assert kubelet.pods() == {}


def test_pod_deleted_by_someone_else_is_an_exit_with_nothing_known(server, launchers):
    d = _driver(server, launchers)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    wait(lambda: d.launcher.pod_watch.get(name))
    kubernetes.client.CoreV1Api(server.api()).delete_namespaced_pod(name, NS, _preload_content=False)
    facts = wait(lambda: [f for f in d.launcher.poll() if isinstance(f, Exited)])
    assert (facts[0].exit_code, facts[0].state) == (None, None)
    assert "deleted" in facts[0].log_tail


def test_stop_timeout_deletes_the_pod_and_its_end_is_no_checkpoint(server, launchers):
    d = _driver(server, launchers, stop_timeout_s=0.2)
    kubelet = Kubelet(server)
    d.handle(decided(decision()))
    name = m.pod_name("j1", 1, 0)
    kubelet.ready(name)
    d.handle(decided(decision(shares=()), t=5.0))
    d.until(lambda: "job.failed.n0" in d.subjects(), timeout=5)
    (failed,) = [e for e in d.events if e.subject == "job.failed.n0"]
    assert "no checkpoint within 0.2 s" in failed.payload.log_tail
    assert kubelet.pods() == {}


def test_first_iteration_time_is_the_ready_conditions_transition(server, launchers):
    lau = _make(server, launchers)
    d = Driver(lau)
    d.handle(registered(), submitted(), decided(decision()))
    Kubelet(server).ready(m.pod_name("j1", 1, 0), at="2030-01-01T00:00:00Z")
    facts = wait(lambda: [f for f in lau.poll() if isinstance(f, FirstIteration)])
    assert facts[0].time == 1893456000.0


def test_launching_a_job_that_still_has_a_pod_is_refused(server, launchers):
    lau = _make(server, launchers)
    d = Driver(lau)
    d.handle(registered(), submitted(), decided(decision()))
    from agents.core import Launch
    lj = d.core.local["j1"]
    with pytest.raises(LaunchError, match="still has a pod"):
        lau.launch(Launch(lj.job, lj.plan, lj.allocation, lj.share, 2, (0, 1), ()))


def test_bad_objects_and_api_failures_never_crash_the_launcher(server, launchers):
    lau = _make(server, launchers)
    d = Driver(lau)
    d.handle(registered(), submitted(), decided(decision()))
    name = m.pod_name("j1", 1, 0)
    kubelet = Kubelet(server)
    v1 = kubernetes.client.CoreV1Api(server.api())
    # an unrelated pod, a pod with our labels and garbage annotations, a garbage status
    spec = {"containers": [{"name": "c", "image": "x"}]}
    v1.create_namespaced_pod(NS, {"metadata": {"name": "other"}, "spec": spec}, _preload_content=False)
    v1.create_namespaced_pod(NS, {"metadata": {"name": "junk", "labels": m.node_labels("n0"),
                                               "annotations": {m.JOB_ID_ANN: "j9", m.ATTEMPT_ANN: "x"}},
                                  "spec": spec}, _preload_content=False)
    kubelet.status(name, {"phase": "Running", "conditions": "nonsense", "containerStatuses": [7, None]})
    for _ in range(5):
        d.watch()
        time.sleep(0.02)
    assert "j9" not in [f.job_id for f in _make(server, launchers).find()]
    # the API refusing everything: poll goes on from memory, stop and kill log and go on
    server.fail("PATCH", r".", 500, "InternalError", "etcd down")
    server.fail("DELETE", r".", 500, "InternalError", "etcd down")
    lau.request_stop("j1", 1)
    lau.kill("j1")
    lau.poll()
    server.heal()
    assert lau.pod_watch.error is None, "one unreadable pod does not stop the watch"
    kubelet.exit(name, 3, "{not json")
    lau.poll()
    assert "other" in kubelet.pods()
