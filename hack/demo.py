"""``make demo``: the system end to end on a local control plane.

For now (foundation) it starts the control plane and the node agent, applies a
Job whose pod runs as a local process, and shows it complete. The end-to-end
issue turns this into the full inference demo.
"""

from __future__ import annotations

import argparse
import sys
import time

from hack.cluster import running_cluster

DEMO_JOB = """
apiVersion: batch/v1
kind: Job
metadata: {name: hello}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: hello
        image: busybox
        command:
        - sh
        - -c
        - echo "hello from pod $HOSTNAME"; printf done > "$NODE_AGENT_ROOT/dev/termination-log"
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.demo")
    parser.add_argument("--keep", action="store_true", help="keep the cluster running until Ctrl-C")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with running_cluster() as cluster:
        print(f"control plane up in {time.monotonic() - started:.1f}s at {cluster.server}")
        cluster.kubectl("apply", "-f", "-", input=DEMO_JOB)
        cluster.kubectl("wait", "--for=condition=Complete", "job/hello", "--timeout=60s")
        print(cluster.kubectl("get", "jobs,pods", "-o", "wide").stdout)
        print(cluster.kubectl("logs", "job/hello").stdout)
        if args.keep:
            print(f"export KUBECONFIG={cluster.kubeconfig}  (Ctrl-C to stop)", flush=True)
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
    print(f"demo finished in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
