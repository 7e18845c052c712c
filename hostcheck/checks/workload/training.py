"""Workload checks of training: AMP numerics and speedup, the DataLoader, DDP on this node and across nodes,
and the optional burn-in.
"""

from __future__ import annotations

from typing import Any

from hostcheck.checks.workload import grading
from hostcheck.checks.workload import sku as S
from hostcheck.checks.workload.common import _f, link_int, verdict_or_skip, workload_check
from hostcheck.gather.suite import AmpRun
from hostcheck.gather.workload import WorkloadRun
from hostcheck.registry import Outcome, Status, worst


@workload_check("workload.E009", "AMP training step numerics", 2.0, "amp", reads_config=True)
def amp_numerics(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any = None) -> Outcome:
    data = run.amp
    if data.error is not None:
        return _f(Status.ERROR, f"AMP step not run: {data.error}")
    statuses, details, bad = [], [], []
    for kind, modes in data.models.items():
        for mode, r in modes.items():
            if r.error is not None:
                statuses.append(Status.ERROR)
                bad.append(f"{kind} {mode}: raised {r.error}")
                continue
            if r.losses is None:
                st, why = Status.ERROR, "a loss that is no number recorded"
            else:
                st, why = grading.loss_numerics(r.losses)
            if mode == "fp16":
                sst = grading.scaler_status(r.skipped or 0, r.steps or 0, grading.lines(config))
                if sst != Status.PASS:
                    why += f"; GradScaler skipped {r.skipped} of {r.steps} steps"
                    st = worst([st, sst])
            statuses.append(st)
            line = f"{kind} {mode}: {why}"
            details.append(line)
            if st != Status.PASS:
                bad.append(line)
    status = verdict_or_skip(statuses)
    if status == Status.PASS:
        msg = f"finite losses that fall, GradScaler healthy ({len(statuses)} model/precision runs, {data.device})"
    elif status == Status.SKIP:
        msg = "no AMP runs recorded"
    else:
        msg = "; ".join(bad)[:500]
    hint = (
        "a numerics failure on a healthy stack points at the GPU (ECC, row remaps) or a broken torch/cuDNN "
        "install; re-run, then run with CUDA_LAUNCH_BLOCKING=1 for the failing precision"
        if status in (Status.FAIL, Status.ERROR)
        else None
    )
    return _f(status, msg, details=tuple(details), hint=hint)


@workload_check("workload.E010", "AMP speedup", 1.0, "amp", reads_config=True)
def amp_speedup(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any = None) -> Outcome:
    th = grading.lines(config)
    data = run.amp
    if data.error is not None:
        return _f(Status.ERROR, f"AMP step not run: {data.error}")
    speedups, details = {}, []
    none = AmpRun()
    for kind, modes in data.models.items():
        base = modes.get("fp32", none).per_s
        best = None
        for mode in ("fp16", "bf16"):
            v = modes.get(mode, none).per_s
            if base and v:
                sp = v / base
                details.append(f"{kind} {mode}: {v:.1f} vs fp32 {base:.1f} {modes[mode].unit} = {sp:.2f}x")
                if best is None or sp > best[0]:
                    best = (sp, mode)
        if best:
            speedups[kind] = best
    if not speedups:
        return _f(Status.ERROR, "no AMP timing recorded", details=tuple(details))
    if data.conv_tf32:
        # torch's default, which a training job gets too; the transformer's fp32 matmuls stay IEEE.
        details.append(
            "the CNN's fp32 baseline runs its convolutions in TF32 (cudnn.allow_tf32, torch's default)"
        )
    worst_kind = min(speedups, key=lambda k: speedups[k][0])
    sp, mode = speedups[worst_kind]
    summary = ", ".join(f"{k} {v[0]:.2f}x ({v[1]})" for k, v in speedups.items())
    if not on_gpu:
        return _f(
            Status.SKIP,
            f"on the CPU, no verdict: {summary}",
            value=round(sp, 3),
            unit="x",
            details=tuple(details),
        )
    status = grading.amp_speedup_status(sp, th)
    hint = None
    if status in (Status.WARN, Status.FAIL):
        hint = (
            "AMP gives no speedup: check that the GPU has tensor cores (compute capability >= 7.0), that "
            "cuDNN is loaded (torch.backends.cudnn.is_available()), that the GPU is not throttling, and that "
            "the CPU is not the bottleneck (launch overhead: larger batches, CUDA graphs)"
        )
    return _f(
        status,
        f"AMP speedup {summary}",
        value=round(sp, 3),
        unit="x",
        expected=f">= {th.amp_speedup_warn}x (reference H100: CNN 3.1x fp16+channels_last, transformer 6.1x bf16)",
        hint=hint,
        details=tuple(details),
    )


