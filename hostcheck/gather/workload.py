"""The workload gatherer: runs the short GPU / AMP / DDP suite in child processes of the training Python.

``gather_workload`` launches the children through the one launcher (hostcheck.child.launch) and returns a
:class:`WorkloadRun`: their raw records and errors, unjudged. The checks in hostcheck.checks.workload judge it.
The code the children run is hostcheck.inside.workload, started the one way code starts in the training Python
(hostcheck.child.launch.inside_argv: the training venv need not have hostcheck).
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from hostcheck.child.launch import (
    ProbeRun,
    child_env,
    free_port,
    inside_argv,
    run_child,
    run_children,
)
from hostcheck.gather.gdr_write import SECONDS as GDR_SECONDS
from hostcheck.gather.gdr_write import SERVER_START_S, SLACK_S, GdrRun, gather_gdr_write
from hostcheck.gather.rdma_rate import gather_rdma_ports

#: The module of hostcheck.inside the children run.
PROBES = "workload"
DEFAULT_SECTIONS = (
    "env",
    "matmul",
    "bandwidth",
    "p2p",
    "amp",
    "dataloader",
    "ddp",
    "nic_loopback",
    "gdr_write",
)
#: Sections launched here rather than run in the suite's process.
LAUNCHED = ("nic_loopback", "gdr_write")
#: What the GPUDirect write runs may take at most (perftest's duration, the server's start, the client's slack).
GDR_LIMIT_S = GDR_SECONDS + SERVER_START_S + SLACK_S + 10.0
#: The all_reduce through the NICs on one node: NCCL may use neither peer-to-peer (NVLink, PCIe) nor shared
#: memory, so every byte goes out through an RDMA NIC and back, as Azure HPC health checks' IB loopback check runs
#: it (customTests/azure_nccl_allreduce_ib_loopback.nhc: -x NCCL_SHM_DISABLE=1 -x NCCL_P2P_DISABLE=1).
NIC_LOOPBACK_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
#: Without the NVIDIA control device no CUDA GPU can be used: the DDP check is gloo, known before the suite.
NVIDIA_CTL = "/dev/nvidiactl"
#: Slack over the sum of the children's own deadlines (process start-up) before the gatherer is cut.
GATHER_SLACK_S = 60.0


@dataclass(frozen=True)
class MultiNode:
    """A multi-node DDP check through torchrun's c10d rendezvous (run the same on every node)."""

    nnodes: str  # "2" or "2:4"
    rdzv_endpoint: str  # host:port
    nproc_per_node: int | None = None  # default: one per local GPU, or one gloo rank without a GPU
    rdzv_id: str = "hostcheck"
    timeout: float = 300.0


@dataclass(frozen=True)
class WorkloadRun:
    """Everything the child processes gave, unjudged."""

    python: str = ""
    suite: ProbeRun | None = None
    #: When the suite died (crash or timeout), the sections it never started, run again in a fresh process.
    suite_rest: ProbeRun | None = None
    #: "in-suite" (one GPU, NCCL in the suite's process), "nccl" (one process per GPU), "gloo" (no GPU,
    #: two CPU processes), "" (not run).
    ddp_mode: str = ""
    ddp: tuple[ProbeRun, ...] = ()
    multinode: tuple[ProbeRun, ...] = ()
    multinode_requested: bool = False
    burn: ProbeRun | None = None
    burn_requested: float = 0.0
    #: The all_reduce through the NICs (NIC_LOOPBACK_ENV), one run per rank; or why it was not run.
    nic_loopback: tuple[ProbeRun, ...] = ()
    nic_loopback_skipped: str = ""
    #: The RDMA ports it is judged against (hostcheck.gather.rdma_rate.NicPort.to_dict()).
    nic_ports: tuple[dict, ...] = ()
    #: GPUDirect RDMA write bandwidth per NIC (hostcheck.gather.gdr_write.GdrRun), when the section ran.
    gdr_write: GdrRun | None = None
    wall_s: float = 0.0
    #: The suite sections asked for (checks of the others are skipped).
    sections: tuple[str, ...] = DEFAULT_SECTIONS

    @cached_property
    def devices(self) -> tuple[DeviceFigures, ...]:
        """Each CUDA device's figures from the suite and the burn-in, parsed once (see device_figures)."""
        return device_figures(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "python": self.python,
            "suite": self.suite.to_dict() if self.suite else None,
            "suite_rest": self.suite_rest.to_dict() if self.suite_rest else None,
            "ddp_mode": self.ddp_mode,
            "ddp": [r.to_dict() for r in self.ddp],
            "multinode": [r.to_dict() for r in self.multinode],
            "burn": self.burn.to_dict() if self.burn else None,
            "nic_loopback": [r.to_dict() for r in self.nic_loopback],
            "nic_loopback_skipped": self.nic_loopback_skipped,
            "nic_ports": list(self.nic_ports),
            "gdr_write": self.gdr_write.to_dict() if self.gdr_write else None,
            "wall_s": round(self.wall_s, 3),
            "sections": list(self.sections),
        }


