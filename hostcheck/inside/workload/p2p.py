"""The p2p section: GPU-to-GPU copy bandwidth for every ordered pair of GPUs (both directions).

A copy between two CUDA devices (``dst.copy_(src)``) is cudaMemcpyPeerAsync on the copy engines: over NVLink
(or PCIe peer-to-peer) when peer access is possible, staged through host memory when it is not. Whether peer
access is possible is reported per pair (``torch.cuda.can_device_access_peer``), so a slow pair says which of the
two it was. Timed with CUDA events on the source GPU's stream, where torch enqueues a cross-device copy.
"""

from __future__ import annotations

import statistics

from .common import MIB, _devices, _torch, timed_batches


def pair_rate(torch, src, dst, nbytes: int, warmup_s: float, measure_s: float, per_batch: int = 4) -> dict:
    """GB/s of ``nbytes`` copied from device ``src`` to device ``dst`` (median of timed batches; each copy
    counted once, as nvbandwidth counts a memcpy)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=src)
    a.fill_(1)
    b = torch.empty(nbytes, dtype=torch.uint8, device=dst)
    b.fill_(2)

    def fn():
        b.copy_(a, non_blocking=True)

    times = timed_batches(torch, src, fn, per_batch, warmup_s, measure_s)
    if dst.type == "cuda":
        torch.cuda.synchronize(dst)
    rates = [nbytes / t / 1e9 for t in times]
    ok = bool(b[:16].eq(1).all()) and bool(b[-16:].eq(1).all())
    return {
        "gbs": statistics.median(rates),
        "gbs_max": max(rates),
        "bytes": nbytes,
        "batches": len(rates),
        "ok": ok,
    }


def probe_p2p(args: dict) -> dict:
    """Every ordered pair of the GPUs (``gpus``: their indices, default all); fewer than two GPUs: skipped."""
    torch = _torch()
    devs = [d for d in _devices(torch, args.get("device", "cuda"), args.get("gpus")) if d.type == "cuda"]
    if len(devs) < 2:
        return {
            "skipped": f"{len(devs)} CUDA GPU{'s' if len(devs) != 1 else ''}: no pair to measure",
            "pairs": [],
        }
    nbytes = int(args.get("bytes", 256 * MIB))
    warmup_s = float(args.get("warmup_s", 0.05))
    measure_s = float(args.get("measure_s", 0.1))
    out = {
        "gpus": [d.index for d in devs],
        "names": [torch.cuda.get_device_name(d) for d in devs],
        "pairs": [],
    }
    first = True
    for src in devs:
        for dst in devs:
            if src == dst:
                continue
            row = {"src": src.index, "dst": dst.index}
            try:
                row["p2p"] = bool(torch.cuda.can_device_access_peer(src.index, dst.index))
            except Exception as exc:
                row["p2p"] = None
                row["p2p_error"] = f"{type(exc).__name__}: {exc}"
            try:
                # The first pair warms the copy engines and clocks up; the others run hot.
                row.update(pair_rate(torch, src, dst, nbytes, warmup_s * (4 if first else 1), measure_s))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
            first = False
            out["pairs"].append(row)
        torch.cuda.empty_cache()
    return out
