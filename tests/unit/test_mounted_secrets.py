"""Secrets the kubelet mounted (a config's ``secretSource: Volumes``), read by the runner.

The layout is a Secret volume's: one directory per Secret under
``$RUNNER_SECRETS_DIR``, one file per key, and the kubelet's own ``..data``
links beside them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner import app
from runner.secrets import MountedSecretReader, RedactingSecretReader, SecretError

pytestmark = pytest.mark.unit


def kubelet_secret(root: Path, name: str, data: dict[str, str]) -> None:
    """A Secret volume as the kubelet writes it: files in a timestamped dir, linked."""
    folder = root / name
    stamped = folder / "..2026_11_26_10_00_00.000000001"
    stamped.mkdir(parents=True)
    for key, value in data.items():
        (stamped / key).write_text(value)
    (folder / "..data").symlink_to(stamped.name)
    for key in data:
        (folder / key).symlink_to(f"..data/{key}")


async def test_reads_each_key_of_a_mounted_secret(tmp_path: Path) -> None:
    kubelet_secret(tmp_path, "db", {"username": "app", "password": "pw-7f3a"})
    reader = MountedSecretReader(tmp_path, "team-a")
    assert await reader.read("team-a", "db") == {"password": "pw-7f3a", "username": "app"}


async def test_a_missing_secret_is_not_found_by_name(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()  # an optional volume whose Secret does not exist
    reader = MountedSecretReader(tmp_path, "team-a")
    for name in ("empty", "absent"):
        with pytest.raises(SecretError, match=rf"^Secret team-a/{name} not found"):
            await reader.read("team-a", name)


async def test_a_secret_of_another_namespace_says_why_it_is_not_there(tmp_path: Path) -> None:
    kubelet_secret(tmp_path, "db", {"password": "pw"})
    reader = MountedSecretReader(tmp_path, "team-a")
    with pytest.raises(SecretError, match=r"krateo-system/db is not in the pod's namespace"):
        await reader.read("krateo-system", "db")


async def test_the_runner_reads_mounted_secrets_when_told_where_and_redacts_them(
    tmp_path: Path,
) -> None:
    # In a pod the directory is a pod path (NODE_AGENT_ROOT maps it for the test agent).
    kubelet_secret(tmp_path / "var/run/secrets/kserve-inference/storage", "db", {"password": "x9"})
    invocation = app.Invocation.start(
        "run",
        {
            "RUNNER_SECRETS_DIR": "/var/run/secrets/kserve-inference/storage",
            "NODE_AGENT_ROOT": str(tmp_path),
            "POD_NAMESPACE": "team-a",
            # No token: reading through the API would fail.
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        },
        None,
    )
    reader = invocation.secrets(None)
    assert isinstance(reader, RedactingSecretReader)
    assert await reader.read("team-a", "db") == {"password": "x9"}
    await invocation.close()