@dataclass(frozen=True)
class DeviceFigures:
    """One CUDA device's measured figures, in base units; a figure the records do not hold as a finite number
    is left out (a hostile or broken child's JSON never becomes a value)."""

    #: The suite's CUDA device index (the report maps it to NVML's through the PCI address).
    index: int
    #: The PCI address the env probe read for it, as the probe gave it; None when it read none.
    pci_bus_id: str | None = None
    #: Matmul throughput per dtype ("bf16", "fp16", "tf32", "fp32"), FLOP/s.
    matmul_flops_per_second: dict[str, float] = field(default_factory=dict)
    #: Copy bandwidth per kind ("h2d_pinned", "d2h_pageable", "device_copy"...), bytes/s.
    copy_bytes_per_second: dict[str, float] = field(default_factory=dict)
    #: The burn-in's figures: burn_median_flops_per_second, burn_min_flops_per_second, burn_result_mismatches.
    quantities: dict[str, float] = field(default_factory=dict)


def finite_number(v: Any, bools: bool = True, scale: float = 1) -> float | int | None:
    """``v * scale`` when ``v`` is a number (a bool as 0/1 where ``bools``) and the product a finite float, else
    None: Unavailable, None, text, NaN and an int beyond any float (a hostile child's JSON) are left out."""
    if isinstance(v, bool):
        v = int(v) if bools else None
    if not isinstance(v, (int, float)):
        return None
    try:
        scaled = v * scale if scale != 1 else v
        return scaled if math.isfinite(scaled) else None
    except OverflowError:
        return None