@workload_check("workload.E011", "DataLoader throughput", 1.0, "dataloader", reads_config=True)
def dataloader(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any = None) -> Outcome:
    data = run.dataloader
    if data.error is not None:
        return _f(Status.ERROR, f"DataLoader probe not run: {data.error}")
    details, errors = [], []
    for r in data.runs:
        if r.error is not None:
            errors.append(f"num_workers={r.workers}: {r.error}")
            details.append(errors[-1])
        else:
            details.append(
                f"num_workers={r.workers}: {r.ips or 0:.0f} img/s (first epoch {r.first_epoch_s or 0:.2f} s)"
            )
    best, best_ips, zero = data.best_workers, data.best_ips, data.zero_ips
    settings = (
        f"num_workers={best}, pin_memory={data.pin_memory}, persistent_workers=True, "
        f"prefetch_factor={data.prefetch_factor}"
    )
    if errors:
        shm = data.shm_bytes
        shm_s = f"/dev/shm is {shm / 2**20:.0f} MiB; " if isinstance(shm, int) else ""
        return _f(
            Status.FAIL,
            "DataLoader failed: " + "; ".join(errors)[:400],
            value=best_ips,
            unit="img/s",
            hint=shm_s
            + "worker crashes ('bus error', 'DataLoader worker killed') usually mean a small /dev/shm "
            "(containers default to 64 MiB: docker --shm-size / --ipc=host) or too little memory",
            details=tuple(details),
        )
    st = grading.dataloader_status(best_ips, zero, data.cpus or 0, grading.lines(config))
    if best_ips is None:
        return _f(Status.ERROR, "DataLoader measured nothing", details=tuple(details))
    gain = f", {best_ips / zero:.2f}x num_workers=0" if zero and best else ""
    if best == 0:
        settings = f"num_workers=0 (no worker count beat it), pin_memory={data.pin_memory}"
    msg = f"{best_ips:.0f} img/s with {settings}{gain} ({data.crop} px crops, {data.cpus} CPUs)"
    if st is None:
        return _f(
            Status.PASS,
            msg + "; too few CPUs to expect a gain from workers",
            value=best_ips,
            unit="img/s",
            details=tuple(details),
        )
    hint = None
    if st == Status.WARN:
        hint = (
            "workers do not speed up decoding: check CPU affinity/cgroup CPU limits (os.sched_getaffinity), "
            "OMP_NUM_THREADS oversubscription in workers, pillow-simd, and /dev/shm"
        )
    return _f(
        st,
        msg,
        value=round(best_ips, 1),
        unit="img/s",
        expected=">= 1.2x num_workers=0",
        hint=hint,
        details=tuple(details),
    )


_HINT_NCCL = (
    "re-run with NCCL_DEBUG=INFO; check that every GPU is visible (CUDA_VISIBLE_DEVICES), peer access "
    "(nvidia-smi topo -m), the NVIDIA fabric manager on NVSwitch systems, and ACS/IOMMU settings "
    "(NCCL_P2P_DISABLE=1 as a test)"
)


@workload_check("workload.E012", "DDP: process group, all_reduce, training step", 2.0, "ddp")
def ddp(run: WorkloadRun, gpus: list, on_gpu: bool) -> Outcome:
    if not run.ddp_mode:
        return _f(Status.SKIP, "DDP probe not run")
    res = run.ddp_results
    recs, errors, hung = res.ranks, res.errors, res.hung
    if errors or not recs:
        why = "; ".join(errors)[:500] or "no rank reported"
        msg = ("DDP hung: " if hung else "DDP failed: ") + why
        return _f(Status.FAIL if hung else Status.ERROR, msg, hint=_HINT_NCCL)
    world = recs[0].world or len(recs)
    backend = recs[0].backend
    bad = [r for r in recs if not (r.allreduce_ok and r.ddp_ok)]
    details = tuple(
        f"rank {r.rank}: all_reduce sum {r.allreduce_value} (want {world}), DDP step loss "
        f"{r.ddp_loss}, param max diff {r.ddp_param_maxdiff}, init {r.init_s} s"
        for r in recs
    )
    if bad:
        return _f(
            Status.FAIL,
            f"{backend} world {world}: wrong all_reduce or diverged DDP step on {len(bad)} rank(s)",
            details=details,
            hint=_HINT_NCCL,
        )
    if backend == "gloo":
        return _f(
            Status.PASS,
            f"no GPU: a {world}-process gloo run proves the distributed path (all_reduce sum "
            f"= {world}, one DDP step); NCCL not exercised",
            details=details,
        )
    return _f(
        Status.PASS,
        f"NCCL world {world} ({run.ddp_mode}): all_reduce sum = {world}, DDP step in sync",
        details=details,
    )


