"""A client configuration whose link to the API server a test can cut (a partition)."""

from __future__ import annotations

from urllib.parse import urlparse

from kubernetes_asyncio.client import Configuration

from hack.cluster import LocalCluster
from kubeclient.transport import load_configuration
from tests.integration.tcpproxy import TcpProxy


async def behind_a_proxy(cluster: LocalCluster) -> tuple[TcpProxy, Configuration]:
    """A started proxy to the cluster's API server, and a configuration that goes through it.

    A client built from the configuration reaches the server only through the
    proxy, so ``proxy.cut()`` partitions it (and only it); the caller stops
    the proxy.
    """
    api = urlparse(cluster.server)
    proxy = TcpProxy(api.hostname or "127.0.0.1", api.port or 443)
    await proxy.start()
    configuration = await load_configuration(kubeconfig=str(cluster.kubeconfig))
    assert isinstance(configuration, Configuration)  # a kubeconfig's: the library's
    configuration.host = f"https://127.0.0.1:{proxy.port}"
    return proxy, configuration
