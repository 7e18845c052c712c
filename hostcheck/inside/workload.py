"""Workload probes: the code that runs in a child process of the *training* Python.

Standalone: standard library, torch (imported lazily) and PIL (for the DataLoader probe) only; no
hostcheck import, Python >= 3.9, so it runs from its file path in a venv that lacks hostcheck (the data and
model it shares with the bench worker, fixtures.py, is loaded from this file's folder)::

    python workload.py suite --json-args '{"device": "cuda", "sections": ["matmul", "amp"]}'
    python workload.py ddp_worker --json-args '{"backend": "gloo"}'      # under RANK/WORLD_SIZE/... env
    python workload.py burn --json-args '{"seconds": 60}'

Every result is one stdout line ``HOSTCHECK_WORKLOAD_JSON:{...}``, flushed at once, so what finished
before a hang or a crash survives the kill. The suite emits ``{"probe": NAME, "event": "start"}`` before
each section, then ``{"probe": NAME, "ok": true, "data": {...}}`` or ``{"probe": NAME, "ok": false,
"error": "...", "traceback": "..."}``: a Python exception in one section does not stop the next one.
Every probe also runs on the CPU with tiny sizes, so CPU tests exercise the same code.

Why one module: it is started by its path as one script in a venv that may lack hostcheck; every extra file
it needed would have to be found and loaded by path the way fixtures.py is, for no gain to the reader.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == _HERE:
    sys.path.pop(0)  # run as a script: our folder must not shadow anything the training venv imports


def _sibling(name: str):
    """``name``.py from this file's folder, for a run by path where hostcheck may not be importable: loaded
    from its path (that folder stays off sys.path) and registered under a name of its own, which is how a
    DataLoader worker started by spawn finds the dataset's class again (it re-runs this file first)."""
    import importlib.util

    mod_name = f"hostcheck_inside_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, os.path.join(_HERE, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


if __package__:  # imported as hostcheck.inside.workload (tests, the GPU tests)
    from . import fixtures
else:  # run by path in the training Python
    fixtures = _sibling("fixtures")
JpegDataset = fixtures.JpegDataset
recommended_workers = fixtures.recommended_workers
shm_bytes = fixtures.shm_bytes
small_cnn = fixtures.small_cnn
write_jpegs = fixtures.write_jpegs

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


# ----------------------------------------------------------------------------------------------- env


def probe_env(args: dict) -> dict:
    t0 = time.perf_counter()
    torch = _torch()
    import_s = time.perf_counter() - t0
    out = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "import_s": round(import_s, 3),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cuda_available": bool(torch.cuda.is_available()),
        "gpus": [],
        # Variables that silently change what the matmul probes measure (TF32 forced off, or on for fp32).
        "precision_env": {
            k: os.environ[k]
            for k in ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
            if k in os.environ
        },
    }
    if out["cuda_available"]:
        t1 = time.perf_counter()
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            bus = None
            if hasattr(p, "pci_bus_id"):
                bus = "{:04x}:{:02x}:{:02x}.0".format(
                    getattr(p, "pci_domain_id", 0), p.pci_bus_id, p.pci_device_id
                )
            out["gpus"].append(
                {
                    "index": i,
                    "name": p.name,
                    "capability": [p.major, p.minor],
                    "memory_bytes": int(p.total_memory),
                    "sm_count": int(p.multi_processor_count),
                    "pci_bus_id": bus,
                }
            )
        torch.zeros(1, device="cuda")
        out["cuda_init_s"] = round(time.perf_counter() - t1, 3)
        out["nccl"] = _nccl_version(torch)
    return out


def _nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
        return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        return None


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


# ----------------------------------------------------------------------------------------------- AMP


def _transformer(nn, d, heads, layers):
    blocks = [
        nn.TransformerEncoderLayer(
            d, heads, dim_feedforward=4 * d, dropout=0.0, batch_first=True, norm_first=True
        )
        for _ in range(layers)
    ]
    return nn.Sequential(*blocks, nn.Linear(d, d))


# Sized so a step is compute-bound on an H100 (CNN about 2 TFLOP a step, transformer about 1.3), not
# launch-bound, yet the whole probe stays within a few seconds.
AMP_GPU = {
    "cnn": {"channels": [64, 128, 256, 512], "batch": 64, "size": 160},
    "transformer": {"d": 1024, "heads": 16, "layers": 2, "batch": 32, "seq": 256},
    "warmup": 3,
    "steps": 6,
}
# Without a GPU the probe only proves the training path (numerics); no speedup is judged.
AMP_CPU = {
    "cnn": {"channels": [8, 16], "batch": 4, "size": 24},
    "transformer": {"d": 32, "heads": 2, "layers": 1, "batch": 2, "seq": 8},
    "warmup": 1,
    "steps": 4,
}


