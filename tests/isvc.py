"""InferenceServices in tests, on the test stand-in CRD (``hack/kserve/``).

Tests create a service and then write its status as KServe's controller
does: ``Ready`` True with ``status.url`` and ``status.address.url``, or
``Ready`` False with KServe's reason and message.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
Obj = dict[str, Any]


def inference_service(name: str, protocol: str = "v2") -> Obj:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "predictor": {
                "model": {
                    "modelFormat": {"name": "sklearn"},
                    "protocolVersion": protocol,
                    "storageUri": "gs://kfserving-examples/models/sklearn/1.0/model",
                }
            }
        },
    }


def ready_status(url: str, external: str | None = None) -> Obj:
    """KServe's status of a Ready service whose predictor answers at ``url``."""
    return {
        "url": external or url,
        "address": {"url": url},
        "conditions": [
            {"type": "IngressReady", "status": "True"},
            {"type": "PredictorReady", "status": "True"},
            {"type": "Ready", "status": "True"},
        ],
    }


def not_ready_status(reason: str, message: str) -> Obj:
    return {
        "conditions": [
            {"type": "PredictorReady", "status": "False", "reason": reason, "message": message},
            {"type": "Ready", "status": "False", "reason": reason, "message": message},
        ]
    }


class InferenceServices:
    """InferenceServices of one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace

    async def create(self, obj: Obj) -> Obj:
        created: Obj = await self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, obj
        )
        return created

    async def set_status(self, name: str, status: Obj) -> Obj:
        """Replace the service's status, as KServe's controller writes it."""
        current: Obj = await self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        current["status"] = status
        updated: Obj = await self.custom.replace_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, name, current
        )
        return updated
