"""This node's ranks: one per GPU (NCCL) or one for the node (gloo), started in the training Python through the one
launcher (hostcheck.child.launch: a session each, killed with their groups at the deadline, on a signal, and by
the reaper should hostcheck die), and what each said (hostcheck.inside.sweep prints one record line per rank).

The message sizes and time slices are the backend's (docs/sweep.md gives the rounds and the time they take)."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hostcheck.child.launch import ProbeRun, child_env, inside_argv, run_children
from hostcheck.inside import sweep_plan as plan
from hostcheck.sweep.contract import Contract

MIB = 1 << 20
#: What each rank moves and computes, by backend. GPU: 256 MiB messages reach the plateau of a 400 Gb/s link
#: (about 5 ms per exchange) and a bf16 matmul of 8192 keeps an H100 busy; CPU (gloo): the code path, a core's
#: matmul and messages a container's link moves in milliseconds.
SIZES = {
    "nccl": {"pair_bytes": 256 * MIB, "allreduce_bytes": 256 * MIB, "matmul_n": 8192, "latency_bytes": 4},
    "gloo": {"pair_bytes": 4 * MIB, "allreduce_bytes": 4 * MIB, "matmul_n": 512, "latency_bytes": 4},
}
#: Time slices (seconds) and counts: a compute batch is longer than the CPU scheduler's 100 ms period, so a CPU
#: quota below what the rank uses (one thread on gloo: OMP_NUM_THREADS=1) shows in every batch; each figure is
#: the best of its ops (hostcheck.inside.sweep: what else runs only slows an op), so CPU nodes, whose links and
#: cores other work shares, get more ops to take the best of.
TIMING = {
    "nccl": {
        "warm_s": 0.5,
        "batch_s": 0.05,
        "compute_s": 1.0,
        "pair_s": 0.2,
        "allreduce_s": 0.3,
        "latency_iters": 50,
        "max_iters": 20,
    },
    "gloo": {
        "warm_s": 0.5,
        "batch_s": 0.25,
        "compute_s": 3.0,
        "pair_s": 1.0,
        "allreduce_s": 0.5,
        "latency_iters": 50,
        "max_iters": 50,
    },
}
#: A pair or all_reduce round at most (a slow link stretches it; the op timeout bounds it), for the child's limit.
ROUND_S = 5.0
RETEST_ROUNDS_MAX = 8
FAULT_VAR = "HOSTCHECK_SWEEP_TEST_FAULT"
_NVIDIA_DEV = re.compile(r"nvidia[0-9]+")


def local_gpus(device: str, env: Mapping[str, str], dev: str = "/dev") -> int:
    """How many GPU ranks this node runs: none with ``cpu``; else CUDA_VISIBLE_DEVICES's entries where it is set,
    or the /dev/nvidiaN devices."""
    if device == "cpu":
        return 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        items = [x for x in visible.split(",") if x.strip()]
        return 0 if not items or items[0].strip().startswith("-") else len(items)
    try:
        return sum(1 for name in os.listdir(dev) if _NVIDIA_DEV.fullmatch(name))
    except OSError:
        return 0


@dataclass(frozen=True)
class Layout:
    """What this node's ranks are given: the backend, the sizes, the schedule's bounds and the hard limit."""

    backend: str
    gpus: int
    sizes: dict[str, int]
    timing: dict[str, float]
    join_timeout_s: float
    op_timeout_s: float
    limit_s: float


def layout(
    contract: Contract,
    gpus: int,
    join_s: float,
    op_s: float,
    all_pairs_max: int,
    message_bytes: int | None,
    limit_s: float | None,
) -> Layout:
    backend = "nccl" if gpus else "gloo"
    sizes = dict(SIZES[backend])
    if message_bytes:
        sizes["pair_bytes"] = sizes["allreduce_bytes"] = int(message_bytes)
    timing = dict(TIMING[backend])
    sched = plan.schedule(contract.world, all_pairs_max)
    rounds = sum(sched.rounds.values()) + RETEST_ROUNDS_MAX
    compute = timing["warm_s"] + timing["compute_s"] + 10 * timing["batch_s"]
    # Join, init, every round at its longest, the collections of results, each bounded by the op timeout.
    worst = join_s + 4 * op_s + compute + rounds * ROUND_S + 60.0
    return Layout(backend, gpus, sizes, timing, join_s, op_s, limit_s or worst)


def worker_args(
    contract: Contract,
    lay: Layout,
    local: int,
    all_pairs_max: int,
    rules: plan.Rules,
    fault: dict[str, float],
    slurm_node: str,
) -> dict[str, Any]:
    return {
        "node": contract.rank,
        "nodes": contract.world,
        "local": local,
        "gpus": lay.gpus,
        "backend": lay.backend,
        "master_addr": contract.master_addr,
        "master_port": contract.master_port,
        "run_id": contract.run_id,
        "agent_store": contract.agent_store,
        "expected_hosts": list(contract.hosts),
        "host": socket.gethostname(),
        "slurm_node": slurm_node,
        "join_timeout_s": lay.join_timeout_s,
        "op_timeout_s": lay.op_timeout_s,
        "sizes": lay.sizes,
        "timing": lay.timing,
        "all_pairs_max": all_pairs_max,
        "retest_rounds_max": RETEST_ROUNDS_MAX,
        "rules": rules.to_dict(),
        "fault": fault,
    }


def start(python: str, args: list[dict[str, Any]], env: dict[str, str], limit_s: float) -> list[ProbeRun]:
    """Run this node's ranks to their end (or ``limit_s``); what each said."""
    argvs = [inside_argv(python, "sweep", "--json-args", json.dumps(a)) for a in args]
    envs = []
    for a in args:
        e = child_env(env)
        if a["backend"] == "gloo":
            e.setdefault("OMP_NUM_THREADS", "1")
        envs.append(e)
    # A failed rank leaves its peers in a collective that ends at the op timeout: they get that long.
    grace = float(args[0]["op_timeout_s"]) + 30.0
    return run_children(argvs, limit_s, name="sweep", envs=envs, grace_after_failure=grace)
