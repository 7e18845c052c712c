"""From what was observed to the figures the verdict reads: each training process's loop, CPU by role, reads,
/dev/shm, the GPUs, communication, and the timeline's bins. Pure: an Observation, the hook's records and where
the dataset directories live go in, an :class:`Analysis` comes out.

Roles: a *rank* is a process whose hook recorded DataLoader batches; its *workers* are the pids its DataLoader
iterators listed and every other process below it; everything else in the job's tree (a launcher, a shell) is
*other*. Rates are taken over the loop's span (the first batch's request to the last batch's arrival), so the
imports and set-up before the loop do not water them down; without a loop, over the whole run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hostcheck.gather.base import Unavailable
from hostcheck.gather.datapath import BlockDevice, DataDir
from hostcheck.job.dcgm import dcgm_by_gpu, dcgm_line, dcgm_means
from hostcheck.job.observe import Observation
from hostcheck.job.records import HookProcess, LoopTimes, clock_counts, loop_times, step_spans, wait_in_bins
from hostcheck.job.sample import CLK_TCK, ProcSample

#: The GPU signals, in their order of preference (docs/job.md): SM activity from NVML's GPM metrics (Hopper and
#: later), then DCGM's profiling fields (dcgmi dmon), then NVML utilisation, labelled wherever it is shown.
SIGNAL_GPM = "sm-activity (NVML GPM)"
SIGNAL_DCGM = "sm-activity (DCGM profiling)"
_SIGNAL_KEY = {SIGNAL_GPM: "sm_active_mean", SIGNAL_DCGM: "dcgm_sm_active_mean"}
SIGNAL_UTIL = "utilisation (NVML; kernel-time utilisation, not SM activity)"
#: Bins of the timeline's data wait, about, and the narrowest bin.
TIMELINE_BINS = 240
MIN_BIN_S = 0.02


@dataclass(frozen=True)
class Rank:
    pid: int
    rank: int | None
    argv: tuple[str, ...]
    times: LoopTimes
    #: The settings of the DataLoader iterator that gave the most batches.
    loader: dict[str, Any]
    model: dict[str, Any] | None
    final: dict[str, Any] | None
    workers: tuple[int, ...]
    #: CPU cores the process itself used during its loop.
    cpu_cores: float | None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def threads(self) -> int | None:
        for rec in (self.model, self.final):
            if rec and isinstance(rec.get("threads"), int):
                return rec["threads"]
        return None


@dataclass(frozen=True)
class Analysis:
    command: tuple[str, ...]
    duration_s: float
    exit_code: int
    rc: int | None
    ended_by: str
    signal: int | None
    start_error: str | None
    cores: int
    ranks: tuple[Rank, ...]
    #: Processes that loaded torch and wrote records but iterated no DataLoader (their errors still count).
    others: tuple[HookProcess, ...]
    #: Data wait over wait + step, all ranks together.
    wait_share: float | None
    batches: int
    loop_s: float
    cpu: dict[str, Any]
    io: dict[str, Any]
    shm: dict[str, Any]
    gpus: tuple[dict[str, Any], ...]
    gpu_error: str | None
    comm: dict[str, Any]
    errors: tuple[dict[str, Any], ...]
    data_dirs: tuple[dict[str, Any], ...]
    timeline: dict[str, Any]
    started_wall: float = 0.0
    sampler_error: str | None = None
    #: Where the loops' threads were between batches: the hook's stack samples, all ranks together.
    stacks: dict[str, Any] = field(default_factory=dict)
    #: Hook record files or records not used (a FIFO, a link, a wrong type), each with its reason.
    records_dropped: tuple[str, ...] = ()
    dcgm_error: str | None = None  # why dcgmi dmon gave nothing; None where there is no dcgmi

    @property
    def gpu_used(self) -> bool:
        return any(g.get("used_by_job") for g in self.gpus)

    @property
    def gpu_signal(self) -> str | None:
        """Which figure says how busy the GPUs were: SM activity from NVML's GPM metrics where every GPU the
        job used has it, else from DCGM's profiling fields where every one has those, else NVML utilisation
        (the last resort: the share of time any kernel ran, not how much of the GPU it used); None without."""
        used = self._judged_gpus()
        if used and all(g.get("sm_active_mean") is not None for g in used):
            return SIGNAL_GPM
        if used and all(g.get("dcgm_sm_active_mean") is not None for g in used):
            return SIGNAL_DCGM
        if any(g.get("util_mean") is not None for g in used):
            return SIGNAL_UTIL
        return None

    @property
    def gpu_util(self) -> float | None:
        """Mean activity of the GPUs the job used (all GPUs when NVML listed no process of the job's), in the
        :attr:`gpu_signal`'s terms."""
        key = _SIGNAL_KEY.get(self.gpu_signal or "", "util_mean")
        vals = [g[key] for g in self._judged_gpus() if g.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    def _judged_gpus(self) -> list[dict[str, Any]]:
        return [g for g in self.gpus if g.get("used_by_job")] or list(self.gpus)

    def to_dict(self) -> dict[str, Any]:
        out = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("ranks", "others", "timeline", "started_wall", "sampler_error")
        }
        out["ranks"] = [_rank_dict(r) for r in self.ranks]
        return out


def _rank_dict(r: Rank) -> dict[str, Any]:
    t = r.times
    return {
        "pid": r.pid,
        "rank": r.rank,
        "argv": list(r.argv),
        "batches": t.batches,
        "wait_s": round(t.wait_s, 4),
        "step_s": round(t.step_s, 4),
        "between_epochs_s": round(t.between_epochs_s, 4),
        "first_batch_s": round(t.first_batch_s, 4),
        "wait_share": None if t.wait_share is None else round(t.wait_share, 4),
        "median_wait_ms": _r(t.median_wait_ms, 3),
        "median_step_ms": _r(t.median_step_ms, 3),
        "epoch_start_waits_s": [round(x, 4) for x in t.epoch_start_waits_s],
        "loader": r.loader,
        "model": r.model,
        "threads": r.threads,
        "workers": list(r.workers),
        "cpu_cores": _r(r.cpu_cores, 3),
        "autocast": (r.final or {}).get("autocast"),
        "collectives": (r.final or {}).get("collectives") or {},
        "ddp": (r.final or {}).get("ddp") or [],
        "pil": (r.final or {}).get("pil"),
    }


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, nd)


