"""The verdict rules of hostcheck.job.diagnosis on synthetic analyses: each kind and each cause from its evidence,
the fixes in role variables and DataLoader arguments, the text and the picture of a GPU job (no GPU here)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hostcheck.job import png
from hostcheck.job.analyse import Analysis, Rank
from hostcheck.job.diagnosis import DEFAULT, diagnose
from hostcheck.job.records import LoopTimes
from hostcheck.job.render import render_text, report_dict


def times(wait: float, step: float = 10.0, batches: int = 200, starts: tuple[float, ...] = ()) -> LoopTimes:
    return LoopTimes(batches, wait, step, 0.0, 0.1, 0.0, wait + step, 5.0, 50.0, starts)


def rank(wait_share: float = 0.02, num_workers: int = 8, threads: int = 4, **kw: Any) -> Rank:
    step = 10.0
    wait = step * wait_share / (1 - wait_share)
    final = kw.pop("final", {"autocast": {"device": "cuda", "dtype": "torch.bfloat16", "enabled": True}})
    return Rank(
        pid=100,
        rank=0,
        argv=("train.py",),
        times=kw.pop("times", times(wait, step)),
        loader={"num_workers": num_workers, "pin_memory": True, "persistent_workers": True, "batch_size": 64},
        model=kw.pop("model", {"threads": threads, "param_devices": {"cuda": 10}, "conv_weights": 0}),
        final=final,
        workers=tuple(range(200, 200 + num_workers)),
        cpu_cores=0.9,
        **kw,
    )


def analysis(
    ranks: tuple[Rank, ...] | None = None,
    gpu_util: float | None = 95.0,
    cores: int = 32,
    cpu: dict | None = None,
    **kw: Any,
) -> Analysis:
    ranks = ranks if ranks is not None else (rank(),)
    t = [r.times for r in ranks]
    wait, step = sum(x.wait_s for x in t), sum(x.step_s for x in t)
    gpus = ()
    if gpu_util is not None:
        gpus = ({"index": 0, "samples": 40, "util_mean": gpu_util, "used_by_job": True},)
    base_cpu = {"cores": cores, "main": 0.9, "workers": 2.0, "job": 3.0, "node_busy": 3.2, "workers_n": 8}
    base_cpu |= {"worker_mean": 0.25, "worker_max": 0.4}
    return Analysis(
        command=("python", "train.py"),
        duration_s=60.0,
        exit_code=0,
        rc=0,
        ended_by="exit",
        signal=None,
        start_error=None,
        cores=cores,
        ranks=ranks,
        others=(),
        wait_share=wait / (wait + step),
        batches=sum(x.batches for x in t),
        loop_s=50.0,
        cpu={**base_cpu, **(cpu or {})},
        io=kw.pop(
            "io", {"job_read_mb_s": 5.0, "loader_blkio_share": None, "psi_io_some": 0.01, "devices": ()}
        ),
        shm=kw.pop("shm", {"size_bytes": 64 << 30, "peak_bytes": 1 << 30, "start_bytes": 0}),
        gpus=gpus,
        gpu_error=None if gpus else "no GPU",
        comm=kw.pop("comm", {"share": None, "ddp": [], "collectives_s": 0.0}),
        errors=kw.pop("errors", ()),
        data_dirs=(),
        timeline=kw.pop(
            "timeline", {"duration_s": 60, "bin_s": 1, "wait_pct": [], "gpu": [], "cpu": [], "cores": 32}
        ),
        **kw,
    )


def ids(causes) -> list[str]:
    return [c.id for c in causes]


def test_a_busy_gpu_is_compute_bound_whatever_the_wait():
    v = diagnose(analysis(ranks=(rank(wait_share=0.3),), gpu_util=DEFAULT.gpu_busy_target_pct))
    assert v.kind == "compute-bound" and v.causes == ()


def test_compute_bound_on_the_gpu_names_amp_channels_last_and_cudnn_benchmark_when_missing():
    model = {"threads": 4, "param_devices": {"cuda": 50}, "conv_weights": 53, "channels_last_weights": 0}
    v = diagnose(analysis(ranks=(rank(final={"autocast": None}, model=model),)))
    assert v.kind == "compute-bound"
    assert ids(v.findings) == ["no-amp", "channels-last", "cudnn-benchmark"]


def test_input_bound_with_busy_workers_is_cpu_decode_with_pillow_simd():
    final = {"autocast": None, "pil": {"version": "11.0.0", "simd": False}}
    a = analysis(ranks=(rank(wait_share=0.4, num_workers=4, final=final),), gpu_util=55.0)
    a = replace(a, cpu={**a.cpu, "workers_n": 4, "worker_mean": 0.97, "job": 5.0})
    v = diagnose(a)
    assert v.kind == "input-bound" and ids(v.causes) == ["cpu-decode"]
    fix = v.causes[0].fix
    assert "DataLoader(num_workers=31)" in fix and "gpunode_tuning_pillow_simd_enabled: true" in fix


def test_input_bound_in_the_main_process_asks_for_workers():
    v = diagnose(analysis(ranks=(rank(wait_share=0.6, num_workers=0),), gpu_util=30.0, cpu={"workers_n": 0}))
    assert v.kind == "input-bound" and ids(v.causes) == ["too-few-workers"]
    assert v.causes[0].fix == "DataLoader(num_workers=31, persistent_workers=True, pin_memory=True)"
    assert v.headline.startswith("input-bound (too-few-workers): the main thread waited for data 60%")


def test_input_bound_with_a_full_shm_names_the_role_variable():
    shm = {"size_bytes": 64 << 20, "peak_bytes": 63 << 20, "start_bytes": 0}
    v = diagnose(analysis(ranks=(rank(wait_share=0.3),), gpu_util=40.0, shm=shm))
    assert v.causes[0].id == "shared-memory"
    assert "gpunode_tuning_shm_size: 8G" in v.causes[0].fix and "--shm-size=8g" in v.causes[0].fix


def test_input_bound_on_a_busy_disk_is_storage():
    io = {
        "job_read_mb_s": 180.0,
        "loader_blkio_share": None,
        "psi_io_some": 0.35,
        "devices": (
            {"device": "sdb", "rotational": True, "dirs": ["/data"], "read_mb_s": 180.0, "util": 0.97},
        ),
    }
    v = diagnose(analysis(ranks=(rank(wait_share=0.5),), gpu_util=35.0, io=io))
    assert ids(v.causes) == ["storage"]
    assert "sdb (a rotational disk) holding /data was busy 97%" in v.causes[0].evidence
    assert "system.E005" in v.causes[0].fix


def test_node_wide_io_stalls_are_storage_only_when_the_job_reads_from_storage():
    """PSI is node-wide: another process's writeback must not be blamed on a job that read nothing."""
    io = {"job_read_mb_s": 0.0, "loader_blkio_share": None, "psi_io_some": 0.6, "devices": ()}
    v = diagnose(analysis(ranks=(rank(wait_share=0.5, num_workers=0),), gpu_util=35.0, io=io))
    assert ids(v.causes) == ["too-few-workers"]
    v = diagnose(
        analysis(
            ranks=(rank(wait_share=0.5, num_workers=0),), gpu_util=35.0, io={**io, "job_read_mb_s": 40.0}
        )
    )
    assert ids(v.causes)[0] == "storage"
    assert "the job read 40 MB/s from storage while tasks stalled on I/O 60%" in v.causes[0].evidence


