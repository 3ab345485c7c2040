"""The runner's Kubernetes Secret reader against the real API server, as the runner user."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from hack.cluster import USERS, LocalCluster
from runner.secrets import KubernetesSecretReader, SecretError

SECRET = "finops-database-handler-endpoint"


def grant_get(cluster: LocalCluster, namespace: str, names: list[str]) -> None:
    """Least privilege, as the chart should grant it: get on named Secrets only."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "runner-secrets", "namespace": namespace},
        "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": names}
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "runner-secrets", "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "runner-secrets",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USERS["runner"].name}
        ],
    }
    for manifest in (role, binding):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def create_secret(cluster: LocalCluster, namespace: str, data: dict[str, str]) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": namespace},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(secret))


async def test_the_runner_user_reads_exactly_the_secrets_it_was_granted(
    cluster: LocalCluster, namespace: str
) -> None:
    data = {"server-url": "http://127.0.0.1:1", "username": "u", "password": "p-123"}
    create_secret(cluster, namespace, data)
    grant_get(cluster, namespace, [SECRET, "not-created"])
    reader = KubernetesSecretReader({"KUBECONFIG": str(cluster.kubeconfig_for("runner"))})
    try:
        assert dict(await reader.read(namespace, SECRET)) == data
        with pytest.raises(SecretError, match=f"Secret {namespace}/not-created not found"):
            await reader.read(namespace, "not-created")
        with pytest.raises(SecretError) as refused:
            await reader.read(namespace, "someone-elses")
        assert str(refused.value).startswith(
            f"the runner may not read Secret {namespace}/someone-elses (403): "
        )
    finally:
        await reader.close()


async def test_in_a_pod_the_service_account_files_come_from_the_node_agent_root(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    create_secret(cluster, namespace, {"server-url": "http://h", "token": "t-456"})
    grant_get(cluster, namespace, [SECRET])
    account = tmp_path / "var/run/secrets/kubernetes.io/serviceaccount"
    account.mkdir(parents=True)
    (account / "token").write_text(cluster.token_for("runner"))
    (account / "ca.crt").write_bytes(cluster.ca_path.read_bytes())
    (account / "namespace").write_text(namespace)
    host, port = cluster.server.removeprefix("https://").rsplit(":", 1)
    reader = KubernetesSecretReader(
        {
            "NODE_AGENT_ROOT": str(tmp_path),
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
        }
    )
    try:
        assert (await reader.read(namespace, SECRET))["token"] == "t-456"
    finally:
        await reader.close()
