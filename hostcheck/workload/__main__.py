"""``python -m hostcheck.workload``: run the workload checks alone (for bring-up and for benchmarking the
checks themselves; ``python -m hostcheck`` runs them with everything else)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from hostcheck.argtypes import duration, seconds
from hostcheck.workload.api import (
    DEFAULT_SECTIONS,
    MultiNode,
    gather_workload,
    gpus_from_nvml,
    judge_workload,
)
from hostcheck.workload.runner import python_arg

ICON = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "skip", "error": "ERR "}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hostcheck.workload", description=__doc__)
    ap.add_argument(
        "--python", default=sys.executable, type=python_arg, help="the training Python (default: this one)"
    )
    ap.add_argument("--quick", action="store_true", help="run no workload (every check skipped)")
    ap.add_argument("--burn", type=duration, default=0.0, metavar="SECONDS", help="add a matmul stress run")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--timeout", type=seconds, default=180.0, help="hard limit for the probe process, s")
    ap.add_argument("--nnodes", help="multi-node DDP through torchrun (with --rdzv-endpoint)")
    ap.add_argument("--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous, the same on every node")
    ap.add_argument("--rdzv-id", default="hostcheck")
    ap.add_argument("--nproc-per-node", type=int)
    ap.add_argument("--sections", help=f"comma-separated subset of {','.join(DEFAULT_SECTIONS)}")
    ap.add_argument(
        "--section-args",
        help='JSON per section, e.g. \'{"matmul": {"n": 8192, "measure_s": 2}, "dataloader": {"images": 512}}\'',
    )
    ap.add_argument("--json", action="store_true", help="findings and raw records as JSON")
    a = ap.parse_args(argv)
    if bool(a.nnodes) != bool(a.rdzv_endpoint):
        ap.error("--nnodes and --rdzv-endpoint go together")
    mn = MultiNode(a.nnodes, a.rdzv_endpoint, a.nproc_per_node, a.rdzv_id) if a.nnodes else None
    t0 = time.monotonic()
    gpus = [] if a.quick else gpus_from_nvml()
    sections = tuple(x.strip() for x in a.sections.split(",")) if a.sections else DEFAULT_SECTIONS
    unknown = set(sections) - set(DEFAULT_SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    run = gather_workload(
        a.python,
        quick=a.quick,
        burn=a.burn,
        timeout=a.timeout,
        device=a.device,
        multinode=mn,
        sections=sections,
        section_args=json.loads(a.section_args) if a.section_args else None,
    )
    findings = judge_workload(run, gpus)
    wall = time.monotonic() - t0
    if a.json:
        print(
            json.dumps(
                {
                    "wall_s": round(wall, 3),
                    "gpus": [g.__dict__ for g in gpus],
                    "findings": [f.to_dict() for f in findings],
                    "run": run.to_dict(),
                },
                indent=1,
                default=str,
            )
        )
    else:
        for f in findings:
            print(f"{ICON[f.status]}  {f.id}  {f.title}: {f.message}")
            for d in f.details:
                print(f"        {d}")
            if f.hint:
                print(f"        hint: {f.hint}")
        timings = ", ".join(
            f"{r['probe']} {r['wall_s']:.1f} s"
            for r in (run.suite.records if run.suite else ())
            if "wall_s" in r
        )
        print(f"wall {wall:.1f} s ({timings})")
    return 1 if any(f.status in ("fail", "error") for f in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