def test_a_wait_nothing_explains_says_so():
    v = diagnose(analysis(ranks=(rank(wait_share=0.2, num_workers=32),), gpu_util=70.0))
    assert ids(v.causes) == ["unexplained-wait"]


def test_exposed_ddp_communication_is_communication_bound():
    comm = {"share": 0.25, "ddp": [{"pid": 100, "exposed_ms": 12.0}], "collectives_s": 0.0}
    v = diagnose(analysis(gpu_util=60.0, comm=comm))
    assert v.kind == "communication-bound" and ids(v.causes) == ["ddp-communication"]


def test_an_idle_gpu_with_the_model_on_the_cpu_says_so():
    model = {"threads": 4, "param_devices": {"cpu": 10}, "conv_weights": 0}
    v = diagnose(analysis(ranks=(rank(model=model),), gpu_util=3.0))
    assert v.kind == "idle-gpu" and ids(v.causes) == ["job-not-on-gpu"]
    v = diagnose(analysis(gpu_util=50.0))
    assert v.kind == "idle-gpu" and ids(v.causes) == ["cpu-overhead"]


def test_without_a_gpu_a_small_wait_is_compute_bound_on_the_cpu():
    v = diagnose(analysis(gpu_util=None))
    assert v.kind == "compute-bound" and "on the CPU" in v.headline


