"""The job doctor's shares over random timelines: whatever the batches, epochs, collectives and DDP timers, every
share lies in [0, 1] (the issue saw "346-436% of each step waits for gradients"), collectives after the loop are
the end wait and never the loop's communication, and the stack samples' summary survives hostile records."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostcheck.job.analyse import _comm, _stacks, comm_times
from hostcheck.job.records import HookProcess, loop_times, parse_lines

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

times_ = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
spans = st.lists(st.tuples(times_, st.floats(min_value=-1.0, max_value=10.0, allow_nan=False)), max_size=40)


def proc(batches, ends=(), colls=(), ddp=None, pid=1) -> HookProcess:
    b = tuple(sorted((s, s + d) for s, d in batches))
    final = {"ddp": ddp} if ddp is not None else None
    return HookProcess(
        pid=pid,
        batches=b,
        batch_iters=tuple(0 for _ in b),
        epoch_ends=tuple(sorted(ends)),
        collectives=tuple(sorted((("all_reduce", s, s + d) for s, d in colls), key=lambda c: c[1])),
        final=final,
    )


ddp_timers = st.one_of(
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {
                "avg_backward_comm_time": st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
                "avg_backward_compute_comm_overlap_time": st.floats(
                    min_value=-1e12, max_value=1e12, allow_nan=False
                ),
            }
        ),
        max_size=3,
    ),
)


@SETTINGS
@given(batches=spans, ends=st.lists(times_, max_size=5), colls=spans, ddp=ddp_timers)
def test_every_share_lies_in_0_1_whatever_the_timeline(batches, ends, colls, ddp):
    p = proc(batches, ends, colls, ddp)
    t = loop_times(p)
    c = comm_times(p, t)
    assert c["share"] is None or 0.0 <= c["share"] <= 1.0, c
    assert c["loop_collectives_s"] >= 0 and c["end_wait_s"] >= 0 and c["outside_s"] >= 0
    assert all(math.isfinite(v) for v in (c["loop_collectives_s"], c["ddp_exposed_s"], c["end_wait_s"]))


@SETTINGS
@given(
    batches=st.lists(st.tuples(times_, st.floats(0.0, 1.0)), min_size=2, max_size=30), wait=st.floats(0.1, 50)
)
def test_collectives_after_the_loop_are_the_end_wait_and_never_the_loop_s_share(batches, wait):
    p0 = proc(batches)
    end = loop_times(p0).end
    p = proc(batches, colls=[(end + 0.5, wait)])
    c = comm_times(p, loop_times(p))
    assert c["share"] in (0.0, None) and c["loop_collectives_s"] == 0.0  # None: a loop of no time
    assert math.isclose(c["end_wait_s"], wait, rel_tol=1e-9)


def test_a_collective_inside_a_step_counts_for_that_step_only():
    # Batches at 0-1, 2-3, 4-5 (waits of 1 s, the first one start-up), steps 1-2 and 3-4; a collective from 3.5
    # to 4.5 overlaps a step for 0.5 s and a data wait for 0.5 s: the share is 0.5 s over the loop's 4 s of
    # wait and step.
    p = proc([(0, 1), (2, 1), (4, 1)], colls=[(3.5, 1.0)])
    c = comm_times(p, loop_times(p))
    assert math.isclose(c["loop_collectives_s"], 0.5) and math.isclose(c["share"], 0.5 / 4)


def test_the_job_share_is_the_ranks_mean_and_bounded():
    from hostcheck.job.analyse import Rank

    procs = {
        1: proc([(0, 0.1), (1, 0.1), (2, 0.1)], colls=[(0.1, 0.9), (1.1, 0.9)], pid=1),  # all steps in comm
        2: proc([(0, 0.1), (1, 0.1), (2, 0.1)], colls=[(2.1, 4.0)], pid=2),  # only an end wait
    }
    ranks = [
        Rank(
            pid=k,
            rank=k - 1,
            argv=(),
            times=loop_times(p),
            loader={},
            model=None,
            final=None,
            workers=(),
            cpu_cores=1,
        )
        for k, p in procs.items()
    ]
    c = _comm(ranks, procs)
    # Rank 1: 1.8 s of its 2.0 s of wait and step in collectives; rank 2: none in its loop, 4 s after it.
    assert [r["share"] for r in c["ranks"]] == [0.9, 0.0]
    assert c["share"] == 0.45 and c["end_wait_s"] == 4.0


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@SETTINGS
@given(c=junk, stk=junk)
def test_hostile_collective_and_stack_records_never_crash_the_reader_or_the_summary(c, stk):
    lines = [
        json.dumps({"k": "proc", "pid": 7}),
        json.dumps({"k": "b", "it": 0, "t": [0, 0.1, 1, 1.1, 2, 2.1]}),
        json.dumps({"k": "c", "c": c}, default=str),
        json.dumps({"k": "stk", **(stk if isinstance(stk, dict) else {"n": stk})}, default=str),
    ]
    p = parse_lines(lines)
    assert p is not None
    s = _stacks([p])
    assert s["samples"] >= 0 and len(s["top"]) <= 5 and len(s["wchan"]) <= 5
    share = comm_times(p, loop_times(p))["share"]
    assert share is None or 0.0 <= share <= 1.0
