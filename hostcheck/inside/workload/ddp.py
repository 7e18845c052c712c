"""The DDP section and the per-rank worker: all_reduce correctness, one DDP step, all_reduce bandwidth."""

from __future__ import annotations

import contextlib
import datetime
import gc
import math
import os
import time

from .common import GIB, MIB, _sync, _torch

# ----------------------------------------------------------------------------------------------- DDP


def ddp_worker(args: dict) -> dict:
    """One rank: init the process group (NCCL on GPUs, gloo otherwise), check all_reduce, one DDP step,
    all_reduce bus bandwidth. Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT from the environment
    (set by our launcher or by torchrun)."""
    torch = _torch()
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = args.get("backend") or ("nccl" if torch.cuda.is_available() else "gloo")
    timeout = datetime.timedelta(seconds=float(args.get("pg_timeout_s", 60)))
    out = {"rank": rank, "world": world, "local_rank": local_rank, "backend": backend}
    t0 = time.perf_counter()
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        try:
            dist.init_process_group("nccl", timeout=timeout, device_id=device)
        except TypeError:  # torch without device_id
            dist.init_process_group("nccl", timeout=timeout)
        out["gpu"] = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    try:
        # all_reduce correctness: the sum of ones over the ranks equals the world size everywhere.
        t = torch.ones(1 << 20, device=device)
        dist.all_reduce(t)
        _sync(torch, device)
        out["init_s"] = round(time.perf_counter() - t0, 3)
        lo, hi = float(t.min()), float(t.max())
        out["allreduce_ok"] = lo == hi == float(world)
        out["allreduce_value"] = [lo, hi]

        _ddp_step(torch, dist, device, rank, local_rank, out)
        _allreduce_bw(torch, dist, device, world, args, out)
    finally:
        # The DDP objects are gone by now (_ddp_step's locals): the process group is torn down here, with every
        # collective finished, and never by a Reducer's deallocation, which can deadlock gloo's worker threads
        # against the GIL (seen: about 1 in 100 one-rank gloo runs hung in ~ProcessGroupGloo).
        gc.collect()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    return out