@pytest.mark.parametrize(
    ("message", "cause"),
    [
        (
            "DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that dataloader's workers "
            "are out of shared memory. Please try to raise your shared memory limit.",
            "shared-memory",
        ),
        ("DataLoader worker (pid 4242) is killed by signal: Killed. ", "worker-killed"),
        ("Caught ValueError in DataLoader worker process 1.\nOriginal Traceback ...", "dataset-raised"),
        ("DataLoader worker (pid(s) 4242) exited unexpectedly", "worker-exited"),
    ],
)
def test_a_dead_worker_is_the_headline_with_its_cause(message, cause):
    err = {"where": "next", "type": "RuntimeError", "message": message}
    v = diagnose(analysis(errors=(err,), gpu_util=20.0))
    assert v.kind == "worker-died" and v.causes[0].id == cause
    assert v.loop_kind in ("idle-gpu", "compute-bound", "input-bound")
    if cause == "shared-memory":
        assert "gpunode_tuning_shm_size" in v.causes[0].fix


def test_a_pipe_error_from_next_with_workers_is_a_dead_worker():
    err = {"where": "next", "type": "ConnectionResetError", "message": "[Errno 104] Connection reset by peer"}
    assert diagnose(analysis(errors=(err,))).kind == "worker-died"
    assert diagnose(analysis(ranks=(rank(num_workers=0),), errors=(err,))).kind != "worker-died"


def test_too_many_threads_for_the_cores_name_the_omp_setting():
    # 16 torch threads and 8 workers asked on 16 cores, and they held them: 8.0 cores each, measured.
    cpu = {"workers_n": 8, "workers": 8.0, "main": 8.0, "job": 16.0}
    v = diagnose(analysis(ranks=(rank(threads=16, num_workers=8),), cores=16, cpu=cpu))
    over = next(c for c in v.findings if c.id == "oversubscribed")
    assert (
        "16 torch threads using 8.0 cores + 8 DataLoader workers using 8.0 cores = 16.0 busy of 16 cores"
        in over.evidence
    )
    assert "gpunode_tuning_omp_num_threads: 8" in over.fix


def test_workers_started_again_every_epoch_ask_for_persistent_workers():
    r = rank(times=times(1.0, 10.0, starts=(2.5, 2.7, 2.6)))
    r = replace(r, loader={**r.loader, "persistent_workers": False})
    v = diagnose(analysis(ranks=(r,)))
    assert "persistent-workers" in ids(v.findings)


def test_too_few_batches_is_no_loop_or_an_idle_gpu():
    r = rank(times=times(0.1, 0.1, batches=2))
    assert diagnose(analysis(ranks=(r,), gpu_util=None)).kind == "no-training-loop"
    assert diagnose(analysis(ranks=(r,), gpu_util=10.0)).kind == "idle-gpu"


def test_the_text_leads_with_the_verdict_and_shows_the_gpu():
    a = analysis(ranks=(rank(wait_share=0.5, num_workers=0),), gpu_util=41.0, cpu={"workers_n": 0})
    a = replace(a, gpus=({**a.gpus[0], "mem_used_max_bytes": 10 << 30, "mem_total_bytes": 80 << 30},))
    text = render_text(a, diagnose(a))
    assert text.startswith("hostcheck job: input-bound (too-few-workers)")
    assert "  fix       DataLoader(num_workers=31" in text
    assert "  GPU 0     utilisation 41% (kernel time, not SM activity), memory 10.0 GiB of 80.0 GiB" in text
    doc = report_dict(a, diagnose(a))
    assert doc["verdict"]["measures"]["input_wait_share_threshold"] == DEFAULT.input_wait_share


