"""The job report as text (for a person, on stderr) and as a JSON document (``--json PATH``, schema_version 1,
schema: docs/samples/job/job-report.schema.json)."""

from __future__ import annotations

import json
import shlex
import signal
import time
from typing import Any

from hostcheck import SCHEMA_VERSION, __version__
from hostcheck.check.render import visible
from hostcheck.job.analyse import SIGNAL_DCGM, Analysis
from hostcheck.job.diagnosis import Diagnosis, pct


def _ended(a: Analysis, window_s: float | None = None) -> str:
    if a.ended_by == "window":
        if window_s is None:
            return "stopped at the end of its --seconds window (exit 0)"
        # The run's duration counts the time the command took to stop after SIGINT too: said apart.
        after = max(0.0, a.duration_s - window_s)
        return f"stopped at the end of its {window_s:g} s window (--seconds), {after:.1f} s to exit after SIGINT (exit 0)"
    if a.ended_by == "signal":
        name = signal.Signals(a.signal).name if a.signal else "a signal"
        return f"ended by {name} sent to hostcheck (exit {a.exit_code})"
    if a.ended_by == "not-started":
        return f"not started: {a.start_error} (exit {a.exit_code})"
    if a.rc is not None and a.rc < 0:
        try:
            name = signal.Signals(-a.rc).name
        except ValueError:
            name = f"signal {-a.rc}"
        return f"killed by {name} (exit {a.exit_code})"
    return f"exit {a.exit_code}"


def _num(v: Any, unit: str = "", nd: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{nd}f}{unit}"
    return f"{v}{unit}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


# long: the text report top to bottom, one section after another, as the reader sees it
def render_text(a: Analysis, v: Diagnosis, window_s: float | None = None) -> str:
    """The report; ``window_s``: the --seconds the command was given, when it was."""
    cmd = shlex.join(a.command) if a.command else ""
    lines = [
        f"hostcheck job: {v.headline}",
        f"  command   {cmd[:200]}",
        f"  ran       {a.duration_s:.1f} s, {_ended(a, window_s)}",
    ]
    if v.loop_kind:
        lines.append(f"  the loop  was {v.loop_kind} before it failed")
    for c in v.causes:
        lines += [f"  why       {c.evidence}", f"  fix       {c.fix}"]
    lines += ["", "evidence"]
    for r in a.ranks:
        t = r.times
        who = f"rank {r.rank} (pid {r.pid})" if r.rank is not None else f"pid {r.pid}"
        lines.append(
            f"  loop      {who}: {t.batches} batches in {a.loop_s:.1f} s, data wait {pct(t.wait_share)} "
            f"(median {_num(t.median_wait_ms, ' ms', 1)} a batch), step median {_num(t.median_step_ms, ' ms', 1)}, "
            f"first batch {t.first_batch_s:.2f} s"
        )
        ld = r.loader
        if ld:
            lines.append(
                "  loader    "
                + " ".join(
                    f"{k}={ld.get(k)}"
                    for k in (
                        "num_workers",
                        "pin_memory",
                        "persistent_workers",
                        "prefetch_factor",
                        "batch_size",
                    )
                    if k in ld
                )
                + (f" dataset={ld.get('dataset')}" if ld.get("dataset") else "")
            )
        final = r.final or {}
        ac = final.get("autocast")
        model = r.model or {}
        amp = (
            f"autocast {ac.get('dtype')} on {ac.get('device')}" if ac and ac.get("enabled") else "no autocast"
        )
        conv = model.get("conv_weights")
        cl = (
            f"channels_last {model.get('channels_last_weights')}/{conv} conv weights"
            if conv
            else "no conv weights"
        )
        bench = final.get("cudnn_benchmark", model.get("cudnn_benchmark"))
        lines.append(
            f"  model     {amp}; {cl}; cudnn.benchmark={bench}; torch threads {_num(r.threads)}; "
            f"params on {', '.join(sorted((model.get('param_devices') or {}).keys())) or 'n/a'}"
        )
        if final.get("pil"):
            pil = final["pil"]
            lines.append(
                f"  PIL       {pil.get('version')} ({'pillow-simd' if pil.get('simd') else 'stock Pillow'})"
            )
    cpu = a.cpu
    workers = (
        f"{cpu['workers_n']} DataLoader workers {_num(cpu.get('workers'))} cores "
        f"(each {_num(cpu.get('worker_mean'))} on average, busiest {_num(cpu.get('worker_max'))})"
        if cpu.get("workers_n")
        else "no DataLoader workers"
    )
    lines.append(
        f"  CPU       training processes {_num(cpu.get('main'))} cores, {workers}; the job "
        f"{_num(cpu.get('job'))}, the node {_num(cpu.get('node_busy'))} of {a.cores} cores busy"
    )
    io = a.io
    disk = "; ".join(
        f"{d['device']}{' (rotational)' if d.get('rotational') else ''} {_num(d.get('read_mb_s'), ' MB/s', 1)} "
        f"busy {pct(d.get('util'))}"
        for d in io.get("devices") or ()
    )
    lines.append(
        f"  reads     job {_num(io.get('job_read_mb_s'), ' MB/s', 1)} from disk"
        + (f"; {disk}" if disk else "")
        + (f"; I/O stalls (PSI) {pct(io.get('psi_io_some'))}" if io.get("psi_io_some") is not None else "")
    )
    shm = a.shm
    lines.append(f"  /dev/shm  peak {_bytes(shm.get('peak_bytes'))} of {_bytes(shm.get('size_bytes'))}")
    if a.gpus:
        lines.append(f"  GPU       judged by {a.gpu_signal or 'no figure'}")
        if a.dcgm_error and a.gpu_signal != SIGNAL_DCGM:
            lines.append(f"  DCGM      profiling fields not used: {a.dcgm_error}")
        for g in a.gpus:
            gpm = (
                f"SM activity {_num(g.get('sm_active_mean'), '%', 0)}, SM occupancy "
                f"{_num(g.get('sm_occupancy_mean'), '%', 0)} (NVML GPM), "
                if g.get("sm_active_mean") is not None
                else ""
            )
            if g.get("dcgm_sm_active_mean") is not None:
                gpm += (
                    f"SM activity {_num(g.get('dcgm_sm_active_mean'), '%', 0)}, SM occupancy "
                    f"{_num(g.get('dcgm_sm_occupancy_mean'), '%', 0)}, graphics engine "
                    f"{_num(g.get('dcgm_gr_active_mean'), '%', 0)} (DCGM profiling), "
                )
            lines.append(
                f"  GPU {g['index']}     {gpm}utilisation {_num(g.get('util_mean'), '%', 0)} (kernel time, not SM "
                f"activity), memory {_bytes(g.get('mem_used_max_bytes'))}"
                f" of {_bytes(g.get('mem_total_bytes'))}, {_num(g.get('power_mean_w'), ' W', 0)}, SM "
                f"{_num(g.get('sm_clock_mean_mhz'), ' MHz', 0)}, PCIe rx {_num(g.get('pcie_rx_mb_s'), ' MB/s', 0)} tx "
                f"{_num(g.get('pcie_tx_mb_s'), ' MB/s', 0)}{'' if g.get('used_by_job') else ' (no process of the job on it)'}"
            )
    else:
        lines.append(f"  GPU       none sampled ({a.gpu_error or 'no GPU'})")
        if a.dcgm_error:
            lines.append(f"  DCGM      profiling fields not used: {a.dcgm_error}")
    if a.comm.get("share") is not None or a.comm.get("ddp"):
        lines.append(
            f"  comm      communication inside the loop {pct(a.comm.get('share'))} of it; collectives "
            f"{a.comm.get('collectives_s')} s in all, of which {_num(a.comm.get('end_wait_s'), ' s', 1)} waiting "
            f"after the loop{_timed(a.comm.get('timed'))}"
        )
    st = a.stacks or {}
    where = st.get("where") or {}
    if st.get("samples"):
        line = (
            f"  stacks    {st['samples']} samples of the loop thread: {where.get('step', 0)} between batches, "
            f"{where.get('data', 0)} waiting for data, {where.get('comm', 0)} in collectives, "
            f"{where.get('outside', 0)} outside the loop"
        )
        top = st.get("top") or []
        if top:
            line += f"; between batches mostly at {top[0][0]} ({top[0][1]})"
        wchan = [f"{w} ({n})" for w, n in st.get("wchan") or [] if w not in ("0", "")]
        if wchan:
            line += f"; wchan {', '.join(wchan[:3])}"
        lines.append(line)
    for e in a.errors:
        msg = (e.get("message") or "").strip().splitlines()
        lines.append(f"  error     {e.get('type')}: {msg[0][:160] if msg else ''}")
    if v.findings:
        lines += ["", "also"]
        for c in v.findings:
            lines += [f"  - {c.evidence}", f"    fix: {c.fix}"]
    if a.sampler_error:
        lines.append(f"(the /proc sampler stopped: {a.sampler_error})")
    for why in a.records_dropped[:10]:
        lines.append(f"(hook records dropped: {why})")
    if len(a.records_dropped) > 10:
        lines.append(f"(and {len(a.records_dropped) - 10} more dropped)")
    # The command, its errors and its GPUs' names are the job's: a line of theirs cannot start one of ours.
    return "\n".join(visible(x) for x in lines) + "\n"


