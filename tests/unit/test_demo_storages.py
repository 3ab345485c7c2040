"""The demo's storages match their examples: names, Secrets and the loopback rewrite.

``make demo DEMO_ARGS=--storage krateo|postgres|s3`` applies an example file and
waits for the config, run and Secret it names (hack/demo.py's ``STORAGES``); an
example renamed without the demo would only show when the demo times out. The
examples' storage entries must also be what the runner accepts (``resolve``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from contract.credentials import find_inline_credentials
from hack.demo import NAMESPACE, STORAGES, demo_manifests
from hack.s3server import S3Server
from runner import storage
from runner.storage.s3 import S3Provider

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(STORAGES))
def test_each_demo_storage_names_what_its_example_defines(name: str) -> None:
    demo = STORAGES[name]
    docs = list(yaml.safe_load_all((REPO / "examples" / demo.example).read_text()))
    config = next(d for d in docs if d["kind"] == "InferenceConfig")
    run = next(d for d in docs if d["kind"] == "InferenceRun")
    assert (config["metadata"]["name"], run["metadata"]["name"]) == (demo.config, demo.run)
    assert run["spec"]["configRef"]["name"] == demo.config
    refs = [
        entry.get("secretRef") or entry.get("api", {}).get("endpointRef")
        for side in config["spec"]["storage"].values()
        for entry in side.values()
    ]
    assert refs
    for ref in refs:
        assert ref["name"] == demo.secret
        assert ref.get("namespace", NAMESPACE) == demo.secret_namespace


def test_the_s3_example_resolves_and_the_demo_points_it_at_loopback() -> None:
    server = S3Server(Path("/nonexistent"), port=45123)
    docs = demo_manifests(8080, STORAGES["s3"].example, s3=server)
    config = next(d for d in docs if d["kind"] == "InferenceConfig")
    entries = config["spec"]["storage"]
    assert entries["input"]["s3"]["endpointUrl"] == "http://127.0.0.1:45123"
    assert entries["output"]["s3"]["endpointUrl"] == "http://127.0.0.1:45123"
    assert config["spec"]["kserve"]["modelUrl"].startswith("127.0.0.1:8080/")
    source = storage.resolve(entries["input"], "input", {})
    sink = storage.resolve(entries["output"], "output", {})
    assert isinstance(source, S3Provider)
    assert isinstance(sink, S3Provider)
    assert (source.settings.format, sink.settings.format) == ("parquet", "parquet")
    assert find_inline_credentials(entries) == []


def test_examples_beyond_krateo_storage_name_this_projects_runner_image() -> None:
    """Upstream's runner images (kserve-krateo-runner) know only the krateo provider."""
    checked = 0
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] != "InferenceConfig":
                continue
            providers = {key for side in doc["spec"]["storage"].values() for key in side}
            if providers <= {"krateo"}:
                continue
            checked += 1
            assert "kserve-krateo-runner" not in doc["spec"]["image"], (path.name, providers)
    assert checked >= 3
