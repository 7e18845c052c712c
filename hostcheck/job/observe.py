"""Run the user's command and watch it: /proc and /dev/shm at every interval, NVML beside it, the hook's records.

The command starts through the one launcher (hostcheck.child.launch): a session of its own, the run token in its
environment, its whole group killed when the run ends and what left the group swept by the token. Its standard
streams are hostcheck's own, so the job prints where it always does. Every Python it starts loads the hook
(hostcheck/inside/job_hook.py) through the sitecustomize folder put first on PYTHONPATH; nothing else in its
environment changes.

The run ends when the command exits, when ``seconds`` have passed (the group gets SIGINT, as Ctrl-C would send it,
then SIGKILL after ``grace`` seconds) or when hostcheck gets SIGHUP/SIGINT/SIGTERM (forwarded the same way).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from hostcheck.child.launch import Launch, inside_env
from hostcheck.exitcodes import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_SIGNAL_BASE
from hostcheck.gather.nvml import GpuSample, NvmlSampler
from hostcheck.job.dcgm import DcgmRow, DcgmSampler
from hostcheck.job.links import fabric_moved, read_rdma_counters
from hostcheck.job.sample import ProcInfo, ProcSample, ProcSampler, Series
from hostcheck.registry import Thread

#: The folder whose sitecustomize.py loads the hook (started by path: this side never imports it).
JOBSITE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "inside", "jobsite")
#: Where the hook writes its records (hostcheck/inside/job_hook.py reads the same name).
DIR_VAR = "HOSTCHECK_JOB_DIR"
#: NVML's PCIe counters take 20 ms a call: read them every this many samples.
PCIE_EVERY = 4
#: The GPUs' process lists every this many samples.
GPU_PROCS_EVERY = 4


def job_env(base: dict[str, str], run_dir: str) -> dict[str, str]:
    """The job's environment: hostcheck's own, with the hook's folder first on PYTHONPATH and the run folder."""
    # Not launch.inside_argv: the command is the user's, and every Python it starts must load the hook, so the
    # hook's sitecustomize folder goes first on PYTHONPATH, by the function that builds every inside PYTHONPATH.
    env = inside_env(base, first=(JOBSITE,), hook=True)
    env[DIR_VAR] = run_dir
    return env


@dataclass(frozen=True)
class Observation:
    """What watching the job gave; records of the hook are read separately (hostcheck.job.records)."""

    argv: tuple[str, ...]
    run_dir: str
    started_wall: float
    t0: float
    t_end: float
    #: The command's own return code (negative: killed by that signal); None when it never started.
    rc: int | None
    #: What ``hostcheck job`` exits with (docs/job.md, exit codes).
    exit_code: int
    #: "exit" (the command ended), "window" (--seconds ran out), "signal" (hostcheck got SIGHUP/SIGINT/SIGTERM),
    #: "not-started".
    ended_by: str
    signal: int | None = None
    error: str | None = None
    interval_s: float = 0.5
    cores: int = 1
    leader: int | None = None
    samples: tuple[ProcSample, ...] = ()
    procs: dict[int, ProcInfo] = field(default_factory=dict)
    shm_size: int | None = None
    shm_max_used: int | None = None
    shm_start_used: int | None = None
    gpu_samples: tuple[tuple[float, tuple[GpuSample, ...]], ...] = ()
    gpu_error: str | None = None
    #: GPU index -> the pids NVML listed on it during the run.
    gpu_pids: dict[int, tuple[int, ...]] = field(default_factory=dict)
    sampler_error: str | None = None
    #: DCGM's profiling rows (``dcgmi dmon``), each with when it was read; why there are none (None where the
    #: node has no dcgmi at all).
    dcgm_samples: tuple[tuple[float, DcgmRow], ...] = ()
    dcgm_error: str | None = None
    #: The fabric's error counters at the job's start and end (hostcheck.job.links): "nvlink" and "rdma" ->
    #: (start, end) maps; a namespace that could not be read is absent.
    fabric: dict[str, tuple[dict[str, int], dict[str, int]]] = field(default_factory=dict)
    #: GPU UUID -> NVML index, to name a GPU's links.
    gpu_index: dict[str, int] = field(default_factory=dict)

    @property
    def fabric_moved(self) -> dict[str, Any]:
        """The NVLinks and RDMA ports whose counters rose during the job (hostcheck.job.links.fabric_moved)."""
        return fabric_moved(self.fabric, self.gpu_index)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Loop(Thread):
    """Calls ``fn(now, n)`` every ``interval`` seconds until stopped; the first error ends it and is kept."""

    def __init__(self, name: str, interval: float, fn: Callable[[float, int], None], stop: threading.Event):
        super().__init__(name=name, daemon=True)
        self.interval, self.fn, self.stop_event = interval, fn, stop
        self.error: str | None = None

    def run(self) -> None:
        n = 0
        next_t = time.monotonic()
        while not self.stop_event.is_set():
            try:
                self.fn(time.monotonic(), n)
            except _NoNvml as exc:
                self.error = str(exc)
                return
            except Exception as exc:  # a sampler's defect must not end the job or the report
                self.error = f"{type(exc).__name__}: {exc}"
                return
            n += 1
            next_t += self.interval
            self.stop_event.wait(max(0.0, next_t - time.monotonic()))


