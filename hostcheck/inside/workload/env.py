"""The environment section: Python, torch, CUDA and NCCL versions, the GPUs torch sees."""

from __future__ import annotations

import os
import sys
import time

from .common import _torch

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