def _main_loader(p: HookProcess) -> dict[str, Any]:
    if not p.iterators:
        return {}
    counts: dict[int, int] = {}
    for it in p.batch_iters:
        counts[it] = counts.get(it, 0) + 1
    best = max(counts, key=counts.get) if counts else None
    chosen = next((r for r in p.iterators if r.get("it") == best), p.iterators[0])
    keep = (
        "num_workers",
        "pin_memory",
        "pin_memory_effective",
        "persistent_workers",
        "prefetch_factor",
        "batch_size",
        "dataset",
        "dataset_root",
        "mp_context",
        "timeout",
    )
    return {k: chosen.get(k) for k in keep if k in chosen}


def _pairs(samples: Sequence[ProcSample], s0: float, s1: float) -> list[tuple[ProcSample, ProcSample]]:
    """Consecutive samples whose interval's middle lies in [s0, s1]; all of them when fewer than two do."""
    pairs = list(zip(samples, samples[1:]))
    inside = [(a, b) for a, b in pairs if s0 <= (a.t + b.t) / 2 <= s1]
    return inside if len(inside) >= 2 else pairs


def _cpu_by_pid(pairs: list[tuple[ProcSample, ProcSample]]) -> dict[int, tuple[float, float, float]]:
    """pid -> (CPU seconds, seconds observed, seconds blocked on block I/O) over the pairs."""
    acc: dict[int, list[float]] = {}
    for a, b in pairs:
        dt = b.t - a.t
        for pid, (ticks, _rb, blk) in b.procs.items():
            prev = a.procs.get(pid)
            if prev is None or ticks < prev[0]:
                continue
            v = acc.setdefault(pid, [0.0, 0.0, 0.0])
            v[0] += (ticks - prev[0]) / CLK_TCK
            v[1] += dt
            v[2] += max(0, blk - prev[2]) / CLK_TCK
    return {pid: (v[0], v[1], v[2]) for pid, v in acc.items()}


def _below(pid: int, ppids: dict[int, int], roots: set[int]) -> int | None:
    """The root (a rank) ``pid`` descends from, if any."""
    seen = set()
    cur = ppids.get(pid)
    while cur and cur not in seen:
        if cur in roots:
            return cur
        seen.add(cur)
        cur = ppids.get(cur)
    return None


def _delta(pairs: list[tuple[ProcSample, ProcSample]], get: Any) -> float | None:
    vals = [(get(a), get(b)) for a, b in pairs]
    vals = [(x, y) for x, y in vals if x is not None and y is not None]
    return sum(max(0, y - x) for x, y in vals) if vals else None


