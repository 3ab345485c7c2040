"""The kubeconfig ``kubectl infer`` uses, found and merged as kubectl does.

``--kubeconfig FILE`` wins; else every file of ``$KUBECONFIG`` (``a:b``) merged;
else ``~/.kube/config``; in a pod with none of them, the pod's service account.
The merge is kubernetes_asyncio's (:class:`KubeConfigMerger`, which also keeps
each entry's file so relative certificate paths resolve next to it), with the
two rules where kubectl differs from it: the *first* file that sets
``current-context`` wins (the merger keeps the last), and an empty file is
skipped (the merger fails on it).

Each way this can go wrong is a :class:`KubeconfigProblem` with one line and its
own exit code: no such file, a file that is not a kubeconfig, a context that is
not in it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import kube_config
from kubernetes_asyncio.config.config_exception import ConfigException

from kubeclient.incluster import (
    SERVICE_ACCOUNT_DIR,
    InClusterConfigError,
    InClusterConfiguration,
)
from kubeclient.transport import ApiConfiguration
from kubectl_infer.runview import Exit

DEFAULT_KUBECONFIG = Path("~/.kube/config")


class KubeconfigProblem(Exception):
    """The kubeconfig cannot give a cluster to talk to; ``exit`` says which way."""

    def __init__(self, exit: Exit, message: str) -> None:
        super().__init__(message)
        self.exit = exit


class _Merger(kube_config.KubeConfigMerger):
    """kubernetes_asyncio's merger with kubectl's rules for ``current-context`` and empty files."""

    def load_config(self, path: str) -> None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise KubeconfigProblem(
                Exit.BAD_KUBECONFIG, f"kubeconfig {path} cannot be read: {_first_line(exc)}"
            ) from None
        if loaded is None:
            return  # an empty file adds nothing (kubectl skips it too)
        if not isinstance(loaded, dict) or any(
            not isinstance(loaded.get(key) or [], list) for key in ("clusters", "contexts", "users")
        ):
            raise KubeconfigProblem(
                Exit.BAD_KUBECONFIG,
                f"kubeconfig {path} is not a kubeconfig (clusters, contexts and users are lists)",
            )
        first = self.config_merged.value.get("current-context") if self.config_merged else None
        super().load_config(path)
        if first and self.config_merged is not None:
            self.config_merged.value["current-context"] = first


@dataclass
class Kubeconfig:
    """What the plugin connects with, and the namespace the context names (None: none)."""

    configuration: ApiConfiguration
    namespace: str | None


def _context_names(config: dict[str, Any]) -> list[str]:
    """The names of a merged kubeconfig's contexts (the merger wraps each in a ConfigNode)."""
    names = []
    for context in config.get("contexts") or []:
        entry = context.value if isinstance(context, kube_config.ConfigNode) else context
        if isinstance(entry, dict) and entry.get("name"):
            names.append(str(entry["name"]))
    return names


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _paths(explicit: str | None, environ: dict[str, str]) -> tuple[str, str]:
    """The ``os.pathsep``-separated files to merge, and how to name them in a message."""
    if explicit:
        return explicit, f"--kubeconfig {explicit}"
    from_env = environ.get("KUBECONFIG", "")
    if any(from_env.split(os.pathsep)):
        return from_env, f"KUBECONFIG={from_env}"
    default = str(DEFAULT_KUBECONFIG.expanduser())
    return default, default


def _select(
    kubeconfig: str | None, context: str | None, environ: dict[str, str]
) -> tuple[kube_config.ConfigNode, str, str] | Kubeconfig:
    """The merged kubeconfig, the context to use and how to name the files in a message
    (or, in a pod without a kubeconfig, the pod's own configuration)."""
    paths, named = _paths(kubeconfig, environ)
    files = [p for p in paths.split(os.pathsep) if p]
    if kubeconfig and not Path(kubeconfig).expanduser().exists():
        raise KubeconfigProblem(Exit.NO_KUBECONFIG, f"no kubeconfig: {named} does not exist")
    if not any(Path(p).expanduser().exists() for p in files):
        if not kubeconfig and environ.get("KUBERNETES_SERVICE_HOST"):
            return _in_cluster()
        raise KubeconfigProblem(Exit.NO_KUBECONFIG, f"no kubeconfig: {named} does not exist")
    merged = _Merger(paths).config
    if merged is None:
        raise KubeconfigProblem(Exit.BAD_KUBECONFIG, f"kubeconfig {named} is empty")
    config: dict[str, Any] = merged.value
    names = _context_names(config)
    chosen = context or config.get("current-context")
    if not chosen:
        raise KubeconfigProblem(
            Exit.NO_CONTEXT,
            f"no context: {named} sets no current-context and --context is not given "
            f"(contexts: {', '.join(names) or 'none'})",
        )
    if chosen not in names:
        how = "--context" if context else "current-context"
        raise KubeconfigProblem(
            Exit.NO_CONTEXT,
            f"{how} {chosen!r} is not in {named} (contexts: {', '.join(names) or 'none'})",
        )
    return merged, str(chosen), named


async def load(
    *, kubeconfig: str | None, context: str | None, environ: dict[str, str] | None = None
) -> Kubeconfig:
    """The configuration for ``--kubeconfig``/``$KUBECONFIG`` and ``--context``, as kubectl
    picks them; :class:`KubeconfigProblem` when there is none."""
    selected = _select(kubeconfig, context, dict(os.environ if environ is None else environ))
    if isinstance(selected, Kubeconfig):
        return selected
    merged, chosen, named = selected
    configuration = Configuration()
    try:
        loader = kube_config.KubeConfigLoader(
            config_dict=merged, config_base_path=None, active_context=chosen
        )
        await loader.load_and_set(configuration)
        current = loader.current_context or {}
        namespace = (current.get("context") or {}).get("namespace")
    except (ConfigException, KeyError, TypeError, ValueError, AttributeError, OSError) as exc:
        raise KubeconfigProblem(
            Exit.BAD_KUBECONFIG, f"kubeconfig {named}, context {chosen!r}: {_first_line(exc)}"
        ) from None
    return Kubeconfig(configuration, str(namespace) if namespace else None)


def _in_cluster() -> Kubeconfig:
    """The pod's service account and namespace, as kubectl uses them in a pod."""
    try:
        configuration = InClusterConfiguration.from_pod()
    except InClusterConfigError as exc:
        raise KubeconfigProblem(Exit.NO_KUBECONFIG, f"no kubeconfig: {_first_line(exc)}") from None
    try:
        namespace: str | None = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip() or None
    except OSError:
        namespace = None
    return Kubeconfig(configuration, namespace)


def context_names(kubeconfig: str | None, environ: dict[str, str] | None = None) -> list[str]:
    """The contexts of the merged kubeconfig (shell completion of ``--context``)."""
    paths, _ = _paths(kubeconfig, dict(os.environ if environ is None else environ))
    merged = _Merger(paths).config
    if merged is None:
        return []
    return sorted(_context_names(merged.value))