#: How a count of collectives was timed, in the report's words.
TIMED_WORDS = {
    "gpu": "on the GPU (CUDA events)",
    "host": "by the host clock (CPU tensors, gloo, barrier)",
    "launch": "by their launch only (asynchronous, never waited for: under-measured)",
}


def _timed(timed: Any) -> str:
    """ "; calls timed: 40 on the GPU (CUDA events), 2 by the host clock ..." for the calls counted each way."""
    if not isinstance(timed, dict):
        return ""
    parts = [
        f"{timed[k]} {w}" for k, w in TIMED_WORDS.items() if isinstance(timed.get(k), int) and timed[k] > 0
    ]
    return f"; calls timed: {', '.join(parts)}" if parts else ""


def report_dict(a: Analysis, v: Diagnosis, png_path: str | None = None) -> dict[str, Any]:
    """The JSON document (docs/samples/job/job-report.schema.json)."""
    body = a.to_dict()
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "hostcheck job", "version": __version__},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(a.started_wall or time.time())),
        "exit_code": a.exit_code,
        "job": {
            "command": list(a.command),
            "duration_s": round(a.duration_s, 3),
            "ended_by": a.ended_by,
            "rc": a.rc,
            "signal": a.signal,
            "start_error": a.start_error,
            "cores": a.cores,
        },
        "verdict": v.to_dict(),
        "loop": {
            "batches": a.batches,
            "seconds": round(a.loop_s, 3),
            "wait_share": None if a.wait_share is None else round(a.wait_share, 4),
        },
        **{
            k: body[k]
            for k in (
                "ranks",
                "cpu",
                "io",
                "shm",
                "gpus",
                "gpu_error",
                "dcgm_error",
                "comm",
                "errors",
                "data_dirs",
                "stacks",
                "records_dropped",
            )
        },
        "gpu_signal": a.gpu_signal,
        "timeline": a.timeline,
        "png": png_path,
    }


def render_json(a: Analysis, v: Diagnosis, png_path: str | None = None) -> str:
    return json.dumps(report_dict(a, v, png_path), indent=1, default=str) + "\n"
