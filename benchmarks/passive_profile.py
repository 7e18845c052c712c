#!/usr/bin/env python3
"""How long does ``hostcheck check --profile passive`` take, as Slurm's HealthCheckProgram starts it, beside a bash
script doing LBNL NHC's basic checks (benchmarks/nhc_basic.sh), and what does it import?

slurmd starts its HealthCheckProgram as a fresh process every HealthCheckInterval and kills it after 60 s
(slurm.conf(5)); the passive profile's own deadline is 30 s. This starts the real command the way slurmd and
the gpunode-health timer do (a new interpreter each time, one line of output) and the bash script, interleaved,
``--runs`` times after one warm-up of each, and prints their medians, the ratio, and the passive run's 95th
percentile and worst time with the machine it ran on. Then one run under ``python -X importtime``: how many of
hostcheck's modules it loads, the costliest, and any module of a subcommand the passive run does not use.

hostcheck runs from its compiled modules, as an installed wheel does (pip compiles them): the benchmark gives the
interpreter a private bytecode folder (PYTHONPYCACHEPREFIX) that the warm-up fills, whatever
PYTHONDONTWRITEBYTECODE says in the calling shell.

    python3 benchmarks/passive_profile.py [--runs 30] [--config FILE] [--json out.json] [--root CHECKOUT]

``--root``: another checkout's hostcheck to run (an older commit, to compare on the same machine and load).

Exit 1 when the worst run took more than half the profile's deadline or the median ratio is above the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from machine import describe

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from hostcheck.profiles import PROFILES  # noqa: E402

SCRIPT = os.path.join(HERE, "nhc_basic.sh")
#: LBNL NHC costs about 4.4 times the bash script (it parses its ~4,900 lines of bash on every run); the passive
#: profile's goal is at most twice NHC.
GOAL_RATIO = 9.0
#: The subcommands a passive run has no use for (hostcheck/command.py loads only the one a line names).
UNUSED = ("bench", "fleet", "job", "baseline")


def once(argv: list[str], env: dict[str, str]) -> tuple[float, int, str, str, float]:
    """(wall seconds, exit code, stdout, stderr, CPU seconds of the process and what it waited for). It runs in
    the bytecode folder: ``python -m`` puts the working folder first on sys.path, before PYTHONPATH, and a
    checkout as the working folder would be run whatever --root says."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=120, cwd=env["PYTHONPYCACHEPREFIX"]
    )
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return wall, p.returncode, p.stdout.strip(), p.stderr, cpu


def imports(stderr: str) -> list[tuple[str, int]]:
    """(module, cumulative microseconds) from ``python -X importtime`` output."""
    out = []
    for line in stderr.splitlines():
        parts = line[len("import time:") :].split("|") if line.startswith("import time:") else []
        if len(parts) == 3 and parts[1].strip().isdigit():
            out.append((parts[2].strip(), int(parts[1])))
    return out


def pct(times: list[float], q: float) -> float:
    return times[min(len(times) - 1, round(q * (len(times) - 1)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--config", help="a hostcheck.toml to run with")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--root", default=ROOT, help="the checkout whose hostcheck runs (default: this one)")
    a = ap.parse_args(argv)
    cmd = [sys.executable, "-m", "hostcheck", "check", "--profile", "passive", "--summary"]
    if a.config:
        cmd += ["--config", a.config]
    with tempfile.TemporaryDirectory(prefix="hostcheck-bench-pyc-") as pyc:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=os.path.abspath(a.root), PYTHONPYCACHEPREFIX=pyc)
        # Warm-up: the page cache holds the interpreter, the tools and hostcheck's modules, compiled, as on a node.
        once(cmd, env), once(["bash", SCRIPT], env)
        runs, script = [], []
        for _ in range(max(1, a.runs)):
            runs.append(once(cmd, env))
            script.append(once(["bash", SCRIPT], env))
        _, _, _, stderr, _ = once([sys.executable, "-X", "importtime", *cmd[1:]], env)
    times = sorted(t for t, _, _, _, _ in runs)
    base = sorted(t for t, _, _, _, _ in script)
    loaded = imports(stderr)
    ours = sorted(((m, us) for m, us in loaded if m.split(".")[0] == "hostcheck"), key=lambda x: -x[1])
    unused = sorted({m for m, _ in ours if m.split(".")[1:2] and m.split(".")[1] in UNUSED})
    deadline = PROFILES["passive"].deadline_s
    ratio = statistics.median(times) / statistics.median(base)
    cpu = statistics.median(c for *_, c in runs)
    cpu_base = statistics.median(c for *_, c in script)
    out = {
        "machine": describe(),
        "root": os.path.abspath(a.root),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "runs": len(times),
        "median_s": round(statistics.median(times), 3),
        "p95_s": round(pct(times, 0.95), 3),
        "max_s": round(times[-1], 3),
        "script_median_s": round(statistics.median(base), 4),
        "ratio": round(ratio, 1),
        # CPU time moves less with the load beside the benchmark than wall time does.
        "cpu_median_s": round(cpu, 3),
        "script_cpu_median_s": round(cpu_base, 4),
        "cpu_ratio": round(cpu / cpu_base, 1) if cpu_base else None,
        "goal_ratio": GOAL_RATIO,
        "deadline_s": deadline,
        "exit_codes": sorted({rc for _, rc, _, _, _ in runs}),
        "last_line": runs[-1][2],
        "script_line": script[-1][2],
        "modules_imported": len(loaded),
        "hostcheck_modules": len(ours),
        "import_s": round(max((us for m, us in loaded if m in ("hostcheck.command",)), default=0) / 1e6, 3),
        "costliest_imports": [[m, round(us / 1000, 1)] for m, us in ours[:8]],
        "unused_subcommands_imported": unused,
    }
    print(
        f"passive profile beside LBNL NHC's basic checks in bash, {out['runs']} runs each, interleaved, on "
        f"{out['machine']} (load {' '.join(map(str, out['load_average']))})\n"
        f"  hostcheck --profile passive: median {out['median_s'] * 1000:.0f} ms, p95 {out['p95_s'] * 1000:.0f} ms, "
        f"worst {out['max_s'] * 1000:.0f} ms (deadline {deadline:g} s; slurmd's limit 60 s)\n"
        f"  benchmarks/nhc_basic.sh:     median {out['script_median_s'] * 1000:.1f} ms\n"
        f"  ratio {out['ratio']:.1f}x (goal: at most {GOAL_RATIO:g}x, twice NHC's 4.4x); CPU time "
        f"{out['cpu_median_s'] * 1000:.0f} ms against {out['script_cpu_median_s'] * 1000:.1f} ms: {out['cpu_ratio']}x\n"
        f"  python -X importtime: {out['modules_imported']} modules, {out['hostcheck_modules']} of hostcheck; "
        f"costliest (cumulative ms): {', '.join(f'{m} {ms}' for m, ms in out['costliest_imports'])}\n"
        f"  subcommands imported that a passive run does not use: {', '.join(unused) or 'none'}\n"
        f"  exit codes {out['exit_codes']}; last output: {out['last_line']}\n"
        f"  script: {out['script_line']}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if times[-1] <= deadline / 2 and ratio <= GOAL_RATIO and not unused else 1


if __name__ == "__main__":
    sys.exit(main())
