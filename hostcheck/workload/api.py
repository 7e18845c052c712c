"""Workload checks: launch the probes (gather), judge what they measured (pure), or both (run_workload).

    findings = run_workload(python, gpus=gpus_from_nvml(snapshot.nvml))

``gather_workload`` runs the child processes and returns a :class:`WorkloadRun` (raw records and errors);
``judge_workload(run, gpus)`` is a pure function of that run and the GPUs' link facts and returns one
:class:`WorkloadFinding` per id in :data:`CHECKS`, always all of them, in order.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from hostcheck.workload import judge as J
from hostcheck.workload import sku as S
from hostcheck.workload.runner import ProbeRun, child_env, free_port, run_child, run_children

PROBES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes.py")

#: Stable ids (never reused), titles and weights, in report order.
CHECKS: tuple[tuple[str, str, float], ...] = (
    ("workload.E001", "Matmul throughput, bf16", 2.0),
    ("workload.E002", "Matmul throughput, fp16", 1.0),
    ("workload.E003", "Matmul throughput, tf32", 1.0),
    ("workload.E004", "Matmul throughput, fp32", 0.5),
    ("workload.E005", "Host-to-device bandwidth, pinned", 1.0),
    ("workload.E006", "Device-to-host bandwidth, pinned", 1.0),
    ("workload.E007", "Host<->device bandwidth, pageable", 0.5),
    ("workload.E008", "Device memory bandwidth", 1.0),
    ("workload.E009", "AMP training step numerics", 2.0),
    ("workload.E010", "AMP speedup", 1.0),
    ("workload.E011", "DataLoader throughput", 1.0),
    ("workload.E012", "DDP: process group, all_reduce, training step", 2.0),
    ("workload.E013", "all_reduce bus bandwidth", 1.0),
    ("workload.E014", "Multi-node DDP", 1.0),
    ("workload.E015", "Burn-in stress", 1.0),
)
TITLES = {cid: title for cid, title, _ in CHECKS}
#: The suite section each check reads.
SECTION_OF = {
    **{f"workload.E00{i}": "matmul" for i in (1, 2, 3, 4)},
    **{f"workload.E00{i}": "bandwidth" for i in (5, 6, 7, 8)},
    "workload.E009": "amp",
    "workload.E010": "amp",
    "workload.E011": "dataloader",
    "workload.E012": "ddp",
    "workload.E013": "ddp",
}
MATMUL_IDS = {
    "bf16": "workload.E001",
    "fp16": "workload.E002",
    "tf32": "workload.E003",
    "fp32": "workload.E004",
}

DEFAULT_SECTIONS = ("env", "matmul", "bandwidth", "amp", "dataloader", "ddp")
#: Without the NVIDIA control device no CUDA GPU can be used: the DDP check is gloo, known before the suite.
NVIDIA_CTL = "/dev/nvidiactl"

_HINT_MATMUL = (
    "look for throttling (nvidia-smi -q -d PERFORMANCE: power cap, thermal, HW slowdown), a lowered power "
    "limit or application clocks, other processes on the GPU, and ECC/row-remap events; re-measure with "
    "benchmarks/matmul_h2d_long_vs_short.py"
)
_HINT_COPY = (
    "check for throttling and other processes on the GPU; compare nvidia-smi -q -d CLOCK memory clocks"
)


@dataclass(frozen=True)
class WorkloadFinding:
    """One judged workload check; maps 1:1 onto hostcheck's Outcome/Result fields."""

    id: str
    title: str
    status: str  # pass | warn | fail | skip | error
    message: str
    value: Any = None
    unit: str | None = None
    expected: Any = None
    hint: str | None = None
    details: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "message": self.message,
            "value": self.value,
            "unit": self.unit,
            "expected": self.expected,
            "hint": self.hint,
            "details": list(self.details),
        }


@dataclass(frozen=True)
class GpuLink:
    """What judging needs from NVML about one GPU (index in NVML / PCI bus order)."""

    index: int
    name: str | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    pcie_gen_current: int | None = None
    pcie_width_current: int | None = None
    #: Active NVLink links; 0 = none (PCIe only), None = unknown.
    nvlink_active: int | None = None
    numa_node: int | None = None

    @classmethod
    def from_any(cls, obj: Any, index: int = 0) -> GpuLink:
        """From a dict, a GpuLink, or anything with these attributes (hostcheck's NVML GpuInfo)."""
        if isinstance(obj, GpuLink):
            return obj

        def get(k: str) -> Any:
            v = obj.get(k) if isinstance(obj, dict) else getattr(obj, k, None)
            if k == "name":
                return v if isinstance(v, str) else None
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        idx = get("index")
        return cls(
            index=idx if idx is not None else index,
            name=get("name"),
            pcie_gen_max=get("pcie_gen_max"),
            pcie_width_max=get("pcie_width_max"),
            pcie_gen_current=get("pcie_gen_current"),
            pcie_width_current=get("pcie_width_current"),
            nvlink_active=get("nvlink_active"),
            numa_node=get("numa_node"),
        )


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
    quick: bool = False
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
    wall_s: float = 0.0
    #: The suite sections asked for (checks of the others are skipped).
    sections: tuple[str, ...] = DEFAULT_SECTIONS

    def to_dict(self) -> dict[str, Any]:
        return {
            "python": self.python,
            "quick": self.quick,
            "suite": self.suite.to_dict() if self.suite else None,
            "suite_rest": self.suite_rest.to_dict() if self.suite_rest else None,
            "ddp_mode": self.ddp_mode,
            "ddp": [r.to_dict() for r in self.ddp],
            "multinode": [r.to_dict() for r in self.multinode],
            "burn": self.burn.to_dict() if self.burn else None,
            "wall_s": round(self.wall_s, 3),
            "sections": list(self.sections),
        }