def _ddp_step(torch, dist, device, rank: int, local_rank: int, out: dict) -> None:
    """One DDP training step; afterwards every rank must hold the same parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    d = 256 if device.type == "cuda" else 32
    model = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, 1)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator(device="cpu").manual_seed(100 + rank)  # different data per rank
    x = torch.randn(64, d, generator=g).to(device)
    y = torch.randn(64, 1, generator=g).to(device)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    diff = (flat - ref).abs().max().reshape(1)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    lossv = float(loss.detach())
    out["ddp_loss"] = lossv
    out["ddp_param_maxdiff"] = float(diff)
    out["ddp_ok"] = bool(math.isfinite(lossv) and float(diff) == 0.0)
    dist.barrier()  # every rank's reducer work is done before the DDP objects go


def _allreduce_time(torch, dist, device, buf, iters: int, warmup: int = 2) -> float:
    """Seconds per all_reduce of ``buf`` on the slowest rank (every rank gets the same figure)."""
    for _ in range(warmup):
        dist.all_reduce(buf)
    _sync(torch, device)
    dist.barrier()
    t1 = time.perf_counter()
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(buf)
        stop.record()
        stop.synchronize()
        per = start.elapsed_time(stop) / 1000.0 / iters
    else:
        for _ in range(iters):
            dist.all_reduce(buf)
        per = (time.perf_counter() - t1) / iters
    slowest = torch.tensor([per], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest)


#: The algorithm bandwidth a healthy 8 x H100 node reaches at large messages, about 275 GB/s (NVIDIA's NCCL
#: maintainer on NVIDIA/nccl-tests#212): the message size is the largest whose timed operations fit the budget
#: at that rate, so a slow node is measured at the same size as a healthy one, only with fewer operations.
NOMINAL_ALGBW = 275e9
#: A small message measured beside the large one, for the record: it shows how far from the plateau it is.
SMALL_MESSAGE = 256 * MIB


def allreduce_bytes(budget_s: float, most: int, iters: int, first: int = MIB) -> int:
    """The largest power of two from ``first`` up to ``most`` whose ``iters`` operations take at most
    ``budget_s`` at NOMINAL_ALGBW (at least ``first``, at most ``most``)."""
    nbytes = max(1, min(first, most))
    while nbytes * 2 <= most and nbytes * 2 * iters / NOMINAL_ALGBW <= budget_s:
        nbytes *= 2
    return nbytes


def _allreduce_bw(torch, dist, device, world: int, args: dict, out: dict) -> None:
    """all_reduce bandwidth of the slowest rank into ``out``: algbw and busbw = algbw x 2(n-1)/n at the largest
    message the time budget ``bw_budget_s`` allows (allreduce_bytes, up to ``bw_max_bytes``, capped at a quarter
    of the GPU's memory), and at 256 MiB beside it, both in ``bw_sweep``; ``bw_bytes`` measures that one size.
    The number of timed operations adapts to the measured time, so a slow node stays within the budget.
    Large messages reach the plateau that the per-SKU lines are set at (NVIDIA/nccl-tests#212)."""
    if world < 2:
        # NCCL's one-rank all_reduce in place is a no-op: timing it would report an absurd "bandwidth".
        out["bw_skipped"] = "world size 1: all_reduce moves no data"
        return
    cuda = device.type == "cuda"
    iters = int(args.get("bw_iters", 20 if cuda else 3))
    budget = float(args.get("bw_budget_s", 2.0 if cuda else 0.5))
    if "bw_bytes" in args:
        sizes = [int(args["bw_bytes"])]
    else:
        most = int(args.get("bw_max_bytes", 16 * GIB if cuda else 4 * MIB))
        if cuda:
            most = min(most, torch.cuda.get_device_properties(device).total_memory // 4)
        else:  # gloo over host memory: the code path, not a figure anyone judges
            most = min(most, 64 * MIB)
        target = allreduce_bytes(budget, most, iters)
        sizes = sorted({min(SMALL_MESSAGE, target), target})
    sweep = []
    for nbytes in sizes:
        share = budget * (0.9 if nbytes == sizes[-1] else 0.1)
        buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        one = _allreduce_time(torch, dist, device, buf, 1)
        n = max(1, min(iters, int(share / one) if one > 0 else iters))
        per = _allreduce_time(torch, dist, device, buf, n, warmup=0) if n > 1 else one
        del buf
        if cuda:
            torch.cuda.empty_cache()
        algbw = nbytes / per / 1e9
        busbw = algbw * 2.0 * (world - 1) / world
        sweep.append({"bytes": nbytes, "iters": n, "s": per, "algbw_gbs": algbw, "busbw_gbs": busbw})
    last = sweep[-1]
    out["bw_bytes"] = last["bytes"]
    out["bw_iters"] = last["iters"]
    out["allreduce_s"] = last["s"]
    out["algbw_gbs"] = last["algbw_gbs"]
    out["busbw_gbs"] = last["busbw_gbs"]
    out["bw_sweep"] = sweep
    out["bw_budget_s"] = budget
    dist.barrier()


def probe_ddp_inprocess(args: dict) -> dict:
    """World size 1 in this process (one GPU): NCCL still initialises and the step runs, without a
    second `import torch`. With ``single_gpu_only`` and not exactly one GPU, it only says so
    (``deferred``): the parent then launches one process per GPU, or two gloo processes."""
    import socket

    if args.get("single_gpu_only"):
        torch = _torch()
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if args.get("device") == "cpu":
            n = 0
        if n != 1:
            return {"deferred": True, "gpus": n}

    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        env["MASTER_PORT"] = str(s.getsockname()[1])
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return ddp_worker(args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