def _device_index(row: Any) -> int | None:
    v = row.get("index") if isinstance(row, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _suite_rows(run: WorkloadRun, name: str) -> list[dict]:
    """A suite section's per-device rows; CPU rows have no device index, so nothing there is a GPU's."""
    data, _ = suite_section(run, name)
    rows = data.get("gpus") if isinstance(data, dict) else None
    return [r for r in rows if _device_index(r) is not None] if isinstance(rows, list) else []


def _burn_rows(run: WorkloadRun) -> list[dict]:
    recs = run.burn.records if run.burn is not None else ()
    rec = next((x for x in reversed(recs) if x.get("probe") == "burn" and x.get("ok")), None)
    data = rec.get("data") if rec is not None else None
    rows = data.get("gpus") if isinstance(data, dict) else None
    return [r for r in rows if _device_index(r) is not None] if isinstance(rows, list) else []


#: (burn record key, quantity, scale to base units)
BURN_FIGURES = (
    ("tflops_median", "burn_median_flops_per_second", 1e12),
    ("tflops_min", "burn_min_flops_per_second", 1e12),
    ("mismatches", "burn_result_mismatches", 1),
)


def device_figures(run: WorkloadRun) -> tuple[DeviceFigures, ...]:
    """The suite's matmul and bandwidth rows and the burn-in's, per CUDA device, in base units."""
    parts: dict[int, dict[str, dict[str, float]]] = {}

    def slot(row: dict, part: str) -> dict[str, float]:
        return parts.setdefault(row["index"], {"quantities": {}, "matmul": {}, "copy": {}})[part]

    for row in _suite_rows(run, "matmul"):
        dtypes = row.get("dtypes")
        for dt, m in dtypes.items() if isinstance(dtypes, dict) else ():
            ok = isinstance(m, dict) and isinstance(dt, str)
            v = finite_number(m.get("tflops"), bools=False, scale=1e12) if ok else None
            if v is not None:
                slot(row, "matmul")[dt] = v
    for row in _suite_rows(run, "bandwidth"):
        for kind, m in row.items():
            ok = isinstance(m, dict) and isinstance(kind, str)
            v = finite_number(m.get("gbs"), bools=False, scale=1e9) if ok else None
            if v is not None:
                slot(row, "copy")[kind] = v
    for row in _burn_rows(run):
        for key, name, scale in BURN_FIGURES:
            v = finite_number(row.get(key), bools=False, scale=scale)
            if v is not None:
                slot(row, "quantities")[name] = v
    buses = {r["index"]: r.get("pci_bus_id") for r in _suite_rows(run, "env")}
    return tuple(
        DeviceFigures(
            index=i,
            pci_bus_id=buses.get(i) if isinstance(buses.get(i), str) else None,
            matmul_flops_per_second=p["matmul"],
            copy_bytes_per_second=p["copy"],
            quantities=p["quantities"],
        )
        for i, p in parts.items()
    )


# ------------------------------------------------------------------------------------------ gathering


def _probe_argv(python: str, probe: str, args: dict) -> list[str]:
    return inside_argv(python, PROBES, probe, "--json-args", json.dumps(args))


def section(run: ProbeRun | None, name: str) -> tuple[dict | None, str | None]:
    """(data, None) for a suite section that finished, else (None, why not)."""
    if run is None:
        return None, "not run"
    started = False
    for rec in run.records:
        if rec.get("probe") != name:
            continue
        if rec.get("event") == "start":
            started = True
        elif "ok" in rec:
            if rec["ok"]:
                return rec.get("data") or {}, None
            return None, f"{name} probe raised {rec.get('error')}"
    if started:
        return None, f"the probe process {run.error or 'stopped'} during {name}"
    if run.error:
        return None, f"the probe process {run.error} before {name}"
    return None, f"{name} did not run"


def started(run: ProbeRun | None, name: str) -> bool:
    return run is not None and any(r.get("probe") == name and r.get("event") == "start" for r in run.records)


def suite_run_for(run: WorkloadRun, name: str) -> ProbeRun | None:
    """The suite process that ran (or should have run) section ``name``."""
    if run.suite_rest is not None and not started(run.suite, name):
        return run.suite_rest
    return run.suite


def suite_section(run: WorkloadRun, name: str) -> tuple[dict | None, str | None]:
    """:func:`section` over the suite and, for what it never started, the re-run of the rest."""
    return section(suite_run_for(run, name), name)


# long: the suite, DDP, burn-in and the two NIC sections are started in order against one deadline
def gather_workload(
    python: str,
    *,
    burn: float = 0.0,
    timeout: float = 180.0,
    env: dict | None = None,
    device: str = "auto",
    sections: tuple[str, ...] = DEFAULT_SECTIONS,
    section_args: dict | None = None,
    ddp_timeout: float | None = None,
    multinode: MultiNode | None = None,
    gpu_possible: bool | None = None,
    nic_ports: Any = None,
) -> WorkloadRun:
    """Run the probes in child processes of ``python`` (the training venv's interpreter).

    ``timeout`` bounds each child: the suite process, the DDP ranks (``ddp_timeout`` when given) and the burn
    (its length plus ``timeout``); ``env`` is
    the training environment to apply (LD_PRELOAD, OMP_NUM_THREADS...). ``gpu_possible`` (default: whether
    /dev/nvidiactl exists) False runs the gloo DDP check beside the suite. ``nic_ports``: the RDMA ports
    (hostcheck.gather.rdma_rate.gather_rdma_ports) for the all_reduce through the NICs. Never raises for a probe
    failure.
    """
    t0 = time.monotonic()
    if ddp_timeout is None:
        ddp_timeout = timeout
    cenv = child_env(env)
    section_args = dict(section_args or {})
    ddp_args = dict(section_args.get("ddp") or {})
    section_args["ddp"] = dict(ddp_args, single_gpu_only=True)
    in_suite = [x for x in sections if x not in LAUNCHED]
    argv = _probe_argv(python, "suite", {"device": device, "sections": in_suite, "args": section_args})
    ddp_mode = ""
    ddp_runs: tuple[ProbeRun, ...] = ()
    if gpu_possible is None:
        gpu_possible = device != "cpu" and os.path.exists(NVIDIA_CTL)
    if (device == "cpu" or not gpu_possible) and "ddp" in sections:
        # Known up front: no GPU is measured, so the two gloo ranks can run beside the suite.
        box: dict[str, Any] = {}
        t = threading.Thread(
            target=lambda: box.update(runs=launch_local_ddp(python, 2, "gloo", ddp_args, ddp_timeout, env)),
            daemon=True,
        )
        t.start()
        suite = run_child(argv, timeout, name="suite", env=cenv)
        t.join(ddp_timeout + 30)
        ddp_mode, ddp_runs = "gloo", tuple(box.get("runs") or ())
    else:
        suite = run_child(argv, timeout, name="suite", env=cenv)
    rest = None
    remaining = [x for x in in_suite if not started(suite, x) and not (x == "ddp" and ddp_mode == "gloo")]
    if suite.error and remaining:
        # A crash or hang takes the process down: give the sections it never reached a process of their own.
        rest_args = {"device": device, "sections": remaining, "args": section_args}
        rest = run_child(_probe_argv(python, "suite", rest_args), timeout, name="suite-rest", env=cenv)
    view = WorkloadRun(suite=suite, suite_rest=rest)
    if not ddp_mode and "ddp" in sections:
        ddp_mode, ngpu = _ddp_plan(view, device)
        if ddp_mode in ("nccl", "gloo"):
            nproc = ngpu if ddp_mode == "nccl" else 2
            ddp_runs = launch_local_ddp(python, nproc, ddp_mode, ddp_args, ddp_timeout, env)
    loop_runs: tuple[ProbeRun, ...] = ()
    loop_skip = ""
    ports = nic_ports if isinstance(nic_ports, tuple) else ()
    if "nic_loopback" in sections:
        active = [p for p in ports if getattr(p, "state", None) == "ACTIVE"]
        mode, ngpu = _ddp_plan(view, device)
        if not active:
            why = "not read" if nic_ports is None else str(nic_ports)
            loop_skip = f"no active RDMA port ({why})" if not ports else "no RDMA port is ACTIVE"
        elif mode != "nccl" or ngpu < 2:
            loop_skip = f"needs two or more GPUs under NCCL ({ngpu if mode == 'nccl' else 'no NCCL'})"
        else:
            loop_env = {**(env or {}), **NIC_LOOPBACK_ENV}
            loop_runs = launch_local_ddp(python, ngpu, "nccl", ddp_args, ddp_timeout, loop_env)
    gdr = None
    if "gdr_write" in sections:
        mode, ngpu = _ddp_plan(view, device)
        gdr = gather_gdr_write(nic_ports if nic_ports is not None else ports, ngpu if mode != "gloo" else 0)
    mn_runs: tuple[ProbeRun, ...] = ()
    if multinode is not None:
        if multinode.nproc_per_node is None:
            # torchrun's "gpu" raises without CUDA: one rank per GPU, else one gloo rank per node.
            mode, n = _ddp_plan(view, device)
            multinode = replace(multinode, nproc_per_node=n if mode == "nccl" else 1)
        mn_runs = (launch_multinode(python, multinode, ddp_args, env),)
    burn_run = None
    if burn and burn > 0:
        burn_run = run_child(
            _probe_argv(python, "burn", {"seconds": float(burn), "device": device}),
            float(burn) + timeout,
            name="burn",
            env=cenv,
        )
    return WorkloadRun(
        python=python,
        suite=suite,
        suite_rest=rest,
        ddp_mode=ddp_mode,
        ddp=ddp_runs,
        multinode=mn_runs,
        multinode_requested=multinode is not None,
        burn=burn_run,
        burn_requested=float(burn or 0.0),
        nic_loopback=loop_runs,
        nic_loopback_skipped=loop_skip,
        nic_ports=tuple(p.to_dict() for p in ports),
        gdr_write=gdr,
        wall_s=time.monotonic() - t0,
        sections=tuple(sections),
    )


def _ddp_plan(view: WorkloadRun, device: str) -> tuple[str, int]:
    """Where the DDP check runs: in the suite's process (exactly one GPU), or launched here."""
    data, _ = suite_section(view, "ddp")
    ran = started(suite_run_for(view, "ddp"), "ddp")
    env_data, _ = suite_section(view, "env")
    if data is not None and not data.get("deferred"):
        return "in-suite", 1
    if data is not None:
        ngpu = int(data.get("gpus") or 0)
    elif ran or env_data is None:
        return "in-suite", 1  # it ran there and failed, or the suite died first: judging says why
    else:
        ngpu = len(env_data.get("gpus") or []) if env_data.get("cuda_available") else 0
    if device == "cpu":
        ngpu = 0
    return ("nccl", ngpu) if ngpu >= 1 else ("gloo", 2)


def launch_local_ddp(
    python: str,
    nproc: int,
    backend_mode: str,
    args: dict | None = None,
    timeout: float = 120.0,
    env: dict | None = None,
) -> tuple[ProbeRun, ...]:
    """One process per rank on this node (what torchrun does, without its launcher's `import torch`).

    The rendezvous port is picked free just before the launch; if another process took it in between
    (``Address already in use``), the launch is repeated once on a new port."""
    wargs = dict(args or {}, backend="nccl" if backend_mode == "nccl" else "gloo")
    runs: list[ProbeRun] = []
    for _attempt in range(2):
        port = free_port()
        argvs, envs = [], []
        for r in range(nproc):
            e = child_env(env)
            e.update(
                {
                    "RANK": str(r),
                    "LOCAL_RANK": str(r),
                    "WORLD_SIZE": str(nproc),
                    "LOCAL_WORLD_SIZE": str(nproc),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                }
            )
            if backend_mode == "gloo":
                e.setdefault("OMP_NUM_THREADS", "1")
            argvs.append(_probe_argv(python, "ddp_worker", wargs))
            envs.append(e)
        runs = run_children(argvs, timeout, name="ddp", envs=envs)
        if not any("address already in use" in r.stderr_tail.lower() for r in runs if r.error):
            break
    return tuple(runs)


def torchrun_argv(python: str, mn: MultiNode, args: dict | None = None) -> list[str]:
    argv = [python, "-m", "torch.distributed.run", "--nnodes", str(mn.nnodes)]
    argv += ["--nproc-per-node", str(mn.nproc_per_node) if mn.nproc_per_node else "gpu"]
    argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", mn.rdzv_endpoint, "--rdzv-id", mn.rdzv_id]
    # --no-python: torchrun runs our command as it is, so every rank starts the one way (launch.inside_argv).
    return [
        *argv,
        "--no-python",
        *inside_argv(python, PROBES, "ddp_worker", "--json-args", json.dumps(dict(args or {}))),
    ]


def local_addr_towards(endpoint: str) -> str | None:
    """This node's address on the route to ``host:port`` (a UDP connect sends nothing), or None."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.connect(addr)
            return str(s.getsockname()[0])
    except (OSError, ValueError, IndexError):
        return None


def launch_multinode(python: str, mn: MultiNode, args: dict | None = None, env: dict | None = None):
    cenv = child_env(env)
    # Without it, torchrun tells the other nodes to reach rank 0 by its host name, which fails wherever the
    # nodes cannot resolve each other's names (seen with three podman nodes); an address always works.
    # torchrun reads PET_LOCAL_ADDR as --local-addr; an older torch ignores it.
    if not cenv.get("PET_LOCAL_ADDR"):
        addr = local_addr_towards(mn.rdzv_endpoint)
        if addr:
            cenv["PET_LOCAL_ADDR"] = addr
    return run_child(torchrun_argv(python, mn, args), mn.timeout, name="multinode", env=cenv)


def gather_limit(options: Any) -> float:
    """The whole workload run's ceiling, from the options: every child has its own hard deadline (suite and
    the re-run of what it never reached, two DDP launch tries, two of the all_reduce through the NICs, the GPUDirect
    write runs, the multi-node rendezvous, burn), and this
    bounds their sum, so a bug in the sequencing cannot hang a run either."""
    t = options.workload_timeout_s
    rdzv = options.rdzv_timeout_s if options.nnodes else 0.0
    burn = options.burn
    loopback = 2 * t if "nic_loopback" in options.workload_sections else 0.0  # launch_local_ddp tries twice
    gdr = GDR_LIMIT_S if "gdr_write" in options.workload_sections else 0.0
    return 2 * t + 2 * t + loopback + gdr + rdzv + ((burn + t) if burn > 0 else 0.0) + GATHER_SLACK_S


def gather_for(options: Any, python: str, env: dict[str, str]) -> WorkloadRun:
    """The run the options ask for, with ``python`` (the training Python) and ``env`` (its environment file)."""
    mn = None
    if options.nnodes and options.rdzv_endpoint:
        mn = MultiNode(
            nnodes=str(options.nnodes),
            rdzv_endpoint=str(options.rdzv_endpoint),
            nproc_per_node=options.nproc_per_node,
            rdzv_id=options.rdzv_id or "hostcheck",
            timeout=options.rdzv_timeout_s,
        )
    wants_nics = {"nic_loopback", "gdr_write"} & set(options.workload_sections)
    nics = gather_rdma_ports(options.host_root) if wants_nics else None
    return gather_workload(
        python,
        nic_ports=nics,
        burn=options.burn,
        timeout=options.workload_timeout_s,
        env=env,
        device=options.workload_device,
        sections=options.workload_sections,
        section_args=options.workload_section_args,
        multinode=mn,
    )
