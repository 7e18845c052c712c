#!/usr/bin/env python3
"""scripts/gpu-proof's first step: the machine a proof ran on, as one JSON object on standard output.

Run with the training Python (PYTHON): date (UTC), host, Python, torch, CUDA, cuDNN, NCCL, the GPUs torch sees,
and nvidia-smi's row per GPU (name, driver, bus id, memory, PCIe link, persistence, ECC, MIG). This is the
"date, GPU, driver, torch" of a committed record (docs/nvidia.md, "GPU figures: what was measured where").
Exit 0 with at least one usable CUDA GPU, 3 without one (the JSON is written either way).
"""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import sys
import time

SMI_FIELDS = (
    "index",
    "name",
    "driver_version",
    "pci.bus_id",
    "memory.total",
    "pcie.link.gen.max",
    "pcie.link.width.max",
    "persistence_mode",
    "ecc.mode.current",
    "mig.mode.current",
)


def torch_facts() -> dict:
    try:
        import torch
    except Exception as exc:  # a training Python without torch is a finding, not a crash
        return {"torch_error": f"{type(exc).__name__}: {exc}"[:300]}
    out = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    out["gpus"] = torch.cuda.device_count() if out["cuda_available"] else 0
    if out["gpus"]:
        out["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(out["gpus"])]
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        out["cudnn"] = torch.backends.cudnn.version()
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:
            out["nccl_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def smi_facts() -> dict:
    argv = ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"nvidia_smi_error": f"{type(exc).__name__}: {exc}"[:300]}
    rows = [dict(zip(SMI_FIELDS, (c.strip() for c in line.split(",")))) for line in done.stdout.splitlines()]
    rows = [r for r in rows if len(r) == len(SMI_FIELDS)]
    out: dict = {"nvidia_smi": rows}
    if rows:
        out["driver"] = rows[0]["driver_version"]
    if done.returncode:
        out["nvidia_smi_error"] = f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[:300]}"
    return out


def main() -> int:
    out = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "executable": sys.executable,
    }
    out.update(torch_facts())
    out.update(smi_facts())
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0 if out.get("gpus") else 3


if __name__ == "__main__":
    sys.exit(main())
