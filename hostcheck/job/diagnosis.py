"""The verdict on a job: what held it back, the evidence, and the fix in the terms of our roles' settings.

Pure: an :class:`~hostcheck.job.analyse.Analysis` and the effective lines in, a :class:`Diagnosis` out. Every
threshold is a row of hostcheck/data/job_thresholds.json (value, unit, source or own basis, read through
hostcheck/thresholds.py) and of docs/job.md; the names below are those rows'. The rules, in order:

1. a DataLoader worker died or raised (the job's error says so): ``worker-died``;
2. fewer than MIN_BATCHES batches: ``idle-gpu`` when a GPU sat under its busy target, else ``no-training-loop``;
3. the GPUs the job used were busy at their target or more (SM activity from NVML GPM against SM_ACTIVE_TARGET;
   without GPM, NVML utilisation against GPU_BUSY_TARGET): ``compute-bound``;
4. the main thread waited for data INPUT_WAIT_SHARE of the loop or more: ``input-bound``, with the causes below;
5. communication inside the loop's steps (explicit collectives, and DDP's backward communication not hidden
   behind backward compute) took COMM_SHARE of the loop or more: ``communication-bound``; a wait in collectives
   after the loop (ranks ending at different times) is a finding, never this verdict;
6. the loop's processes used less than HOST_BLOCKED_CPU cores and, where the hook sampled the loop thread's
   stack, it was asleep in HOST_BLOCKED_ASLEEP of the samples in its steps: ``host-blocked`` (neither
   computing, nor waiting for data, nor communicating), with the top frames and the kernel wait channel;
7. a GPU was there and under its target: ``idle-gpu`` (the main thread is busy, the GPU is not);
8. otherwise ``compute-bound`` (without a GPU: on the CPU).

Input-bound causes (each when its evidence is there; the fix lists them in this order): shared memory, CPU-bound
decoding in the workers, storage, too few workers; a wait none of them explains says so. Oversubscription of the
cores by torch's threads and the workers, pin_memory, persistent_workers and the GPU-side settings (autocast,
channels_last, cudnn.benchmark) are findings beside the verdict.

Why one module: the rules are one ordered decision over one set of thresholds, and the causes and findings must
not contradict each other (the worker advice, oversubscription and the node's CPU read the same figures); split,
the order and the thresholds would be spread over files that each only make sense with the others.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from hostcheck import fixes
from hostcheck.job.analyse import SIGNAL_DCGM, SIGNAL_GPM, Analysis
from hostcheck.thresholds import JobThresholds

#: The shipped lines (hostcheck/data/job_thresholds.json: each row with its source or its own basis); ``hostcheck
#: job`` passes the configuration's effective ones ([thresholds] applied).
DEFAULT = JobThresholds()

KINDS = (
    "input-bound",
    "compute-bound",
    "communication-bound",
    "host-blocked",
    "idle-gpu",
    "worker-died",
    "no-training-loop",
)


@dataclass(frozen=True)
class Cause:
    """One reason with its evidence and its fix."""

    id: str
    evidence: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "evidence": self.evidence, "fix": self.fix}


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    headline: str
    causes: tuple[Cause, ...] = ()
    findings: tuple[Cause, ...] = ()
    #: For worker-died: what the loop was before it failed (input-bound, compute-bound, ...), else None.
    loop_kind: str | None = None
    #: The numbers the rules read, with the thresholds they were held against.
    measures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "headline": self.headline,
            "loop_kind": self.loop_kind,
            "causes": [c.to_dict() for c in self.causes],
            "findings": [c.to_dict() for c in self.findings],
            "measures": self.measures,
        }


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _ranks_n(a: Analysis) -> int:
    return max(1, len(a.ranks))


def cores_per_rank(a: Analysis) -> int:
    return max(1, a.cores // _ranks_n(a))


def _num_workers(a: Analysis) -> int | None:
    vals = [r.loader.get("num_workers") for r in a.ranks if isinstance(r.loader.get("num_workers"), int)]
    return min(vals) if vals else None


def _suggest_workers(a: Analysis) -> int:
    # One core per rank stays with the main process; a DataLoader gains little past what the cores can run.
    return max(2, cores_per_rank(a) - 1)


def _error_text(e: dict[str, Any]) -> str:
    return f"{e.get('type', '')}: {e.get('message', '')} {e.get('cause', '')}"


_WORKER_ERROR = re.compile(r"DataLoader worker \(pid|in DataLoader worker process|DataLoader worker .*exited")
_SHM_WORDS = re.compile(r"[Bb]us error|shared memory|\bshm\b|No space left on device.*shm", re.S)


#: What a worker's death looks like from the main process when torch re-raises the pipe's error (the worker
#: was not yet reaped when the main process looked).
_PIPE_ERRORS = ("ConnectionResetError", "EOFError", "BrokenPipeError", "ConnectionRefusedError")


def worker_error(a: Analysis) -> dict[str, Any] | None:
    for e in a.errors:
        if _WORKER_ERROR.search(_error_text(e)):
            return e
    with_workers = any(r.loader.get("num_workers") for r in a.ranks)
    for e in a.errors:
        if with_workers and e.get("where") == "next" and e.get("type") in _PIPE_ERRORS:
            return e
    return None


def _first_sentence(e: dict[str, Any]) -> str:
    msg = (e.get("message") or "").strip().splitlines()
    first = msg[0] if msg else str(e.get("type", ""))
    return first.split(". ", 1)[0].rstrip(".")[:200]


def _shm_cause(a: Analysis, from_error: bool, t: Any = DEFAULT) -> Cause | None:
    size, peak = a.shm.get("size_bytes"), a.shm.get("peak_bytes")
    full = bool(size and peak is not None and peak >= t.shm_full_share * size)
    if not (full or from_error):
        return None
    gib = 1 << 30
    want = max(8, math.ceil(2 * (peak or 0) / gib), math.ceil(2 * (size or 0) / gib) if full else 0)
    seen = f"/dev/shm peaked at {_gib(peak)} of {_gib(size)}" if size else "/dev/shm's size unknown"
    why = "a worker was killed by a bus error / shared-memory failure; " if from_error else ""
    return Cause(
        "shared-memory",
        f"{why}{seen} (full at {pct(t.shm_full_share)}): workers pass every batch through /dev/shm",
        fixes.SHM.format(size=f"{want}G") + f"; in a container: --shm-size={want}g or --ipc=host",
    )


def _gib(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _worker_died(a: Analysis, e: dict[str, Any], t: Any = DEFAULT) -> list[Cause]:
    text = _error_text(e)
    first = _first_sentence(e)
    if _SHM_WORDS.search(text):
        shm = _shm_cause(a, from_error=True, t=t)
        return [shm] if shm else []
    if "signal: Killed" in text:
        return [
            Cause(
                "worker-killed",
                f"{first}: SIGKILL, which is what the kernel's OOM killer sends",
                "check `journalctl -k | grep -i 'out of memory'`; lower num_workers or prefetch_factor, or keep the "
                "Dataset's per-item memory small (lists of Python objects are copied into every worker)",
            )
        ]
    caught = re.search(r"Caught (\w+) in DataLoader worker process (\d+)", text)
    if caught:
        return [
            Cause(
                "dataset-raised",
                f"the Dataset raised {caught.group(1)} in worker {caught.group(2)}: {first}",
                "fix the Dataset's __getitem__ (the job's traceback shows the line); "
                "num_workers=0 runs it in the main process under a debugger",
            )
        ]
    if e.get("type") in _PIPE_ERRORS and not _WORKER_ERROR.search(text):
        first = f"{e.get('type')} reading from the workers ({first})"
    code = re.search(r"exit code (-?\d+)", text)
    how = f" with exit code {code.group(1)}" if code else ""
    return [
        Cause(
            "worker-exited",
            f"{first}: a worker ended{how} without a Python error (os._exit, a crash in native code)",
            "run with num_workers=0 to see the error in the main process; look for a segfault in "
            "`journalctl -k` or a library that calls exit()",
        )
    ]


# long: the input-bound causes in the order the fix lists them; they read the same figures and must not contradict
def _input_causes(a: Analysis, t: Any = DEFAULT) -> list[Cause]:
    causes: list[Cause] = []
    shm = _shm_cause(a, from_error=False, t=t)
    if shm:
        causes.append(shm)
    nw = _num_workers(a)
    cpu = a.cpu
    cores = a.cores
    job_cpu = cpu.get("job")
    node_full = job_cpu is not None and job_cpu >= t.job_saturated_share * cores
    wmean = cpu.get("worker_mean")
    saturated = bool(nw and wmean is not None and wmean >= t.worker_saturated_cores)
    main_cpu = cpu.get("main")
    pil = next(((r.final or {}).get("pil") for r in a.ranks if (r.final or {}).get("pil")), None)
    want = _suggest_workers(a)
    decode_fix = []
    if saturated or node_full:
        if nw is not None and nw < want and not node_full:
            decode_fix.append(
                f"DataLoader(num_workers={want}) (up to the {cores_per_rank(a)} cores per rank)"
            )
        if pil and not pil.get("simd"):
            decode_fix.append(fixes.PILLOW_SIMD + f" (PIL {pil.get('version')} is stock Pillow)")
        decode_fix.append(
            ("or " if decode_fix else "")
            + "move decoding off the CPU: torchvision.io.decode_jpeg(device='cuda') or NVIDIA DALI, or store the "
            "dataset pre-decoded at training size"
        )
        ev = (
            f"workers used {wmean:.2f} of a core each (busy at {t.worker_saturated_cores:.0%})"
            if saturated
            else f"the job used {job_cpu:.1f} of {cores} cores (full at {t.job_saturated_share:.0%})"
        )
        causes.append(Cause("cpu-decode", ev + ": loading and decoding is CPU-bound", "; ".join(decode_fix)))
    storage = _storage_evidence(a, t=t)
    if storage and not saturated:
        causes.append(
            Cause(
                "storage",
                storage,
                "put the dataset on local NVMe/SSD (`hostcheck check --data-dir DIR` judges the disk: system.E005) "
                "or cache it in RAM or local scratch; on network storage more workers hide latency",
            )
        )
    node_busy = cpu.get("node_busy")
    node_saturated = node_busy is not None and node_busy >= t.job_saturated_share * cores and not node_full
    fetch_ms = _main_fetch_ms(a)
    if nw == 0 and fetch_ms is not None and fetch_ms < t.worker_handoff_ms and not storage and not shm:
        causes.append(
            Cause(
                "cheap-fetch",
                f"num_workers=0 and a batch took {fetch_ms:.2f} ms to fetch in the main process (median), less "
                f"than handing a batch over from a worker costs (about {t.worker_handoff_ms:g} ms): workers "
                "would make each batch slower",
                "no workers needed; the wait is per-sample indexing and collation: fetch whole batches at once "
                "(DataLoader(dataset, sampler=BatchSampler(RandomSampler(dataset), batch_size, drop_last=False), "
                "batch_size=None) with a Dataset that takes a list of indices, as TensorDataset does) or a "
                "larger batch",
            )
        )
    elif nw == 0:
        ev = f"num_workers=0: the main process loads every batch itself (CPU {_cores(main_cpu)})"
        if main_cpu is not None and main_cpu >= t.main_loading_cpu_cores:
            ev += ", decoding while the model waits"
        if fetch_ms is not None:
            ev += f"; a batch takes {fetch_ms:.1f} ms to fetch, more than a worker's hand-off"
        causes.append(
            Cause(
                "too-few-workers",
                ev,
                f"DataLoader(num_workers={want}, persistent_workers=True"
                + (", pin_memory=True)" if a.gpu_used else ")"),
            )
        )
    elif nw is not None and node_saturated and not saturated and not storage:
        causes.append(
            Cause(
                "node-cpu-busy",
                f"the node's CPUs were busy ({node_busy:.2f} of {cores} cores) while the job itself used "
                f"{_cores(job_cpu)}: other processes hold the cores more workers would need",
                "run it where nothing else competes (a Slurm exclusive allocation, a drained node), then again",
            )
        )
    elif nw is not None and not saturated and not node_full and not storage and nw < want:
        causes.append(
            Cause(
                "too-few-workers",
                f"num_workers={nw} and the job's CPU was not busy (workers {_cores(wmean)} each, the job "
                f"{_cores(job_cpu)} of {cores}, the node {_cores(node_busy)}): more workers would load in "
                "parallel",
                f"DataLoader(num_workers={want})",
            )
        )
    if not causes:
        causes.append(
            Cause(
                "unexplained-wait",
                f"num_workers={nw}, workers {_cores(wmean)} each, no storage or shared-memory pressure seen",
                "raise prefetch_factor (default 2), look for a slow collate_fn or a lock in the Dataset; "
                "torch.profiler shows where the main thread waits",
            )
        )
    return causes


def _main_fetch_ms(a: Analysis) -> float | None:
    """The hook's median wait per batch of the ranks that load in the main process (num_workers=0): there the
    wait is the fetch itself (indexing, loading, collation)."""
    vals = [
        r.times.median_wait_ms
        for r in a.ranks
        if r.loader.get("num_workers") == 0 and r.times.median_wait_ms is not None
    ]
    return max(vals) if vals else None


def _cores(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} cores"


def _storage_evidence(a: Analysis, t: Any = DEFAULT) -> str | None:
    parts = []
    for d in a.io.get("devices") or ():
        if d.get("util") is not None and d["util"] >= t.disk_busy_share:
            rot = " (a rotational disk)" if d.get("rotational") else ""
            parts.append(
                f"{d['device']}{rot} holding {', '.join(d['dirs'])} was busy {pct(d['util'])} of the loop "
                f"reading {d.get('read_mb_s')} MB/s"
            )
    blk = a.io.get("loader_blkio_share")
    if blk is not None and blk >= t.blkio_share:
        parts.append(f"the loaders were blocked on disk reads {pct(blk)} of the time")
    psi, read = a.io.get("psi_io_some"), a.io.get("job_read_mb_s")
    if psi is not None and psi >= t.psi_io_share and read is not None and read >= t.job_read_mb_s:
        parts.append(
            f"the job read {read:g} MB/s from storage while tasks stalled on I/O {pct(psi)} of the time (PSI)"
        )
    return "; ".join(parts) or None


def _findings(a: Analysis, kind: str, t: Any = DEFAULT) -> list[Cause]:
    out = []
    node, job = a.cpu.get("node_busy"), a.cpu.get("job")
    if node is not None and job is not None and node - job >= t.contended_share * a.cores:
        out.append(
            Cause(
                "cpu-contended",
                f"other processes used {node - job:.1f} of the {a.cores} cores during the loop: the job's timings "
                "include that competition",
                "run it where nothing else competes (a Slurm exclusive allocation, a drained node), then again",
            )
        )
    threads = [r.threads for r in a.ranks if r.threads]
    workers = a.cpu.get("workers_n") or 0
    # Threads and workers count by the cores they used (measured), not by their number: an idle thread or worker
    # takes no core. Oversubscribed: the job asked for more threads than cores and its processes held them all.
    main_cores = a.cpu.get("main") or 0.0
    worker_cores = a.cpu.get("workers") or 0.0
    used = main_cores + worker_cores
    if threads and sum(threads) + workers > a.cores and used >= t.job_saturated_share * a.cores:
        ranks = _ranks_n(a)
        n = max(1, int(a.cores - worker_cores) // ranks)
        if n < max(threads):
            fix = fixes.THREADS.format(n=n) + " (OMP_NUM_THREADS in the training environment)"
        else:  # one thread a rank already: the workers are what is too many
            per_rank = max(1, (a.cores - sum(threads)) // ranks)
            fix = f"DataLoader(num_workers={per_rank}) per rank, or a node with more cores per GPU"
        out.append(
            Cause(
                "oversubscribed",
                f"{ranks} rank(s) x {max(threads)} torch threads using {main_cores:.1f} cores + {workers} DataLoader "
                f"workers using {worker_cores:.1f} cores = {used:.1f} busy of {a.cores} cores (full at "
                f"{t.job_saturated_share:.0%})",
                fix,
            )
        )
    end_wait = a.comm.get("end_wait_s")
    if end_wait and a.loop_s > 0 and end_wait >= t.comm_share * a.loop_s:
        out.append(
            Cause(
                "end-wait",
                f"a rank waited {end_wait:.1f} s in collectives after its training loop (the loop took "
                f"{a.loop_s:.1f} s): ranks ended at different times (one evaluating or saving while the others "
                "wait at a barrier). Not gradient communication, and not counted in the loop's shares",
                "share the end-of-run work (evaluation, checkpointing) across ranks, or accept the wait; "
                "it is not the interconnect",
            )
        )
    if a.gpu_used and any(r.loader and r.loader.get("pin_memory") is False for r in a.ranks):
        out.append(
            Cause(
                "pin-memory",
                "pin_memory=False: every batch is copied to the GPU from pageable memory, synchronously",
                "DataLoader(pin_memory=True) and .to(device, non_blocking=True)",
            )
        )
    for r in a.ranks:
        waits = r.times.epoch_start_waits_s
        if (
            waits
            and not r.loader.get("persistent_workers")
            and sum(waits) / len(waits) >= t.epoch_start_wait_s
        ):
            out.append(
                Cause(
                    "persistent-workers",
                    f"each epoch waited {sum(waits) / len(waits):.1f} s for its workers to start again",
                    "DataLoader(persistent_workers=True)",
                )
            )
            break
    if a.gpu_used and kind in ("compute-bound", "idle-gpu"):
        out += _gpu_settings(a)
    return out


def _gpu_settings(a: Analysis) -> list[Cause]:
    out = []
    autocast = [(r.final or {}).get("autocast") for r in a.ranks]
    if not any(x and x.get("enabled") for x in autocast):
        out.append(
            Cause(
                "no-amp",
                "no torch.autocast in the training step: the math runs in fp32/tf32",
                "with torch.autocast('cuda', dtype=torch.bfloat16): around forward and loss (PyTorch's tuning guide)",
            )
        )
    conv = [r.model for r in a.ranks if r.model and r.model.get("conv_weights")]
    if conv and not any(m.get("channels_last_weights") for m in conv):
        out.append(
            Cause(
                "channels-last",
                f"{conv[0]['conv_weights']} convolution weights, none in channels_last",
                "model.to(memory_format=torch.channels_last) and the same for the input batches",
            )
        )
    if conv and not any(m.get("cudnn_benchmark") for m in conv):
        out.append(
            Cause(
                "cudnn-benchmark",
                "torch.backends.cudnn.benchmark is False with convolutions in the model",
                "torch.backends.cudnn.benchmark = True (for fixed input sizes)",
            )
        )
    return out


def gpu_target(a: Analysis, t: Any = DEFAULT) -> float:
    """The busy line for the signal the GPUs were judged by (SM activity or, the last resort, utilisation)."""
    return t.sm_active_target_pct if a.gpu_signal in (SIGNAL_GPM, SIGNAL_DCGM) else t.gpu_busy_target_pct


def gpu_words(a: Analysis) -> str:
    """The GPU figure in words that say which signal it is."""
    util = a.gpu_util
    if util is None:
        return "no GPU figures"
    if a.gpu_signal == SIGNAL_GPM:
        return f"GPU SM activity {util:.0f}% (NVML GPM)"
    if a.gpu_signal == SIGNAL_DCGM:
        return f"GPU SM activity {util:.0f}% (DCGM profiling)"
    return f"GPU utilisation {util:.0f}% (NVML: kernel-time utilisation, not SM activity)"


def _host_blocked(a: Analysis, t: Any = DEFAULT) -> Cause | None:
    """The loop thread neither computes (its processes barely use a core) nor waits for data or communicates
    (rules 4 and 5 came first): it waits in some other host call. Stack samples, where there are enough,
    must agree (the thread asleep in most samples taken in its steps); they also say where it waits."""
    main = a.cpu.get("main")
    if main is None or not a.ranks:
        return None
    per_rank = main / len(a.ranks)
    if per_rank >= t.host_blocked_cpu_cores:
        return None
    st = a.stacks or {}
    in_steps = (st.get("where") or {}).get("step", 0)
    states = st.get("state") or {}
    asleep = sum(v for k, v in states.items() if k in ("S", "D"))
    if (
        in_steps >= t.min_stack_samples
        and states
        and asleep < t.host_blocked_asleep_share * sum(states.values())
    ):
        return None
    ev = f"the loop's process used {per_rank:.2f} cores over the loop (computing from {t.host_blocked_cpu_cores:g})"
    where = ""
    top = st.get("top") or []
    if in_steps >= t.min_stack_samples and top:
        frames, n = top[0]
        ev += f"; in {n} of {in_steps} stack samples taken between batches the thread was at {frames}"
        where = f" (at {frames.split(' < ')[0]})"
        if states:
            ev += f", asleep in {asleep} of {sum(states.values())}"
        wchan = [w for w, _n in st.get("wchan") or [] if w not in ("0", "")]
        if wchan:
            ev += f"; kernel wait channel {wchan[0]}"
    elif in_steps < t.min_stack_samples:
        ev += f"; too few stack samples to say where ({in_steps})"
    return Cause(
        "host-call",
        ev,
        f"move the blocking call{where} out of the training step: run it in a background thread, every N "
        "steps, or asynchronously (a sleep, a lock, a synchronous log/metrics/checkpoint write, a remote call, a "
        "subprocess); py-spy dump --pid PID shows the thread live",
    )


def _loop_kind(a: Analysis, t: Any = DEFAULT) -> tuple[str, list[Cause], str]:
    """The loop's classification (rules 3 to 8), its causes and a one-line headline."""
    util = a.gpu_util
    w = a.wait_share
    comm = a.comm.get("share")
    gpu = gpu_words(a)
    target = gpu_target(a, t=t)
    if util is not None and util >= target:
        return "compute-bound", [], f"compute-bound: {gpu} (target {target:.0f}%)"
    if w is not None and w >= t.input_wait_share:
        causes = _input_causes(a, t=t)
        why = ", ".join(c.id for c in causes)
        return (
            "input-bound",
            causes,
            f"input-bound ({why}): the main thread waited for data {pct(w)} of the loop",
        )
    if comm is not None and comm >= t.comm_share:
        return (
            "communication-bound",
            [
                Cause(
                    "ddp-communication",
                    f"communication inside the loop's steps (collectives, and DDP's gradient communication not "
                    f"hidden behind backward) took {pct(comm)} of the loop",
                    "check the interconnect (hostcheck's workload.E013 all_reduce bus bandwidth); DDP("
                    "gradient_as_bucket_view=True, bucket_cap_mb=...), model.no_sync() under gradient "
                    "accumulation, a larger batch per GPU",
                ),
                *_fabric_errors(a),
            ],
            f"communication-bound: communication took {pct(comm)} of the loop",
        )
    blocked = _host_blocked(a, t=t)
    if blocked is not None:
        return (
            "host-blocked",
            [blocked],
            f"host-blocked: the main thread was neither computing ({a.cpu.get('main'):.2f} cores), nor waiting "
            f"for data ({pct(w)}), nor communicating ({pct(comm or 0.0)}): it waits in a host call",
        )
    if a.gpus and util is not None:
        return (
            "idle-gpu",
            _idle_causes(a),
            f"idle GPU: {gpu} while the main thread waited for data only {pct(w)}",
        )
    if a.gpus or a.gpu_used:
        return "idle-gpu", _idle_causes(a), "idle GPU"
    where = "on the CPU (no GPU in use)" if not a.gpus else ""
    return (
        "compute-bound",
        [],
        f"compute-bound {where}: data wait {pct(w)} of the loop (input-bound from {pct(t.input_wait_share)})".replace(
            "  ", " "
        ),
    )