def _reach(sku: Any, nvlink: bool | None, gpus: list) -> float | None:
    """The most GB/s one way the GPUs' interconnect carries by its datasheet: the SKU's NVLink peak over NVLink, the
    slowest GPU's PCIe link rate over PCIe; None where it is not known (an unknown SKU over NVLink)."""
    if nvlink:
        return sku.peak_nvlink_gbs if sku is not None and sku.peak_nvlink_gbs else None
    if nvlink is False:
        rates = [
            grading.pcie_theoretical_gbs(link_int(g, "pcie_gen_max"), link_int(g, "pcie_width_max"))
            for g in gpus
        ]
        return min(rates) if rates and all(r is not None for r in rates) else None
    return None


@workload_check("workload.E013", "all_reduce bus bandwidth", 1.0, "ddp", reads_config=True)
def busbw(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any = None) -> Outcome:
    th = grading.lines(config)
    if not run.ddp_mode:
        return _f(Status.SKIP, "DDP probe not run")
    recs, errors = run.ddp_results.ranks, run.ddp_results.errors
    if errors or not recs:
        return _f(Status.ERROR, "not measured: the DDP probe failed")
    world = recs[0].world or len(recs)
    backend = recs[0].backend
    r0 = next((r for r in recs if r.rank == 0), recs[0])
    bus = r0.busbw_gbs
    alg = r0.algbw_gbs
    size = f"{(r0.bw_bytes or 0) / 2**20:.0f} MiB"
    if backend != "nccl":
        return _f(
            Status.SKIP,
            f"gloo on the CPU: busbw {bus:.2f} GB/s at {size}, not judged"
            if bus is not None
            else "not measured",
            value=bus,
            unit="GB/s",
        )
    if world < 2:
        return _f(
            Status.SKIP,
            f"one GPU: no inter-GPU traffic (algbw {alg:.0f} GB/s at {size} is a local copy)"
            if alg
            else "one GPU: all_reduce moves no data, bandwidth not measured",
            value=bus,
            unit="GB/s",
        )
    nv = [link_int(g, "nvlink_active") for g in gpus[:world]]
    nvlink: bool | None = None
    if nv and all(x is not None for x in nv):
        nvlink = all(x > 0 for x in nv)
    floor = grading.busbw_floor(nvlink, th)
    names = {g.name for g in gpus[:world] if isinstance(getattr(g, "name", None), str)}
    name = names.pop() if len(names) == 1 else None
    line = S.allreduce_line(name, world) if name is not None and len(gpus) >= world else None
    reach = _reach(S.lookup(name), nvlink, gpus[:world])
    can_fail = floor is not None and reach is not None and reach > floor
    nbytes = r0.bw_bytes
    inter = {True: "NVLink", False: "PCIe", None: "interconnect unknown"}[nvlink]
    msg = f"all_reduce busbw {bus:.1f} GB/s at {size} over {world} GPUs ({inter}; algbw {alg:.1f} GB/s)"
    if floor is not None and not can_fail and bus < floor:
        msg += (
            f"; below Meta GCM's {floor:g} GB/s floor, which "
            + (
                f"this SKU's interconnect ({reach:g} GB/s one way) cannot reach"
                if reach is not None
                else f"no datasheet says {name or 'these GPUs'} can reach (an unknown SKU: no line of its own)"
            )
            + ": a warning, not a fail"
        )
    if line is None:
        st = grading.busbw_status(bus, world, nvlink, th, floor_can_fail=can_fail)
        expected = f">= {floor:g} GB/s (Meta GCM floor, {inter}; warn within 5%)" if floor else None
    else:
        st = grading.allreduce_status(
            bus,
            nbytes,
            floor,
            line.busbw_gbs,
            line.bytes,
            line.basis == "public",
            th,
            floor_can_fail=can_fail,
        )
        expected = f">= {line.busbw_gbs:g} GB/s at {line.bytes / 2**30:g} GiB ({line.source})"
        if nbytes is None or nbytes < line.bytes:
            msg += (
                f"; the line is set at {line.bytes / 2**30:g} GiB, a size this run did not reach (the plateau "
                "needs large messages), so below it only warns"
            )
    if st is None:
        return _f(Status.SKIP, msg + ", no verdict", value=bus, unit="GB/s")
    hint = _HINT_NCCL if st in (Status.WARN, Status.FAIL) else None
    if hint and line is not None and (nbytes is None or nbytes < line.bytes):
        hint = (
            "measure at the line's size: a longer budget (--profile burnin) or "
            '--workload-section-args \'{"ddp": {"bw_max_bytes": N}}\'; then ' + hint
        )
    return _f(st, msg, value=round(bus, 1), unit="GB/s", expected=expected, hint=hint)


