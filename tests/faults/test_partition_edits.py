"""Configs edited and runs created on them while the controller is cut off from the API server.

The controller talks to the API server through a proxy
(``tests/integration/tcpproxy.py``, plain mode) that the test cuts: every open
connection (watches included) is reset and new ones are refused, as in a
network partition. In each of several rounds, with the link cut, every config
is edited and new runs are created on the edited configs; then the link comes
back and the test waits for the runs' ConfigMaps and Jobs. When the controller's runs
informer comes back before its configs informer (a coin toss each round),
a controller that takes the config from its cache builds those runs'
contracts from the config as it was before the edit: that was seen on a live
API server, 7 runs of 10.

Checked, for every run: its contract (read from its ConfigMap) is the one of
the config as edited in its round; the ConfigMap's annotations and the run's
status name that config version: its generation after the edit, and a
resourceVersion no older than the edit's and older than the next edit's (the
controller writes the config's own status after an edit, so the version it
read may be that one). From the audit log: every child created once, one Job
per run. From the API: every run converges.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlparse

import pytest
from kubernetes_asyncio import client

from hack.invariants import Ledger, Run, children_once, count_by_verb, report
from tests.faults.conftest import OK, World, log_excerpt, phases, start_in_thread, through
from tests.integration.tcpproxy import TcpProxy
from tests.kubehelpers import eventually
from tests.runs import inference_run

# Whether the runs informer comes back first is a coin toss per round: eight rounds
# make a run without a stale contract on the old code unlikely.
ROUNDS = 8
CONFIGS = ("alpha", "beta", "gamma")
RUNS_PER_CONFIG = 2
CONFIG_GENERATION = "ai.krateo.io/config-generation"
CONFIG_RESOURCE_VERSION = "ai.krateo.io/config-resource-version"


def _model(config: str, round_: int) -> str:
    """The model name a config has after its edit of round ``round_``."""
    return f"{config}-model-r{round_}"


@pytest.mark.timeout(600)
async def test_runs_created_during_a_partition_get_the_edited_config(world: World) -> None:
    cluster, namespace, timeline, runs = world.cluster, world.namespace, world.timeline, world.runs
    api = urlparse(cluster.server)
    proxy = TcpProxy(api.hostname or "127.0.0.1", api.port or 443)
    await proxy.start()
    core = client.CoreV1Api(world.api)
    ledger = Ledger()
    # run name -> (config, round, the edit's (resourceVersion, generation))
    made_in: dict[str, tuple[str, int, tuple[int, int]]] = {}
    # (config, round) -> resourceVersion of the edit of that round
    edits: dict[tuple[str, int], int] = {}
    proc = world.controller()
    await world.configs(**dict.fromkeys(CONFIGS, OK))
    through(proc.kubeconfig, f"https://127.0.0.1:{proxy.port}")
    violations: list[str] = []
    try:
        await start_in_thread(proc)
        timeline.note("controller ready behind the proxy")
        for round_ in range(1, ROUNDS + 1):
            proxy.cut()
            timeline.note(f"round {round_}: link cut")
            for config in CONFIGS:
                patch = {"spec": {"kserve": {"modelName": _model(config, round_)}}}
                edited = await runs.patch(config, patch, "inferenceconfigs")
                meta = edited["metadata"]
                edits[(config, round_)] = int(meta["resourceVersion"])
                for i in range(RUNS_PER_CONFIG):
                    name = f"r{round_}-{config}-{i}"
                    # Every other run suspended: its Job and ConfigMap are made the
                    # same way, with no pod to run on the shared machine.
                    suspend = i % 2 == 1
                    run = ledger.add(
                        await runs.create(inference_run(name, config, suspend=suspend)),
                        "Suspended" if suspend else "Succeeded",
                    )
                    made_in[run.name] = (
                        config,
                        round_,
                        (int(meta["resourceVersion"]), int(meta["generation"])),
                    )
            timeline.note(f"round {round_}: configs edited, runs created")
            await asyncio.sleep(world.rng.uniform(2.0, 6.0))
            proxy.restore()
            timeline.note(f"round {round_}: link back")
            this_round = [r for r in ledger if made_in[r.name][1] == round_]
            await _children_exist(world, this_round)
            timeline.note(f"round {round_}: every run of the round has its ConfigMap and Job")
        await world.converged(ledger, timeline, violations, within=180, step_by_step=True)
    finally:
        code = await asyncio.to_thread(proc.stop)  # the proxy lives on this loop
        await proxy.stop()

    current = await phases(world.api, namespace)
    checked = 0
    for run in ledger:
        config, round_, (edit_rv, generation) = made_in[run.name]
        next_edit = edits.get((config, round_ + 1))
        cm = await core.read_namespaced_config_map(run.child, namespace)
        contract = json.loads(cm.data["contract.json"])
        model = contract["kserve"].get("modelName")
        if model != _model(config, round_):
            violations.append(
                f"{run.name}: contract from a stale config: modelName {model!r}, "
                f"want {_model(config, round_)!r} (config {config} edited in round {round_})"
            )
        annotations = cm.metadata.annotations or {}
        used_rv, used_generation = (
            annotations.get(CONFIG_RESOURCE_VERSION),
            annotations.get(CONFIG_GENERATION),
        )
        if used_generation != str(generation) or used_rv is None:
            violations.append(
                f"{run.name}: ConfigMap says config generation {used_generation!r} "
                f"resourceVersion {used_rv!r}, want generation {generation}"
            )
        elif int(used_rv) < edit_rv or (next_edit is not None and int(used_rv) >= next_edit):
            violations.append(
                f"{run.name}: ConfigMap says config resourceVersion {used_rv}, not one of "
                f"the config between its edit ({edit_rv}) and the next ({next_edit})"
            )
        st = (current.get(run.name) or {}).get("status") or {}
        if (st.get("configResourceVersion"), st.get("configGeneration")) != (
            used_rv,
            generation,
        ):
            violations.append(
                f"{run.name}: status says config {st.get('configResourceVersion')!r}/"
                f"{st.get('configGeneration')!r}, its ConfigMap {used_rv!r}/{used_generation!r}"
            )
        checked += 1
    assert checked == ROUNDS * len(CONFIGS) * RUNS_PER_CONFIG  # no vacuous pass

    requests = world.audit.requests()
    user = world.user
    mine = [r for r in requests if r.user == user]
    assert mine, "the audit log shows no request of the controller: nothing was checked"
    violations += children_once(requests, user, ledger)
    if code != 0:
        violations.append(f"the controller exited {code} on SIGTERM")
    config_reads = sum(
        1 for r in mine if r.verb == "get" and r.resource == "inferenceconfigs" and r.ok
    )
    context = [
        *timeline.lines,
        f"controller requests: {count_by_verb(requests, user)}",
        f"live reads of configs: {config_reads}",
        *log_excerpt(proc, "config moved", "config is gone", '"level":"error"', limit=30),
    ]
    print("\n".join(context))  # shown with -s, and with a failure
    assert not violations, report("partition while configs are edited", violations, context)


async def _children_exist(world: World, runs: list[Run]) -> None:
    """Wait for the ConfigMap and the Job of every run in ``runs``.

    A one-shot run's contract is fixed once its Job exists; until then a next
    round's edit may still (rightly) reach its ConfigMap.
    """
    core, batch = client.CoreV1Api(world.api), client.BatchV1Api(world.api)
    wanted = {run.child for run in runs}

    async def made() -> bool:
        configmaps = await core.list_namespaced_config_map(world.namespace)
        jobs = await batch.list_namespaced_job(world.namespace)
        return wanted <= {cm.metadata.name for cm in configmaps.items} and wanted <= {
            job.metadata.name for job in jobs.items
        }

    await eventually(made, within=90, what=f"the ConfigMaps and Jobs of {sorted(wanted)}")