def _fabric_errors(a: Analysis) -> list[Cause]:
    """The NVLinks and RDMA ports whose error counters rose during the job (hostcheck.job.links), as a cause."""
    links, ports = a.comm.get("links_moved") or [], a.comm.get("ports_moved") or []
    if not links and not ports:
        return []
    named = [f"NVLink {x}" for x in links] + [f"RDMA {x}" for x in ports]
    return [
        Cause(
            "link-errors",
            "error counters rose during the job on " + "; ".join(named),
            "a link that retries or retrains carries less: run hostcheck on the node (nvlink.E001-E004 judge the "
            "NVLinks; 'nvidia-smi nvlink -e' and the ports' counters under /sys/class/infiniband show them), "
            "drain it if they keep rising",
        )
    ]


def _idle_causes(a: Analysis) -> list[Cause]:
    on_cpu = [r for r in a.ranks if r.model and set(r.model.get("param_devices") or {}) == {"cpu"}]
    if on_cpu or not a.gpu_used:
        return [
            Cause(
                "job-not-on-gpu",
                "the model's parameters are on the CPU"
                if on_cpu
                else "NVML listed no process of the job on a GPU",
                "model.to('cuda') and batch.to('cuda', non_blocking=True); check CUDA_VISIBLE_DEVICES",
            )
        ]
    return [
        Cause(
            "cpu-overhead",
            "the main thread is busy between batches but the GPU is not: Python overhead, small kernels, or host "
            "synchronisations (.item(), .cpu(), printing tensors) every step",
            "a larger batch per GPU; torch.compile or CUDA graphs; fewer host syncs per step",
        )
    ]


