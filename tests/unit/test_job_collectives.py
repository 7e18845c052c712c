"""How the job hook times explicit collectives, on a fake CUDA device whose streams and events follow CUDA's rules.

The fake models what the CUDA runtime documents (CUDA Runtime API, "Event Management" and "Stream Management"):
work enqueued on a stream runs after the work already there; ``cudaEventRecord`` puts an event in the stream, and the
event completes when the stream reaches it; ``cudaEventQuery`` says whether it has (cudaSuccess or
cudaErrorNotReady), never blocking; ``cudaEventElapsedTime`` gives the milliseconds between two completed events and
fails with cudaErrorNotReady before. torch.cuda.Event wraps these (record, query, elapsed_time). A NCCL collective
returns once enqueued; a blocking call (``async_op=False``) has made the caller's current stream wait for it, an
asynchronous one returns a Work whose ``wait()`` makes the current stream wait (torch.distributed's Work.wait
docstring: "Letting the current stream block on the completion of the NCCL work").

Before, the hook timed the Python call: a collective that returned at once and ran 50 ms on the GPU counted 0 ms.
"""

from __future__ import annotations

import json
import math
import types

import pytest

from hostcheck.inside import job_hook
from hostcheck.job import records
from hostcheck.job.analyse import Rank, _comm, comm_times
from hostcheck.job.records import parse_lines, read_run
from hostcheck.job.render import _timed


class Device:
    """One GPU's streams on a virtual clock (seconds), shared with the hook's clock."""

    def __init__(self):
        self.now = 0.0
        self.capturing = False
        self.events = 0
        self.broken = None
        self.current = Stream(self, 7)
        self.nccl = Stream(self, 9)


class Stream:
    def __init__(self, dev, handle):
        self.dev = dev
        self.cuda_stream = handle
        self.busy_until = 0.0

    def run(self, seconds, after=0.0):
        """Enqueue ``seconds`` of work, starting no earlier than ``after`` (another stream it waits for)."""
        start = max(self.dev.now, self.busy_until, after)
        self.busy_until = start + seconds
        return self.busy_until


def fake_torch(dev):
    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing, "elapsed_time needs timing events"
            dev.events += 1
            self.t = None

        def record(self, stream=None):
            self.t = max(dev.now, (stream or dev.current).busy_until)

        def query(self):
            if dev.broken:
                raise RuntimeError(dev.broken)
            return self.t is not None and dev.now >= self.t

        def elapsed_time(self, end):
            if not (self.query() and end.query()):
                raise RuntimeError("CUDA error: device not ready")
            return (end.t - self.t) * 1000.0

    cuda = types.SimpleNamespace(
        Event=Event,
        current_stream=lambda device=None: dev.current,
        is_current_stream_capturing=lambda: dev.capturing,
    )
    return types.SimpleNamespace(cuda=cuda)


def cuda_tensor():
    return types.SimpleNamespace(is_cuda=True, device=types.SimpleNamespace(index=0, type="cuda"))


def cpu_tensor():
    return types.SimpleNamespace(is_cuda=False, device=types.SimpleNamespace(index=None, type="cpu"))


class Work:
    """A NCCL Work: its collective runs on NCCL's stream; wait() makes the current stream wait for it."""

    def __init__(self, dev, end):
        self.dev, self.end = dev, end

    def wait(self, timeout=None):
        self.dev.current.busy_until = max(self.dev.current.busy_until, self.end)
        return True


@pytest.fixture
def dev(tmp_path, monkeypatch):
    """A fresh hook state writing into tmp_path, its clock the device's, torch the fake."""
    d = Device()
    state = job_hook._State()
    state.dir = str(tmp_path)
    monkeypatch.setattr(job_hook, "_S", state)
    monkeypatch.setattr(job_hook, "_clock", lambda: d.now)
    monkeypatch.setitem(__import__("sys").modules, "torch", fake_torch(d))
    monkeypatch.setattr(Work, "wait", job_hook._wrap_wait(Work.wait))
    return d


def nccl(dev, seconds, name="all_reduce"):
    """A collective that returns at once; blocking: the current stream waits for it; async: a Work."""

    def call(tensor, async_op=False):
        end = dev.nccl.run(seconds, after=dev.current.busy_until)
        if async_op:
            return Work(dev, end)
        dev.current.busy_until = max(dev.current.busy_until, end)
        return None

    return job_hook._wrap_collective(name, call)


def finish(dev, tmp_path, at=10.0):
    dev.now = at
    job_hook.flush(final=True)
    (p,) = read_run(str(tmp_path))
    return p


