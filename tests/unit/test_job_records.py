"""The hook's wrappers and its records, in this process and without torch: what a wrapped next() returns and
raises is the original's, a failure of the hook's own stops its recording and nothing else, an exception a signal
handler raised inside the hook's code still reaches the job; the records read back into loop times."""

from __future__ import annotations

import json
import os
import signal

import pytest

from hostcheck.inside import job_hook
from hostcheck.job.records import HookProcess, loop_times, parse_lines, read_run, wait_in_bins


@pytest.fixture
def hook(tmp_path, monkeypatch):
    """A fresh hook state writing into tmp_path."""
    state = job_hook._State()
    state.dir = str(tmp_path)
    monkeypatch.setattr(job_hook, "_S", state)
    return state


class FakeIter:
    """Stands in for a DataLoader iterator: yields its items, then StopIteration; ``boom`` raises."""

    def __init__(self, items, boom=None):
        self.items = list(items)
        self.boom = boom
        self._num_workers = 0

    def _next_data(self):
        if self.boom is not None and len(self.items) == 1:
            raise self.boom
        if not self.items:
            raise StopIteration
        return self.items.pop(0)


def test_a_wrapped_next_returns_and_raises_what_the_original_does(hook, tmp_path):
    wrapped = job_hook._wrap_next_data(FakeIter._next_data)
    it = FakeIter(["a", "b", "c"])
    assert [wrapped(it), wrapped(it), wrapped(it)] == ["a", "b", "c"]
    with pytest.raises(StopIteration):
        wrapped(it)
    bad = FakeIter(["x", "y"], boom=ValueError("from the dataset"))
    assert wrapped(bad) == "x"
    with pytest.raises(ValueError, match="from the dataset"):
        wrapped(bad)
    job_hook.flush(final=True)
    procs = read_run(str(tmp_path))
    assert len(procs) == 1
    p = procs[0]
    assert p.pid == os.getpid() and len(p.batches) == 4 and len(p.epoch_ends) == 1
    assert [e["type"] for e in p.errors] == ["ValueError"] and p.final["opt_steps"] == 0


def test_a_failure_of_the_hook_stops_its_recording_not_the_job(hook, tmp_path, capsys):
    hook.dir = str(tmp_path / "not-a-folder")  # every write fails
    wrapped = job_hook._wrap_next_data(FakeIter._next_data)
    it = FakeIter(range(5))
    hook.last_flush = -1e9  # the first batch flushes at once
    assert [wrapped(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    assert hook.off
    assert "hostcheck job hook: stopped recording" in capsys.readouterr().err


def test_an_exception_a_signal_handler_raises_inside_the_hook_reaches_the_job(hook):
    """torch's SIGCHLD handler raises "DataLoader worker ... exited unexpectedly" wherever the main thread is,
    the hook's own bookkeeping included: that exception is the job's."""

    def handler(signum, frame):
        raise RuntimeError("DataLoader worker (pid 1) exited unexpectedly")

    previous = signal.signal(signal.SIGUSR1, handler)
    try:

        def batch(it, start, end):
            os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs inside the hook's code
            for _ in range(1000):
                pass

        wrapped = job_hook._wrap_next_data(FakeIter._next_data)
        real = job_hook._batch
        job_hook._batch = batch
        try:
            with pytest.raises(RuntimeError, match="exited unexpectedly"):
                wrapped(FakeIter([1]))
        finally:
            job_hook._batch = real
        assert not hook.off
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_forked_child_starts_with_nothing_pending(hook):
    hook.pending.append({"k": "x"})
    hook.batches = 7
    job_hook._after_fork_in_child()
    assert hook.pending == [] and hook.batches == 0 and hook.file is None


def _proc(**kw):
    return json.dumps({"k": "proc", "pid": 10, "ppid": 1, "argv": ["train.py"], "env": {"RANK": "1"}, **kw})


def test_records_read_back_into_wait_and_step_times():
    lines = [
        _proc(),
        json.dumps({"k": "it", "it": 0, "num_workers": 0}),
        # batches: waits 0.5 (the first: start-up), 0.1, 0.1; steps 0.2, 0.3
        json.dumps({"k": "b", "it": 0, "t": [0.0, 0.5, 0.7, 0.8, 1.1, 1.2]}),
        json.dumps({"k": "e", "it": 0, "t": 1.3}),
        # the next epoch: a new iterator; the gap across the epoch end is not a step
        json.dumps({"k": "b", "it": 1, "t": [3.0, 4.5, 4.6, 4.7]}),
        "{not json",
        json.dumps({"k": "final", "error": {"type": "RuntimeError", "message": "boom"}}),
    ]
    p = parse_lines(lines)
    assert p is not None and p.rank == 1 and p.bad_lines == 1
    t = loop_times(p)
    assert t.batches == 5 and t.first_batch_s == pytest.approx(0.5)
    assert t.wait_s == pytest.approx(0.1 + 0.1 + 1.5 + 0.1)
    assert t.step_s == pytest.approx(0.2 + 0.3 + 0.1)
    assert t.between_epochs_s == pytest.approx(3.0 - 1.2)
    assert t.epoch_start_waits_s == pytest.approx((1.5,))
    assert [e["where"] for e in p.errors] == ["uncaught"]


def test_a_file_without_its_process_record_is_no_process():
    assert parse_lines([json.dumps({"k": "b", "t": [0, 1]})]) is None


def test_wait_in_bins_ends_whatever_the_floats_round_to():
    # Boundaries that floating point cannot hit exactly once loop forever in a naive walk.
    p = HookProcess(pid=1, batches=((0.1 + 0.2, 0.7000000000000001), (1.2, 1.2), (2.9999999, 3.5)))
    bins = wait_in_bins(p, 0.0, 0.1, 30)
    assert sum(bins) == pytest.approx(0.4, abs=1e-6)
    assert len(bins) == 30 and all(0 <= b <= 0.1 + 1e-9 for b in bins)
