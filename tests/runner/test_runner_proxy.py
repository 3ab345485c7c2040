"""One proxy story: model and storage calls honour HTTP(S)_PROXY and NO_PROXY,
the Secret read (with the runner's token) never goes through a proxy.

The runner runs in-process against the model server and the storage on
loopback, with its Secret read from the real API server as the runner user,
and a logging proxy (``tests.httpproxy``) named in the environment.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from contract.exitcodes import ExitCode
from hack.cluster import LocalCluster
from runner.secrets import KubernetesSecretReader
from tests.httpproxy import LoggingProxy
from tests.integration.test_runner_secret import SECRET, create_secret, grant_get
from tests.runner.conftest import STORAGE_PASSWORD, STORAGE_USER, World, iris_contract

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")


def netloc(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def contract_reading(namespace: str, model_url: str) -> dict[str, Any]:
    contract = iris_contract(model_url)
    for role in ("input", "output"):
        contract[role]["krateo"]["api"]["endpointRef"] = {"name": SECRET, "namespace": namespace}
    return contract


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


async def run_through(
    world: World,
    cluster: LocalCluster,
    namespace: str,
    proxy_env: pytest.MonkeyPatch,
    storage_url: str,
    no_proxy: str | None = None,
) -> tuple[LoggingProxy, int, str]:
    create_secret(
        cluster,
        namespace,
        {"server-url": storage_url, "username": STORAGE_USER, "password": STORAGE_PASSWORD},
    )
    grant_get(cluster, namespace, [SECRET])
    reader = KubernetesSecretReader({"KUBECONFIG": str(cluster.kubeconfig_for("runner"))})
    async with LoggingProxy() as proxy:
        # Both spellings, as users set them; the API server is https, so a
        # proxied Secret read would show up as a CONNECT.
        for name in ("HTTP_PROXY", "HTTPS_PROXY"):
            proxy_env.setenv(name, proxy.url)
        if no_proxy is not None:
            proxy_env.setenv("NO_PROXY", no_proxy)
        try:
            outcome = await world.run(
                contract_reading(namespace, world.model_server.infer_url()), reader
            )
        finally:
            await reader.close()
    return proxy, outcome.exit_code, outcome.termination


async def test_model_and_storage_go_through_the_proxy_and_the_secret_read_does_not(
    world: World, cluster: LocalCluster, namespace: str, proxy_env: pytest.MonkeyPatch
) -> None:
    world.storage.seed_iris("iris")
    proxy, code, termination = await run_through(
        world, cluster, namespace, proxy_env, world.storage.url
    )
    assert code == ExitCode.DONE, termination
    assert proxy.seen, "the proxy saw no request at all"
    model, storage, api = (
        netloc(world.model_server.url),
        netloc(world.storage.url),
        netloc(cluster.server),
    )
    assert model in proxy.targets(), proxy.seen
    assert storage in proxy.targets(), proxy.seen
    assert api not in proxy.targets(), proxy.seen
    assert len(world.storage.predictions("iris_predictions")) == 150


async def test_no_proxy_is_honoured(
    world: World, cluster: LocalCluster, namespace: str, proxy_env: pytest.MonkeyPatch
) -> None:
    world.storage.seed_iris("iris")
    # The storage by another name of the same loopback address: NO_PROXY names it.
    port = urlsplit(world.storage.url).port
    proxy, code, termination = await run_through(
        world,
        cluster,
        namespace,
        proxy_env,
        f"http://localhost:{port}",
        no_proxy="localhost,.example.internal",
    )
    assert code == ExitCode.DONE, termination
    targets = proxy.targets()
    assert netloc(world.model_server.url) in targets, proxy.seen
    assert not any(t.startswith("localhost:") for t in targets), json.dumps(proxy.seen)
    assert netloc(cluster.server) not in targets, proxy.seen
    assert len(world.storage.predictions("iris_predictions")) == 150
