"""The burn-in: bf16 matmul on every GPU for a while, throughput per window and a bit-exact result check."""

from __future__ import annotations

import math
import statistics
import time

from .common import _devices, _sync, _torch

# ---------------------------------------------------------------------------------------------- burn


def probe_burn(args: dict) -> dict:
    """bf16 matmul on every GPU for `seconds`: throughput per second-long window, and a result check
    (the same product recomputed must stay bit-identical: a drift is a hardware fault)."""
    torch = _torch()
    devs = _devices(torch, args.get("device", "cuda"), args.get("gpus"))
    seconds = float(args.get("seconds", 10))
    cpu = devs[0].type == "cpu"
    n = int(args.get("n", 256 if cpu else 8192))
    dtype = torch.float32 if cpu else torch.bfloat16
    window = float(args.get("window_s", 0.2 if cpu else 1.0))
    st = []
    for dev in devs:
        gen = torch.Generator(device=dev).manual_seed(0)
        a = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
        b = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
        c = torch.empty(n, n, device=dev, dtype=dtype)
        torch.matmul(a, b, out=c)  # the same call as the loop's, so the same algorithm
        ref = c.float().sum()
        st.append({"dev": dev, "a": a, "b": b, "c": c, "ref": float(ref), "windows": [], "mismatch": 0})
    flop = 2.0 * n * n * n
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        w_end = time.perf_counter() + window
        counts = [0] * len(st)
        t0 = time.perf_counter()
        while time.perf_counter() < w_end:
            for i, s in enumerate(st):
                for _ in range(4):
                    torch.matmul(s["a"], s["b"], out=s["c"])
                counts[i] += 4
            for s in st:
                _sync(torch, s["dev"])
        dt = time.perf_counter() - t0
        for i, s in enumerate(st):
            s["windows"].append(counts[i] * flop / dt / 1e12)
            chk = float(s["c"].float().sum())
            if chk != s["ref"]:
                s["mismatch"] += 1
    out = {"seconds": seconds, "n": n, "gpus": []}
    for s in st:
        w = s["windows"]
        out["gpus"].append(
            {
                "device": str(s["dev"]),
                "index": s["dev"].index,
                "tflops_first": w[0] if w else None,
                "tflops_last": w[-1] if w else None,
                "tflops_min": min(w) if w else None,
                "tflops_median": statistics.median(w) if w else None,
                "windows": len(w),
                "mismatches": s["mismatch"],
                "finite": math.isfinite(s["ref"]),
            }
        )
    return out
