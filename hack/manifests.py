"""InferenceConfig and InferenceRun manifests for tests and benches: plain dicts, no I/O."""

from __future__ import annotations

from typing import Any

from kubeclient.resources import GROUP as GROUP
from kubeclient.resources import VERSION as VERSION

Obj = dict[str, Any]

STORAGE = {
    "input": {
        "krateo": {"api": {"endpointRef": {"name": "storage"}, "path": "/in", "verb": "POST"}}
    },
    "output": {
        "krateo": {"api": {"endpointRef": {"name": "storage"}, "path": "/out", "verb": "POST"}}
    },
}


def inference_config(
    name: str, image: str, *, policy: str = "None", storage: Obj | None = None, **spec: Any
) -> Obj:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceConfig",
        "metadata": {"name": name},
        "spec": {
            "image": image,
            "autoDeletePolicy": policy,
            "kserve": {
                "modelName": "sklearn-iris",
                "modelUrl": "127.0.0.1:1/v2/models/sklearn-iris/infer",
                "modelVersion": "v2",
                "modelInputName": "input-0",
            },
            "storage": storage or STORAGE,
            **spec,
        },
    }


def without_model_url(config: Obj) -> Obj:
    """``config`` with a blank ``kserve.modelUrl``: valid by the schema, unusable by the controller.

    (The CRD refuses a config with no model at all; a URL of spaces names none either,
    which only the controller sees: ``MissingModelUrl``.)
    """
    config["spec"]["kserve"]["modelUrl"] = " "
    return config


# The merge patch that makes a config of without_model_url() usable again.
MODEL_URL_PATCH = {"spec": {"kserve": {"modelUrl": "m:1/v2/models/m/infer"}}}


def inference_run(name: str, config: str, **spec: Any) -> Obj:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceRun",
        "metadata": {"name": name},
        "spec": {"configRef": {"name": config}, "parameters": {"table": "iris"}, **spec},
    }