# ------------------------------------------------------------------------------------------ gathering


def _probe_argv(python: str, probe: str, args: dict) -> list[str]:
    return [python, PROBES_PATH, probe, "--json-args", json.dumps(args)]


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


def gather_workload(
    python: str,
    *,
    quick: bool = False,
    burn: float = 0.0,
    timeout: float = 180.0,
    env: dict | None = None,
    device: str = "auto",
    sections: tuple[str, ...] = DEFAULT_SECTIONS,
    section_args: dict | None = None,
    ddp_timeout: float | None = None,
    multinode: MultiNode | None = None,
    gpu_possible: bool | None = None,
) -> WorkloadRun:
    """Run the probes in child processes of ``python`` (the training venv's interpreter).

    ``timeout`` bounds each child: the suite process, the DDP ranks (``ddp_timeout`` when given) and the burn
    (its length plus ``timeout``); ``env`` is
    the training environment to apply (LD_PRELOAD, OMP_NUM_THREADS...). ``gpu_possible`` (default: whether
    /dev/nvidiactl exists) False runs the gloo DDP check beside the suite. Never raises for a probe failure.
    """
    if quick:
        return WorkloadRun(python=python, quick=True, multinode_requested=multinode is not None)
    t0 = time.monotonic()
    if ddp_timeout is None:
        ddp_timeout = timeout
    cenv = child_env(env)
    section_args = dict(section_args or {})
    ddp_args = dict(section_args.get("ddp") or {})
    section_args["ddp"] = dict(ddp_args, single_gpu_only=True)
    argv = _probe_argv(python, "suite", {"device": device, "sections": list(sections), "args": section_args})
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
    remaining = [x for x in sections if not started(suite, x) and not (x == "ddp" and ddp_mode == "gloo")]
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
    return [*argv, PROBES_PATH, "ddp_worker", "--json-args", json.dumps(dict(args or {}))]


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


# ------------------------------------------------------------------------------------------- NVML side


def count_nvlinks(nvml: Any, index: int, max_links: int = 18) -> int | None:
    """Active NVLink links of GPU ``index`` (NVML initialised by the caller); 0 when the GPU has none."""
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None
    n = 0
    for link in range(max_links):
        try:
            if int(nvml.nvmlDeviceGetNvLinkState(h, link)) == 1:  # NVML_FEATURE_ENABLED
                n += 1
        except Exception:
            if link == 0:
                return 0  # NVML_ERROR_NOT_SUPPORTED on the first link: no NVLink on this GPU
            break
    return n


def _nvml_link(nvml: Any, i: int) -> GpuLink:
    """A GpuLink straight from NVML (when no hostcheck NVML snapshot is at hand)."""

    def call(fn: str, *args: Any) -> Any:
        try:
            v = getattr(nvml, fn)(*args)
        except Exception:
            return None
        return v.decode() if isinstance(v, bytes) else v

    h = call("nvmlDeviceGetHandleByIndex", i)
    if h is None:
        return GpuLink(index=i)
    return GpuLink.from_any(
        {
            "index": i,
            "name": call("nvmlDeviceGetName", h),
            "pcie_gen_max": call("nvmlDeviceGetMaxPcieLinkGeneration", h),
            "pcie_width_max": call("nvmlDeviceGetMaxPcieLinkWidth", h),
            "pcie_gen_current": call("nvmlDeviceGetCurrPcieLinkGeneration", h),
            "pcie_width_current": call("nvmlDeviceGetCurrPcieLinkWidth", h),
            "numa_node": call("nvmlDeviceGetNumaNodeId", h),
        },
        i,
    )


def gpus_from_nvml(snapshot: Any = None, nvml: Any = None) -> list[GpuLink]:
    """GpuLinks from hostcheck's NVML snapshot (duck-typed: ``.gpus`` of objects with pcie_* fields), with
    active NVLink links counted through ``nvml`` (the pynvml module; imported when None, skipped if absent)."""
    gpus = [GpuLink.from_any(g, i) for i, g in enumerate(getattr(snapshot, "gpus", None) or ())]
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            return gpus
    try:
        nvml.nvmlInit()
    except Exception:
        return gpus
    try:
        if not gpus:
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except Exception:
                count = 0
            gpus = [_nvml_link(nvml, i) for i in range(count)]
        return [
            GpuLink(**{**g.__dict__, "nvlink_active": count_nvlinks(nvml, g.index)})  # frozen: rebuild
            for g in gpus
        ]
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


