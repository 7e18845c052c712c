"""Measured paths: between GPUs (workload.E016, the copy bandwidth of every ordered pair of GPUs in the node),
through the NICs (workload.E017, an all_reduce with NCCL's peer-to-peer and shared memory off) and from each NIC
into GPU memory (workload.E018, GPUDirect RDMA write bandwidth with perftest).

A pair connected by NVLink is judged against its SKU's line in ``hostcheck/data/gpu_skus.json`` (``peer_copy``:
Azure's H100/H200 P2P line, which can fail); every pair is also compared with the node's other pairs, which can
only warn (no public line says how far a pair may lag its peers). A copy that raised is an error, never a fail;
a copy that delivered the wrong bytes is a fail.
"""

from __future__ import annotations

from typing import Any

from hostcheck.checks.workload import peers as P
from hostcheck.checks.workload import sku as S
from hostcheck.checks.workload.common import _f, gpu_for, link_int, num, workload_check
from hostcheck.gather.workload import WorkloadRun
from hostcheck.registry import Outcome, Status, plural, worst

_HINT_P2P = (
    "look at the pair's path: nvidia-smi topo -m (NV# for NVLink, PIX/PXB/PHB/SYS for PCIe), nvidia-smi nvlink "
    "--status -i GPU (a link down or at a lower speed), the NVIDIA fabric manager on NVSwitch systems, and ACS "
    "on the PCIe switches (it forces peer traffic through the root complex); re-measure with NVIDIA's nvbandwidth"
)


def _tolerance(config: Any) -> float:
    t = getattr(config, "thresholds", None)
    return float(getattr(t, "gpu_peer_tolerance", 0.1))


def _nvlink(gpus: list, index: Any) -> bool | None:
    n = link_int(gpu_for(gpus, index), "nvlink_active")
    return None if n is None else n > 0


@workload_check("workload.E016", "GPU-to-GPU copy bandwidth, every pair", 1.0, "p2p", reads_config=True)
def peer_copy(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any) -> Outcome:
    data = run.p2p
    if data.error is not None:
        return _f(Status.ERROR, f"GPU-to-GPU copies not measured: {data.error}")
    if data.skipped:
        return _f(Status.SKIP, f"not measured: {data.skipped}")
    pairs = data.pairs
    if not pairs:
        return _f(Status.ERROR, "GPU-to-GPU copies: the probe gave no pair")
    names = set(data.names)
    line = S.peer_copy_line(names.pop()) if len(names) == 1 else None
    statuses: list[Status] = []
    details: list[str] = []
    rates: dict[tuple[int, int], float] = {}
    for p in pairs:
        key = (p.src, p.dst)
        where = f"GPU {key[0]} -> GPU {key[1]}"
        gbs = p.gbs
        p2p = {
            True: "peer access on",
            False: "peer access OFF (staged through host memory)",
            None: "peer access ?",
        }[p.p2p]
        if p.error or gbs is None or gbs <= 0:
            statuses.append(Status.ERROR)
            details.append(f"{where}: not measured ({p.error or 'no figure'})")
            continue
        rates[key] = gbs
        text = f"{where}: {gbs:.1f} GB/s, {p2p}"
        if p.ok is False:
            statuses.append(Status.FAIL)
            details.append(text + "; the copied bytes were wrong")
            continue
        nvlink = _nvlink(gpus, key[0]) and _nvlink(gpus, key[1])
        if line is not None and nvlink:
            if gbs < line.gbs:
                statuses.append(Status.FAIL if line.basis == "public" else Status.WARN)
                details.append(f"{text}; below the line {line.gbs:g} GB/s")
                continue
            if gbs < line.gbs * line.warn_band:
                statuses.append(Status.WARN)
                details.append(f"{text}; within {line.warn_band - 1:.0%} of the line {line.gbs:g} GB/s")
                continue
        details.append(text)
        statuses.append(Status.PASS)
    tol = _tolerance(config)
    for key, ratio in P.below_peers(rates, tol).items():
        statuses.append(Status.WARN)
        details.append(f"GPU {key[0]} -> GPU {key[1]}: {P.peer_detail(rates[key], ratio, 'GB/s', tol)}")
    st = worst(statuses)
    slowest = min(rates, key=rates.get) if rates else None
    msg = f"{len(pairs)} GPU pairs copied"
    if slowest is not None:
        msg += f"; slowest GPU {slowest[0]} -> GPU {slowest[1]} at {rates[slowest]:.1f} GB/s"
    if line is not None:
        expected = f">= {line.gbs:g} GB/s per NVLink pair ({line.source})"
    else:
        expected = f"within {tol:.0%} of the other pairs (no per-SKU line: never extrapolated)"
    bad = [d for d, s in zip(details, statuses) if s is not Status.PASS] if st is not Status.PASS else []
    return _f(
        st,
        msg,
        value=round(rates[slowest], 1) if slowest is not None else None,
        unit="GB/s",
        expected=expected,
        hint=_HINT_P2P if st in (Status.WARN, Status.FAIL) else None,
        details=tuple(bad or details),
    )


_HINT_NIC = (
    "look at the RDMA ports: ibstat / ibv_devinfo (state, rate), the ports' error counters, GPUDirect RDMA "
    "(nvidia-peermem or DMA-BUF), NCCL_IB_HCA naming the right devices, and NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET "
    "on a re-run with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
)


