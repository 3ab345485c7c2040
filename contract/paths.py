"""Where the runner finds its pod files, and the test node agent's contract.

In a real pod the runner uses fixed absolute paths: the contract at
``/tmp/contract.json``, the termination log at ``/dev/termination-log`` and the
service account's files under ``/var/run/secrets/kubernetes.io/serviceaccount/``.

**Test node agent contract.** The test-only node agent runs a pod as a local
process and gives it a private directory that stands for the pod's filesystem
root, exported as ``NODE_AGENT_ROOT``. When that variable is set, every default
pod path ``P`` above is read or written at ``$NODE_AGENT_ROOT/P`` instead
(``$NODE_AGENT_ROOT/tmp/contract.json``, ``$NODE_AGENT_ROOT/dev/termination-log``,
…). The agent places the files there and reads the termination log back from
there. Explicit overrides (``CONTRACT_PATH``, ``TERMINATION_LOG_PATH``) are used
exactly as given, never remapped.

:func:`pod_path` is the only place this rule lives.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# Where the pod finds its contract and writes its termination message: one
# definition for both sides. controller.render mounts the contract ConfigMap's
# CONTRACT_KEY at CONTRACT (a subPath over a writable emptyDir at CONTRACT_DIR)
# and sets the container's terminationMessagePath to TERMINATION_LOG.
CONTRACT_DIR = "/tmp"
CONTRACT_KEY = "contract.json"
CONTRACT = f"{CONTRACT_DIR}/{CONTRACT_KEY}"
TERMINATION_LOG = "/dev/termination-log"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_ACCOUNT_TOKEN = f"{SERVICE_ACCOUNT_DIR}/token"
SERVICE_ACCOUNT_CA = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
SERVICE_ACCOUNT_NAMESPACE = f"{SERVICE_ACCOUNT_DIR}/namespace"


def pod_path(path: str, environ: Mapping[str, str] | None = None) -> Path:
    """The local path of the absolute pod path ``path`` (see the module docstring)."""
    env = os.environ if environ is None else environ
    if not path.startswith("/"):
        raise ValueError(f"pod paths are absolute, got {path!r}")
    root = env.get("NODE_AGENT_ROOT")
    if root:
        return Path(root) / path.lstrip("/")
    return Path(path)


def contract_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    explicit = env.get("CONTRACT_PATH")
    return Path(explicit) if explicit else pod_path(CONTRACT, env)


def termination_log_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    explicit = env.get("TERMINATION_LOG_PATH")
    return Path(explicit) if explicit else pod_path(TERMINATION_LOG, env)