# -------------------------------------------------------------------------------------------- judging


def _f(id_: str, status: str, message: str, **kw: Any) -> WorkloadFinding:
    return WorkloadFinding(id=id_, title=TITLES[id_], status=status, message=message, **kw)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _link_for(gpus: list[GpuLink], index: int | None) -> GpuLink | None:
    for g in gpus:
        if g.index == index:
            return g
    return None


def _verdict_or_skip(statuses: list[str | None]) -> str:
    real = [s for s in statuses if s is not None]
    return J.worst(real) if real else J.SKIP


def judge_workload(run: WorkloadRun, gpus: list | None = None) -> list[WorkloadFinding]:
    """Every workload finding, in :data:`CHECKS` order. Pure: reads ``run`` and ``gpus`` only."""
    links = [GpuLink.from_any(g, i) for i, g in enumerate(gpus or [])]
    if run.quick:
        return [_f(cid, J.SKIP, "skipped by --quick (no workload run)") for cid, _, _ in CHECKS]
    env, env_err = suite_section(run, "env")
    on_gpu = bool(env and env.get("cuda_available"))
    out: list[WorkloadFinding] = []
    out += judge_matmul(run, on_gpu)
    out += judge_bandwidth(run, links, on_gpu)
    out.append(judge_amp_numerics(run))
    out.append(judge_amp_speedup(run, on_gpu))
    out.append(judge_dataloader(run))
    out += judge_ddp(run, links)
    out.append(judge_multinode(run))
    out.append(judge_burn(run))
    out = [
        _f(f.id, J.SKIP, f"not run: section {SECTION_OF[f.id]} not selected")
        if f.id in SECTION_OF and SECTION_OF[f.id] not in run.sections
        else f
        for f in out
    ]
    if env_err and "No module named" in env_err:
        hint = (
            "the training Python cannot import torch (or PIL): install them in the training venv "
            "(role gpunode_pytorch) or point --python at the right interpreter"
        )
        out = [
            WorkloadFinding(**{**f.__dict__, "hint": f.hint or hint}) if f.status == J.ERROR else f
            for f in out
        ]
    if env_err and run.suite is not None and run.suite.error:
        tail = run.suite.stderr_tail
        out = [
            f
            if f.status != J.ERROR or not tail
            else WorkloadFinding(**{**f.__dict__, "details": (*f.details, *tail.splitlines()[-5:])})
            for f in out
        ]
    return out


def _precision_env(run: WorkloadRun) -> str:
    """Variables that force TF32 off (NVIDIA_TF32_OVERRIDE=0) or on for fp32, as the env probe saw them."""
    env, _ = suite_section(run, "env")
    found = (env or {}).get("precision_env") or {}
    return ", ".join(f"{k}={v}" for k, v in sorted(found.items()))


def judge_matmul(run: WorkloadRun, on_gpu: bool) -> list[WorkloadFinding]:
    data, err = suite_section(run, "matmul")
    out = []
    for dt in S.DTYPES:
        cid = MATMUL_IDS[dt]
        if data is None:
            out.append(_f(cid, J.ERROR, f"matmul not measured: {err}"))
            continue
        rows = data.get("gpus") or []
        if not on_gpu:
            cpu = (rows[0].get("dtypes") or {}).get(dt, {}) if rows else {}
            v = _num(cpu.get("tflops"))
            msg = "no CUDA GPU: " + (
                f"{dt} matmul on the CPU {v:.3g} TFLOP/s, no verdict" if v else "skipped"
            )
            out.append(_f(cid, J.SKIP, msg, value=v, unit="TFLOP/s"))
            continue
        statuses, details, values, expected = [], [], [], None
        errors = []
        for row in rows:
            m = (row.get("dtypes") or {}).get(dt) or {}
            name = row.get("name")
            if "error" in m:
                errors.append(f"GPU {row.get('index')}: {m['error']}")
                statuses.append(J.ERROR)
                continue
            v = _num(m.get("tflops"))
            if v is None:
                continue
            values.append(v)
            if m.get("finite") is False:
                statuses.append(J.FAIL)
                details.append(f"GPU {row.get('index')} {name}: {v:.1f} TFLOP/s but the result is not finite")
                continue
            fig = S.matmul_figure(name, dt)
            st, frac = J.judge_fraction(
                v, fig.value if fig else None, fig.basis == S.ESTIMATE if fig else False
            )
            statuses.append(st)
            if fig:
                expected = (
                    f">= {J.PASS_FRACTION * fig.value:.0f} (90% of {fig.value:g} achievable, {fig.basis})"
                )
                details.append(
                    f"GPU {row.get('index')} {name}: {v:.1f} TFLOP/s = {frac:.0%} of {fig.value:g} ({fig.source})"
                )
            else:
                details.append(
                    f"GPU {row.get('index')} {name}: {v:.1f} TFLOP/s (no reference for this SKU/dtype)"
                )
        status = _verdict_or_skip(statuses)
        worst_v = min(values) if values else None
        if errors and not values:
            out.append(_f(cid, J.ERROR, "; ".join(errors)[:500], details=tuple(details)))
            continue
        if status == J.SKIP:
            msg = (
                f"{dt} matmul {worst_v:.1f} TFLOP/s measured; unknown SKU or dtype, no verdict"
                if worst_v
                else (f"{dt} matmul not measured")
            )
        else:
            msg = f"{dt} matmul {worst_v:.1f} TFLOP/s on the slowest GPU ({len(values)} measured)"
        hint = _HINT_MATMUL if status in (J.WARN, J.FAIL) else None
        forced = _precision_env(run)
        if hint and forced and dt in ("tf32", "fp32"):
            hint = f"{forced} is set in the training environment and changes what {dt} runs; " + hint
        out.append(
            _f(
                cid,
                status,
                msg,
                value=worst_v,
                unit="TFLOP/s",
                expected=expected,
                hint=hint,
                details=tuple(details),
            )
        )
    return out


