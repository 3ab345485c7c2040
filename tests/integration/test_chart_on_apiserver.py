"""The Helm chart against the real API server of the local control plane.

- ``helm template`` output is created for real (``kubectl create``, no dry
  run) with default values and with ``watchNamespaces``, in namespaces that
  enforce *and* warn on Pod Security "restricted";
- the controller's pod template is admitted as a real Pod there (the API server
  has no Deployment controller, so nothing else would create one);
- the chart's RBAC is checked with the real authorizer, both by access reviews
  and by requests made with a TokenRequest token of the chart's ServiceAccount;
- ``helm install`` with default values succeeds, and ``helm uninstall`` takes
  the leader-election Lease along (the controller creates it, owned by its
  ServiceAccount, which Helm deletes);
- ``hostNetwork``: off by default; on, the pods share the node's network, each
  replica binds to its node's address (``BIND_ADDRESS`` from ``status.podIP``),
  the API server gives the ports hostPorts, and Pod Security "restricted"
  refuses the pod;
- the ``helm test`` hook Pod runs ``python -m controller check`` with the
  controller's image, ServiceAccount, security context and settings (it is
  also among the objects created in the restricted namespace above; the check
  itself runs in tests/integration/test_selfcheck.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.settings import load_settings
from hack.cluster import LocalCluster
from kubeclient.client import KubeClient
from kubeclient.leaderelection import LeaderElector
from tests.chart import (
    CHART_DIR,
    CONTROLLER_SERVICE_ACCOUNT,
    RELEASE,
    RUNNER_SERVICE_ACCOUNT,
    HelmError,
    Obj,
    delete_cluster_scoped,
    find,
    helm,
    one,
    parse,
    render,
    render_text,
    service_account_kubeconfig,
    service_account_user,
    to_yaml,
)
from tests.kubehelpers import eventually, namespace_objects

# The first test of a run may build helm from source (minutes on a cold machine:
# hack/helm/build.sh); later ones reuse the cached binary.
pytestmark = pytest.mark.timeout(900)

PSA_WARN = {
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/warn-version": "latest",
}


def warn_restricted(cluster: LocalCluster, namespace: str) -> None:
    """Deployments are only *warned* about by Pod Security; turn warnings on."""
    cluster.kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in PSA_WARN.items()))


@pytest.fixture
def watched(cluster: LocalCluster) -> Iterator[list[str]]:
    """Two more namespaces enforcing and warning on Pod Security "restricted"."""
    names = [f"chart-watched-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    for name in names:
        cluster.kubectl("create", "namespace", name)
        cluster.kubectl(
            "label",
            "namespace",
            name,
            "ksc-test=true",
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        )
        warn_restricted(cluster, name)
    try:
        yield names
    finally:
        for name in names:
            cluster.kubectl("delete", "namespace", name, "--wait=false")


def create_rendered(cluster: LocalCluster, manifest: str) -> tuple[list[Obj], str]:
    """Create every object of a ``helm template`` output (CRDs included); return them and stderr.

    The CRDs are shared by the whole test run, so they are applied (idempotent,
    server-side); everything else is created, which fails on any conflict.
    """
    objects = parse(manifest)
    crds = find(objects, "CustomResourceDefinition")
    rest = [o for o in objects if o["kind"] != "CustomResourceDefinition"]
    assert len(crds) == 2
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=to_yaml(crds))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd", *(c["metadata"]["name"] for c in crds)
    )
    done = cluster.kubectl("create", "-f", "-", input=to_yaml(rest))
    return rest, done.stderr


def assert_exists(cluster: LocalCluster, objects: list[Obj]) -> None:
    for obj in objects:
        group = obj["apiVersion"].rpartition("/")[0]
        kind = obj["kind"].lower()
        args = ["get", f"{kind}.{group}" if group else kind, obj["metadata"]["name"]]
        if "namespace" in obj["metadata"]:
            args += ["-n", obj["metadata"]["namespace"]]
        cluster.kubectl(*args, "-o", "name")


def pod_from_template(deployment: Obj, name: str) -> Obj:
    template = deployment["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": deployment["metadata"]["namespace"],
            "labels": {"ksc-test": "chart-pod"},
        },
        "spec": template["spec"],
    }


def pod_spec(deployment: Obj) -> Obj:
    return dict(deployment["spec"]["template"]["spec"])


def the_container(spec: Obj) -> Obj:
    (container,) = spec["containers"]
    return dict(container)


def env_of(container: Obj) -> dict[str, Obj]:
    return {entry["name"]: entry for entry in container.get("env") or []}


def selfcheck_pod(objects: list[Obj]) -> Obj:
    """The one ``helm test`` hook of the chart."""
    (pod,) = [
        obj
        for obj in find(objects, "Pod")
        if (obj["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"
    ]
    return pod


def settings_data(objects: list[Obj]) -> dict[str, str]:
    return dict(one(objects, "ConfigMap", f"{RELEASE}-settings")["data"])


def can_i(cluster: LocalCluster, who: str, *args: str) -> bool:
    done = cluster.kubectl("auth", "can-i", *args, f"--as={who}", check=False)
    answer = done.stdout.strip()
    assert answer in ("yes", "no"), done.stdout + done.stderr
    return answer == "yes"


async def test_default_values_create_in_a_restricted_namespace(
    cluster: LocalCluster, restricted_namespace: str
) -> None:
    release_ns = restricted_namespace
    warn_restricted(cluster, release_ns)
    manifest = render_text(namespace=release_ns)
    objects, stderr = create_rendered(cluster, manifest)
    try:
        assert "would violate PodSecurity" not in stderr, stderr
        assert "Warning" not in stderr, stderr
        # Everything exists, the helm test hook Pod included: "restricted" admits it too.
        assert selfcheck_pod(objects)["metadata"]["namespace"] == release_ns
        assert_exists(cluster, objects)

        # Enforcement is real here: a root pod is refused...
        deployment = one(objects, "Deployment")
        root = pod_from_template(deployment, "root-pod")
        root["spec"] = {**root["spec"], "securityContext": {"runAsUser": 0}}
        refused = cluster.kubectl("create", "-f", "-", input=json.dumps(root), check=False)
        assert refused.returncode != 0
        assert "violates PodSecurity" in refused.stderr
        # ...and the controller's pod template is admitted as a real Pod.
        pod = pod_from_template(deployment, "controller-pod")
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
        cluster.kubectl("delete", "pod", "controller-pod", "-n", release_ns, "--wait=false")

        # All namespaces: the controller may read runs everywhere, but no Secret.
        controller = service_account_user(release_ns, CONTROLLER_SERVICE_ACCOUNT)
        assert can_i(cluster, controller, "watch", "inferenceruns.ai.krateo.io", "--all-namespaces")
        assert can_i(cluster, controller, "create", "jobs.batch", "-n", "default")
        assert can_i(cluster, controller, "get", "pods", "--subresource=log", "-n", "default")
        assert not can_i(cluster, controller, "get", "secrets", "-n", release_ns)
        assert not can_i(cluster, controller, "list", "secrets", "--all-namespaces")
        assert not can_i(
            cluster, controller, "create", "inferenceruns.ai.krateo.io", "-n", "default"
        )
        runner = service_account_user(release_ns, RUNNER_SERVICE_ACCOUNT)
        assert can_i(cluster, runner, "get", "secrets", "-n", release_ns)
        assert not can_i(cluster, runner, "list", "secrets", "-n", release_ns)
        assert not can_i(cluster, runner, "watch", "secrets", "-n", release_ns)
    finally:
        delete_cluster_scoped(cluster, objects)


async def test_watch_namespaces_create_and_grant_only_those_namespaces(
    cluster: LocalCluster, restricted_namespace: str, watched: list[str], tmp_path: Path
) -> None:
    release_ns = restricted_namespace
    warn_restricted(cluster, release_ns)
    values: dict[str, Any] = {"watchNamespaces": watched}
    manifest = render_text(values, namespace=release_ns)
    objects, stderr = create_rendered(cluster, manifest)
    try:
        assert "Warning" not in stderr, stderr
        # No cluster-wide access for the controller (the roles for people,
        # aggregated into edit/view, are ClusterRoles by nature).
        assert not [
            r
            for r in find(objects, "ClusterRole")
            if r["metadata"]["labels"].get("app.kubernetes.io/component") != "user-roles"
        ]
        assert not find(objects, "ClusterRoleBinding")
        assert_exists(cluster, objects)

        # Requests made with a TokenRequest token of the chart's ServiceAccount.
        kubeconfig = service_account_kubeconfig(
            cluster, release_ns, CONTROLLER_SERVICE_ACCOUNT, path=tmp_path / "controller"
        )

        def as_controller(*args: str) -> Any:
            return cluster.kubectl(f"--kubeconfig={kubeconfig}", *args, check=False)

        for namespace in watched:
            allowed = as_controller("get", "inferenceruns.ai.krateo.io", "-n", namespace)
            assert allowed.returncode == 0, allowed.stderr
        for namespace in (release_ns, "default"):
            denied = as_controller("get", "inferenceruns.ai.krateo.io", "-n", namespace)
            assert denied.returncode != 0
            assert "forbidden" in denied.stderr.lower()
        secrets = as_controller("get", "secrets", "-n", watched[0])
        assert "forbidden" in secrets.stderr.lower()
        everywhere = as_controller("get", "inferenceruns.ai.krateo.io", "--all-namespaces")
        assert "forbidden" in everywhere.stderr.lower()

        # Leader election: create any Lease, but read and renew only the chart's.
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": RELEASE, "namespace": release_ns},
            "spec": {"holderIdentity": "test", "leaseDurationSeconds": 15},
        }
        created = cluster.kubectl(
            f"--kubeconfig={kubeconfig}", "create", "-f", "-", input=json.dumps(lease)
        )
        assert created.returncode == 0
        assert as_controller("get", "lease", RELEASE, "-n", release_ns).returncode == 0
        other = service_account_user(release_ns, CONTROLLER_SERVICE_ACCOUNT)
        assert not can_i(cluster, other, "get", "leases/someone-else", "-n", release_ns)
        assert not can_i(cluster, other, "create", "leases", "-n", watched[0])
        # The Lease's owner: its own ServiceAccount, read by name only.
        own = as_controller("get", "serviceaccount", CONTROLLER_SERVICE_ACCOUNT, "-n", release_ns)
        assert own.returncode == 0, own.stderr
        assert not can_i(cluster, other, "get", "serviceaccounts/default", "-n", release_ns)
        assert not can_i(cluster, other, "list", "serviceaccounts", "-n", release_ns)

        # Runners: one identity per watched namespace, each reading its own Secrets only.
        for namespace in watched:
            runner = service_account_user(namespace, RUNNER_SERVICE_ACCOUNT)
            assert can_i(cluster, runner, "get", "secrets", "-n", namespace)
            assert not can_i(cluster, runner, "list", "secrets", "-n", namespace)
            others = [n for n in (*watched, release_ns) if n != namespace]
            for other_ns in others:
                assert not can_i(cluster, runner, "get", "secrets", "-n", other_ns)
    finally:
        delete_cluster_scoped(cluster, objects)


async def test_helm_install_with_default_values(
    cluster: LocalCluster, restricted_namespace: str, tmp_path: Path
) -> None:
    release_ns = restricted_namespace
    installed = helm(
        "install",
        RELEASE,
        str(CHART_DIR),
        "--namespace",
        release_ns,
        # The run's shared CRDs were applied without Helm: a release may not take them over.
        "--set",
        "crds.install=false",
        kubeconfig=cluster.kubeconfig,
    )
    try:
        assert "STATUS: deployed" in installed.stdout, installed.stdout
        status = json.loads(
            helm(
                "status", RELEASE, "-n", release_ns, "-o", "json", kubeconfig=cluster.kubeconfig
            ).stdout
        )
        assert status["info"]["status"] == "deployed"
        cluster.kubectl("get", "deployment", RELEASE, "-n", release_ns)
        cluster.kubectl("get", "crd", "inferenceruns.ai.krateo.io", "inferenceconfigs.ai.krateo.io")
        settings = json.loads(
            cluster.kubectl(
                "get", "configmap", f"{RELEASE}-settings", "-n", release_ns, "-o", "json"
            ).stdout
        )
        assert settings["data"]["WATCH_NAMESPACE"] == ""
        assert settings["data"]["LEADER_ELECT"] == "true"

        # No kubelet runs the pods here: elect as the controller would, with
        # its token and the settings its pod gets, so that the Lease exists.
        pod_env = {
            **settings["data"],
            "POD_NAMESPACE": release_ns,
            "POD_SERVICE_ACCOUNT": CONTROLLER_SERVICE_ACCOUNT,  # spec.serviceAccountName
            "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        }
        pod_settings = load_settings([], pod_env, namespace_file=Path("/nonexistent"))
        assert pod_settings.lease_namespace == release_ns
        assert pod_settings.lease_owner == CONTROLLER_SERVICE_ACCOUNT
        token = service_account_kubeconfig(cluster, release_ns, path=tmp_path / "controller")
        async with await KubeClient.connect(kubeconfig=str(token)) as kube:
            elector = LeaderElector(
                kube,
                name=pod_settings.lease_name,
                namespace=release_ns,
                identity="pod-0",
                owner_service_account=pod_settings.lease_owner,
            )
            assert await elector.try_acquire_or_renew()
            assert await elector.release()
        lease = json.loads(
            cluster.kubectl("get", "lease", RELEASE, "-n", release_ns, "-o", "json").stdout
        )
        (owner,) = lease["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("ServiceAccount", CONTROLLER_SERVICE_ACCOUNT)
    finally:
        helm("uninstall", RELEASE, "-n", release_ns, kubeconfig=cluster.kubeconfig)
    # Uninstall removes the cluster-wide RBAC too.
    gone = cluster.kubectl("get", "clusterrole", f"{RELEASE}-{release_ns}", check=False)
    assert "NotFound" in gone.stderr

    # And the Lease, which Helm never knew: the collector follows its owner.
    async def lease_gone() -> bool:
        leftover = cluster.kubectl("get", "lease", RELEASE, "-n", release_ns, check=False)
        return "NotFound" in leftover.stderr

    await eventually(lease_gone, within=60, what="the Lease to go with the release")


# ----------------------------------------------------------------------------- Lease owner

LEASE_OWNER_RULE = {
    "apiGroups": [""],
    "resources": ["serviceaccounts"],
    "resourceNames": [CONTROLLER_SERVICE_ACCOUNT],
    "verbs": ["get"],
}


def reads_service_accounts(rule: Obj) -> bool:
    return "" in rule.get("apiGroups", []) and "serviceaccounts" in rule.get("resources", [])


async def test_with_election_the_controller_may_read_its_own_service_account() -> None:
    objects = render(namespace="ksc-system")
    controller = the_container(pod_spec(one(objects, "Deployment")))
    assert env_of(controller)["POD_SERVICE_ACCOUNT"] == {
        "name": "POD_SERVICE_ACCOUNT",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}},
    }
    role = one(objects, "Role", f"{RELEASE}-leader-election", "ksc-system")
    assert [rule for rule in role["rules"] if reads_service_accounts(rule)] == [LEASE_OWNER_RULE]
    # Nowhere else: no other Role or ClusterRole of the controller reads ServiceAccounts.
    for kind in ("Role", "ClusterRole"):
        for obj in find(objects, kind):
            if obj is not role:
                assert not any(reads_service_accounts(r) for r in obj["rules"]), obj

    # An account the chart does not create is the one named, in the rule too.
    custom = render(
        {"serviceAccount": {"create": False, "name": "platform-controller"}},
        namespace="ksc-system",
    )
    assert not find(custom, "ServiceAccount", "platform-controller")
    assert pod_spec(one(custom, "Deployment"))["serviceAccountName"] == "platform-controller"
    role = one(custom, "Role", f"{RELEASE}-leader-election", "ksc-system")
    (rule,) = [rule for rule in role["rules"] if reads_service_accounts(rule)]
    assert rule["resourceNames"] == ["platform-controller"]


async def test_without_election_nothing_reads_a_service_account() -> None:
    objects = render({"replicaCount": 1, "leaderElection": {"enabled": False}})
    assert not find(objects, "Role", f"{RELEASE}-leader-election")
    for kind in ("Role", "ClusterRole"):
        for obj in find(objects, kind):
            assert not any(reads_service_accounts(r) for r in obj["rules"]), obj


async def test_extra_env_cannot_name_another_lease_owner() -> None:
    with pytest.raises(HelmError, match=r"extraEnv\.POD_SERVICE_ACCOUNT is set by the chart"):
        render({"extraEnv": {"POD_SERVICE_ACCOUNT": "someone-else"}})


# ----------------------------------------------------------------------------- hostNetwork


async def test_without_host_network_the_pods_use_the_pod_network() -> None:
    objects = render()
    for spec in (pod_spec(one(objects, "Deployment")), selfcheck_pod(objects)["spec"]):
        assert "hostNetwork" not in spec
        assert "dnsPolicy" not in spec
    assert "strategy" not in one(objects, "Deployment")["spec"]  # the default rolling update
    controller = the_container(pod_spec(one(objects, "Deployment")))
    assert set(env_of(controller)) == {"POD_NAME", "POD_NAMESPACE", "POD_SERVICE_ACCOUNT"}
    # BIND_ADDRESS keeps its default (0.0.0.0): the pod has its own address.
    assert "BIND_ADDRESS" not in settings_data(objects)


async def test_host_network_binds_each_replica_to_its_node_address(
    cluster: LocalCluster, namespace: str, restricted_namespace: str
) -> None:
    objects = render({"hostNetwork": True}, namespace=namespace)
    deployment = one(objects, "Deployment")
    spec = pod_spec(deployment)
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    hook = selfcheck_pod(objects)["spec"]
    assert (hook["hostNetwork"], hook["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    # No surge pod: with one replica per node it would wait for a free node forever.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    controller = the_container(spec)
    assert env_of(controller)["BIND_ADDRESS"] == {
        "name": "BIND_ADDRESS",
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
    }
    # An explicit env wins over envFrom: the ConfigMap must not pretend otherwise.
    data = settings_data(objects)
    assert "BIND_ADDRESS" not in data
    # On the node whose InternalIP is 127.0.0.2, status.podIP is that address.
    pod_env = {
        **data,
        "POD_NAMESPACE": namespace,
        "BIND_ADDRESS": "127.0.0.2",
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
    }
    settings = load_settings([], pod_env, namespace_file=Path("/nonexistent"))
    assert settings.bind_address == "127.0.0.2"
    assert (settings.metrics_port, settings.health_port) == (8080, 8081)

    # The real API server admits it where host networking is allowed, and makes
    # every container port a host port: what the scheduler keeps apart.
    for ns in (namespace, restricted_namespace):
        cluster.kubectl("create", "serviceaccount", CONTROLLER_SERVICE_ACCOUNT, "-n", ns)
    pod = pod_from_template(deployment, "host-network-pod")
    admitted = json.loads(
        cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod)
        ).stdout
    )
    assert admitted["spec"]["hostNetwork"] is True
    ports = the_container(admitted["spec"])["ports"]
    assert {p["name"]: (p["containerPort"], p.get("hostPort")) for p in ports} == {
        "http-metrics": (8080, 8080),
        "health": (8081, 8081),
    }
    # Pod Security "restricted" (and "baseline") forbid host networking.
    pod["metadata"]["namespace"] = restricted_namespace
    refused = cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
    )
    assert refused.returncode != 0
    assert "violates PodSecurity" in refused.stderr
    assert "hostNetwork=true" in refused.stderr


async def test_host_network_refuses_a_bind_address_from_extra_env() -> None:
    with pytest.raises(HelmError, match=r"extraEnv\.BIND_ADDRESS has no effect with hostNetwork"):
        render({"hostNetwork": True, "extraEnv": {"BIND_ADDRESS": "0.0.0.0"}})
    # Without hostNetwork it is an ordinary setting.
    objects = render({"extraEnv": {"BIND_ADDRESS": "127.0.0.1"}})
    assert settings_data(objects)["BIND_ADDRESS"] == "127.0.0.1"


async def test_host_network_is_a_boolean() -> None:
    with pytest.raises(HelmError, match="hostNetwork"):
        render({"hostNetwork": "yes"})


# ----------------------------------------------------------------------------- helm test


async def test_the_helm_test_hook_runs_the_self_check_as_the_controller() -> None:
    values: dict[str, Any] = {
        "image": {"repository": "registry.example/ksc", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry-credentials"}],
    }
    objects = render(values, namespace="ksc-system")
    pod = selfcheck_pod(objects)
    assert pod["metadata"]["annotations"] == {
        "helm.sh/hook": "test",
        "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded,hook-failed",
        "helm.sh/hook-output-log-policy": "hook-failed",
    }
    assert pod["metadata"]["name"] == f"{RELEASE}-selfcheck"
    assert pod["metadata"]["namespace"] == "ksc-system"
    # Not a controller pod: neither the metrics Service nor the PDB selects it.
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "selfcheck"
    for kind in ("Service", "PodDisruptionBudget"):
        selector = one(objects, kind)["spec"]["selector"]
        assert not (selector.get("matchLabels", selector).items() <= labels.items()), kind

    controller_spec = pod_spec(one(objects, "Deployment"))
    controller = the_container(controller_spec)
    spec = pod["spec"]
    check = the_container(spec)
    assert spec["restartPolicy"] == "Never"
    assert spec["serviceAccountName"] == CONTROLLER_SERVICE_ACCOUNT
    assert spec["serviceAccountName"] == controller_spec["serviceAccountName"]
    assert spec["automountServiceAccountToken"] is True
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert check["image"] == controller["image"] == "registry.example/ksc:1.2.3"
    assert check["imagePullPolicy"] == controller["imagePullPolicy"] == "Always"
    assert check["command"] == ["python", "-m", "controller", "check"]
    assert "args" not in check

    # The chart's restricted security context, a read-only root and a scratch /tmp.
    assert spec["securityContext"] == controller_spec["securityContext"]
    assert check["securityContext"] == controller["securityContext"]
    assert check["securityContext"]["readOnlyRootFilesystem"] is True
    assert check["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert check["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    (volume,) = spec["volumes"]
    assert volume["name"] == "tmp"
    assert "emptyDir" in volume
    assert check["resources"]["requests"]["cpu"] == "50m"
    assert check["resources"]["limits"]["memory"] == "256Mi"

    # The controller's settings, so it checks what the controller would use.
    assert check["envFrom"] == controller["envFrom"]
    assert check["envFrom"] == [{"configMapRef": {"name": f"{RELEASE}-settings"}}]
    assert env_of(check) == {
        "POD_NAMESPACE": {
            "name": "POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        }
    }
    pod_env = {
        **settings_data(objects),
        "POD_NAMESPACE": "ksc-system",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    }
    settings = load_settings([], pod_env, namespace_file=Path("/nonexistent"))
    assert settings.in_cluster
    assert settings.leader_election
    assert (settings.lease_namespace, settings.lease_name) == ("ksc-system", RELEASE)
    assert settings.watch_namespaces == ()


async def test_helm_test_leaves_no_pod_and_helm_uninstall_leaves_nothing(
    cluster: LocalCluster, namespace: str
) -> None:
    helm(
        "install", RELEASE, str(CHART_DIR), "--namespace", namespace,
        "--set", "crds.install=false",  # the run's shared CRDs were applied without Helm
        kubeconfig=cluster.kubeconfig,
    )  # fmt: skip
    try:
        # The node agent cannot run the controller image's check (it has no such image),
        # so the hook pod fails here: the path where a pod used to be left behind. The
        # passing path runs on real nodes (tests/node/test_chart_on_nodes.py).
        tested = helm(
            "test", RELEASE, "-n", namespace, "--logs", "--timeout", "3m",
            check=False, kubeconfig=cluster.kubeconfig, timeout=400,
        )  # fmt: skip
        assert tested.returncode != 0, tested.stdout
        assert f"{RELEASE}-selfcheck" in tested.stdout + tested.stderr, tested
        hooks = cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=selfcheck",
            "-o", "name",
        ).stdout  # fmt: skip
        assert hooks.strip() == "", f"the helm test pod was left behind: {hooks}"
        assert namespace_objects(cluster, namespace), "the release should still be there"
    finally:
        helm("uninstall", RELEASE, "-n", namespace, "--wait", kubeconfig=cluster.kubeconfig)

    async def nothing_left() -> bool:
        return not namespace_objects(cluster, namespace)

    await eventually(nothing_left, within=120, what=f"nothing left in {namespace}")
