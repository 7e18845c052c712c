"""What every workload probe shares: the record line, torch imported lazily, timed batches, the devices."""

from __future__ import annotations

import json
import statistics
import sys
import time

MARKER = "HOSTCHECK_WORKLOAD_JSON:"
MIB = 1 << 20
GIB = 1 << 30


def emit(rec: dict) -> None:
    sys.stdout.write(MARKER + json.dumps(rec, default=str) + "\n")
    sys.stdout.flush()


def _torch():
    import torch

    return torch


# --------------------------------------------------------------------------------------------- timing


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_batches(
    torch, device, fn, per_batch: int, warmup_s: float, measure_s: float, max_batches: int = 200
):
    """Seconds per call of ``fn``: warm up for ``warmup_s`` (clocks ramp up, autotuning), then time batches
    of ``per_batch`` calls until ``measure_s`` has passed (at least 3 batches). CUDA events on a GPU,
    recorded on ``device``'s current stream (the one ``fn``'s kernels go to)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            return _timed_batches(torch, device, fn, per_batch, warmup_s, measure_s, max_batches)
    return _timed_batches(torch, device, fn, per_batch, warmup_s, measure_s, max_batches)


def _timed_batches(torch, device, fn, per_batch, warmup_s, measure_s, max_batches):
    t_end = time.perf_counter() + warmup_s
    fn()
    _sync(torch, device)
    while time.perf_counter() < t_end:
        for _ in range(per_batch):
            fn()
        _sync(torch, device)
    times = []
    t_end = time.perf_counter() + measure_s
    while len(times) < 3 or (time.perf_counter() < t_end and len(times) < max_batches):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(per_batch):
                fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1000.0 / per_batch)
        else:
            t0 = time.perf_counter()
            for _ in range(per_batch):
                fn()
            times.append((time.perf_counter() - t0) / per_batch)
    return times


def _summary(values):
    return {"median": statistics.median(values), "max": max(values), "min": min(values), "n": len(values)}


def _devices(torch, device: str, gpus=None):
    """ "cpu", "cuda" or "auto" (CUDA when available) -> the torch devices to measure."""
    if device == "cpu" or not torch.cuda.is_available():
        return [torch.device("cpu")]
    idx = list(range(torch.cuda.device_count())) if gpus is None else [int(g) for g in gpus]
    return [torch.device("cuda", i) for i in idx]
