"""docs/gitops-health.md's kstatus verdicts for InferenceConfigs, against the real kstatus library.

Each row of the page's table (after the ``<!-- config kstatus verdicts -->``
marker) is a config the controller really made on the local control plane,
read back as kubectl serves it and judged by ``hack/kstatus`` (cli-utils'
``status.Compute``, what Flux runs).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hack.cluster import LocalCluster
from hack.crds import install_inferenceservice_crd
from tests.chart import REPO
from tests.integration.test_health_tools import kstatus, kstatus_check, read_back, spec_ahead
from tests.runs import Obj, Runs, inference_config, without_model_url

__all__ = ["kstatus_check"]  # the fixture, imported for the test below

OK, FAIL = "test.local/fake-ok:1", "test.local/fake-fail:1"
GUIDE = REPO / "docs" / "gitops-health.md"
MARKER = "<!-- config kstatus verdicts -->"


def guide_rows() -> dict[str, str]:
    """The table after MARKER: the config's first words -> kstatus' verdict (first word)."""
    text = GUIDE.read_text()
    assert MARKER in text, f"{GUIDE} has no {MARKER}"
    rows: dict[str, str] = {}
    for line in text.split(MARKER, 1)[1].strip().splitlines():
        line = line.strip()
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in ("Config",) or set(cells[0]) <= {"-"}:
            continue
        rows[cells[0].split(",")[0].split(" (")[0]] = cells[-1].split()[0]
    return rows


@pytest.mark.usefixtures("probing_controller")
async def test_the_guides_config_verdicts_are_what_kstatus_says(
    runs: Runs, namespace: str, cluster: LocalCluster, kstatus_check: Path
) -> None:
    rows = guide_rows()
    assert len(rows) == 4, rows
    install_inferenceservice_crd(cluster)
    waiting = inference_config("waiting", OK)
    waiting["spec"]["kserve"] = {"inferenceServiceRef": {"name": "not-there-yet"}}
    await runs.create(inference_config("good", OK))
    await runs.create(inference_config("probe-fails", FAIL))
    await runs.create(without_model_url(inference_config("bad", OK)))
    await runs.create(waiting)
    await runs.wait_config_condition("good", "Probed", "True")
    await runs.wait_config_condition("probe-fails", "Probed", "False")
    await runs.wait_config_condition("bad", "Stalled", "True")
    await runs.wait_config_condition("waiting", "Reconciling", "True")

    def back(name: str) -> Obj:
        return read_back(cluster, namespace, "inferenceconfig", name)

    good = back("good")
    seen: dict[str, list[Obj]] = {
        "usable": [good, back("probe-fails")],
        "unusable as written": [back("bad")],
        "waiting for its InferenceService": [back("waiting")],
        "edited": [spec_ahead(good)],
    }
    assert rows.keys() == seen.keys(), rows
    for row, objects in seen.items():
        for obj in objects:
            verdict = kstatus(kstatus_check, obj)
            name = obj["metadata"]["name"]
            assert verdict["status"] == rows[row], f"{row} ({name}): kstatus says {verdict}"
    # Failed carries the Stalled condition's message, as the page says.
    bad = back("bad")
    (stalled,) = [c for c in bad["status"]["conditions"] if c["type"] == "Stalled"]
    assert kstatus(kstatus_check, bad)["message"] == stalled["message"]
    assert re.search(r"model", stalled["message"]), stalled