@workload_check(
    "workload.E017", "all_reduce through the NICs (NCCL P2P and SHM off)", 1.0, "nic_loopback", True
)
def nic_loopback(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any) -> Outcome:
    if run.nic_loopback_skipped:
        return _f(Status.SKIP, f"not run: {run.nic_loopback_skipped}")
    if not run.nic_loopback:
        return _f(Status.SKIP, "not run")
    res = run.nic_loopback_results
    recs, errors, hung = res.ranks, res.errors, res.hung
    if hung:
        return _f(Status.FAIL, "the all_reduce through the NICs hung", hint=_HINT_NIC, details=tuple(errors))
    if errors or not recs:
        return _f(Status.ERROR, "not measured: the all_reduce through the NICs failed", details=tuple(errors))
    r0 = next((r for r in recs if r.rank == 0), recs[0])
    if not all(r.allreduce_ok for r in recs):
        return _f(Status.FAIL, "the all_reduce through the NICs gave a wrong sum", hint=_HINT_NIC)
    bus = r0.busbw_gbs
    if bus is None:
        return _f(Status.ERROR, f"not measured: {r0.bw_skipped or 'no bus bandwidth'}")
    active = [p for p in run.nic_ports if p.get("state") == "ACTIVE" and num(p.get("rate_gbps"))]
    size = f"{(r0.bw_bytes or 0) / 2**20:.0f} MiB"
    msg = f"all_reduce busbw {bus:.1f} GB/s at {size} over {r0.world} GPUs with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
    if not active:
        return _f(
            Status.SKIP,
            msg + "; no active RDMA port with a rate to judge it by",
            value=round(bus, 1),
            unit="GB/s",
        )
    slow = min(active, key=lambda p: p["rate_gbps"])
    line_gbs = slow["rate_gbps"] / 8.0
    frac = float(getattr(getattr(config, "thresholds", None), "nic_loopback_line_fraction", 0.8))
    msg += f"; the slowest port {slow['device']}:{slow['port']} runs at {slow['rate_gbps']:g} Gb/s = {line_gbs:g} GB/s"
    expected = (
        f">= {frac:.0%} of {line_gbs:g} GB/s (hostcheck's line from Azure's retired IB loopback check; warns)"
    )
    st = Status.WARN if bus < frac * line_gbs else Status.PASS
    return _f(
        st,
        msg,
        value=round(bus, 1),
        unit="GB/s",
        expected=expected,
        hint=_HINT_NIC if st is Status.WARN else None,
    )


_HINT_GDR = (
    "check the NIC and its path to the GPU: ibstat (rate, state), GPUDirect RDMA (nvidia-peermem loaded or DMA-BUF "
    "with the open kernel modules), ACS on the PCIe switch between them, the GPU's and the NIC's NUMA node "
    "(nvidia-smi topo -m), and re-run ib_write_bw --use_cuda by hand"
)


@workload_check(
    "workload.E018", "GPUDirect RDMA write bandwidth per NIC", 1.0, "gdr_write", reads_config=True
)
def gdr_write(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any) -> Outcome:
    g = run.gdr_write
    if g is None:
        return _f(Status.SKIP, "not run")
    if g.skipped:
        return _f(Status.SKIP, f"not run: {g.skipped}")
    t = getattr(config, "thresholds", None)
    ndr = float(getattr(t, "gdr_write_ndr_gbps", 360.0))
    frac = float(getattr(t, "gdr_write_line_fraction", 0.9))
    statuses, details, rates = [], [], []
    for row in g.rows:
        where = f"{row.get('device')}:{row.get('port')} with GPU {row.get('gpu')} (NUMA node {row.get('numa_node')})"
        gbps = num(row.get("gbps"))
        if row.get("error") or gbps is None:
            statuses.append(Status.ERROR)
            details.append(f"{where}: not measured ({row.get('error') or 'no figure'})")
            continue
        rates.append(gbps)
        rate = num(row.get("rate_gbps"))
        if rate == 400.0:
            st = Status.FAIL if gbps < ndr else Status.PASS
            line = f"{ndr:g} Gb/s (Azure, NDR)"
        elif rate:
            st = Status.WARN if gbps < frac * rate else Status.PASS
            line = f"{frac:.0%} of {rate:g} Gb/s (hostcheck's, warns)"
        else:
            st, line = Status.PASS, "no line (the port's rate is unknown)"
        statuses.append(st)
        details.append(f"{where}: {gbps:.1f} Gb/s, line {line}")
    if not statuses:
        return _f(Status.ERROR, "GPUDirect write: no NIC gave a result")
    st = worst(statuses)
    missed = len(g.rows) - len(rates)
    if not rates:
        msg = f"no NIC wrote into GPU memory ({plural(missed, 'NIC')} not measured)"
    else:
        msg = f"{plural(len(rates), 'NIC')} wrote into GPU memory; slowest {min(rates):.1f} Gb/s"
        msg += f" ({missed} not measured)" if missed else ""
    return _f(
        st,
        msg,
        value=round(min(rates), 1) if rates else None,
        unit="Gb/s",
        expected=f">= {ndr:g} Gb/s on a 400 Gb/s port (Azure HPC health checks); {frac:.0%} of other rates (warns)",
        hint=_HINT_GDR if st in (Status.WARN, Status.FAIL) else None,
        details=tuple(details),
    )
