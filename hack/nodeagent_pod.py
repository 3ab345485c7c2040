"""One pod on the node agent (:mod:`hack.nodeagent`): its record, and what its containers need.

- :class:`PodRun`: a pod this node runs, its processes and where its files are.
- :class:`PodSetup`: before a container starts, its volumes (ConfigMap, Secret,
  emptyDir, downwardAPI, projected service-account tokens), its filesystem
  layout under ``<pod dir>/root``, its environment and its command line. What
  is not there yet (a missing Secret) is a :class:`WaitingError`, as with a
  kubelet.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import urlparse

from hack.nodeagent_api import Api, ApiError, Json

# Environment passed through from the agent to pod processes. KSC_* carries the
# test session's marker so the suite can prove no process outlived it.
PASS_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "VIRTUAL_ENV", "TZ")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion; ``$$(VAR)`` escapes, unknown names stay as written."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$\([A-Za-z_][A-Za-z0-9_]*\)|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, value)


def field_ref(pod: Json, path: str) -> str:
    meta = pod["metadata"]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str(meta.get(m.group(1), {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.hostIP": "127.0.0.1",
        "status.podIP": "127.0.0.1",
    }
    if path not in simple:
        raise ValueError(f"unsupported fieldRef {path!r}")
    return str(simple[path])


class WaitingError(Exception):
    """The pod cannot start yet (e.g. a missing Secret): kubelet keeps it waiting."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class PodRun:
    """A pod this node runs: its object, its filesystem root, its task and its processes."""

    pod: Json
    root: Path
    task: asyncio.Task[None] | None = None
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    deleting: bool = False

    def log_path(self, container: str) -> Path:
        """Where ``container``'s output goes (and ``/containerLogs`` reads it from)."""
        return self.root.parent / f"{self.root.name}-{container}.log"


