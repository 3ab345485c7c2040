"""The entry points as an operator meets them: a bad kubeconfig, ``--version``.

Each case runs the real ``python -m controller`` / ``python -m runner`` (and the
console scripts) in a subprocess with a controlled environment: PATH, a HOME
of its own, and only what the case needs. None needs a cluster.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import controller.__main__ as controller_main
from kubeclient.client import KubeClient

VERSION = importlib.metadata.version("kserve-inference-controller")
SCRIPTS = Path(sys.executable).parent


def kubeconfig(**changes: Any) -> dict[str, Any]:
    """A well-formed kubeconfig (server never contacted), with ``changes`` applied."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "me", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "dev", "context": {"cluster": "local", "user": "me"}}],
        "current-context": "dev",
    }
    for key, value in changes.items():
        key = key.replace("_", "-")
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


def run(
    home: Path, *args: str, module: str = "controller", **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a clean exit 2."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert done.returncode == 2, done.stderr
    return lines[0]


# ------------------------------------------------------------------ bad kubeconfig


def test_kubeconfig_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "config"
    line = one_line(run(tmp_path, KUBECONFIG=str(missing)))
    assert str(missing) in line
    assert "does not exist" in line
    assert "KUBECONFIG" in line


def test_kubeconfig_flag_naming_a_file_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "gone.yaml"
    line = one_line(run(tmp_path, "--kubeconfig", str(missing)))
    assert str(missing) in line
    assert "does not exist" in line


GHOST_USER = [{"name": "dev", "context": {"cluster": "local", "user": "ghost"}}]


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ("clusters: [unclosed\n  - : :\n", ["not valid YAML"]),
        ("\x00\x01binary", ["not valid YAML"]),
        ("just some words\n", ["not a kubeconfig"]),
        ("- a\n- list\n", ["not a kubeconfig"]),
        ("", ["empty"]),
        # "dev": the contexts there are to choose from.
        (
            kubeconfig(current_context=None),
            ["no current-context", "kubectl config use-context", "dev"],
        ),
        (kubeconfig(current_context="prod"), ["'prod'", "kubectl config use-context"]),
        (kubeconfig(contexts=GHOST_USER), ["user 'ghost'"]),
        (kubeconfig(clusters=[]), ["cluster 'local'"]),
    ],
    ids=[
        "not-yaml",
        "binary",
        "a-string",
        "a-list",
        "empty",
        "without-current-context",
        "current-context-not-in-the-file",
        "context-names-a-user-not-in-the-file",
        "context-names-a-cluster-not-in-the-file",
    ],
)
def test_a_kubeconfig_that_cannot_be_used_is_said_in_one_line(
    tmp_path: Path, content: str | dict[str, Any], fragments: list[str]
) -> None:
    path = tmp_path / "config"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    line = one_line(run(tmp_path, KUBECONFIG=str(path)))
    assert str(path) in line
    for fragment in fragments:
        assert fragment in line


def test_no_kubeconfig_at_all_outside_a_cluster(tmp_path: Path) -> None:
    line = one_line(run(tmp_path))
    assert str(tmp_path / ".kube" / "config") in line
    assert "KUBECONFIG" in line
    assert "--kubeconfig" in line


def test_in_a_pod_without_a_service_account_token(tmp_path: Path) -> None:
    # KUBERNETES_SERVICE_HOST says "in a pod", but no token is mounted here.
    line = one_line(
        run(
            tmp_path,
            KUBERNETES_SERVICE_HOST="10.0.0.1",
            KUBERNETES_SERVICE_PORT="443",
            POD_NAMESPACE="kserve-controller-system",
        )
    )
    assert "in-cluster" in line
    assert "--kubeconfig" in line


def test_console_script_gives_the_same_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    done = subprocess.run(
        [str(SCRIPTS / "kserve-inference-controller"), "--kubeconfig", str(missing)],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert str(missing) in one_line(done)


def test_a_usable_kubeconfig_passes_the_check(tmp_path: Path) -> None:
    whole = tmp_path / "config"
    whole.write_text(yaml.safe_dump(kubeconfig()))
    controller_main.check_kubeconfig(str(whole))
    first = tmp_path / "a"
    second = tmp_path / "b"
    first.write_text(yaml.safe_dump(kubeconfig(current_context=None)))
    second.write_text(yaml.safe_dump({"current-context": "dev"}))
    # A KUBECONFIG list is merged as kubernetes_asyncio merges it; missing entries are skipped.
    controller_main.check_kubeconfig(
        os.pathsep.join([str(first), str(tmp_path / "no"), str(second)])
    )


def test_other_failures_while_connecting_still_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig()))

    async def broken(*_: object, **__: object) -> KubeClient:
        raise RuntimeError("a real bug")

    monkeypatch.setattr(KubeClient, "connect", broken)
    monkeypatch.setattr(controller_main, "configure_logging", lambda *_: None)
    with pytest.raises(RuntimeError, match="a real bug"):
        controller_main.main(["--kubeconfig", str(path)])


# ------------------------------------------------------------------------ --version


@pytest.mark.parametrize("module", ["controller", "runner"])
def test_version_needs_no_cluster_nor_contract(tmp_path: Path, module: str) -> None:
    # Even with a setting that would otherwise stop the controller.
    done = run(tmp_path, "--version", module=module, POLLING_INTERVAL="1 minute")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"kserve-inference-{module}", VERSION]
    assert done.stderr == ""


@pytest.mark.parametrize("script", ["kserve-inference-controller", "kserve-inference-runner"])
def test_console_scripts_print_the_version(tmp_path: Path, script: str) -> None:
    done = subprocess.run(
        [str(SCRIPTS / script), "--version"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [script, VERSION]
