"""The hook's wrappers and its records, in this process and without torch: what a wrapped next() returns and
raises is the original's, a failure of the hook's own stops its recording and nothing else, an exception a signal
handler raised inside the hook's code still reaches the job; the records read back into loop times."""

from __future__ import annotations

import json
import math
import os
import signal
import threading

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


# --- hostile records: the job can write into its own records folder ---------------------------------------


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ('{"k": "proc", "pid": "abc"}', 'pid is "abc"'),
        ('{"k": "proc", "pid": 7, "argv": 5}', "argv is 5"),
        ('{"k": "proc", "pid": 7, "env": {"RANK": 1}}', "env.RANK is 1"),
        ('{"k": "proc", "pid": true}', "pid is true"),
    ],
)
def test_a_process_record_of_the_wrong_types_is_dropped_and_named(line, named):
    dropped: list[str] = []
    assert parse_lines([line], dropped) is None
    assert any(named in d for d in dropped), dropped
    # absent: the same record with its types right is a process
    assert parse_lines([_proc()], dropped) is not None


@pytest.mark.parametrize(
    "bad",
    [
        '{"k": "b", "it": 0, "t": [NaN, 1.0, 2.0, 3.0]}',
        '{"k": "b", "it": 0, "t": [Infinity, 1.0]}',
        '{"k": "b", "it": 0, "t": [1e999, 1.0]}',
        '{"k": "b", "it": 0, "t": ["0", 1.0]}',
        '{"k": "b", "it": "x", "t": [0.0, 1.0]}',
        '{"k": "e", "it": 0, "t": "late"}',
        '{"k": "sum", "n": 3, "wait": NaN, "gaps": 0}',
        '{"k": "err", "type": 5, "message": "m"}',
        '{"k": "final", "error": {"type": "E", "message": 5}}',
        '{"k": "final", "pil": "11.0"}',
        '{"k": "model", "param_devices": ["cuda"]}',
        '{"k": "it", "it": 0, "workers": "12"}',
    ],
)
def test_a_record_of_the_wrong_types_is_dropped_the_others_kept(bad):
    good = json.dumps({"k": "b", "it": 0, "t": [0.0, 0.5, 0.7, 0.8]})
    dropped: list[str] = []
    p = parse_lines([_proc(), good, bad], dropped)
    assert p is not None and p.bad_lines == 1 and len(p.batches) == 2 and dropped
    assert all(math.isfinite(x) for b in p.batches for x in b)
    clean: list[str] = []
    assert parse_lines([_proc(), good], clean).bad_lines == 0 and clean == []


def test_a_fifo_or_a_link_named_like_a_record_is_named_never_read(tmp_path):
    (tmp_path / "hook-1-1.jsonl").write_text(_proc() + "\n")
    os.mkfifo(tmp_path / "hook-2-1.jsonl")  # opening it for reading would wait for a writer for ever
    (tmp_path / "hook-3-1.jsonl").symlink_to("/dev/zero")
    (tmp_path / "hook-4-1.jsonl").symlink_to(tmp_path / "hook-1-1.jsonl")
    dropped: list[str] = []
    box: dict = {}
    t = threading.Thread(
        target=lambda: box.setdefault("procs", read_run(str(tmp_path), dropped)), daemon=True
    )
    t.start()
    t.join(10)
    assert not t.is_alive(), "read_run blocked"
    assert len(box["procs"]) == 1
    assert any(d.startswith("hook-2-1.jsonl: is a FIFO") for d in dropped), dropped
    assert any(d.startswith("hook-3-1.jsonl: is a symbolic link") for d in dropped), dropped
    assert any(d.startswith("hook-4-1.jsonl: is a symbolic link") for d in dropped), dropped
