#!/usr/bin/env python3
"""What a sweep of N nodes costs rank 0: its rounds, the judging's wall time and peak memory, and the report's size.

For each N it builds the record a sweep of N one-GPU nodes would produce (tests/unit/fixtures/sweep_sim.py: the
real schedule and retest, one node's NIC planted at 40%), then times hostcheck.sweep.judge on it and the report's
JSON, and takes tracemalloc's peak for the two on a second pass (the memory rank 0's hostcheck needs beyond its
interpreter and the record it read). The time of the measurement itself is docs/sweep.md's estimate from the
message sizes; this measures what happens after.

    python3 benchmarks/sweep_scale.py [--nodes 8 64 1024 16384] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc

from machine import describe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "unit", "fixtures")]

from sweep_sim import Cluster  # noqa: E402

from hostcheck.inside import sweep_plan as plan  # noqa: E402
from hostcheck.sweep.judge import judge  # noqa: E402
from hostcheck.sweep.render import build_report, render_json  # noqa: E402


def measure(n: int) -> dict:
    record = Cluster(n, seed=1, noise=0.02, slow_nic={n // 2 + 1: 0.4}).record()
    raw = len(json.dumps(record))
    meta = {"time": "", "launcher": "slurm", "master": "", "duration_s": 0.0}
    t0 = time.perf_counter()
    j = judge(record, plan.Rules())
    text = render_json(build_report(record, j, meta))
    took = time.perf_counter() - t0
    # Memory on a second pass: tracemalloc slows the code it traces tenfold.
    tracemalloc.start()
    render_json(build_report(record, judge(record, plan.Rules()), meta))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "nodes": n,
        "mode": record["mode"],
        "rounds": record["rounds"],
        "pairs_measured": len(record["pairs"]),
        "named": [f.nodes for f in j.suspects],
        "judge_s": round(took, 3),
        "peak_mib": round(peak / 2**20, 1),
        "record_mib": round(raw / 2**20, 2),
        "report_mib": round(len(text) / 2**20, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 1024, 16384])
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    print(describe())
    rows = [measure(n) for n in args.nodes]
    for r in rows:
        print(
            f"{r['nodes']:>6} nodes ({r['mode']}): rounds {r['rounds']}, {r['pairs_measured']} pairs measured, "
            f"named {r['named']}; judge + report {r['judge_s']} s, peak {r['peak_mib']} MiB, "
            f"record {r['record_mib']} MiB, report {r['report_mib']} MiB"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": describe(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