def test_a_collective_that_returns_at_once_and_runs_50_ms_on_the_gpu_counts_50_ms(dev, tmp_path):
    all_reduce = nccl(dev, 0.050)
    assert all_reduce(cuda_tensor()) is None
    assert dev.now == 0.0  # the call took no host time: the old hook counted 0 ms
    job_hook.flush()  # the GPU is not done: nothing is read yet, and nothing waited for it
    assert job_hook._S.coll["all_reduce"] == [1, 0.0]
    p = finish(dev, tmp_path, at=0.2)
    ((name, a, b),) = p.collectives
    assert name == "all_reduce" and a == 0.0 and math.isclose(b, 0.050)
    assert p.collective_clocks == {"gpu": 1}
    assert p.final["collectives"]["all_reduce"] == [1, 0.05]
    assert p.final["collective_clocks"] == {"gpu": 1}


def test_compute_queued_ahead_of_the_collective_is_not_counted_as_communication(dev, tmp_path):
    dev.current.run(0.030)  # a backward pass still running when the collective is issued
    nccl(dev, 0.050)(cuda_tensor())
    p = finish(dev, tmp_path)
    ((_, a, b),) = p.collectives
    # 50 ms, not 80: placed from its call on the host clock (in the step that issued it), as long as it ran
    assert a == 0.0 and math.isclose(b, 0.050)


def test_back_to_back_collectives_follow_each_other_on_the_stream(dev, tmp_path):
    """Three issued in one instant run one after the other: 150 ms of communication, not three overlapping 50s."""
    ar = nccl(dev, 0.050)
    for _ in range(3):
        ar(cuda_tensor())
    dev.current.run(0.010)  # compute between them
    ar(cuda_tensor())
    p = finish(dev, tmp_path)
    spans = [(round(a, 6), round(b, 6)) for _, a, b in p.collectives]
    assert spans == [(0.0, 0.05), (0.05, 0.1), (0.1, 0.15), (0.16, 0.21)]
    assert math.isclose(p.final["collectives"]["all_reduce"][1], 0.2)


def test_the_events_are_read_at_the_flushes_without_waiting_and_in_order(dev, tmp_path):
    ar = nccl(dev, 0.050)
    ar(cuda_tensor())
    ar(cuda_tensor())
    dev.now = 0.06  # the first has finished, the second not
    job_hook.flush()
    assert job_hook._S.coll["all_reduce"][1] == pytest.approx(0.05)
    assert len(job_hook._S.gpu.pending) - job_hook._S.gpu.head == 1
    p = finish(dev, tmp_path)
    assert [round(b - a, 6) for _, a, b in p.collectives] == [0.05, 0.05]


def test_events_are_reused_not_created_per_call(dev, tmp_path):
    ar = nccl(dev, 0.001)
    for i in range(200):
        ar(cuda_tensor())
        dev.now = 0.001 * (i + 1) + 1e-9
    p = finish(dev, tmp_path)
    assert p.collective_clocks == {"gpu": 200}
    assert dev.events <= 8


def test_an_async_collective_counts_the_time_the_stream_stood_still_at_its_wait(dev, tmp_path):
    """50 ms on NCCL's stream beside 20 ms of compute: the loop lost 30 ms, at the wait."""
    work = nccl(dev, 0.050)(cuda_tensor(), async_op=True)
    assert isinstance(work, Work)
    dev.current.run(0.020)  # compute overlapping the communication
    dev.now = 0.001
    assert work.wait() is True
    p = finish(dev, tmp_path)
    ((_, a, b),) = p.collectives
    assert math.isclose(a, 0.001) and math.isclose(b - a, 0.030)  # from the wait, as long as the stream stood
    assert p.collective_clocks == {"gpu": 1}


def test_an_async_collective_never_waited_for_keeps_its_launch_time_and_says_so(dev, tmp_path):
    work = nccl(dev, 0.050)(cuda_tensor(), async_op=True)
    p = finish(dev, tmp_path)
    assert p.collective_clocks == {"launch": 1} and p.collectives == (("all_reduce", 0.0, 0.0),)
    assert work is not None  # held by the job to the end, never waited


def test_untracked_works_wait_untouched(dev, tmp_path):
    w = Work(dev, 0.5)
    assert w.wait() is True and dev.current.busy_until == 0.5
    p = finish(dev, tmp_path)
    assert p is not None and p.collectives == ()


def test_cpu_tensors_and_barrier_are_timed_by_the_host_clock_and_say_so(dev, tmp_path):
    def gloo(tensor=None):
        dev.now += 0.010  # gloo blocks the calling thread

    ar = job_hook._wrap_collective("all_reduce", gloo)
    barrier = job_hook._wrap_collective("barrier", lambda: gloo())
    ar(cpu_tensor())
    barrier()
    p = finish(dev, tmp_path)
    assert [(n, round(a, 6), round(b, 6)) for n, a, b in p.collectives] == [
        ("all_reduce", 0.0, 0.01),
        ("barrier", 0.01, 0.02),
    ]
    assert p.collective_clocks == {"host": 2} and dev.events == 0