def test_the_picture_draws_gpu_busy_and_data_wait():
    timeline = {
        "duration_s": 30.0,
        "bin_s": 0.25,
        "wait_pct": [None] * 8 + [60.0, 20.0] * 56,
        "gpu": [[t / 2, 40.0 + (t % 5) * 8] for t in range(60)],
        "cpu": [[t / 2, 1.0, 6.5] for t in range(60)],
        "cores": 8,
    }
    data = png.draw_timeline(timeline, "hostcheck job: input-bound", "python train.py | 30 s | exit 0")
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        assert im.size == (png.WIDTH, png.HEIGHT)
        colours = {im.getpixel((x, y)) for x in range(70, png.WIDTH - 24, 3) for y in range(80, 450, 3)}
    assert {png.GREEN, png.RED_FILL, png.BLUE, png.ORANGE} <= colours


# --- the false verdicts, each with the fault planted and absent ------------------------------------------


def test_idle_workers_are_not_busy_threads():
    """Two workers at 0.01 cores each on a 2-core node with one torch thread: not oversubscribed (they were
    counted as 3 busy threads on 2 cores); the same workers at a core each are."""
    idle = {"workers_n": 2, "workers": 0.02, "worker_mean": 0.01, "job": 1.0, "node_busy": 1.1}
    v = diagnose(analysis(ranks=(rank(threads=1, num_workers=2),), cores=2, gpu_util=None, cpu=idle))
    assert "oversubscribed" not in ids(v.findings)
    busy = {**idle, "workers": 1.2, "worker_mean": 0.6, "main": 0.7, "job": 1.9, "node_busy": 2.0}
    v = diagnose(analysis(ranks=(rank(threads=1, num_workers=2),), cores=2, gpu_util=None, cpu=busy))
    assert "oversubscribed" in ids(v.findings)


def test_idle_torch_threads_are_not_busy_threads():
    """The storage-bound job of the report: 2 torch threads and 2 workers asked on 2 cores, but the job used 0.03
    cores while it waited on the disk: no "oversubscribed" and no advice to lower the OpenMP threads. The same job
    with its processes holding the cores (1.9 of 2) is oversubscribed."""
    io = {"job_read_mb_s": 40.0, "loader_blkio_share": 0.8, "psi_io_some": 0.6, "devices": ()}
    waiting = {
        "workers_n": 2,
        "workers": 0.02,
        "worker_mean": 0.01,
        "main": 0.01,
        "job": 0.03,
        "node_busy": 0.1,
    }
    r = rank(wait_share=0.9, threads=2, num_workers=2)
    v = diagnose(analysis(ranks=(r,), cores=2, gpu_util=None, cpu=waiting, io=io))
    assert v.kind == "input-bound" and "storage" in ids(v.causes)
    assert "oversubscribed" not in ids(v.findings)
    assert "omp_num_threads" not in " ".join(c.fix for c in v.findings)
    held = {**waiting, "workers": 0.7, "worker_mean": 0.35, "main": 1.2, "job": 1.9, "node_busy": 1.95}
    v = diagnose(analysis(ranks=(r,), cores=2, gpu_util=None, cpu=held, io=io))
    over = next(c for c in v.findings if c.id == "oversubscribed")
    assert "2 torch threads using 1.2 cores + 2 DataLoader workers using 0.7 cores = 1.9 busy of 2 cores" in (
        over.evidence
    )
    assert "gpunode_tuning_omp_num_threads: 1" in over.fix


def test_a_busy_node_is_not_told_the_cpu_was_not_busy():
    """Input-bound with idle workers while other processes hold every core: the cause is the node's CPU, said
    apart from the job's own, never "the CPU was not busy"."""
    cpu = {"workers_n": 2, "workers": 0.02, "worker_mean": 0.01, "job": 0.3, "node_busy": 2.0}
    v = diagnose(analysis(ranks=(rank(wait_share=0.4, num_workers=2),), cores=2, gpu_util=None, cpu=cpu))
    assert v.kind == "input-bound" and ids(v.causes) == ["node-cpu-busy"]
    assert "2.00 of 2 cores" in v.causes[0].evidence and "0.30 cores" in v.causes[0].evidence
    assert "not busy" not in v.headline + v.causes[0].evidence
    quiet = {**cpu, "node_busy": 0.4}
    v = diagnose(analysis(ranks=(rank(wait_share=0.4, num_workers=2),), cores=8, gpu_util=None, cpu=quiet))
    assert ids(v.causes) == ["too-few-workers"]