def _device_rows(data_dirs: Sequence[DataDir], pairs: list[tuple[ProcSample, ProcSample]], span: float):
    rows: dict[str, dict[str, Any]] = {}
    for d in data_dirs:
        dev = d.device
        if not isinstance(dev, BlockDevice):
            continue
        names = [dev.name] if pairs and dev.name in pairs[0][1].disks else list(dev.disks)
        for name in names:
            row = rows.setdefault(name, {"device": name, "rotational": dev.rotational, "dirs": []})
            row["dirs"].append(d.path)
            read = _delta(pairs, lambda s, n=name: s.disks.get(n, (None, None))[0])
            busy = _delta(pairs, lambda s, n=name: s.disks.get(n, (None, None))[1])
            row["read_mb_s"] = _r(read * 512 / span / 1e6, 2) if read is not None and span > 0 else None
            row["util"] = _r(min(1.0, busy / 1000 / span), 3) if busy is not None and span > 0 else None
    return tuple(rows.values())


def _dir_dict(d: DataDir) -> dict[str, Any]:
    dev = d.device
    return {
        "path": d.path,
        "error": d.error.reason if d.error else None,
        "mount_point": d.mount_point,
        "fstype": d.fstype,
        "device": dev.name if isinstance(dev, BlockDevice) else None,
        "rotational": dev.rotational if isinstance(dev, BlockDevice) else None,
        "no_device": dev.reason if isinstance(dev, Unavailable) else None,
    }


def _gpus(obs: Observation, s0: float, s1: float) -> tuple[dict[str, Any], ...]:
    samples = [s for s in obs.gpu_samples if s0 <= s[0] <= s1] or list(obs.gpu_samples)
    by_gpu: dict[int, list[Any]] = {}
    for _t, gpus in samples:
        for g in gpus:
            by_gpu.setdefault(g.index, []).append(g)
    dcgm = dcgm_by_gpu(obs.dcgm_samples, s0, s1, set(by_gpu))
    by_gpu.update({i: [] for i in dcgm if i not in by_gpu})
    job_pids = set(obs.procs)
    out = []
    for i, gs in sorted(by_gpu.items()):

        def mean(attr: str, gs: list[Any] = gs) -> float | None:
            vals = [getattr(g, attr) for g in gs if getattr(g, attr) is not None]
            return sum(vals) / len(vals) if vals else None

        used = [g.mem_used_bytes for g in gs if g.mem_used_bytes is not None]
        rx, tx = mean("pcie_rx_kbs"), mean("pcie_tx_kbs")
        out.append(
            {
                "index": i,
                "samples": len(gs),
                "util_mean": _r(mean("util_pct"), 1),
                "mem_util_mean": _r(mean("mem_util_pct"), 1),
                "mem_used_max_bytes": max(used) if used else None,
                "mem_total_bytes": next((g.mem_total_bytes for g in gs if g.mem_total_bytes), None),
                "power_mean_w": _r(mean("power_w"), 1),
                "sm_clock_mean_mhz": _r(mean("sm_clock_mhz"), 0),
                "sm_active_mean": _r(mean("sm_active_pct"), 1),
                "sm_occupancy_mean": _r(mean("sm_occupancy_pct"), 1),
                **dcgm_means(dcgm.get(i, [])),
                "pcie_rx_mb_s": _r(rx * 1024 / 1e6, 1) if rx is not None else None,
                "pcie_tx_mb_s": _r(tx * 1024 / 1e6, 1) if tx is not None else None,
                "used_by_job": bool(set(obs.gpu_pids.get(i, ())) & job_pids),
            }
        )
    return tuple(out)


