#!/usr/bin/env python3
"""Is hostcheck's short workload run as good as a long measurement? bf16 matmul and pinned host-to-device.

hostcheck's short run must give bf16 matmul and pinned host-to-device figures within 5% of a long measurement
on the same GPU (docs/workload.md). This measures, on one GPU, in this order:

1. short, cold: exactly what the workload probe does (hostcheck/inside/workload/): 4096^3 bf16 matmul,
   0.3 s warm-up, 0.25 s of timed batches, median; 256 MiB pinned copies, 0.1 s warm-up, 0.2 s timed.
2. long: 8192^3 bf16 matmul, 5 s warm-up, 30 s timed; 1 GiB pinned copies, 2 s warm-up, 20 s timed.
3. short again, hot (right after the long run).

and prints both figures and the difference; exit 1 when a cold short figure is more than 5% off the long one.

    python3 benchmarks/matmul_h2d_long_vs_short.py [--gpu 0] [--long-scale 1.0] [--json out.json]

Runs with the training Python (needs torch with CUDA). About 75 s at --long-scale 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the probe code imports nothing outside hostcheck.inside: import it directly

from hostcheck.inside import workload as probes  # noqa: E402

MIB = 1 << 20


def short(torch, dev):
    m = probes.matmul_rate(torch, dev, "bf16", 4096, 0.3, 0.25)
    c = probes.copy_rate(torch, dev, "h2d", True, 256 * MIB, 0.1, 0.2)
    return {"bf16_tflops": m["tflops"], "h2d_pinned_gbs": c["gbs"]}


def long(torch, dev, scale):
    # No batch cap: the probe's default (200) would end the 30 s matmul after about 4 s.
    m = probes.matmul_rate(torch, dev, "bf16", 8192, 5.0 * scale, 30.0 * scale, max_batches=10**6)
    c = probes.copy_rate(torch, dev, "h2d", True, 1024 * MIB, 2.0 * scale, 20.0 * scale, max_batches=10**6)
    return {
        "bf16_tflops": m["tflops"],
        "h2d_pinned_gbs": c["gbs"],
        "matmul_batches": m["batches"],
        "h2d_batches": c["batches"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--long-scale", type=float, default=1.0, help="scale the long run's durations")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    import torch

    import_s = time.perf_counter() - t0
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to benchmark", file=sys.stderr)
        return 2
    dev = torch.device("cuda", a.gpu)
    torch.cuda.set_device(dev)
    cold = short(torch, dev)
    lng = long(torch, dev, a.long_scale)
    hot = short(torch, dev)
    p = torch.cuda.get_device_properties(dev)
    out = {
        "gpu": p.name,
        "host": platform.node(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": _driver(),
        "import_torch_s": round(import_s, 2),
        "short_cold": cold,
        "long": lng,
        "short_hot": hot,
        "diff_pct": {k: 100.0 * (cold[k] - lng[k]) / lng[k] for k in ("bf16_tflops", "h2d_pinned_gbs")},
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(f"{p.name} (torch {torch.__version__}, CUDA {torch.version.cuda}, driver {out['driver']})")
    print(f"{'':22}{'short cold':>12}{'long':>12}{'short hot':>12}{'diff':>9}")
    for k, unit in (("bf16_tflops", "TFLOP/s"), ("h2d_pinned_gbs", "GB/s")):
        print(
            f"{k + ' (' + unit + ')':22}{cold[k]:12.1f}{lng[k]:12.1f}{hot[k]:12.1f}{out['diff_pct'][k]:+8.1f}%"
        )
    print(f"wall {out['wall_s']} s; import torch {out['import_torch_s']} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all(abs(v) <= 5.0 for v in out["diff_pct"].values()) else 1


def _driver():
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
