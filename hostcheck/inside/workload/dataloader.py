"""The DataLoader section: real JPEGs decoded by worker processes, images per second per worker count."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from ..fixtures import JpegDataset, recommended_workers, shm_bytes, write_jpegs
from .common import _devices, _sync, _torch

# ---------------------------------------------------------------------------------------- DataLoader


def dataloader_images(workers, batch: int, floor: int = 192) -> int:
    """Images per epoch: three batches for each worker of the largest count, or that count measures one
    batch's latency instead of a rate (192 images in batches of 32 kept only 6 of 8 workers busy)."""
    return max(floor, 3 * max(int(w) for w in workers) * batch)


def dataloader_rate(
    torch, ds, workers: int, batch: int, pin: bool, device, epochs: int, max_batches: int | None = None
):
    """Images/s of `epochs` timed passes after one warm pass (workers start during the warm pass); at
    most ``max_batches`` timed batches when given (a steady rate needs no whole epoch without workers)."""
    from torch.utils.data import DataLoader

    kw = {"batch_size": batch, "shuffle": True, "num_workers": workers, "pin_memory": pin, "drop_last": False}
    if workers > 0:
        kw["persistent_workers"] = True
        kw["prefetch_factor"] = 4
    dl = DataLoader(ds, **kw)
    try:
        # Warm pass: a whole epoch with workers (they start, and persist); one batch without.
        t0 = time.perf_counter()
        for xb, _ in dl:
            if device.type == "cuda":
                xb.to(device, non_blocking=pin)
            if workers == 0:
                break
        warm_s = time.perf_counter() - t0
        _sync(torch, device)
        t0 = time.perf_counter()
        n = nb = 0
        for _ in range(epochs):
            for xb, _ in dl:
                if device.type == "cuda":
                    xb = xb.to(device, non_blocking=pin)
                n += xb.shape[0]
                nb += 1
                if max_batches is not None and nb >= max_batches:
                    break
        _sync(torch, device)
        return {"ips": n / (time.perf_counter() - t0), "images": n, "first_epoch_s": warm_s}
    finally:
        del dl


def probe_dataloader(args: dict) -> dict:
    torch = _torch()
    dev = _devices(torch, args.get("device", "cuda"), args.get("gpus"))[0]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ngpu = torch.cuda.device_count() if dev.type == "cuda" else 1
    cpu = dev.type == "cpu"
    batch = int(args.get("batch", 8 if cpu else 16))
    crop = int(args.get("crop", 64 if cpu else 224))
    size = tuple(args.get("size", (160, 128) if cpu else (484, 402)))
    epochs = int(args.get("epochs", 1))
    rec = recommended_workers(cpus, ngpu)
    cands = args.get("workers")
    if cands is None:
        cands = sorted({0, rec} | ({max(1, rec // 2)} if rec >= 4 else set()))
    count = int(args.get("images", 32 if cpu else dataloader_images(cands, batch)))
    zero_batches = int(args.get("zero_batches", 6))
    pin = dev.type == "cuda"
    tmp = tempfile.mkdtemp(prefix="hostcheck-jpeg-")
    try:
        t0 = time.perf_counter()
        paths = write_jpegs(tmp, count, size=size)
        write_s = time.perf_counter() - t0
        ds = JpegDataset(paths, crop=crop)
        results = {}
        for w in cands:
            try:
                cap = zero_batches if int(w) == 0 else None
                results[str(w)] = dataloader_rate(torch, ds, int(w), batch, pin, dev, epochs, cap)
            except Exception as exc:
                results[str(w)] = {"error": f"{type(exc).__name__}: {exc}"}
        good = {int(k): v["ips"] for k, v in results.items() if "ips" in v}
        best = max(good, key=good.get) if good else None
        return {
            "cpus": cpus,
            "gpus": ngpu,
            "recommended_workers": rec,
            "pin_memory": pin,
            "persistent_workers": True,
            "prefetch_factor": 4,
            "batch": batch,
            "crop": crop,
            "images": count,
            "write_s": round(write_s, 3),
            "results": results,
            "best_workers": best,
            "best_ips": good.get(best) if best is not None else None,
            "zero_ips": good.get(0),
            "shm_bytes": shm_bytes(),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