def diagnose(a: Analysis, t: Any = DEFAULT) -> Diagnosis:
    """Apply the rules of the module's docstring."""
    measures = {
        "wait_share": None if a.wait_share is None else round(a.wait_share, 4),
        "input_wait_share_threshold": t.input_wait_share,
        "gpu_util": None if a.gpu_util is None else round(a.gpu_util, 1),
        "gpu_signal": a.gpu_signal,
        "gpu_busy_target": gpu_target(a, t=t),
        "comm_share": a.comm.get("share"),
        "comm_share_threshold": t.comm_share,
        "batches": a.batches,
        "min_batches": t.min_batches,
        "end_wait_s": a.comm.get("end_wait_s"),
        "host_blocked_cpu_threshold": t.host_blocked_cpu_cores,
    }
    err = worker_error(a)
    if err is not None:
        causes = _worker_died(a, err, t=t)
        loop_kind = None
        if a.batches >= t.min_batches:
            loop_kind, _, _ = _loop_kind(a, t=t)
        return Diagnosis(
            "worker-died",
            f"a DataLoader worker died: {_first_sentence(err)}",
            tuple(causes),
            tuple(_findings(a, "worker-died", t=t)),
            loop_kind,
            measures,
        )
    if a.batches < t.min_batches:
        util = a.gpu_util
        if util is not None and util < gpu_target(a, t=t):
            return Diagnosis(
                "idle-gpu",
                f"idle GPU ({gpu_words(a)}) and {a.batches} DataLoader batches in {a.duration_s:.0f} s",
                tuple(_idle_causes(a)),
                (),
                None,
                measures,
            )
        if a.ended_by == "not-started":  # no window, however long, would have shown a loop
            cause = Cause(
                "not-started",
                f"the command did not start: {a.start_error or 'unknown reason'}",
                "check the command's name, its path and that it is executable (exit 127: not found, 126: "
                "not executable)",
            )
        else:
            cause = Cause(
                "no-loop",
                f"the hook saw fewer than {t.min_batches} batches from torch.utils.data.DataLoader",
                "give it a longer --seconds window, or the job does not iterate a torch DataLoader "
                "(its own loader, or not Python: the hook is loaded by Python's site module)",
            )
        return Diagnosis(
            "no-training-loop",
            f"no training loop seen: {a.batches} DataLoader batches in {a.duration_s:.1f} s"
            + ("" if a.ranks or a.others else " (no Python process of the job imported torch)"),
            (cause,),
            (),
            None,
            measures,
        )
    kind, causes, headline = _loop_kind(a, t=t)
    return Diagnosis(kind, headline, tuple(causes), tuple(_findings(a, kind, t=t)), None, measures)
