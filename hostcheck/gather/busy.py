"""Is the node busy? Another process on a GPU, or a Slurm job on the node, means no workload run.

A GPU job beside someone else's training would measure their contention as a slow GPU, and would slow them
down. The answer comes from what is already gathered (NVML's process lists) and /proc (a Slurm job step runs
under a ``slurmstepd: [JOBID.STEP]`` process on its node), so asking costs no GPU call.
"""

from __future__ import annotations

import os
import re
from typing import Any

from hostcheck import infile
from hostcheck.gather.base import Unavailable, list_dir, parse_int

_STEPD = re.compile(rb"^slurmstepd: \[(\d+)(?:[._]\S*)?\]")


def gpu_holders(nvml: Any) -> list[str]:
    """``GPU 3: python[1234]`` for every process NVML lists on a GPU (none when NVML was not read)."""
    out = []
    for g in getattr(nvml, "gpus", ()) or ():
        procs = getattr(g, "processes", ())
        if not isinstance(procs, (tuple, list)):
            continue  # an Unavailable process list: nothing known
        out += [f"GPU {g.index}: {p.name}[{p.pid}]" for p in procs if p.pid != os.getpid()]
    return out


def slurm_jobs(proc_root: str = "/proc", own_job: str | None = None) -> list[str]:
    """Job ids with a slurmstepd on this node, but ``own_job`` (the job whose prolog runs us). ``proc_root`` is
    the host root's proc (a checker in a container sees the host's tasks there): read through the one bounded
    reader, a task folder that is a link is not followed."""
    jobs: set[str] = set()
    entries = list_dir(proc_root)
    if isinstance(entries, Unavailable):
        return []
    for pid in entries:
        task = os.path.join(proc_root, pid)
        if parse_int(pid) is None or os.path.islink(task):
            continue
        try:
            cmd = infile.read_bytes(os.path.join(task, "cmdline"), 256, follow=False, truncate=True)
        except infile.ReadError:
            continue
        m = _STEPD.match(cmd)
        if m and m.group(1).decode() != own_job:
            jobs.add(m.group(1).decode())
    return sorted(jobs, key=int)


def busy_reason(nvml: Any, proc_root: str = "/proc", environ: dict | None = None) -> str | None:
    """Why the workload must not run now, or None (``proc_root``: the host root's proc)."""
    env = os.environ if environ is None else environ
    holders = gpu_holders(nvml)
    if holders:
        more = f" (+{len(holders) - 2} more)" if len(holders) > 2 else ""
        return f"a GPU is in use: {', '.join(holders[:2])}{more}"
    jobs = slurm_jobs(proc_root, env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))
    if jobs:
        return f"Slurm job{'s' if len(jobs) > 1 else ''} {', '.join(jobs[:3])} running on this node"
    return None
