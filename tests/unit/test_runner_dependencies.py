"""The runner needs no Kubernetes client library: its one API call is aiohttp."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_runner_image_does_not_install_kubernetes_asyncio() -> None:
    requirements = (REPO / "deploy/images/requirements-runner.txt").read_text()
    pinned = [line.split("==")[0] for line in requirements.splitlines() if "==" in line]
    assert "aiohttp" in pinned, "the requirements file lists nothing recognisable"
    assert "kubernetes-asyncio" not in pinned


def test_the_runner_reads_a_secret_without_kubernetes_asyncio(tmp_path: Path) -> None:
    # kubernetes_asyncio made unimportable, as in the runner image: the Secret
    # reader still loads a kubeconfig and asks the API (here: a closed port).
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        textwrap.dedent(
            """
            apiVersion: v1
            kind: Config
            current-context: x
            contexts: [{name: x, context: {cluster: c, user: u}}]
            clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
            users: [{name: u, user: {token: t}}]
            """
        )
    )
    code = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.modules["kubernetes_asyncio"] = None  # ImportError on any import of it
        import runner.__main__, runner.app, runner.check
        from runner.secrets import KubernetesSecretReader, SecretError

        async def main() -> None:
            reader = KubernetesSecretReader({{"KUBECONFIG": {str(kubeconfig)!r}}})
            try:
                await reader.read("ns", "s")
            except SecretError as error:
                print(error)
            finally:
                await reader.close()

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "cannot reach the Kubernetes API to read Secret ns/s" in done.stdout
