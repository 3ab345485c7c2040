"""Pure parts of the test infrastructure: the node agent's helpers and the leftover check."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import uuid

import pytest

from hack.cluster import leftover_processes
from hack.nodeagent import parse_image_command
from hack.nodeagent_pod import expand, field_ref

POD = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "1234-abcd",
        "labels": {"app": "x"},
        "annotations": {"batch.kubernetes.io/job-completion-index": "3"},
    },
    "spec": {"nodeName": "local-node", "serviceAccountName": "runner"},
}


def test_expand_substitutes_known_variables_and_keeps_the_rest() -> None:
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", env) == "1-two"
    assert expand("$(MISSING)", env) == "$(MISSING)"
    assert expand("$$(A)", env) == "$(A)"
    assert expand("plain $A", env) == "plain $A"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.uid", "1234-abcd"),
        ("metadata.name", "p"),
        ("metadata.namespace", "ns"),
        ("spec.serviceAccountName", "runner"),
        ("metadata.labels['app']", "x"),
        ("metadata.annotations['batch.kubernetes.io/job-completion-index']", "3"),
    ],
)
def test_field_ref(path: str, value: str) -> None:
    assert field_ref(POD, path) == value


def test_field_ref_rejects_unknown_paths() -> None:
    with pytest.raises(ValueError, match="unsupported fieldRef"):
        field_ref(POD, "status.phase")


def test_parse_image_command() -> None:
    assert parse_image_command('*runner*=["python", "-m", "runner"]') == (
        "*runner*",
        ["python", "-m", "runner"],
    )
    with pytest.raises(argparse.ArgumentTypeError):
        parse_image_command("img=python -m runner")


def test_leftover_processes_finds_marked_descendants_only_while_they_live() -> None:
    marker = uuid.uuid4().hex
    env = {**os.environ, "KSC_UNIT_MARK": marker}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        found = leftover_processes("KSC_UNIT_MARK", marker)
        assert [pid for pid, _ in found] == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert leftover_processes("KSC_UNIT_MARK", marker) == []
