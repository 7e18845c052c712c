#!/usr/bin/env python3
"""How much memory and time does ``hostcheck check --profile passive`` take when a tool floods it, or when the
node has 1,000 RDMA devices?

Every external program hostcheck runs is read through one bounded runner (hostcheck.gather.base.Tool: at most
OUTPUT_CAP bytes, then the tool is stopped; a log keeps its last OUTPUT_CAP bytes), so a tool that prints 1 GB
should cost hostcheck about that cap, not the gigabyte. This runs the real command as slurmd's HealthCheckProgram
does (a fresh interpreter, ``--summary``), once per scenario, and reports hostcheck's own peak RSS (its VmHWM, read
from /proc while it runs: the high-water mark of its own memory, which ru_maxrss is not, since Linux carries the
parent's over fork and exec; the fake tools' memory is theirs, not counted) and its wall time:

- ``plain``: the node as it is;
- ``nvidia-smi-1gb``: nvidia-smi prints 1 GB (the interpreter runs with ``-S``: no nvidia-ml-py, so the
  nvidia-smi fallback reads it);
- ``journalctl-1gb``: journalctl prints 1 GB of kernel-log lines (the one log kept as its last part, cut);
- ``rdma-1000``: ``--host-root`` is a tree with 1,000 RDMA devices (one ACTIVE port each, twelve error counters).

    python3 benchmarks/passive_memory.py [--json out.json]

Exit 1 when a flooded run's peak RSS is more than FLOOD_ROOM_MIB above the plain run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from machine import describe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hostcheck.gather.base import OUTPUT_CAP  # noqa: E402
from hostcheck.gather.rdma import ERROR_COUNTERS  # noqa: E402

#: What a flood may add to the plain run's peak: the cap, its text, and slack for the allocator.
FLOOD_ROOM_MIB = 64
GIGABYTE = "#!/bin/sh\nexec head -c 1000000000 /dev/zero\n"
LOG_GIGABYTE = (
    "#!/bin/sh\nyes '2026-01-01T00:00:00+0000 node kernel: a kernel message' | head -c 1000000000\n"
)


def _hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(ln.split()[1] for ln in f if ln.startswith("VmHWM:")))
    except (OSError, StopIteration, ValueError):
        return None  # gone, or a zombie (no memory left to read)


def measured(argv: list[str], env: dict[str, str]) -> dict:
    """Run ``argv`` and follow its own high-water mark (VmHWM) every 20 ms until it exits."""
    t0 = time.perf_counter()
    peak = 0
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        while p.poll() is None:
            peak = max(peak, _hwm_kib(p.pid) or 0)
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        said = (out.read() or err.read()).decode(errors="replace").strip().splitlines()
    return {
        "peak_rss_mib": round(peak / 1024, 1),
        "wall_s": round(wall, 2),
        "exit_code": p.returncode,
        "last_line": said[-1][:200] if said else "",
    }


def rdma_tree(root: str, devices: int) -> str:
    for i in range(devices):
        dev = os.path.join(root, f"sys/class/infiniband/mlx5_{i}")
        port = os.path.join(dev, "ports/1")
        os.makedirs(os.path.join(port, "counters"))
        os.makedirs(os.path.join(dev, "device"))
        for name, text in (
            ("state", "4: ACTIVE\n"),
            ("phys_state", "5: LinkUp\n"),
            ("rate", "400 Gb/sec (4X NDR)\n"),
            ("link_layer", "InfiniBand\n"),
        ):
            with open(os.path.join(port, name), "w") as f:
                f.write(text)
        for counter in ERROR_COUNTERS:
            with open(os.path.join(port, "counters", counter), "w") as f:
                f.write("0\n")
        with open(os.path.join(dev, "device/numa_node"), "w") as f:
            f.write(f"{i % 2}\n")
    return root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    a = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="hostcheck-bench-memory-")
    state = os.path.join(work, "state.json")
    base_cmd = ["check", "--profile", "passive", "--summary", "--state-file", state]
    env = {**os.environ, "PYTHONPATH": ROOT}
    bins = {}
    for name, body in (("nvidia-smi", GIGABYTE), ("journalctl", LOG_GIGABYTE)):
        d = os.path.join(work, f"bin-{name}")
        os.makedirs(d)
        with open(os.path.join(d, name), "w") as f:
            f.write(body)
        os.chmod(os.path.join(d, name), 0o755)
        bins[name] = {**env, "PATH": d + os.pathsep + env.get("PATH", "")}
    scenarios = {
        "plain": ([sys.executable, "-S", "-m", "hostcheck", *base_cmd], env),
        "nvidia-smi-1gb": ([sys.executable, "-S", "-m", "hostcheck", *base_cmd], bins["nvidia-smi"]),
        "journalctl-1gb": ([sys.executable, "-S", "-m", "hostcheck", *base_cmd], bins["journalctl"]),
        "rdma-1000": (
            [
                sys.executable,
                "-S",
                "-m",
                "hostcheck",
                *base_cmd,
                "--host-root",
                rdma_tree(work + "/host", 1000),
            ],
            env,
        ),
    }
    measured(scenarios["plain"][0], env)  # warm-up: the page cache holds the interpreter and hostcheck
    figures = {name: measured(cmd, e) for name, (cmd, e) in scenarios.items()}
    out = {"machine": describe(), "output_cap_mib": OUTPUT_CAP >> 20, "scenarios": figures}
    print(f"passive profile, peak RSS and wall time on {out['machine']} (output cap {OUTPUT_CAP >> 20} MiB)")
    for name, f in figures.items():
        print(f"  {name:15} {f['peak_rss_mib']:7.1f} MiB {f['wall_s']:6.2f} s  exit {f['exit_code']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    plain = figures["plain"]["peak_rss_mib"]
    worst = max(f["peak_rss_mib"] for n, f in figures.items() if n.endswith("1gb"))
    return 0 if worst - plain <= FLOOD_ROOM_MIB else 1


if __name__ == "__main__":
    sys.exit(main())
