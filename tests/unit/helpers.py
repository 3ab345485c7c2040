"""Objects the unit tests build the same way: a minimal valid config and run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from controller.api import InferenceConfig, InferenceRun

# The upstream controller's own worked example: its child names end in -5be07ada.
UID = "5be07ada-5fe0-4c9e-a8bc-aaae67d8d344"
CONFIG_UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000000"
# "Now" for the pure planning tests: status derivation and planning take it as an argument.
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def make_config(**spec: Any) -> InferenceConfig:
    """Config ``ns/cfg``: an image, a model URL, an HTTP input; ``spec`` adds or overrides."""
    return InferenceConfig.model_validate(
        {
            "metadata": {"name": "cfg", "namespace": "ns", "uid": "cfg-uid"},
            "spec": {
                "image": "runner:1",
                "kserve": {"modelUrl": "127.0.0.1:1/v2/models/m/infer"},
                "storage": {"input": {"http": {"url": "http://in"}}},
                **spec,
            },
        }
    )


def make_run(**spec: Any) -> InferenceRun:
    """Run ``ns/r`` (uid :data:`UID`, generation 1) of config ``cfg``; ``spec`` adds to it."""
    return InferenceRun.model_validate(
        {
            "metadata": {"name": "r", "namespace": "ns", "uid": UID, "generation": 1},
            "spec": {"configRef": {"name": "cfg"}, **spec},
        }
    )
