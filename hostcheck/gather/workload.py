"""The workload gatherer: runs the short GPU / AMP / DDP suite in child processes of the training Python.

``gather_workload`` launches the children through the one launcher (hostcheck.child.launch) and returns a
:class:`WorkloadRun`: their raw records and errors, unjudged, and the typed facts read once from them
(hostcheck.gather.suite). The checks in hostcheck.checks.workload judge those facts; the report publishes them.
The code the children run is hostcheck.inside.workload, started the one way code starts in the training Python
(hostcheck.child.launch.inside_argv: the training venv need not have hostcheck).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, replace
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
from hostcheck.gather.suite import (
    AmpSection,
    BurnResult,
    DataLoaderSection,
    DeviceFigures,
    DeviceSection,
    PeerCopies,
    RankResults,
    SuiteEnv,
    amp_section,
    burn_result,
    dataloader_section,
    ddp_results,
    device_figures,
    device_section,
    multinode_results,
    peer_copies,
    rank_results,
    started,
    suite_env,
    suite_run_for,
    suite_section,
)
from hostcheck.registry import Thread

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
        """Each CUDA device's figures from the suite and the burn-in, in base units (see device_figures)."""
        return device_figures(self)

    # The typed facts the checks and the report read: each built once from the raw records, here.
    @cached_property
    def env(self) -> SuiteEnv:
        return suite_env(self)

    @cached_property
    def matmul(self) -> DeviceSection:
        return device_section(self, "matmul")

    @cached_property
    def bandwidth(self) -> DeviceSection:
        return device_section(self, "bandwidth")

    @cached_property
    def amp(self) -> AmpSection:
        return amp_section(self)

    @cached_property
    def p2p(self) -> PeerCopies:
        return peer_copies(self)

    @cached_property
    def dataloader(self) -> DataLoaderSection:
        return dataloader_section(self)

    @cached_property
    def burn_result(self) -> BurnResult | None:
        return burn_result(self)

    @cached_property
    def ddp_results(self) -> RankResults:
        return ddp_results(self)

    @cached_property
    def nic_loopback_results(self) -> RankResults:
        return rank_results(self.nic_loopback)

    @cached_property
    def multinode_results(self) -> RankResults:
        return multinode_results(self.multinode)

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


# ------------------------------------------------------------------------------------------ gathering


def _probe_argv(python: str, probe: str, args: dict) -> list[str]:
    return inside_argv(python, PROBES, probe, "--json-args", json.dumps(args))


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
        t = Thread(
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
