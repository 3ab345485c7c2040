"""Helm conventions of the chart, checked against the real API server.

The roles for people aggregate into Kubernetes' own ``edit``/``view``; the
optional NetworkPolicy is valid; install-time refusals are tested in
tests/unit/test_chart.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hack.cluster import LocalCluster
from hack.crds import install_crds
from tests import chart
from tests.kubehelpers import eventually

GROUP_RESOURCE = "inferenceruns.ai.krateo.io"


@pytest.fixture
def user_roles(cluster: LocalCluster, namespace: str) -> Iterator[list[chart.Obj]]:
    install_crds(cluster)  # RBAC answers about a resource the API server serves
    roles = [
        obj
        for obj in chart.render(namespace=namespace)
        if (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "user-roles"
    ]
    assert [r["metadata"]["name"].rsplit("-", 1)[1] for r in roles] == ["editor", "viewer"]
    chart.apply(cluster, roles)
    try:
        yield roles
    finally:
        chart.delete_cluster_scoped(cluster, roles)


def can(
    cluster: LocalCluster, namespace: str, who: str, verb: str, resource: str, *extra: str
) -> bool:
    done = cluster.kubectl(
        "auth",
        "can-i",
        verb,
        resource,
        *extra,
        "-n",
        namespace,
        f"--as={chart.service_account_user(namespace, who)}",
        check=False,
    )
    return done.stdout.strip() == "yes"


async def test_namespace_users_get_runs_with_the_default_roles_they_hold(
    cluster: LocalCluster, namespace: str, user_roles: list[chart.Obj]
) -> None:
    for who, role in (("alice", "edit"), ("bob", "view"), ("carol", "admin")):
        cluster.kubectl("create", "serviceaccount", who, "-n", namespace)
        cluster.kubectl(
            "create",
            "rolebinding",
            who,
            f"--clusterrole={role}",
            f"--serviceaccount={namespace}:{who}",
            "-n",
            namespace,
        )

    async def aggregated() -> bool:
        return can(cluster, namespace, "alice", "create", GROUP_RESOURCE) and can(
            cluster, namespace, "bob", "list", GROUP_RESOURCE
        )

    await eventually(aggregated, within=30, what="the chart's roles aggregated into edit and view")
    assert can(cluster, namespace, "alice", "delete", "inferenceconfigs.ai.krateo.io")
    assert can(cluster, namespace, "carol", "patch", GROUP_RESOURCE)
    assert can(cluster, namespace, "bob", "watch", "inferenceconfigs.ai.krateo.io")
    assert not can(cluster, namespace, "bob", "create", GROUP_RESOURCE)
    assert not can(cluster, namespace, "bob", "delete", "inferenceconfigs.ai.krateo.io")
    # Status belongs to the controller: nobody's default role writes it.
    assert not can(cluster, namespace, "alice", "update", GROUP_RESOURCE, "--subresource=status")
    assert can(cluster, namespace, "bob", "get", GROUP_RESOURCE, "--subresource=status")


def test_the_network_policy_is_accepted_by_the_api_server(
    cluster: LocalCluster, namespace: str
) -> None:
    values = {
        "networkPolicy": {
            "enabled": True,
            "metricsFrom": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}},
                {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
            ],
        }
    }
    (policy,) = chart.find(chart.render(values, namespace=namespace), "NetworkPolicy")
    done = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=chart.to_yaml([policy]))
    assert "created (server dry run)" in done.stdout