def _pcie_desc(link: GpuLink | None) -> str:
    if link is None:
        return "link unknown"
    cur = f"gen{link.pcie_gen_current} x{link.pcie_width_current}" if link.pcie_gen_current else "?"
    mx = f"gen{link.pcie_gen_max} x{link.pcie_width_max}" if link.pcie_gen_max else "?"
    return f"link {cur} now, {mx} max"


def _pcie_hint(link: GpuLink | None) -> str:
    parts = []
    if (
        link
        and link.pcie_width_current
        and link.pcie_width_max
        and link.pcie_width_current < link.pcie_width_max
    ):
        parts.append(
            f"the link trained at x{link.pcie_width_current} of x{link.pcie_width_max}: reseat the GPU or "
            "riser, check the slot and BIOS bifurcation"
        )
    else:
        parts.append("check the link width (nvidia-smi -q -d PCIE; lspci -vv LnkSta vs LnkCap)")
    parts.append("IOMMU translation (try iommu=pt on the kernel command line)")
    numa = f" {link.numa_node}" if link and link.numa_node is not None else ""
    parts.append(f"NUMA placement (run on the GPU's node{numa}: numactl --cpunodebind=N --membind=N)")
    return "; ".join(parts)


def judge_bandwidth(run: WorkloadRun, links: list[GpuLink], on_gpu: bool) -> list[WorkloadFinding]:
    data, err = suite_section(run, "bandwidth")
    ids = ("workload.E005", "workload.E006", "workload.E007", "workload.E008")
    if data is None:
        return [_f(cid, J.ERROR, f"bandwidth not measured: {err}") for cid in ids]
    if not on_gpu:
        return [_f(cid, J.SKIP, "no CUDA GPU: nothing to measure") for cid in ids]
    rows = data.get("gpus") or []
    out = []
    for cid, key in (("workload.E005", "h2d_pinned"), ("workload.E006", "d2h_pinned")):
        statuses, details, values = [], [], []
        hint, expected = None, None
        for row in rows:
            m = row.get(key) or {}
            link = _link_for(links, row.get("index"))
            if "error" in m:
                statuses.append(J.ERROR)
                details.append(f"GPU {row.get('index')}: {m['error']}")
                continue
            v = _num(m.get("gbs"))
            if v is None:
                continue
            values.append(v)
            theo = J.pcie_theoretical_gbs(link.pcie_gen_max, link.pcie_width_max) if link else None
            ach = J.pinned_achievable_gbs(link.pcie_gen_max, link.pcie_width_max) if link else None
            st, frac = J.judge_fraction(v, ach)
            statuses.append(st)
            if ach:
                expected = (
                    f">= {J.PASS_FRACTION * ach:.1f} (90% of {ach:.1f} = 0.85 x {theo:.1f} theoretical)"
                )
                details.append(
                    f"GPU {row.get('index')}: {v:.1f} GB/s = {v / theo:.0%} of {theo:.1f} GB/s ({_pcie_desc(link)})"
                )
                if st in (J.WARN, J.FAIL) and hint is None:
                    hint = _pcie_hint(link)
            else:
                details.append(f"GPU {row.get('index')}: {v:.1f} GB/s (PCIe link unknown: no verdict)")
        status = _verdict_or_skip(statuses)
        worst_v = min(values) if values else None
        what = "host-to-device" if key.startswith("h2d") else "device-to-host"
        if worst_v is None:
            msg = f"{what} pinned not measured"
        elif status == J.SKIP:
            msg = f"{what} pinned {worst_v:.1f} GB/s; PCIe link unknown (NVML), no verdict"
        else:
            msg = f"{what} pinned {worst_v:.1f} GB/s on the slowest GPU"
        out.append(
            _f(
                cid,
                status,
                msg,
                value=worst_v,
                unit="GB/s",
                expected=expected,
                hint=hint,
                details=tuple(details),
            )
        )
    # Pageable, both directions.
    statuses, details, values = [], [], []
    for row in rows:
        link = _link_for(links, row.get("index"))
        theo = J.pcie_theoretical_gbs(link.pcie_gen_max, link.pcie_width_max) if link else None
        for key in ("h2d_pageable", "d2h_pageable"):
            m = row.get(key) or {}
            v = _num(m.get("gbs"))
            if v is None:
                if "error" in m:
                    statuses.append(J.ERROR)
                    details.append(f"GPU {row.get('index')} {key}: {m['error']}")
                continue
            values.append(v)
            pinned = _num((row.get(key.replace("pageable", "pinned")) or {}).get("gbs"))
            ratio = f", {v / pinned:.0%} of pinned" if pinned else ""
            details.append(f"GPU {row.get('index')} {key}: {v:.1f} GB/s{ratio}")
            if theo:
                statuses.append(J.WARN if v < J.PAGEABLE_WARN_FRACTION * theo else J.PASS)
    status = _verdict_or_skip(statuses)
    worst_v = min(values) if values else None
    out.append(
        _f(
            "workload.E007",
            status,
            f"pageable copies {worst_v:.1f} GB/s at the slowest (pinned memory is the fast path: "
            "DataLoader(pin_memory=True))"
            if worst_v
            else "pageable copies not measured",
            value=worst_v,
            unit="GB/s",
            expected=f">= {J.PAGEABLE_WARN_FRACTION:.0%} of the link's theoretical rate",
            hint="pageable copies are staged by one CPU thread: check memory bandwidth, NUMA placement and "
            "transparent hugepages"
            if status == J.WARN
            else None,
            details=tuple(details),
        )
    )
    # Device copy.
    statuses, details, values, expected = [], [], [], None
    for row in rows:
        m = row.get("device_copy") or {}
        if "error" in m:
            statuses.append(J.ERROR)
            details.append(f"GPU {row.get('index')}: {m['error']}")
            continue
        v = _num(m.get("gbs"))
        if v is None:
            continue
        values.append(v)
        fig = S.copy_figure(row.get("name"))
        st, frac = J.judge_fraction(v, fig.value if fig else None, bool(fig and fig.basis == S.ESTIMATE))
        statuses.append(st)
        if fig:
            expected = f">= {J.PASS_FRACTION * fig.value:.0f} (90% of {fig.value:g} GB/s, {fig.basis})"
            details.append(
                f"GPU {row.get('index')} {row.get('name')}: {v:.0f} GB/s = {frac:.0%} ({fig.source})"
            )
        else:
            details.append(f"GPU {row.get('index')} {row.get('name')}: {v:.0f} GB/s (unknown SKU)")
    status = _verdict_or_skip(statuses)
    worst_v = min(values) if values else None
    out.append(
        _f(
            "workload.E008",
            status,
            f"device copy {worst_v:.0f} GB/s (read + write) on the slowest GPU"
            if worst_v
            else "not measured",
            value=worst_v,
            unit="GB/s",
            expected=expected,
            hint=_HINT_COPY if status in (J.WARN, J.FAIL) else None,
            details=tuple(details),
        )
    )
    return out