def _merge(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals sorted and joined where they overlap (empty and reversed ones dropped)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted((a, b) for a, b in spans if b > a):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Seconds two merged interval lists have in common."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] <= ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _length(xs: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in xs)


def comm_times(p: HookProcess, t: LoopTimes) -> dict[str, Any]:
    """One rank's communication over its loop only. Explicit collectives count where they overlap the steps
    (the main thread between a batch's arrival and the next request); DDP's exposed backward communication
    happens inside backward, so inside the steps, and is held to the step time the collectives left. The share
    is that time over the loop's wait + step time, so it lies in [0, 1] by construction. Collectives after the
    loop's last batch (a final barrier while another rank evaluates) are the *end wait*; the rest (set-up,
    between epochs) is *outside* the loop."""
    steps = _merge(step_spans(p))
    steps_s = _length(steps)
    calls = _merge([(a, b) for _n, a, b in p.collectives])
    total = _length(calls)
    in_steps = _overlap(calls, steps)
    end_wait = _overlap(calls, [(t.end, math.inf)]) if t.end is not None else 0.0
    ddp_rows, ddp_s = [], 0.0
    for d in (p.final or {}).get("ddp") or []:
        comm, overlap = d.get("avg_backward_comm_time"), d.get("avg_backward_compute_comm_overlap_time")
        if isinstance(comm, (int, float)) and isinstance(overlap, (int, float)):
            exposed = max(0.0, comm - overlap) / 1e9
            if math.isfinite(exposed):
                ddp_rows.append({"pid": p.pid, "exposed_ms": round(exposed * 1000, 3), **d})
                ddp_s += exposed * len(steps)
    ddp_s = min(ddp_s, steps_s - in_steps)
    busy = max(t.wait_s + t.step_s, steps_s)
    seen = bool(p.collectives) or bool(ddp_rows)
    return {
        "pid": p.pid,
        "share": (in_steps + ddp_s) / busy if busy > 0 and seen else None,
        "loop_collectives_s": in_steps,
        "ddp_exposed_s": ddp_s,
        "end_wait_s": end_wait,
        "outside_s": max(0.0, total - in_steps - end_wait),
        "ddp": ddp_rows,
    }


def _comm(ranks: Sequence[Rank], procs: dict[int, HookProcess]) -> dict[str, Any]:
    """Each rank's :func:`comm_times`; the job's share is the ranks' mean (so also in [0, 1])."""
    rows, ddp_rows, shares, coll_s = [], [], [], 0.0
    for r in ranks:
        p = procs[r.pid]
        c = comm_times(p, r.times)
        colls = (r.final or {}).get("collectives") or {}
        coll_s += sum(
            x for v in colls.values() if isinstance(v, list) for x in v[1:2] if type(x) in (int, float)
        )
        ddp_rows += c.pop("ddp")
        if c["share"] is not None:
            shares.append(c["share"])
        rows.append({"rank": r.rank, **{k: _r(v, 4) if isinstance(v, float) else v for k, v in c.items()}})
    return {
        "share": _r(sum(shares) / len(shares), 4) if shares else None,
        "ddp": ddp_rows,
        "collectives_s": round(coll_s, 4),
        "timed": clock_counts(procs[r.pid] for r in ranks),
        "end_wait_s": _r(max((x["end_wait_s"] for x in rows), default=0.0), 3),
        "ranks": rows,
    }


def _stacks(procs: Sequence[HookProcess]) -> dict[str, Any]:
    """The ranks' stack-sample summaries added up: samples by where the thread was, and for the samples taken
    in the steps the commonest top frames, kernel wait channels and thread states."""
    out: dict[str, Any] = {"samples": 0, "where": {}, "top": {}, "wchan": {}, "state": {}, "interval_s": None}
    for p in procs:
        st = p.stacks
        if not isinstance(st, dict):
            continue
        n = st.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            out["samples"] += n
        if isinstance(st.get("interval"), (int, float)):
            out["interval_s"] = st["interval"]
        for key in ("where", "wchan", "state"):
            src = st.get(key)
            if not isinstance(src, dict):
                continue
            for k, v in list(src.items())[:64]:  # the hook keeps at most 32 keys: more is not its record
                k = str(k)[:64]
                if key == "where" and k not in ("data", "comm", "step", "outside"):
                    continue
                if key == "state" and len(k) > 2:
                    continue
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    out[key][k] = out[key].get(k, 0) + v
        top = st.get("top")
        for item in top[:64] if isinstance(top, list) else ():
            if (
                isinstance(item, (list, tuple))
                and len(item) == 2
                and isinstance(item[1], int)
                and not isinstance(item[1], bool)
                and item[1] > 0
            ):
                k = str(item[0])[:400]
                out["top"][k] = out["top"].get(k, 0) + item[1]
    for key in ("wchan", "top"):
        out[key] = sorted(out[key].items(), key=lambda kv: -kv[1])[:5]
    return out


def analyse(  # long: one pass from the observation and hook records to every figure the verdict reads
    obs: Observation,
    hooks: Sequence[HookProcess],
    data_dirs: Sequence[DataDir] = (),
    records_dropped: Sequence[str] = (),
) -> Analysis:
    ranks_p = [p for p in hooks if p.batches or p.summed[0]]
    others = tuple(p for p in hooks if p not in ranks_p)
    times = {p.pid: loop_times(p) for p in ranks_p}
    starts = [t.start for t in times.values() if t.start is not None]
    ends = [t.end for t in times.values() if t.end is not None]
    s0 = min(starts) if starts else obs.t0
    s1 = max(ends) if ends else obs.t_end
    span = max(1e-9, s1 - s0)
    pairs = _pairs(obs.samples, s0, s1)
    cover = pairs[-1][1].t - pairs[0][0].t if pairs else 0.0
    cpu = _cpu_by_pid(pairs)
    ppids = {pid: info.ppid for pid, info in obs.procs.items()}
    rank_pids = {p.pid for p in ranks_p}
    listed = {w for p in ranks_p for it in p.iterators for w in it.get("workers") or ()}
    workers_of: dict[int, set[int]] = {pid: set() for pid in rank_pids}
    for pid in set(obs.procs) | listed:
        if pid in rank_pids:
            continue
        root = _below(pid, ppids, rank_pids)
        if root is None:
            root = next(
                (p.pid for p in ranks_p if any(pid in (it.get("workers") or ()) for it in p.iterators)), None
            )
        if root is not None:
            workers_of[root].add(pid)
    ranks = []
    for p in sorted(ranks_p, key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.pid)):
        c = cpu.get(p.pid)
        ranks.append(
            Rank(
                pid=p.pid,
                rank=p.rank,
                argv=p.argv,
                times=times[p.pid],
                loader=_main_loader(p),
                model=p.model,
                final=p.final,
                workers=tuple(sorted(workers_of.get(p.pid, ()))),
                cpu_cores=c[0] / c[1] if c and c[1] > 0 else None,
                env=p.env,
            )
        )
    all_workers = {w for r in ranks for w in r.workers}
    worker_cores = [cpu[w][0] / cpu[w][1] for w in all_workers if w in cpu and cpu[w][1] >= 0.5 * cover > 0]

    def total(pids):
        return sum(cpu[p][0] for p in pids if p in cpu) / cover if cover > 0 else None

    node = _delta(pairs, lambda s: s.node_cpu[0] if s.node_cpu else None)
    node_all = _delta(pairs, lambda s: s.node_cpu[1] if s.node_cpu else None)
    loaders = all_workers or rank_pids
    blk = [cpu[p] for p in loaders if p in cpu]
    psi_io = _delta(pairs, lambda s: s.psi_io)
    psi_cpu = _delta(pairs, lambda s: s.psi_cpu)
    read = _delta(pairs, lambda s: sum(v[1] for v in s.procs.values() if v[1] is not None))
    wait = sum(t.wait_s for t in times.values())
    step = sum(t.step_s for t in times.values())
    errors: list[dict[str, Any]] = []
    for e in (e for p in hooks for e in p.errors):  # the error next() saw is usually the uncaught one too
        if not any(o.get("type") == e.get("type") and o.get("message") == e.get("message") for o in errors):
            errors.append(e)
    return Analysis(
        command=obs.argv,
        duration_s=obs.t_end - obs.t0,
        exit_code=obs.exit_code,
        rc=obs.rc,
        ended_by=obs.ended_by,
        signal=obs.signal,
        start_error=obs.error,
        cores=obs.cores,
        ranks=tuple(ranks),
        others=others,
        wait_share=wait / (wait + step) if wait + step > 0 else None,
        batches=sum(t.batches for t in times.values()),
        loop_s=span if starts else 0.0,
        cpu={
            "cores": obs.cores,
            "main": _r(total(rank_pids), 3) if rank_pids else None,
            "workers": _r(total(all_workers), 3) if all_workers else None,
            "job": _r(total(set(cpu)), 3),
            "node_busy": _r(node / node_all * obs.cores, 3) if node is not None and node_all else None,
            "workers_n": len(all_workers),
            "worker_mean": _r(statistics.mean(worker_cores), 3) if worker_cores else None,
            "worker_max": _r(max(worker_cores), 3) if worker_cores else None,
        },
        io={
            "job_read_mb_s": _r(read / cover / 1e6, 3) if read is not None and cover > 0 else None,
            "loader_blkio_share": _r(sum(b[2] for b in blk) / sum(b[1] for b in blk), 3)
            if blk and sum(b[1] for b in blk) > 0 and sum(b[2] for b in blk) > 0
            else None,
            "psi_io_some": _r(psi_io / 1e6 / cover, 3) if psi_io is not None and cover > 0 else None,
            "psi_cpu_some": _r(psi_cpu / 1e6 / cover, 3) if psi_cpu is not None and cover > 0 else None,
            "devices": _device_rows(data_dirs, pairs, cover),
        },
        shm={"size_bytes": obs.shm_size, "peak_bytes": obs.shm_max_used, "start_bytes": obs.shm_start_used},
        gpus=_gpus(obs, s0, s1),
        gpu_error=obs.gpu_error,
        dcgm_error=obs.dcgm_error,
        comm={**_comm(ranks, {p.pid: p for p in ranks_p}), **obs.fabric_moved},
        errors=tuple(errors),
        data_dirs=tuple(_dir_dict(d) for d in data_dirs),
        timeline=_timeline(obs, ranks_p, times),
        started_wall=obs.started_wall,
        sampler_error=obs.sampler_error,
        stacks=_stacks(ranks_p),
        records_dropped=tuple(records_dropped),
    )