def amp_run(torch, device, model_kind: str, mode: str, cfg: dict) -> dict:
    """A few training steps of one model in one precision mode; losses, scaler skips and throughput."""
    nn = torch.nn
    torch.manual_seed(0)
    gen = torch.Generator(device="cpu").manual_seed(1)
    if model_kind == "cnn":
        c = cfg["cnn"]
        model = small_cnn(nn, c["channels"]).to(device).to(memory_format=torch.channels_last)
        x = torch.randn(c["batch"], 3, c["size"], c["size"], generator=gen).to(device)
        x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (c["batch"],), generator=gen).to(device)
        loss_fn = nn.CrossEntropyLoss()
        per_step = c["batch"]
    else:
        c = cfg["transformer"]
        model = _transformer(nn, c["d"], c["heads"], c["layers"]).to(device)
        x = torch.randn(c["batch"], c["seq"], c["d"], generator=gen).to(device)
        y = torch.randn(c["batch"], c["seq"], c["d"], generator=gen).to(device)
        loss_fn = nn.MSELoss()
        per_step = c["batch"]
    model.train()
    # Adam moves every weight by about lr on the first step: 1e-3 makes a d=1024 transformer's loss jump
    # before it falls, 1e-4 falls from the first step.
    opt = torch.optim.Adam(model.parameters(), lr=float(c.get("lr", 1e-3 if model_kind == "cnn" else 1e-4)))
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mode)
    use_scaler = mode == "fp16"
    scaler = None
    if use_scaler:
        try:
            scaler = torch.amp.GradScaler(device.type)
        except (AttributeError, TypeError):  # torch < 2.3
            scaler = torch.cuda.amp.GradScaler()
    losses = []
    skipped = 0
    warmup = int(cfg["warmup"])
    steps = int(cfg["steps"])
    t_start = None
    t_warm = time.perf_counter()

    for step in range(warmup + steps):
        if step == warmup:
            _sync(torch, device)
            t_start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if amp_dtype is not None:
            with torch.autocast(device_type=device.type, dtype=amp_dtype):
                loss = loss_fn(model(x).float(), y)
        else:
            loss = loss_fn(model(x), y)
        losses.append(loss.detach())
        if scaler is not None:
            before = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if scaler.get_scale() < before:
                skipped += 1
        else:
            loss.backward()
            opt.step()
    _sync(torch, device)
    elapsed = time.perf_counter() - t_start
    vals = [float(v) for v in losses]
    return {
        "losses": vals,
        "skipped": skipped,
        "steps": warmup + steps,
        "per_s": per_step * steps / elapsed,
        "unit": "img/s" if model_kind == "cnn" else "seq/s",
        "scale": scaler.get_scale() if scaler is not None else None,
        # Where the time goes: warm-up includes cuDNN's autotuning (cudnn.benchmark) on a GPU.
        "warm_s": round(t_start - t_warm, 3),
    }


def probe_amp(args: dict) -> dict:
    torch = _torch()
    dev = _devices(torch, args.get("device", "cuda"), args.get("gpus"))[0]
    cfg = dict(AMP_CPU if dev.type == "cpu" else AMP_GPU)
    for k in ("cnn", "transformer", "warmup", "steps"):
        if k in args:
            cfg[k] = args[k]
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.cuda.set_device(dev)
    modes = args.get("modes") or (("fp32", "bf16") if dev.type == "cpu" else ("fp32", "fp16", "bf16"))
    # torch's defaults, as a training job gets them: cuDNN convolutions in "fp32" use TF32, matmuls do not.
    out = {
        "device": str(dev),
        "models": {},
        "conv_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    for kind in ("cnn", "transformer"):
        res = {}
        for mode in modes:
            try:
                res[mode] = amp_run(torch, dev, kind, mode, cfg)
            except Exception as exc:
                res[mode] = {"error": f"{type(exc).__name__}: {exc}"}
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        out["models"][kind] = res
    return out


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


# --------------------------------------------------------------------------------------------- suite

SECTIONS = {
    "env": probe_env,
    "matmul": probe_matmul,
    "bandwidth": probe_bandwidth,
    "amp": probe_amp,
    "dataloader": probe_dataloader,
    "ddp": probe_ddp_inprocess,
}
DEFAULT_SECTIONS = ("env", "matmul", "bandwidth", "amp", "dataloader")


def run_suite(args: dict) -> None:
    """Run the sections in one process (one `import torch`); a record per section, errors kept."""
    sections = args.get("sections") or DEFAULT_SECTIONS
    per = args.get("args") or {}
    for name in sections:
        emit({"probe": name, "event": "start", "t": time.time()})
        sub = dict(per.get(name) or {})
        for k in ("device", "gpus"):
            if k in args and k not in sub:
                sub[k] = args[k]
        emit(run_probe(name, SECTIONS[name], sub))


def run_probe(name: str, fn, args: dict) -> dict:
    """The result record of one probe: its data, or the exception and traceback it raised."""
    t0 = time.perf_counter()
    try:
        return {"probe": name, "ok": True, "data": fn(args), "wall_s": round(time.perf_counter() - t0, 3)}
    except Exception as exc:
        return {
            "probe": name,
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-2000:],
            "wall_s": round(time.perf_counter() - t0, 3),
        }


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.stderr.write("usage: workload.py suite|ddp_worker|burn|<section> [--json-args JSON]\n")
        return 2
    name = argv[0]
    args: dict = {}
    if "--json-args" in argv:
        args = json.loads(argv[argv.index("--json-args") + 1])
    if name == "suite":
        run_suite(args)
        return 0
    fns = dict(SECTIONS, ddp_worker=ddp_worker, burn=probe_burn)
    if name not in fns:
        sys.stderr.write(f"unknown probe {name!r}\n")
        return 2
    # Under torchrun a rank's traceback is lost among the agents' output: the record carries it.
    rec = run_probe(name, fns[name], args)
    emit(rec)
    if not rec["ok"]:
        sys.stderr.write(rec["traceback"])
        return 1
    if name == "ddp_worker":
        # Seen once under load in a container: gloo's threads aborted the interpreter's teardown ("terminate
        # called without an active exception", SIGABRT) after the result was out. The measurement is complete
        # and emitted, so leave without the teardown rather than turn a finished check into a crash.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