@workload_check("workload.E014", "Multi-node DDP", 1.0)
def multinode(run: WorkloadRun, gpus: list, on_gpu: bool) -> Outcome:
    if not run.multinode_requested:
        return _f(Status.SKIP, "not requested (give --nnodes and --rdzv-endpoint)")
    res = run.multinode_results
    recs, errors = res.ranks, res.errors
    if errors or not recs:
        hung = res.hung
        return _f(
            Status.FAIL if hung else Status.ERROR,
            "multi-node DDP "
            + ("hung: " if hung else "failed: ")
            + ("; ".join(errors) or "no rank reported")[:500],
            hint="check the rendezvous endpoint is reachable from every node, the same --rdzv-id on all, "
            "NCCL_SOCKET_IFNAME / NCCL_IB_HCA, and firewalls; NCCL_DEBUG=INFO shows the transport",
            # torchrun's own report (which rank failed, and why) is in its stderr.
            details=tuple(ln for r in run.multinode for ln in r.stderr_tail.splitlines() if ln.strip()),
        )
    bad = [r for r in recs if not (r.allreduce_ok and r.ddp_ok)]
    world = recs[0].world
    r0 = next((r for r in recs if r.rank == 0), None)
    bw = f"; busbw {r0.busbw_gbs:.1f} GB/s" if r0 and r0.busbw_gbs is not None else ""
    details = tuple(f"rank {r.rank}: all_reduce {r.allreduce_value}, ddp_ok {r.ddp_ok}" for r in recs)
    if bad:
        return _f(
            Status.FAIL,
            f"world {world}: wrong all_reduce or diverged DDP step on {len(bad)} local rank(s)",
            details=details,
        )
    return _f(
        Status.PASS,
        f"world {world}: {len(recs)} local rank(s) correct{bw}",
        value=r0.busbw_gbs if r0 else None,
        unit="GB/s",
        details=details,
    )


@workload_check("workload.E015", "Burn-in stress", 1.0, reads_config=True)
def burn(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any = None) -> Outcome:
    dip = grading.lines(config).burn_dip_fraction
    if not run.burn_requested:
        return _f(Status.SKIP, "not requested (--burn SECONDS)")
    b = run.burn
    result = run.burn_result
    if result is None:
        why = b.error if b else "not run"
        return _f(Status.FAIL if b and b.timed_out else Status.ERROR, f"burn did not finish: {why}")
    statuses, details = [], []
    for g in result.rows:
        first, last, lo, med = g.first, g.last, g.lowest, g.median
        st = Status.PASS
        notes = []
        if g.mismatches or not g.finite:
            st = Status.FAIL
            notes.append(f"{g.mismatches} result mismatch(es): the same product changed")
        if med and lo is not None and lo < dip * med and st == Status.PASS:
            st = Status.WARN
            notes.append(f"throughput dipped below {dip:.0%} of its median (throttling?)")
        if first and last is not None and last < dip * first and st == Status.PASS:
            st = Status.WARN
            notes.append("throughput fell over the run (thermal or power throttling)")
        statuses.append(st)
        med_s = f"{med:.0f}" if med is not None else "?"
        lo_s = f"{lo:.0f}" if lo is not None else "?"
        details.append(
            f"{g.device}: median {med_s} TFLOP/s, min {lo_s}, {g.windows} windows; "
            + ("; ".join(notes) or "stable")
        )
    status = verdict_or_skip(statuses)
    secs = f"{result.seconds:g}" if result.seconds is not None else "?"
    return _f(
        status,
        f"{secs} s of matmul stress: " + ("stable" if status == Status.PASS else "; ".join(details))[:400],
        details=tuple(details),
        hint="look at nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER during a burn; a result mismatch needs the "
        "GPU replaced or RMA'd"
        if status in (Status.WARN, Status.FAIL)
        else None,
    )
