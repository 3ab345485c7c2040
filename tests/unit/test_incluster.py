"""The pod's own API connection (kubeclient.incluster), from files and environment alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kubeclient import incluster
from kubeclient.incluster import InClusterConfigError, InClusterConfiguration
from kubeclient.transport import ConfigurationError, load_configuration

ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "token").write_text("first\n")
    return tmp_path


def test_the_address_ca_and_token_come_from_the_pod(mount: Path) -> None:
    configuration = InClusterConfiguration.from_pod(environ=ENV, directory=mount)
    assert configuration.host == "https://10.96.0.1:443"
    assert configuration.ssl_ca_cert == str(mount / "ca.crt")
    assert configuration.verify_ssl
    assert configuration.proxy is None  # HTTPS_PROXY/NO_PROXY are the transport's


def test_an_ipv6_service_address_is_bracketed(mount: Path) -> None:
    env = {**ENV, "KUBERNETES_SERVICE_HOST": "fd00::1"}
    assert InClusterConfiguration.from_pod(environ=env, directory=mount).host == (
        "https://[fd00::1]:443"
    )


@pytest.mark.parametrize(
    ("env", "files", "says"),
    [
        ({}, {"ca.crt": "x", "token": "t"}, "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT"),
        (
            {**ENV, "KUBERNETES_SERVICE_PORT": ""},
            {"ca.crt": "x", "token": "t"},
            "must both be set",
        ),
        (ENV, {"token": "t"}, "ca.crt is missing or empty"),
        (ENV, {"ca.crt": "", "token": "t"}, "ca.crt is missing or empty"),
        (ENV, {"ca.crt": "x"}, "token cannot be read"),
        (ENV, {"ca.crt": "x", "token": " \n"}, "token is empty"),
    ],
    ids=["no-address", "empty-port", "no-ca", "empty-ca", "no-token", "empty-token"],
)
def test_what_is_missing_is_named(
    tmp_path: Path, env: dict[str, str], files: dict[str, str], says: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(InClusterConfigError, match=says):
        InClusterConfiguration.from_pod(environ=env, directory=tmp_path)


async def test_the_token_is_read_again_after_the_reload_period(
    mount: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configuration = InClusterConfiguration.from_pod(environ=ENV, directory=mount)
    header = (await configuration.auth_settings())["BearerToken"]
    assert (header["in"], header["key"], header["value"]) == (
        "header",
        "authorization",
        "Bearer first",
    )
    (mount / "token").write_text("second")
    assert configuration.token() == "first"  # within the period: not read again
    monkeypatch.setattr(incluster, "TOKEN_RELOAD", 0.0)
    assert configuration.token() == "second"
    # Between two writes of the kubelet the file may be briefly absent or empty:
    # the last token is kept, and the next request reads again.
    (mount / "token").write_text("")
    assert configuration.token() == "second"
    (mount / "token").unlink()
    assert configuration.token() == "second"
    (mount / "token").write_text("third")
    assert configuration.token() == "third"


async def test_in_cluster_without_a_pod_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigurationError, match="KUBERNETES_SERVICE_HOST"):
        await load_configuration(in_cluster=True)


async def test_a_bad_kubeconfig_is_a_configuration_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncontexts: []\nclusters: []\nusers: []\n")
    with pytest.raises(ConfigurationError):
        await load_configuration(kubeconfig=str(kubeconfig))


def test_the_controller_does_not_load_kubernetes_asyncio_until_a_kubeconfig_is_read() -> None:
    # Its generated client is about 35 MiB of a controller's memory; in a pod
    # nothing needs it (the kubectl plugin and the tests still use it).
    code = (
        "import sys, controller.__main__; "
        "print(sorted(m for m in sys.modules if m.startswith('kubernetes_asyncio')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"