# long: start, sampling loop, signal forwarding and end of one command share its process handle and deadlines
def observe(
    argv: Sequence[str],
    run_dir: str,
    seconds: float | None = None,
    interval: float = 0.5,
    grace: float = 5.0,
    nvml_factory: Callable[[], NvmlSampler] = NvmlSampler,
    env: dict[str, str] | None = None,
    dcgm_factory: Callable[[float], DcgmSampler] = DcgmSampler,
    host_root: str = "/",
) -> Observation:
    """Run ``argv`` with the hook, sample it, end it (see the module's docstring)."""
    started_wall = time.time()
    t0 = time.monotonic()
    launch = Launch()
    base = dict(os.environ if env is None else env)
    not_started = {
        "argv": tuple(argv),
        "run_dir": run_dir,
        "started_wall": started_wall,
        "t0": t0,
        "rc": None,
    }
    try:
        p = launch.start(list(argv), env=job_env(base, run_dir), cwd=os.getcwd(), stdin=None)
    except FileNotFoundError:
        return Observation(
            **not_started,
            t_end=time.monotonic(),
            exit_code=EXIT_NOT_FOUND,
            ended_by="not-started",
            error=f"{argv[0]}: command not found",
        )
    except OSError as exc:
        return Observation(
            **not_started,
            t_end=time.monotonic(),
            exit_code=EXIT_NOT_EXECUTABLE,
            ended_by="not-started",
            error=f"{argv[0]}: {exc.strerror or exc}",
        )
    if p is None:  # the run was already ended (SIGINT before the start)
        return Observation(
            **not_started, t_end=time.monotonic(), exit_code=130, ended_by="not-started", error="interrupted"
        )
    stop = threading.Event()
    rdma_start = read_rdma_counters(host_root)
    fabric: dict[str, Any] = {}
    procs = ProcSampler(p.pid)
    gpu_series = Series()
    gpu_pids: dict[int, set[int]] = {}
    nvml_box: dict[str, Any] = {}

    def sample_procs(now: float, n: int) -> None:
        procs.sample(now)

    def sample_gpus(now: float, n: int) -> None:
        if "nvml" not in nvml_box:
            nvml_box["nvml"] = nvml_factory()
        nvml = nvml_box["nvml"]
        if nvml.error is not None:
            raise _NoNvml(nvml.error.reason)
        if n == 0:
            fabric["nvlink_start"] = _nvlink_counters(nvml)
        gpu_series.append((now, nvml.sample(pcie=n % PCIE_EVERY == 0)))
        if n % GPU_PROCS_EVERY == 0:
            for gpu, pids in nvml.processes().items():
                gpu_pids.setdefault(gpu, set()).update(pids)

    dcgm_series = Series()
    dcgm_box: dict[str, Any] = {}

    def sample_dcgm(now: float, n: int) -> None:
        if "dcgm" not in dcgm_box:
            dcgm_box["dcgm"] = dcgm_factory(interval)
        for row in dcgm_box["dcgm"].poll():
            dcgm_series.append((now, row))

    loops = [_Loop("hostcheck-job-proc", interval, sample_procs, stop)]
    loops.append(_Loop("hostcheck-job-gpu", interval, sample_gpus, stop))
    loops.append(_Loop("hostcheck-job-dcgm", interval, sample_dcgm, stop))
    for loop in loops:
        with contextlib.suppress(RuntimeError):  # no thread to be had: the job runs unobserved
            loop.start()
    ended_by, signum = "exit", None
    deadline = None if not seconds else t0 + seconds
    try:
        try:
            while p.poll() is None:
                if deadline is not None and time.monotonic() >= deadline:
                    ended_by = "window"
                    _end(p, signal.SIGINT, grace)
                    break
                with contextlib.suppress(Exception):
                    p.wait(0.1)
        except KeyboardInterrupt as exc:  # hostcheck.command's Signalled (SIGHUP/SIGINT/SIGTERM), or Ctrl-C
            ended_by = "signal"
            signum = int(getattr(exc, "signum", signal.SIGINT))
            _end(p, signum, grace)
    finally:
        t_end = time.monotonic()
        stop.set()
        for loop in loops:
            if loop.is_alive():
                loop.join(2.0)
        launch.end()
        nvml = nvml_box.get("nvml")
        if nvml is not None:
            if "nvlink_start" in fabric and nvml.error is None:
                fabric["nvlink_end"] = _nvlink_counters(nvml)
            nvml.close()
        rdma_end = read_rdma_counters(host_root) if rdma_start else {}
        dcgm = dcgm_box.get("dcgm")
        if dcgm is not None:
            dcgm.close()
    rc = p.returncode
    if ended_by == "window":
        code = 0
    elif ended_by == "signal":
        code = EXIT_SIGNAL_BASE + (signum or signal.SIGINT)
    else:
        code = rc if rc is not None and rc >= 0 else EXIT_SIGNAL_BASE + -(rc or 0)
    gpu_loop = loops[1]
    proc_loop = loops[0]
    dcgm_error = loops[2].error
    if dcgm is not None and not dcgm.absent:
        dcgm_error = dcgm_error or dcgm.error
    return Observation(
        argv=tuple(argv),
        run_dir=run_dir,
        started_wall=started_wall,
        t0=t0,
        t_end=t_end,
        rc=rc,
        exit_code=code,
        ended_by=ended_by,
        signal=signum,
        interval_s=interval,
        cores=usable_cores(),
        leader=p.pid,
        samples=tuple(procs.series.items),
        procs=dict(procs.info),
        shm_size=procs.shm_size,
        shm_max_used=procs.shm_max_used if procs.shm_size else None,
        shm_start_used=procs.shm_start_used,
        gpu_samples=tuple(gpu_series.items),
        gpu_error=gpu_loop.error,
        gpu_pids={k: tuple(sorted(v)) for k, v in gpu_pids.items()},
        sampler_error=proc_loop.error,
        dcgm_samples=tuple(dcgm_series.items),
        dcgm_error=dcgm_error,
        fabric=_fabric(fabric, rdma_start, rdma_end),
        gpu_index=dict(fabric.get("nvlink_start", ({}, {}))[1]),
    )


def _nvlink_counters(nvml: Any) -> tuple[dict[str, int], dict[str, int]]:
    """The sampler's NVLink counters; ({}, {}) from a sampler without them or whose read failed."""
    try:
        return nvml.nvlink_counters()
    except Exception:  # a sampler's defect must not end the job or the report
        return {}, {}


def _fabric(
    nvlink: dict[str, Any], rdma_start: dict[str, int], rdma_end: dict[str, int]
) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    out = {}
    if nvlink.get("nvlink_start", ({},))[0] and "nvlink_end" in nvlink:
        out["nvlink"] = (nvlink["nvlink_start"][0], nvlink["nvlink_end"][0])
    if rdma_start:
        out["rdma"] = (rdma_start, rdma_end)
    return out


class _NoNvml(Exception):
    """No GPU figures to be had (said once, in the report)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "NVML unavailable"


def _end(p: Any, signum: int, grace: float) -> None:
    """Send ``signum`` to the job's group and give it ``grace`` seconds to exit (the caller kills what is left)."""
    with contextlib.suppress(OSError):
        os.killpg(p.pid, signum)
    with contextlib.suppress(Exception):
        p.wait(grace)