def test_a_fetch_cheaper_than_a_worker_s_hand_off_needs_no_workers():
    cheap = rank(wait_share=0.4, num_workers=0, times=times(4.0, 6.0))
    cheap = replace(cheap, times=replace(cheap.times, median_wait_ms=0.2))
    v = diagnose(analysis(ranks=(cheap,), gpu_util=None, cpu={"workers_n": 0}))
    assert ids(v.causes) == ["cheap-fetch"] and v.causes[0].fix.startswith("no workers needed")
    assert "num_workers=" not in v.causes[0].fix
    slow = replace(cheap, times=replace(cheap.times, median_wait_ms=60.0))
    v = diagnose(analysis(ranks=(slow,), gpu_util=None, cpu={"workers_n": 0}))
    assert ids(v.causes) == ["too-few-workers"] and "num_workers=31" in v.causes[0].fix


def stacks(step: int = 24, asleep: int = 24) -> dict:
    return {
        "samples": step + 1,
        "where": {"step": step, "data": 1, "comm": 0, "outside": 0},
        "top": [["push_metrics (train.py:13) < <module> (train.py:26)", step]],
        "wchan": [["hrtimer_nanosleep", asleep]],
        "state": {"S": asleep, "R": step - asleep},
        "interval_s": 0.1,
    }


def test_a_main_thread_asleep_in_a_host_call_is_host_blocked_with_its_frame_and_wchan():
    cpu = {"main": 0.03, "workers_n": 0, "workers": None}
    v = diagnose(analysis(ranks=(rank(num_workers=0),), gpu_util=None, cpu=cpu, stacks=stacks()))
    assert v.kind == "host-blocked" and ids(v.causes) == ["host-call"]
    assert (
        "push_metrics (train.py:13)" in v.causes[0].evidence and "hrtimer_nanosleep" in v.causes[0].evidence
    )
    assert "push_metrics (train.py:13)" in v.causes[0].fix
    text = render_text(replace(analysis(gpu_util=None, cpu=cpu, stacks=stacks())), v)
    assert "  stacks    25 samples of the loop thread: 24 between batches" in text


def test_host_blocked_needs_low_cpu_and_agreeing_samples():
    # Computing (a core): compute-bound on the CPU, whatever the samples.
    v = diagnose(analysis(gpu_util=None, cpu={"main": 1.0}, stacks=stacks()))
    assert v.kind == "compute-bound"
    # Little CPU measured, but the samples found the thread running: no host-blocked claim.
    v = diagnose(analysis(gpu_util=None, cpu={"main": 0.05}, stacks=stacks(asleep=2)))
    assert v.kind == "compute-bound"
    # No samples (a hook without them): the CPU alone, and the evidence says the samples were too few.
    v = diagnose(analysis(gpu_util=None, cpu={"main": 0.05}))
    assert v.kind == "host-blocked" and "too few stack samples" in v.causes[0].evidence


def gpus(sm_active: float | None, util: float = 100.0) -> tuple[dict, ...]:
    return (
        {
            "index": 0,
            "samples": 40,
            "util_mean": util,
            "sm_active_mean": sm_active,
            "sm_occupancy_mean": None if sm_active is None else sm_active / 2,
            "used_by_job": True,
        },
    )


def test_sm_activity_judges_the_gpu_where_gpm_has_it_and_utilisation_is_labelled_the_last_resort():
    """NVML utilisation 100% with the SMs 40% active is not compute-bound (it was); 85% SM activity is."""
    a = replace(analysis(), gpus=gpus(40.0))
    v = diagnose(a)
    assert v.kind == "idle-gpu" and "GPU SM activity 40% (NVML GPM)" in v.headline
    assert v.measures["gpu_signal"] == "sm-activity (NVML GPM)" and v.measures["gpu_busy_target"] == 80.0
    v = diagnose(replace(analysis(), gpus=gpus(85.0)))
    assert v.kind == "compute-bound" and "SM activity 85%" in v.headline
    a = replace(analysis(), gpus=gpus(None, util=95.0))
    v = diagnose(a)
    assert v.kind == "compute-bound"
    assert "utilisation 95% (NVML: kernel-time utilisation, not SM activity)" in v.headline
    text = render_text(a, v)
    assert "judged by utilisation (NVML; kernel-time utilisation, not SM activity)" in text
    assert report_dict(a, v)["gpu_signal"].startswith("utilisation")