def judge_amp_numerics(run: WorkloadRun) -> WorkloadFinding:
    cid = "workload.E009"
    data, err = suite_section(run, "amp")
    if data is None:
        return _f(cid, J.ERROR, f"AMP step not run: {err}")
    statuses, details, bad = [], [], []
    for kind, modes in (data.get("models") or {}).items():
        for mode, r in modes.items():
            if "error" in r:
                statuses.append(J.ERROR)
                bad.append(f"{kind} {mode}: raised {r['error']}")
                continue
            st, why = J.loss_numerics(r.get("losses") or [])
            if mode == "fp16":
                sst = J.scaler_status(int(r.get("skipped") or 0), int(r.get("steps") or 0))
                if sst != J.PASS:
                    why += f"; GradScaler skipped {r.get('skipped')} of {r.get('steps')} steps"
                    st = J.worst([st, sst])
            statuses.append(st)
            line = f"{kind} {mode}: {why}"
            details.append(line)
            if st != J.PASS:
                bad.append(line)
    status = _verdict_or_skip(statuses)
    if status == J.PASS:
        msg = f"finite losses that fall, GradScaler healthy ({len(statuses)} model/precision runs, {data.get('device')})"
    elif status == J.SKIP:
        msg = "no AMP runs recorded"
    else:
        msg = "; ".join(bad)[:500]
    hint = (
        "a numerics failure on a healthy stack points at the GPU (ECC, row remaps) or a broken torch/cuDNN "
        "install; re-run, then run with CUDA_LAUNCH_BLOCKING=1 for the failing precision"
        if status in (J.FAIL, J.ERROR)
        else None
    )
    return _f(cid, status, msg, details=tuple(details), hint=hint)


