"""Fuzzed specs at scale: 10,000 Hypothesis examples through the real API server.

    .venv/bin/python -m bench.fuzz [--examples 10000] [--seed N]

The same cases, engine and properties as ``tests/faults/test_fuzz.py`` (see
``hack/fuzz.py``), on a fresh local control plane with the
controller as the test runs it (``python -m controller`` under the chart's
RBAC, ``MAX_RECONCILE_RATE=2``, ``POLLING_INTERVAL=30s``, default client QPS).
Prints Markdown: what was accepted and refused, the first status each run
showed, time to that status, the controller's requests (total, per minute, per
case, from the audit log) and every property failure class with its minimal
example.

The per-case request budget grows with the length of the run: a write the API
server keeps refusing is retried at every 30 s resync, so a failing case may
add two requests a minute without being a hot loop.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from hack.cluster import Api, running_cluster
from hack.controllerproc import controller_for, controller_user
from hack.fuzz import FuzzEngine, FuzzReport, run_fuzz

NAMESPACE = "fuzz"


def markdown(report: FuzzReport, args: argparse.Namespace, seconds: float) -> str:
    s = report.summary
    a = report.audit
    lines = [
        f"`.venv/bin/python -m bench.fuzz --examples {args.examples} --seed {report.seed}`"
        f" - {seconds / 60:.1f} min",
        "",
        "| | count |",
        "|---|---|",
        f"| examples (config + run each, or a run alone) | {s['examples']} |",
        f"| configs accepted / refused | {s['configs_accepted']} / {s['configs_refused']} |",
        f"| runs accepted / refused | {s['runs_accepted']} / {s['runs_refused']} |",
    ]
    if s["time_to_status"]:
        lines.append(
            f"| time to first status p50 / p95 / max | {s['time_to_status_p50']:.2f} s / "
            f"{s['time_to_status_p95']:.2f} s / {s['time_to_status_max']:.2f} s |"
        )
    lines += [
        f"| controller requests | {a.total} in {a.minutes:.1f} min |",
        f"| controller requests per minute, mean / peak minute | "
        f"{a.total / a.minutes:.0f} / {a.per_minute_peak} |",
        f"| requests per case, max (budget) | {a.per_case_max} ({report.budget_per_case}) |",
        f"| requests about no case | {a.unattributed} |",
        "",
        "| first status (phase/reason) | runs |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in s["first_status"].most_common()]
    lines += ["", "| refusals (HTTP status, reason) | objects |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in s["refusals"].most_common()]
    lines += ["", "| field named by the refusal (top 20) | objects |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in s["refusal_fields"].most_common(20)]
    lines += ["", "| controller request | count |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in sorted(a.by_verb.items())]
    lines += ["", f"Property failures: {len(report.problems)}"]
    lines += [f"- {p}" for p in report.problems]
    lines += ["", "```", report.text(), "```"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz")
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--max-classes", type=int, default=12)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ksc-bench-fuzz-") as tmp, running_cluster() as cluster:
        cluster.kubectl("create", "namespace", NAMESPACE)
        controller = controller_for(cluster, NAMESPACE, Path(tmp))
        controller.start()
        proc = controller.proc
        assert proc is not None
        try:
            engine = FuzzEngine(
                Api(cluster.server, cluster.token_for("admin"), cluster.ca_path),
                NAMESPACE,
                alive=lambda: proc.poll() is None,
                log=controller.output,
                audit_log=cluster.audit_log,
                controller_user=controller_user(NAMESPACE),
            )
            # 6 cases a second at best (the controller's client QPS): the run's length
            # in minutes is about examples / 360; two resync retries a minute each.
            budget = 40 + 2 * (args.examples // 360 + 5)
            report = run_fuzz(
                engine,
                args.examples,
                seed,
                budget_per_case=budget,
                unattributed_budget=40,
                unattributed_per_minute=8,  # as tests/faults/test_fuzz.py explains
                max_classes=args.max_classes,
            )
        finally:
            code = controller.stop()
        print(markdown(report, args, time.monotonic() - started))
        print(f"controller exit code on SIGTERM: {code}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
