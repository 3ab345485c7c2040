"""What the client addresses: a :class:`Resource` (group, version, plural) and raw objects.

The descriptors of the built-in kinds the project touches (``JOBS``,
``PODS``...) and of its own two custom resources (``RUNS``, ``CONFIGS``, with
their group, version, kinds and plurals) are here, once, for the controller
and the kubectl plugin alike.

Pure: dataclasses and typing only, so the planners (``controller.plan``,
``controller.projection``...) can name the resources they decide about and
the ``Obj`` alias without importing any I/O (the import-linter contract
"pure-modules-no-io" in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A raw Kubernetes object, as the API server's JSON decodes.
Obj = dict[str, Any]
# An informer's transform (client-go's SetTransform): the object to cache in
# place of the one the server sent (a projection of it), or None to keep it out.
Transform = Callable[[Obj], Obj | None]


@dataclass(frozen=True)
class Resource:
    """A kind of object on the API server: ``group``/``version``, REST ``plural``, ``kind``."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The REST path; ``namespace=None`` on a namespaced resource means all namespaces."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        elif not self.namespaced and namespace:
            raise ValueError(f"{self.kind} is cluster-scoped, got namespace {namespace!r}")
        elif self.namespaced and name is not None:
            raise ValueError(f"{self.kind} {name!r} needs a namespace")
        path = f"{base}/{self.plural}"
        if name is not None:
            if not name:
                raise ValueError(f"empty {self.kind} name")
            path += f"/{name}"
        if subresource:
            if name is None:
                raise ValueError("a subresource needs an object name")
            path += f"/{subresource}"
        return path

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
PODS = Resource("", "v1", "pods", "Pod")
EVENTS = Resource("", "v1", "events", "Event")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
JOBS = Resource("batch", "v1", "jobs", "Job")
CRONJOBS = Resource("batch", "v1", "cronjobs", "CronJob")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")

# The project's own API, as the CRDs in crds/ define it.
GROUP = "ai.krateo.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
RUN_KIND = "InferenceRun"
RUN_PLURAL = "inferenceruns"
CONFIG_KIND = "InferenceConfig"
CONFIG_PLURAL = "inferenceconfigs"
RUNS = Resource(GROUP, VERSION, RUN_PLURAL, RUN_KIND)
CONFIGS = Resource(GROUP, VERSION, CONFIG_PLURAL, CONFIG_KIND)