def judge_amp_speedup(run: WorkloadRun, on_gpu: bool) -> WorkloadFinding:
    cid = "workload.E010"
    data, err = suite_section(run, "amp")
    if data is None:
        return _f(cid, J.ERROR, f"AMP step not run: {err}")
    speedups, details = {}, []
    for kind, modes in (data.get("models") or {}).items():
        base = _num((modes.get("fp32") or {}).get("per_s"))
        best = None
        for mode in ("fp16", "bf16"):
            v = _num((modes.get(mode) or {}).get("per_s"))
            if base and v:
                sp = v / base
                details.append(
                    f"{kind} {mode}: {v:.1f} vs fp32 {base:.1f} {modes[mode].get('unit', '')} = {sp:.2f}x"
                )
                if best is None or sp > best[0]:
                    best = (sp, mode)
        if best:
            speedups[kind] = best
    if not speedups:
        return _f(cid, J.ERROR, "no AMP timing recorded", details=tuple(details))
    if data.get("conv_tf32"):
        # torch's default, which a training job gets too; the transformer's fp32 matmuls stay IEEE.
        details.append(
            "the CNN's fp32 baseline runs its convolutions in TF32 (cudnn.allow_tf32, torch's default)"
        )
    worst_kind = min(speedups, key=lambda k: speedups[k][0])
    sp, mode = speedups[worst_kind]
    summary = ", ".join(f"{k} {v[0]:.2f}x ({v[1]})" for k, v in speedups.items())
    if not on_gpu:
        return _f(
            cid,
            J.SKIP,
            f"on the CPU, no verdict: {summary}",
            value=round(sp, 3),
            unit="x",
            details=tuple(details),
        )
    status = J.amp_speedup_status(sp)
    hint = None
    if status in (J.WARN, J.FAIL):
        hint = (
            "AMP gives no speedup: check that the GPU has tensor cores (compute capability >= 7.0), that "
            "cuDNN is loaded (torch.backends.cudnn.is_available()), that the GPU is not throttling, and that "
            "the CPU is not the bottleneck (launch overhead: larger batches, CUDA graphs)"
        )
    return _f(
        cid,
        status,
        f"AMP speedup {summary}",
        value=round(sp, 3),
        unit="x",
        expected=f">= {J.AMP_WARN_BELOW}x (reference H100: CNN 3.1x fp16+channels_last, transformer 6.1x bf16)",
        hint=hint,
        details=tuple(details),
    )


def judge_dataloader(run: WorkloadRun) -> WorkloadFinding:
    cid = "workload.E011"
    data, err = suite_section(run, "dataloader")
    if data is None:
        return _f(cid, J.ERROR, f"DataLoader probe not run: {err}")
    results = data.get("results") or {}
    details, errors = [], []
    for w, r in sorted(results.items(), key=lambda kv: int(kv[0])):
        if "error" in r:
            errors.append(f"num_workers={w}: {r['error']}")
            details.append(errors[-1])
        else:
            details.append(
                f"num_workers={w}: {r.get('ips', 0):.0f} img/s (first epoch {r.get('first_epoch_s', 0):.2f} s)"
            )
    best, best_ips, zero = data.get("best_workers"), _num(data.get("best_ips")), _num(data.get("zero_ips"))
    settings = (
        f"num_workers={best}, pin_memory={data.get('pin_memory')}, persistent_workers=True, "
        f"prefetch_factor={data.get('prefetch_factor')}"
    )
    if errors:
        shm = data.get("shm_bytes")
        shm_s = f"/dev/shm is {shm / 2**20:.0f} MiB; " if isinstance(shm, int) else ""
        return _f(
            cid,
            J.FAIL,
            "DataLoader failed: " + "; ".join(errors)[:400],
            value=best_ips,
            unit="img/s",
            hint=shm_s
            + "worker crashes ('bus error', 'DataLoader worker killed') usually mean a small /dev/shm "
            "(containers default to 64 MiB: docker --shm-size / --ipc=host) or too little memory",
            details=tuple(details),
        )
    st = J.dataloader_status(best_ips, zero, int(data.get("cpus") or 0))
    if best_ips is None:
        return _f(cid, J.ERROR, "DataLoader measured nothing", details=tuple(details))
    gain = f", {best_ips / zero:.2f}x num_workers=0" if zero and best else ""
    if best == 0:
        settings = f"num_workers=0 (no worker count beat it), pin_memory={data.get('pin_memory')}"
    msg = f"{best_ips:.0f} img/s with {settings}{gain} ({data.get('crop')} px crops, {data.get('cpus')} CPUs)"
    if st is None:
        return _f(
            cid,
            J.PASS,
            msg + "; too few CPUs to expect a gain from workers",
            value=best_ips,
            unit="img/s",
            details=tuple(details),
        )
    hint = None
    if st == J.WARN:
        hint = (
            "workers do not speed up decoding: check CPU affinity/cgroup CPU limits (os.sched_getaffinity), "
            "OMP_NUM_THREADS oversubscription in workers, pillow-simd, and /dev/shm"
        )
    return _f(
        cid,
        st,
        msg,
        value=round(best_ips, 1),
        unit="img/s",
        expected=">= 1.2x num_workers=0",
        hint=hint,
        details=tuple(details),
    )