class PodSetup:
    """What a pod's containers need before they start, read from the API server."""

    def __init__(self, api: Api, image_commands: dict[str, list[str]]) -> None:
        self.api = api
        self.image_commands = image_commands
        parsed = urlparse(api.server)
        self.api_host, self.api_port = parsed.hostname or "127.0.0.1", str(parsed.port or 443)

    async def get(self, kind: str, namespace: str, name: str) -> Json | None:
        try:
            return await self.api.request("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    @staticmethod
    def _data(obj: Json) -> dict[str, bytes]:
        out = {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
        if obj.get("kind") == "Secret":
            out.update({k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()})
        else:
            out.update({k: v.encode() for k, v in (obj.get("data") or {}).items()})
        return out

    async def _source_files(self, pod: Json, src: Json, kind: str) -> dict[str, bytes]:
        """Files of a configMap/secret volume source (``items`` honoured)."""
        ns = pod["metadata"]["namespace"]
        name = src.get("name") or src.get("secretName", "")
        plural = "secrets" if kind == "secret" else "configmaps"
        obj = await self.get(plural, ns, name)
        if obj is None:
            if src.get("optional"):
                return {}
            raise WaitingError("CreateContainerConfigError", f'{kind} "{name}" not found')
        data = self._data(obj)
        if not src.get("items"):
            return data
        files = {}
        for item in src["items"]:
            if item["key"] not in data:
                if src.get("optional"):
                    continue
                raise WaitingError(
                    "CreateContainerConfigError",
                    f"couldn't find key {item['key']} in {kind} {name}",
                )
            files[item["path"]] = data[item["key"]]
        return files

    async def _token(self, pod: Json, src: Json) -> bytes:
        meta, spec = pod["metadata"], pod["spec"]
        sa = spec.get("serviceAccountName") or "default"
        body: Json = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": int(src.get("expirationSeconds", 3607)),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        if src.get("audience"):
            body["spec"]["audiences"] = [src["audience"]]
        answer = await self.api.request(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token", body
        )
        return str(answer["status"]["token"]).encode()

    async def materialise_volume(self, pod: Json, volume: Json, target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        files: dict[str, bytes] = {}
        if "emptyDir" in volume:
            return
        if "configMap" in volume:
            files = await self._source_files(pod, volume["configMap"], "configMap")
        elif "secret" in volume:
            files = await self._source_files(pod, volume["secret"], "secret")
        elif "downwardAPI" in volume:
            for item in volume["downwardAPI"].get("items", []):
                files[item["path"]] = field_ref(pod, item["fieldRef"]["fieldPath"]).encode()
        elif "projected" in volume:
            for source in volume["projected"].get("sources", []):
                if "serviceAccountToken" in source:
                    sat = source["serviceAccountToken"]
                    files[sat["path"]] = await self._token(pod, sat)
                elif "configMap" in source:
                    files.update(await self._source_files(pod, source["configMap"], "configMap"))
                elif "secret" in source:
                    files.update(await self._source_files(pod, source["secret"], "secret"))
                elif "downwardAPI" in source:
                    for item in source["downwardAPI"].get("items", []):
                        files[item["path"]] = field_ref(pod, item["fieldRef"]["fieldPath"]).encode()
        else:
            raise WaitingError("CreateContainerConfigError", f"unsupported volume {volume['name']}")
        for rel, content in files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)

    async def container_env(self, pod: Json, container: Json, root: Path) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        env.update({k: v for k, v in os.environ.items() if k.startswith("KSC_")})
        env.update(
            {
                "HOSTNAME": pod["metadata"]["name"],
                "HOME": str(root),
                "NODE_AGENT_ROOT": str(root),
                "KUBERNETES_SERVICE_HOST": self.api_host,
                "KUBERNETES_SERVICE_PORT": self.api_port,
                "KUBERNETES_SERVICE_PORT_HTTPS": self.api_port,
            }
        )
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            for kind in ("configMapRef", "secretRef"):
                if kind in source:
                    ref = source[kind]
                    plural = "secrets" if kind == "secretRef" else "configmaps"
                    obj = await self.get(plural, ns, ref["name"])
                    if obj is None:
                        if ref.get("optional"):
                            continue
                        raise WaitingError(
                            "CreateContainerConfigError", f'{plural[:-1]} "{ref["name"]}" not found'
                        )
                    env.update({prefix + k: v.decode() for k, v in self._data(obj).items()})
        for var in container.get("env", []):
            name = var["name"]
            if "value" in var:
                env[name] = expand(var["value"], env)
                continue
            source = var.get("valueFrom", {})
            if "fieldRef" in source:
                env[name] = field_ref(pod, source["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in source:
                env[name] = "0"
            else:
                for kind, plural in (
                    ("secretKeyRef", "secrets"),
                    ("configMapKeyRef", "configmaps"),
                ):
                    if kind not in source:
                        continue
                    ref = source[kind]
                    obj = await self.get(plural, ns, ref["name"])
                    value = self._data(obj).get(ref["key"]) if obj else None
                    if value is None:
                        if ref.get("optional"):
                            break
                        raise WaitingError(
                            "CreateContainerConfigError",
                            f'{plural[:-1]} "{ref["name"]}" key "{ref["key"]}" not found',
                        )
                    env[name] = value.decode()
        return env

    def command_for(self, container: Json, env: dict[str, str]) -> list[str]:
        command = list(container.get("command") or [])
        if not command:
            image = container.get("image", "")
            mapped = next(
                (cmd for pattern, cmd in self.image_commands.items() if fnmatch(image, pattern)),
                None,
            )
            if mapped is None:
                raise WaitingError(
                    "ErrImagePull",
                    f"node agent has no command for image {image!r} (--image-command)",
                )
            command = list(mapped)
        return [expand(a, env) for a in command + list(container.get("args") or [])]

    async def prepare(self, pod: Json, root: Path) -> None:
        """Volumes materialised beside ``root``, and the pod's mounts laid out under it."""
        volumes_dir = root.parent / f"{root.name}-volumes"
        for volume in pod["spec"].get("volumes", []):
            await self.materialise_volume(pod, volume, volumes_dir / volume["name"])
        root.mkdir(parents=True, exist_ok=True)
        (root / "dev").mkdir(exist_ok=True)
        mounts = [m for c in pod["spec"]["containers"] for m in c.get("volumeMounts", [])]
        for mount in sorted(mounts, key=lambda m: m["mountPath"].count("/")):
            source = volumes_dir / mount["name"] / mount.get("subPath", "")
            target = root / mount["mountPath"].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.exists():
                continue
            if mount.get("subPath") and not source.exists():
                source.mkdir(parents=True)
            target.symlink_to(source)
