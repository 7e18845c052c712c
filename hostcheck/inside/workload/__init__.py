"""Workload probes: the code that runs in a child process of the *training* Python, one module per probe.

Standard library, torch (imported lazily) and PIL (for the DataLoader probe) only; nothing of hostcheck outside
hostcheck.inside, Python >= 3.9. Started the one way (hostcheck.child.launch.inside_argv)::

    python -m hostcheck.inside.workload suite --json-args '{"device": "cuda", "sections": ["matmul", "amp"]}'
    python -m hostcheck.inside.workload ddp_worker --json-args '{"backend": "gloo"}'  # under RANK/WORLD_SIZE/...
    python -m hostcheck.inside.workload burn --json-args '{"seconds": 60}'

Every result is one stdout line ``HOSTCHECK_WORKLOAD_JSON:{...}``, flushed at once, so what finished
before a hang or a crash survives the kill. The suite emits ``{"probe": NAME, "event": "start"}`` before
each section, then ``{"probe": NAME, "ok": true, "data": {...}}`` or ``{"probe": NAME, "ok": false,
"error": "...", "traceback": "..."}``: a Python exception in one section does not stop the next one.
Every probe also runs on the CPU with tiny sizes, so CPU tests exercise the same code.

Modules: common (the record line, timing, devices), env, compute (matmul), memory (host/device copies), amp,
dataloader, ddp (the in-suite section and the per-rank worker), p2p (GPU-to-GPU copies), burn, suite (the sections and the command line).
The names below are the probes' public face (the tests and the GPU tests use them).
"""

from ..fixtures import recommended_workers
from .amp import probe_amp
from .burn import probe_burn
from .common import GIB, MARKER, MIB, emit, timed_batches
from .compute import MATMUL_DTYPES, matmul_rate, probe_matmul
from .dataloader import JpegDataset, dataloader_images, dataloader_rate, probe_dataloader, write_jpegs
from .ddp import _allreduce_bw, allreduce_bytes, ddp_worker, probe_ddp_inprocess
from .env import probe_env
from .memory import copy_rate, probe_bandwidth
from .p2p import pair_rate, probe_p2p
from .suite import DEFAULT_SECTIONS, SECTIONS, main, run_probe, run_suite

__all__ = [
    "DEFAULT_SECTIONS",
    "GIB",
    "MARKER",
    "MATMUL_DTYPES",
    "MIB",
    "SECTIONS",
    "JpegDataset",
    "_allreduce_bw",
    "allreduce_bytes",
    "copy_rate",
    "dataloader_images",
    "dataloader_rate",
    "ddp_worker",
    "emit",
    "main",
    "matmul_rate",
    "pair_rate",
    "probe_amp",
    "probe_bandwidth",
    "probe_burn",
    "probe_dataloader",
    "probe_ddp_inprocess",
    "probe_env",
    "probe_matmul",
    "probe_p2p",
    "recommended_workers",
    "run_probe",
    "run_suite",
    "timed_batches",
    "write_jpegs",
]
