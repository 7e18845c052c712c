"""The bandwidth section: host<->device copies (pinned and pageable) and the device copy per GPU."""

from __future__ import annotations

import contextlib
import statistics

from .common import GIB, MIB, _devices, _torch, timed_batches

# ----------------------------------------------------------------------------------------- bandwidth


def copy_rate(
    torch,
    device,
    direction: str,
    pinned: bool,
    nbytes: int,
    warmup_s: float,
    measure_s: float,
    max_batches: int = 200,
):
    """GB/s of one host<->device direction ('h2d' or 'd2h'), pinned or pageable host memory."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    host.fill_(1)  # fault the pages in before timing
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev.fill_(2)
    if direction == "h2d":

        def fn():
            dev.copy_(host, non_blocking=pinned)

    else:

        def fn():
            host.copy_(dev, non_blocking=pinned)

    # Pageable copies return to the host only when done, so CUDA events still time them correctly.
    times = timed_batches(torch, device, fn, 4 if pinned else 2, warmup_s, measure_s, max_batches)
    rates = [nbytes / t / 1e9 for t in times]
    return {"gbs": statistics.median(rates), "gbs_max": max(rates), "bytes": nbytes, "batches": len(rates)}


def probe_bandwidth(args: dict) -> dict:
    """Host<->device (pinned and pageable, both directions) and device-copy bandwidth per GPU."""
    torch = _torch()
    devs = _devices(torch, args.get("device", "cuda"), args.get("gpus"))
    out = {"gpus": []}
    if devs[0].type == "cpu":
        # No host<->device link: time a host memory copy so the code path runs (no verdict on it).
        nbytes = int(args.get("copy_bytes", 8 * MIB))
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        times = timed_batches(torch, devs[0], lambda d=dst, s=src: d.copy_(s), 2, 0.02, 0.05)
        out["host_copy_gbs"] = 2 * nbytes / statistics.median(times) / 1e9
        return out
    h2d_bytes = int(args.get("h2d_bytes", 256 * MIB))
    warmup_s = float(args.get("warmup_s", 0.1))
    measure_s = float(args.get("measure_s", 0.2))
    for dev in devs:
        row = {"index": dev.index, "name": torch.cuda.get_device_name(dev)}
        for direction in ("h2d", "d2h"):
            for pinned in (True, False):
                key = "{}_{}".format(direction, "pinned" if pinned else "pageable")
                try:
                    row[key] = copy_rate(torch, dev, direction, pinned, h2d_bytes, warmup_s, measure_s)
                except Exception as exc:
                    row[key] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            total = torch.cuda.get_device_properties(dev).total_memory
            nbytes = int(args.get("copy_bytes", min(GIB, total // 10)))
            src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            src.fill_(3)
            dst = torch.empty_like(src)
            times = timed_batches(torch, dev, lambda d=dst, s=src: d.copy_(s), 10, warmup_s, measure_s)
            rates = [2 * nbytes / t / 1e9 for t in times]  # read + write
            row["device_copy"] = {"gbs": statistics.median(rates), "gbs_max": max(rates), "bytes": nbytes}
            del src, dst
        except Exception as exc:
            row["device_copy"] = {"error": f"{type(exc).__name__}: {exc}"}
        torch.cuda.empty_cache()
        out["gpus"].append(row)
    # The caching host allocator keeps the pinned buffers for the process's life otherwise.
    with contextlib.suppress(Exception):
        getattr(torch._C, "_host_emptyCache", lambda: None)()
    return out