def test_no_timing_event_is_recorded_while_a_cuda_graph_is_captured(dev, tmp_path):
    dev.capturing = True
    nccl(dev, 0.050)(cuda_tensor())
    p = finish(dev, tmp_path)
    assert dev.events == 0 and p.collective_clocks == {"host": 1}


def test_events_the_gpu_never_finishes_are_dropped_not_waited_for(dev, tmp_path, monkeypatch):
    """A GPU far behind (or a hung collective): the bound holds and the exit does not hang."""
    monkeypatch.setattr(job_hook, "GPU_PENDING", 4)
    monkeypatch.setattr(job_hook, "FINAL_POLLS", 3)
    ar = nccl(dev, 1000.0)
    for _ in range(6):
        ar(cuda_tensor())
    assert len(job_hook._S.gpu.pending) - job_hook._S.gpu.head == 4
    job_hook.flush(final=True)  # dev.now stays 0: nothing ever finishes
    (p,) = read_run(str(tmp_path))
    assert p.collective_clocks == {"launch": 6}


def test_a_failing_event_api_stops_gpu_timing_and_never_the_job(dev, tmp_path):
    ar = nccl(dev, 0.050)
    ar(cuda_tensor())
    dev.broken = "CUDA error: an illegal memory access was encountered"
    dev.now = 1.0
    job_hook.flush()
    assert ar(cuda_tensor()) is None  # the job's call goes on, timed by the host now
    dev.broken = None
    p = finish(dev, tmp_path)
    assert p.collective_clocks == {"launch": 1, "host": 1}
    assert "illegal memory access" in p.final["collective_gpu_error"]
    assert not job_hook._S.off


def test_what_the_collective_returns_and_raises_is_the_original_s(dev, tmp_path):
    def raising(tensor):
        raise RuntimeError("NCCL error: unhandled system error")

    with pytest.raises(RuntimeError, match="unhandled system error"):
        job_hook._wrap_collective("all_reduce", raising)(cuda_tensor())
    p = finish(dev, tmp_path)
    assert p.collective_clocks == {"host": 1}


def test_the_report_says_how_the_calls_were_timed(dev, tmp_path):
    nccl(dev, 0.05)(cuda_tensor())
    job_hook._wrap_collective("barrier", lambda: None)()
    p = finish(dev, tmp_path)
    assert "1 on the GPU (CUDA events), 1 by the host clock" in _timed(p.collective_clocks)
    assert _timed({"launch": 2}).endswith(
        "2 by their launch only (asynchronous, never waited for: under-measured)"
    )
    assert _timed({}) == "" and _timed(None) == ""
    assert comm_times(p, records.loop_times(p))["end_wait_s"] == 0.0


def test_records_from_a_hook_before_the_clock_read_as_host_and_an_unknown_clock_is_dropped():
    lines = [
        '{"k":"proc","pid":5,"ppid":1,"argv":[],"env":{}}',
        '{"k":"c","c":[["all_reduce",1.0,1.5],["broadcast",2.0,2.1,"gpu"],["barrier",3.0,3.1,"psychic"]]}',
    ]
    p = parse_lines(lines)
    assert [c[0] for c in p.collectives] == ["all_reduce", "broadcast"]
    assert p.collective_clocks == {"host": 1, "gpu": 1} and p.bad_lines == 1


def test_a_final_record_s_malformed_collective_totals_are_left_out_never_a_crash():
    """The job can write into its records folder: a total of the wrong shape is not counted (it raised
    IndexError, a traceback instead of the job's report)."""
    colls = {
        "all_reduce": [1],
        "broadcast": [2, 0.5],
        "barrier": [1, True],
        "reduce": "x",
        "all_gather": [1, "s"],
    }
    lines = [
        '{"k":"proc","pid":7,"ppid":1,"argv":[],"env":{}}',
        '{"k":"b","it":0,"t":[0,0.1,1,1.1]}',
        json.dumps({"k": "final", "opt_steps": 0, "collectives": colls}),
    ]
    p = parse_lines(lines)
    rank = Rank(
        pid=7,
        rank=0,
        argv=(),
        times=records.loop_times(p),
        loader={},
        model=None,
        final=p.final,
        workers=(),
        cpu_cores=None,
    )
    comm = _comm([rank], {7: p})
    assert comm["collectives_s"] == 0.5 and comm["timed"] == {"gpu": 0, "host": 0, "launch": 0}


def test_the_clock_names_agree_on_both_sides_of_the_inside_boundary():
    assert records.CLOCKS == job_hook.CLOCKS
