"""Probe run as a child process in the *training* Python (hostcheck.child.launch.inside_argv(python, "probe")).

Standard library only, Python >= 3.9, nothing of hostcheck outside hostcheck.inside.
Prints ``HOSTCHECK_PROBE_JSON:{"phase": ...}`` as each slow step starts (so a hang is named by the step it
hung in), then one ``HOSTCHECK_PROBE_JSON:{...}`` line with the result; everything else on stdout is ignored.

Its readers of the process's own environment (:func:`maps`, :func:`pil_info`, :func:`allocator_info`,
:func:`threads_info`, :func:`cpus`, :func:`env_vars`) are also the bench worker's (hostcheck.inside.bench_worker
imports them): one probe of the environment inside the training Python.
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


def maps():
    """The files mapped into this process (/proc/self/maps), sorted: the libraries it loaded."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return []
    return sorted(paths)


def preload_info(paths):
    """Each LD_PRELOAD entry (ld.so(8): separated by spaces or colons), whether that file exists and whether it
    is among the mapped ``paths``: ld.so skips one it cannot load with only a warning on stderr."""
    names = {os.path.basename(p) for p in paths}
    real = {os.path.realpath(p) for p in paths}
    out = []
    for entry in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()[:32]:
        if "/" in entry:
            exists = os.path.exists(entry)
            loaded = os.path.realpath(entry) in real or os.path.basename(entry) in names
        else:  # a bare name is looked up in the library path: only the mapping can tell
            exists = None
            loaded = any(n == entry or n.startswith(entry + ".") for n in names)
        out.append({"entry": entry[:512], "exists": exists, "loaded": loaded})
    return out


OPENMP_LIBS = ("libgomp", "libiomp", "libomp")


def openmp_libs(paths):
    """The OpenMP runtimes among mapped ``paths``."""
    return [p for p in paths if any(n in os.path.basename(p) for n in OPENMP_LIBS)]


def cpus():
    """The CPUs this process may run on (its affinity), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def env_vars(keys, prefixes=()):
    """The variables of this process's environment named in ``keys`` or starting with one of ``prefixes``."""
    prefixes = tuple(prefixes)
    return {k: v for k, v in os.environ.items() if k in keys or (prefixes and k.startswith(prefixes))}


def allocator_info(kind, paths=None):
    """The malloc replacement this process got: mapped allocator libraries (``kind(path)``: the allocator a
    library path is, or None; hostcheck.inside.proof.allocator_kind), LD_PRELOAD and MALLOC_CONF."""
    paths = maps() if paths is None else paths
    return {
        "mapped": [p for p in paths if kind(p)],
        "ld_preload": os.environ.get("LD_PRELOAD"),
        "malloc_conf": os.environ.get("MALLOC_CONF"),
    }


def threads_info(torch, paths=None):
    """torch's intra-op threads, OMP_NUM_THREADS, the OpenMP runtimes mapped, the CPUs."""
    return {
        "torch": torch.get_num_threads(),
        "omp_env": os.environ.get("OMP_NUM_THREADS"),
        "openmp": openmp_libs(maps() if paths is None else paths),
        "cpus": cpus(),
    }


def pil_info():
    """Which PIL this process imports. pillow-simd only when that distribution owns the imported PIL/
    (or, where ownership cannot be read, when its version is PIL's): both distributions can be listed
    while PIL/ holds stock Pillow (a later `pip install` of a Pillow dependant overwrote it)."""
    info = {"version": None, "simd": False, "path": None, "dists": {}, "owner": None}
    try:
        import PIL
        from PIL import Image  # noqa: F401  (the C extension must load too)
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
        return info
    info["version"] = getattr(PIL, "__version__", None)
    init = os.path.realpath(PIL.__file__)
    info["path"] = os.path.dirname(init)
    try:
        from importlib import metadata

        for name in ("pillow-simd", "pillow"):
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                continue
            info["dists"][name] = dist.version
            try:
                owns = os.path.realpath(str(dist.locate_file("PIL/__init__.py"))) == init
            except Exception:
                owns = False
            if owns and info["owner"] is None:
                info["owner"] = name
    except Exception as exc:  # metadata unreadable: fall back to the version rule below
        info["metadata_error"] = f"{type(exc).__name__}: {exc}"
    if info["owner"] is not None:
        info["simd"] = info["owner"] == "pillow-simd"
    else:
        simd_version = info["dists"].get("pillow-simd")
        info["simd"] = simd_version is not None and simd_version == info["version"]
    try:
        from PIL import features

        info["libjpeg_turbo"] = features.version("libjpeg_turbo")
    except Exception:
        info["libjpeg_turbo"] = None
    try:
        from PIL import _imaging

        info["imaging_so"] = os.path.realpath(_imaging.__file__)
    except Exception:
        info["imaging_so"] = None
    return info


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
    except ModuleNotFoundError as exc:
        if exc.name == "torch":  # no torch at all; a missing dependency of torch is a broken install
            out["torch"] = {"installed": False, "error": str(exc)}
            return
        out["torch"] = {"installed": True, "error": f"{type(exc).__name__}: {exc}"[:1000]}
        return
    except Exception as exc:  # ImportError: undefined symbol, a wrong libcudart, ...: keep the text
        out["torch"] = {"installed": True, "error": f"{type(exc).__name__}: {exc}"[:1000]}
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
        "env": env_vars(ENV_KEYS, ("TCMALLOC_",)),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "rlimits": {
            "memlock": [_limit(x) for x in resource.getrlimit(resource.RLIMIT_MEMLOCK)],
            "nofile": [_limit(x) for x in resource.getrlimit(resource.RLIMIT_NOFILE)],
        },
    }
    _pillow(out)
    if os.environ.get("HOSTCHECK_PROBE_NO_TORCH") != "1":
        _torch(out)
    mapped = maps()
    out["maps"] = {
        "jemalloc": [p for p in mapped if "jemalloc" in os.path.basename(p)],
        "tcmalloc": [p for p in mapped if "tcmalloc" in os.path.basename(p)],
        "openmp": openmp_libs(mapped),
    }
    out["preload"] = preload_info(mapped)
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