def _ddp_records(run: WorkloadRun) -> tuple[list[dict], list[str], bool]:
    """(per-rank data, errors, any timed out) from wherever the DDP probe ran."""
    recs, errors, hung = [], [], False
    if run.ddp_mode == "in-suite":
        data, err = suite_section(run, "ddp")
        if data is None:
            errors.append(err or "no result")
            where = suite_run_for(run, "ddp")
            hung = bool(where and where.timed_out and started(where, "ddp"))
        else:
            recs.append(data)
        return recs, errors, hung
    crashed = any(r.error and not r.timed_out for r in run.ddp)
    for r in run.ddp:
        hung = hung or (r.timed_out and not crashed)  # peers killed after a crash did not hang on their own
        d = next((x for x in reversed(r.records) if x.get("probe") == "ddp_worker" and x.get("ok")), None)
        if d is not None:
            recs.append(d.get("data") or {})
        if r.error:
            errors.append(f"{r.name}: {r.error}")
    return recs, errors, hung


_HINT_NCCL = (
    "re-run with NCCL_DEBUG=INFO; check that every GPU is visible (CUDA_VISIBLE_DEVICES), peer access "
    "(nvidia-smi topo -m), the NVIDIA fabric manager on NVSwitch systems, and ACS/IOMMU settings "
    "(NCCL_P2P_DISABLE=1 as a test)"
)


def judge_ddp(run: WorkloadRun, links: list[GpuLink]) -> list[WorkloadFinding]:
    c1, c2 = "workload.E012", "workload.E013"
    if not run.ddp_mode:
        return [_f(c1, J.SKIP, "DDP probe not run"), _f(c2, J.SKIP, "DDP probe not run")]
    recs, errors, hung = _ddp_records(run)
    if errors or not recs:
        why = "; ".join(errors)[:500] or "no rank reported"
        status = J.FAIL if hung else J.ERROR
        msg = ("DDP hung: " if hung else "DDP failed: ") + why
        return [_f(c1, status, msg, hint=_HINT_NCCL), _f(c2, J.ERROR, "not measured: the DDP probe failed")]
    world = int(recs[0].get("world") or len(recs))
    backend = recs[0].get("backend")
    bad = [r for r in recs if not (r.get("allreduce_ok") and r.get("ddp_ok"))]
    details = tuple(
        f"rank {r.get('rank')}: all_reduce sum {r.get('allreduce_value')} (want {world}), DDP step loss "
        f"{r.get('ddp_loss')}, param max diff {r.get('ddp_param_maxdiff')}, init {r.get('init_s')} s"
        for r in recs
    )
    if bad:
        f1 = _f(
            c1,
            J.FAIL,
            f"{backend} world {world}: wrong all_reduce or diverged DDP step on {len(bad)} rank(s)",
            details=details,
            hint=_HINT_NCCL,
        )
    elif backend == "gloo":
        f1 = _f(
            c1,
            J.PASS,
            f"no GPU: a {world}-process gloo run proves the distributed path (all_reduce sum "
            f"= {world}, one DDP step); NCCL not exercised",
            details=details,
        )
    else:
        f1 = _f(
            c1,
            J.PASS,
            f"NCCL world {world} ({run.ddp_mode}): all_reduce sum = {world}, DDP step in sync",
            details=details,
        )
    r0 = next((r for r in recs if r.get("rank") == 0), recs[0])
    bus = _num(r0.get("busbw_gbs"))
    alg = _num(r0.get("algbw_gbs"))
    size = f"{(r0.get('bw_bytes') or 0) / 2**20:.0f} MiB"
    if backend != "nccl":
        f2 = _f(
            c2,
            J.SKIP,
            f"gloo on the CPU: busbw {bus:.2f} GB/s at {size}, not judged"
            if bus is not None
            else "not measured",
            value=bus,
            unit="GB/s",
        )
        return [f1, f2]
    if world < 2:
        f2 = _f(
            c2,
            J.SKIP,
            f"one GPU: no inter-GPU traffic (algbw {alg:.0f} GB/s at {size} is a local copy)"
            if alg
            else "one GPU: all_reduce moves no data, bandwidth not measured",
            value=bus,
            unit="GB/s",
        )
        return [f1, f2]
    nv = [g.nvlink_active for g in links[:world]] if links else []
    nvlink: bool | None = None
    if nv and all(isinstance(x, int) for x in nv):
        nvlink = all(x > 0 for x in nv)
    st = J.busbw_status(bus, world, nvlink)
    floor = J.busbw_floor(nvlink)
    inter = {True: "NVLink", False: "PCIe", None: "interconnect unknown"}[nvlink]
    msg = f"all_reduce busbw {bus:.1f} GB/s at {size} over {world} GPUs ({inter}; algbw {alg:.1f} GB/s)"
    if st is None:
        return [f1, _f(c2, J.SKIP, msg + ", no verdict", value=bus, unit="GB/s")]
    hint = _HINT_NCCL if st in (J.WARN, J.FAIL) else None
    return [
        f1,
        _f(
            c2,
            st,
            msg,
            value=round(bus, 1),
            unit="GB/s",
            expected=f">= {floor:g} GB/s (Meta GCM floor, {inter}; warn within 5%)",
            hint=hint,
        ),
    ]


