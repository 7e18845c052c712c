"""The job hook's collective timing on a real GPU (marker ``gpu``; skipped without CUDA).

One process, a one-rank NCCL group on GPU 0 (NCCL runs a one-rank all_gather as a device copy). A 1 GiB
all_gather takes a few hundred microseconds of copying on any data-centre GPU while its Python call returns
in tens: twenty back to back leave the GPU milliseconds behind the host. The hook must count what the GPU took,
as CUDA events around the whole loop measure it, never the calls' host time, and without a synchronize.
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from hostcheck.inside import job_hook  # noqa: E402
from hostcheck.job.records import read_run  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CALLS = 20
GIB = 1 << 30


@pytest.fixture
def hooked(tmp_path, monkeypatch):
    """A one-rank NCCL group, warmed up (its communicator is made at the first collective), then the hook's
    wrappers on torch.distributed, recording into tmp_path; torch.cuda's synchronize calls counted."""
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    src = torch.ones(GIB // 4, dtype=torch.float32, device=dev)
    out = torch.empty_like(src)
    dist.all_gather_into_tensor(out, src)
    torch.cuda.synchronize()
    state = job_hook._State()
    state.dir = str(tmp_path)
    monkeypatch.setattr(job_hook, "_S", state)
    syncs = []
    for owner, name in ((torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize")):
        orig = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _o=orig, **k: (syncs.append(1), _o(*a, **k))[1])
    job_hook._patch_distributed(dist)
    try:
        yield dist, src, out, syncs
    finally:
        job_hook.uninstall()
        dist.destroy_process_group()


def reference(fn):
    """fn's GPU time by CUDA events on the current stream around it (after the GPU is idle), and its host time."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    fn()
    host = time.perf_counter() - t0
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0, host


def test_blocking_collectives_are_counted_at_their_gpu_time(hooked, tmp_path, record_property):
    dist, src, out, syncs = hooked

    synced = []

    def loop():
        n = len(syncs)
        for _ in range(CALLS):
            dist.all_gather_into_tensor(out, src)
        synced.append(len(syncs) - n)

    ref_s, host_s = reference(loop)
    calls_synced = synced[0]
    job_hook.flush(final=True)
    (p,) = read_run(str(tmp_path))
    hook_s = p.final["collectives"]["all_gather_into_tensor"][1]
    record_property("gpu_s", round(ref_s, 6))
    record_property("host_s", round(host_s, 6))
    record_property("hook_s", round(hook_s, 6))
    assert calls_synced == 0, "the hook synchronized inside the loop"
    assert p.collective_clocks == {"gpu": CALLS}
    assert host_s < 0.5 * ref_s, (
        f"the premise: calls return before the GPU is done ({host_s=:.4f} {ref_s=:.4f})"
    )
    # The GPU ran the copies back to back: their sum is the span, less the gaps between them.
    assert 0.9 * ref_s - 2e-4 <= hook_s <= 1.02 * ref_s + 2e-4, (hook_s, ref_s)
    spans = [b - a for _, a, b in p.collectives]
    assert all(s > 0 for s in spans)


def test_async_collectives_count_the_stream_s_wait(hooked, tmp_path, record_property):
    dist, src, _, syncs = hooked
    outs = [torch.empty_like(src) for _ in range(4)]

    synced = []

    def loop():
        n = len(syncs)
        works = [dist.all_gather_into_tensor(outs[i % 4], src, async_op=True) for i in range(CALLS)]
        for w in works:
            w.wait()
        synced.append(len(syncs) - n)

    ref_s, host_s = reference(loop)
    job_hook.flush(final=True)
    (p,) = read_run(str(tmp_path))
    hook_s = p.final["collectives"]["all_gather_into_tensor"][1]
    record_property("async_gpu_s", round(ref_s, 6))
    record_property("async_hook_s", round(hook_s, 6))
    assert synced == [0], "the hook synchronized inside the loop"
    assert p.collective_clocks == {"gpu": CALLS}
    # Nothing else ran on the current stream: it stood still from the first wait until the last copy was done,
    # which is the span less the launch of the calls before that wait.
    assert ref_s - host_s - 2e-4 <= hook_s <= 1.02 * ref_s + 2e-4, (hook_s, ref_s, host_s)


def test_the_hook_s_cost_per_call(hooked, tmp_path, record_property):
    """Recorded, not judged here (speed is a benchmark's business): microseconds the hook adds to one call."""
    dist, src, _, _ = hooked
    small = torch.ones(1024, device=src.device)

    def per_call():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(500):
            dist.all_reduce(small)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / 500

    with_hook = min(per_call() for _ in range(3))
    job_hook.uninstall()
    without = min(per_call() for _ in range(3))
    job_hook._patch_distributed(dist)
    record_property("hook_us_per_call", round((with_hook - without) * 1e6, 2))
    record_property("call_us_without_hook", round(without * 1e6, 2))
    job_hook.flush(final=True)
    (p,) = read_run(str(tmp_path))
    assert p.collective_clocks == {"gpu": 1500}
