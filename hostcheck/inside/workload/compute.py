"""The matmul section: dense matmul TFLOP/s per dtype and GPU."""

from __future__ import annotations

from .common import _devices, _summary, _torch, timed_batches

# -------------------------------------------------------------------------------------------- matmul

MATMUL_DTYPES = ("bf16", "fp16", "tf32", "fp32")


def matmul_rate(
    torch, device, dtype: str, n: int, warmup_s: float, measure_s: float, max_batches: int = 200
) -> dict:
    """Dense n x n x n matmul TFLOP/s for one dtype on one device (median of timed batches; a long
    measurement raises ``max_batches`` or it stops at 200 batches, about 4 s on a GPU)."""
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}[dtype]
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, device=device, dtype=tdt, generator=gen)
        b = torch.randn(n, n, device=device, dtype=tdt, generator=gen)
        c = torch.empty(n, n, device=device, dtype=tdt)

        def fn():
            torch.matmul(a, b, out=c)

        flop = 2.0 * n * n * n
        # About 20 ms of work per timed batch on the GPU, whatever the dtype's speed.
        if device.type == "cuda":
            guess = {"bf16": 700e12, "fp16": 700e12, "tf32": 350e12, "fp32": 50e12}[dtype]
            per_batch = max(1, min(200, int(0.02 * guess / flop)))
        else:
            per_batch = 1
        times = timed_batches(torch, device, fn, per_batch, warmup_s, measure_s, max_batches)
        rates = [flop / t / 1e12 for t in times]
        ok = bool(torch.isfinite(c[:64, :64].float()).all())
        s = _summary(rates)
        return {"tflops": s["median"], "tflops_max": s["max"], "batches": s["n"], "n": n, "finite": ok}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32


def probe_matmul(args: dict) -> dict:
    torch = _torch()
    devs = _devices(torch, args.get("device", "cuda"), args.get("gpus"))
    cpu = devs[0].type == "cpu"
    # gpu_n: the profile's size for a GPU (hostcheck.profiles.workload_args); the CPU path keeps its tiny one.
    n = int(args.get("n", 256 if cpu else args.get("gpu_n", 4096)))
    dtypes = args.get("dtypes") or (("fp32", "bf16") if cpu else MATMUL_DTYPES)
    warmup_s = float(args.get("warmup_s", 0.05 if cpu else 0.3))
    measure_s = float(args.get("measure_s", 0.1 if cpu else 0.25))
    out = {"gpus": []}
    for dev in devs:
        row = {"index": dev.index, "device": str(dev), "dtypes": {}}
        if dev.type == "cuda":
            row["name"] = torch.cuda.get_device_name(dev)
        for i, dt in enumerate(dtypes):
            # The first dtype on a device gets the long warm-up (clocks ramp up); later ones run hot.
            w = warmup_s if i == 0 else min(warmup_s, 0.1)
            try:
                row["dtypes"][dt] = matmul_rate(torch, dev, dt, n, w, measure_s)
            except Exception as exc:
                row["dtypes"][dt] = {"error": f"{type(exc).__name__}: {exc}"}
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        out["gpus"].append(row)
    return out
