"""Probe run as a child process in the *training* Python (``python -c <this source>``).

Standard library only, Python >= 3.9, no hostcheck import (the training venv need not have hostcheck).
Prints ``HOSTCHECK_PROBE_JSON:{"phase": ...}`` as each slow step starts (so a hang is named by the step it
hung in), then one ``HOSTCHECK_PROBE_JSON:{...}`` line with the result; everything else on stdout is ignored.
"""

import json
import os
import platform
import resource
import sys
import time
import warnings

MARKER = "HOSTCHECK_PROBE_JSON:"
ENV_KEYS = (
    "LD_PRELOAD",
    "MALLOC_CONF",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "GOMP_CPU_AFFINITY",
    "KMP_AFFINITY",
    "CUDA_VISIBLE_DEVICES",
)


def _phase(name):
    sys.stdout.write("\n" + MARKER + json.dumps({"phase": name}) + "\n")
    sys.stdout.flush()


def _limit(v):
    return -1 if v == resource.RLIM_INFINITY else int(v)


def _maps():
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return []
    return sorted(paths)


# Formats and fonts stock Pillow's wheel has; a pillow-simd built without their -dev packages lacks them.
PIL_FEATURES = ("freetype2", "libtiff", "webp", "littlecms2", "jpg_2000")


def _pillow(out):
    info = {}
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover
        metadata = None
    for dist in ("pillow-simd", "Pillow"):
        try:
            info[dist] = metadata.version(dist) if metadata else None
        except Exception:
            info[dist] = None
    _phase("the PIL import")
    try:
        import PIL

        info["PIL"] = getattr(PIL, "__version__", None)
        try:
            from PIL import features

            info["libjpeg_turbo"] = features.version("libjpeg_turbo")
            info["features"] = {name: bool(features.check(name)) for name in PIL_FEATURES}
        except Exception:
            info["libjpeg_turbo"] = None
    except Exception as exc:
        info["PIL"] = None
        info["PIL_error"] = f"{type(exc).__name__}: {exc}"
    out["pillow"] = info


def _torch(out):
    _phase("the torch import")
    t0 = time.monotonic()
    try:
        import torch
    except ImportError as exc:
        out["torch"] = {"installed": False, "error": str(exc)}
        return
    except Exception as exc:
        out["torch"] = {"installed": True, "error": f"import failed: {type(exc).__name__}: {exc}"}
        return
    info = {"installed": True, "import_s": round(time.monotonic() - t0, 3)}
    info["version"] = torch.__version__
    info["cuda"] = getattr(torch.version, "cuda", None)
    try:
        info["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        info["cudnn"] = None
    try:
        v = torch.cuda.nccl.version()
        info["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        info["nccl"] = None
    _phase("CUDA init")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t1 = time.monotonic()
        try:
            info["cuda_available"] = bool(torch.cuda.is_available())
            info["device_count"] = torch.cuda.device_count() if info["cuda_available"] else 0
            caps = []
            for i in range(info["device_count"]):
                caps.append(list(torch.cuda.get_device_capability(i)))
            info["capabilities"] = caps
            info["arch_list"] = list(torch.cuda.get_arch_list()) if info["cuda_available"] else []
        except Exception as exc:
            info["cuda_available"] = False
            info["cuda_error"] = f"{type(exc).__name__}: {exc}"
        info["cuda_init_s"] = round(time.monotonic() - t1, 3)
    info["warnings"] = [str(w.message)[:300] for w in caught]
    if not info.get("arch_list"):
        try:  # the CUDA build's compiled arch list, known without a GPU
            info["arch_list"] = list(torch.cuda.get_arch_list())
        except Exception:
            info["arch_list"] = []
    try:
        info["num_threads"] = torch.get_num_threads()
    except Exception:
        info["num_threads"] = None
    out["torch"] = info


def main():
    out = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "env": {k: os.environ[k] for k in os.environ if k in ENV_KEYS or k.startswith("TCMALLOC_")},
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "rlimits": {
            "memlock": [_limit(x) for x in resource.getrlimit(resource.RLIMIT_MEMLOCK)],
            "nofile": [_limit(x) for x in resource.getrlimit(resource.RLIMIT_NOFILE)],
        },
    }
    _pillow(out)
    if os.environ.get("HOSTCHECK_PROBE_NO_TORCH") != "1":
        _torch(out)
    maps = _maps()
    out["maps"] = {
        "jemalloc": [p for p in maps if "jemalloc" in os.path.basename(p)],
        "tcmalloc": [p for p in maps if "tcmalloc" in os.path.basename(p)],
        "openmp": [
            p for p in maps if any(n in os.path.basename(p) for n in ("libgomp", "libiomp", "libomp"))
        ],
    }
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        out["symbols"] = {"mallctl": hasattr(libc, "mallctl"), "tc_malloc": hasattr(libc, "tc_malloc")}
    except Exception:
        out["symbols"] = {}
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
