"""What ``make cluster`` tells a newcomer to do next, done literally on the local
control plane: the CRDs, a namespace, the controller, ``kubectl infer``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from hack.cluster import REPO, LocalCluster, free_port, next_steps
from hack.polling import wait_for


def test_make_clusters_next_steps_give_a_working_controller(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    text = next_steps(cluster.kubeconfig, cluster.bin_dir)
    # Each indented line is a command, maybe with a `# comment` after it.
    commands = [
        line.split("  # ")[0].strip() for line in text.splitlines() if line.startswith("  ")
    ]
    assert len(commands) >= 5, text
    *setup, controller, infer = commands
    log = tmp_path / "controller.log"
    # The last command is retried for a few seconds: right after a CRD is Established
    # the API server may still answer 503 "storage is (re)initializing" (kubectl too).
    retried = f"for i in $(seq 20); do {infer} && break; sleep 1; done; {infer}"
    script = "\n".join(
        ["set -e", *setup, f"({controller}) > {log} 2>&1 &", f"echo $! > {tmp_path}/pid", retried]
    )
    # Free ports: the machine may run other controllers on the default ones.
    env = {**os.environ, "HEALTH_PORT": str(free_port()), "METRICS_PORT": str(free_port())}
    done = subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        start_new_session=True,
    )  # fmt: skip
    assert (tmp_path / "pid").exists(), done  # the script got as far as the controller
    pid = int((tmp_path / "pid").read_text())
    try:
        assert done.returncode == 0, done
        submitted = subprocess.run(
            [str(Path(sys.executable).parent / "kubectl-infer"), "-n", "demo", "submit",
             "nothing-yet", "--name", "r1", "--no-wait-for-config"],
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted

        def reason() -> str | None:
            got = subprocess.run(
                [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}",
                 "get", "infrun", "r1", "-n", "demo", "-o", "json"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if got.returncode:
                return None
            return (json.loads(got.stdout).get("status") or {}).get("reason") or None

        # Only the controller writes a status: it runs, and reconciles the run.
        seen = wait_for(reason, within=120, what=f"the controller to reconcile r1 ({log})")
        # Its config does not exist: waited for a few seconds, then ConfigNotFound.
        assert seen in ("WaitingForConfig", "ConfigNotFound"), log.read_text()[-2000:]
    finally:
        # The script ran in a session of its own: its process group is the controller's.
        with contextlib.suppress(ProcessLookupError):
            group = os.getpgid(pid)
            os.killpg(group, signal.SIGTERM)
            wait_for(lambda: not _alive(pid), within=30, what="the controller to stop")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
