#!/usr/bin/env python3
"""How long does ``hostcheck check --profile passive`` take, as Slurm's HealthCheckProgram starts it?

slurmd starts its HealthCheckProgram as a fresh process every HealthCheckInterval and kills it after 60 s
(slurm.conf(5)); the passive profile's own deadline is 30 s. This starts the real command the way slurmd and
the gpunode-health timer do (a new interpreter each time, one line of output), ``--runs`` times after one
warm-up, and prints the median, 95th percentile and worst wall time with the machine it ran on.

    python3 benchmarks/passive_profile.py [--runs 30] [--config FILE] [--json out.json]

Exit 1 when the worst run took more than half the profile's deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from machine import describe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hostcheck.profiles import PROFILES  # noqa: E402


def once(argv: list[str]) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    return time.perf_counter() - t0, p.returncode, p.stdout.strip() or p.stderr.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--config", help="a hostcheck.toml to run with")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    a = ap.parse_args(argv)
    cmd = [sys.executable, "-m", "hostcheck", "check", "--profile", "passive", "--summary"]
    if a.config:
        cmd += ["--config", a.config]
    once(cmd)  # warm-up: the page cache holds the interpreter and hostcheck's modules, as on a node
    runs = [once(cmd) for _ in range(max(1, a.runs))]
    times = sorted(t for t, _, _ in runs)
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    deadline = PROFILES["passive"].deadline_s
    out = {
        "machine": describe(),
        "runs": len(times),
        "median_s": round(statistics.median(times), 3),
        "p95_s": round(p95, 3),
        "max_s": round(times[-1], 3),
        "deadline_s": deadline,
        "exit_codes": sorted({rc for _, rc, _ in runs}),
        "last_line": runs[-1][2],
    }
    print(
        f"passive profile, {out['runs']} runs on {out['machine']}\n"
        f"  median {out['median_s']:.2f} s, p95 {out['p95_s']:.2f} s, worst {out['max_s']:.2f} s "
        f"(deadline {deadline:g} s; slurmd's limit 60 s)\n"
        f"  exit codes {out['exit_codes']}; last output: {out['last_line']}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if times[-1] <= deadline / 2 else 1


if __name__ == "__main__":
    sys.exit(main())