def _timeline(obs: Observation, ranks: Sequence[HookProcess], times: dict[int, LoopTimes]) -> dict[str, Any]:
    """Seconds from the job's start. ``wait_pct``: data wait per bin of ``bin_s`` (the ranks' mean, inside their
    loops; the hook has every batch's times, so the bins can be finer than the sampling). ``gpu``: [t, busy %]
    of the GPUs the job used (else all) at each NVML sample; ``cpu``: [t, cores of the ranks, cores of their
    workers] between consecutive /proc samples."""
    duration = max(obs.t_end - obs.t0, 1e-3)
    width = max(MIN_BIN_S, duration / TIMELINE_BINS)
    n = max(1, math.ceil(duration / width))
    per_rank = []
    for p in ranks:
        t = times[p.pid]
        if t.start is None:
            continue
        bins = wait_in_bins(p, obs.t0, width, n)
        lo, hi = t.start - obs.t0, t.end - obs.t0
        per_rank.append(
            [b / width if lo - width < (k + 0.5) * width < hi + width else None for k, b in enumerate(bins)]
        )
    wait: list[float | None] = []
    for k in range(n):
        vals = [r[k] for r in per_rank if r[k] is not None]
        wait.append(round(100 * min(1.0, sum(vals) / len(vals)), 1) if vals else None)
    used = {i for i, pids in obs.gpu_pids.items() if set(pids) & set(obs.procs)}
    # The picture's line is one signal for the whole run: SM activity from GPM, else from DCGM, else utilisation.
    gpm = any(g.sm_active_pct is not None for _t, gpus in obs.gpu_samples for g in gpus)
    dcgm = not gpm and any(r.sm_active_pct is not None for _t, r in obs.dcgm_samples)
    nvml_gpus = {g.index for _t, gpus in obs.gpu_samples for g in gpus} if dcgm else set()
    gpu = dcgm_line(obs.dcgm_samples, used or nvml_gpus, obs.t0) if dcgm else []
    for t, gpus in () if dcgm else obs.gpu_samples:
        mine = [g for g in gpus if not used or g.index in used]
        vals = [g.sm_active_pct if gpm else g.util_pct for g in mine]
        vals = [v for v in vals if v is not None]
        if vals:
            gpu.append([round(t - obs.t0, 3), round(sum(vals) / len(vals), 1)])
    rank_pids = {p.pid for p in ranks}
    ppids = {pid: info.ppid for pid, info in obs.procs.items()}
    cpu = []
    for a, b in zip(obs.samples, obs.samples[1:]):
        dt = b.t - a.t
        if dt <= 0:
            continue
        m = w = 0.0
        for pid, (ticks, _rb, _blk) in b.procs.items():
            prev = a.procs.get(pid)
            if prev is None:
                continue
            cores = max(0, ticks - prev[0]) / CLK_TCK / dt
            if pid in rank_pids:
                m += cores
            elif _below(pid, ppids, rank_pids) is not None:
                w += cores
        cpu.append([round((a.t + b.t) / 2 - obs.t0, 3), round(m, 3), round(w, 3)])
    return {
        "duration_s": round(duration, 3),
        "bin_s": round(width, 4),
        "wait_pct": wait,
        "gpu": gpu,
        "gpu_signal": (SIGNAL_GPM if gpm else SIGNAL_DCGM if dcgm else SIGNAL_UTIL) if gpu else None,
        "cpu": cpu,
        "cores": obs.cores,
    }