def judge_multinode(run: WorkloadRun) -> WorkloadFinding:
    cid = "workload.E014"
    if not run.multinode_requested:
        return _f(cid, J.SKIP, "not requested (give --nnodes and --rdzv-endpoint)")
    recs, errors = [], []
    for r in run.multinode:
        recs += [x.get("data") or {} for x in r.records if x.get("probe") == "ddp_worker" and x.get("ok")]
        # A local rank that raised says why in its record; torchrun's own error only says that it failed.
        errors += [
            f"rank error: {x.get('error')}"
            for x in r.records
            if x.get("probe") == "ddp_worker" and x.get("ok") is False
        ]
        if r.error:
            errors.append(r.error)
    if errors or not recs:
        hung = any(r.timed_out for r in run.multinode)
        return _f(
            cid,
            J.FAIL if hung else J.ERROR,
            "multi-node DDP "
            + ("hung: " if hung else "failed: ")
            + ("; ".join(errors) or "no rank reported")[:500],
            hint="check the rendezvous endpoint is reachable from every node, the same --rdzv-id on all, "
            "NCCL_SOCKET_IFNAME / NCCL_IB_HCA, and firewalls; NCCL_DEBUG=INFO shows the transport",
            # torchrun's own report (which rank failed, and why) is in its stderr.
            details=tuple(ln for r in run.multinode for ln in r.stderr_tail.splitlines() if ln.strip()),
        )
    bad = [r for r in recs if not (r.get("allreduce_ok") and r.get("ddp_ok"))]
    world = recs[0].get("world")
    r0 = next((r for r in recs if r.get("rank") == 0), None)
    bw = f"; busbw {r0['busbw_gbs']:.1f} GB/s" if r0 and _num(r0.get("busbw_gbs")) is not None else ""
    details = tuple(
        f"rank {r.get('rank')}: all_reduce {r.get('allreduce_value')}, ddp_ok {r.get('ddp_ok')}" for r in recs
    )
    if bad:
        return _f(
            cid,
            J.FAIL,
            f"world {world}: wrong all_reduce or diverged DDP step on {len(bad)} local rank(s)",
            details=details,
        )
    return _f(
        cid,
        J.PASS,
        f"world {world}: {len(recs)} local rank(s) correct{bw}",
        value=_num(r0.get("busbw_gbs")) if r0 else None,
        unit="GB/s",
        details=details,
    )


def judge_burn(run: WorkloadRun) -> WorkloadFinding:
    cid = "workload.E015"
    if not run.burn_requested:
        return _f(cid, J.SKIP, "not requested (--burn SECONDS)")
    b = run.burn
    rec = (
        next((x for x in reversed(b.records) if x.get("probe") == "burn" and x.get("ok")), None)
        if b
        else None
    )
    if rec is None:
        why = b.error if b else "not run"
        return _f(cid, J.FAIL if b and b.timed_out else J.ERROR, f"burn did not finish: {why}")
    statuses, details = [], []
    for g in (rec.get("data") or {}).get("gpus") or []:
        first, last, lo = _num(g.get("tflops_first")), _num(g.get("tflops_last")), _num(g.get("tflops_min"))
        med = _num(g.get("tflops_median"))
        st = J.PASS
        notes = []
        if g.get("mismatches") or not g.get("finite", True):
            st = J.FAIL
            notes.append(f"{g.get('mismatches')} result mismatch(es): the same product changed")
        if med and lo is not None and lo < 0.9 * med and st == J.PASS:
            st = J.WARN
            notes.append("throughput dipped below 90% of its median (throttling?)")
        if first and last is not None and last < 0.9 * first and st == J.PASS:
            st = J.WARN
            notes.append("throughput fell over the run (thermal or power throttling)")
        statuses.append(st)
        med_s = f"{med:.0f}" if med is not None else "?"
        lo_s = f"{lo:.0f}" if lo is not None else "?"
        details.append(
            f"{g.get('device')}: median {med_s} TFLOP/s, min {lo_s}, {g.get('windows')} windows; "
            + ("; ".join(notes) or "stable")
        )
    status = _verdict_or_skip(statuses)
    secs = (rec.get("data") or {}).get("seconds")
    return _f(
        cid,
        status,
        f"{secs:g} s of matmul stress: " + ("stable" if status == J.PASS else "; ".join(details))[:400],
        details=tuple(details),
        hint="look at nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER during a burn; a result mismatch needs the "
        "GPU replaced or RMA'd"
        if status in (J.WARN, J.FAIL)
        else None,
    )


# ---------------------------------------------------------------------------------------------- all in one


def run_workload(
    python: str,
    quick: bool = False,
    burn: float = 0.0,
    gpus: list | None = None,
    timeout: float = 180.0,
    env: dict | None = None,
    multinode: MultiNode | None = None,
    device: str = "auto",
) -> list[WorkloadFinding]:
    """Launch the probes with ``python`` and judge them against ``gpus`` (GpuLink / dicts / NVML GpuInfo)."""
    run = gather_workload(
        python, quick=quick, burn=burn, timeout=timeout, env=env, multinode=multinode, device=device
    )
    return judge_workload(run, gpus)


__all__ = [
    "CHECKS",
    "GpuLink",
    "MultiNode",
    "WorkloadFinding",
    "WorkloadRun",
    "gather_workload",
    "gpus_from_nvml",
    "judge_workload",
    "run_workload",
    "section",
]
