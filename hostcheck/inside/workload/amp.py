"""The AMP section: a small CNN and transformer trained in fp32 and under autocast, numerics and speed."""

from __future__ import annotations

import time

from ..fixtures import small_cnn
from .common import _devices, _sync, _torch

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
