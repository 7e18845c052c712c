"""The hook's records (``hook-<pid>-<n>.jsonl`` in the run folder) read back into one summary per process.

Pure where it can be: :func:`parse_lines` turns a file's lines into a :class:`HookProcess`; :func:`read_run`
reads a folder. A line that is not a JSON object (a process killed mid-write) is skipped and counted.
"""

from __future__ import annotations

import bisect
import glob
import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hostcheck import infile
from hostcheck.schema import type_errors

#: Files past this size are read only this far (a hook file holds ~30 bytes a batch).
MAX_FILE_BYTES = 64 << 20
#: How the hook timed a collective (hostcheck/inside/job_hook.py CLOCKS; that side imports nothing of this one, and a
#: test holds the two equal): on the GPU by CUDA events, by the host clock, or by its launch only.
CLOCKS = ("gpu", "host", "launch")


@dataclass(frozen=True)
class HookProcess:
    """One Python process of the job that iterated a DataLoader (or raised, or stepped an optimizer)."""

    pid: int
    ppid: int = 0
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    torch: str | None = None
    cpus: int | None = None
    affinity: int | None = None
    #: Every batch (start, end) in monotonic seconds, sorted by start.
    batches: tuple[tuple[float, float], ...] = ()
    #: Batches only counted (past the hook's detail cap): count, wait seconds, seconds between them.
    summed: tuple[int, float, float] = (0, 0.0, 0.0)
    #: When an iterator ran out (an epoch ended).
    epoch_ends: tuple[float, ...] = ()
    #: Each DataLoader iterator's settings record, in order.
    iterators: tuple[dict[str, Any], ...] = ()
    #: Which iterator each batch came from (parallel to ``batches``).
    batch_iters: tuple[int, ...] = ()
    model: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    errors: tuple[dict[str, Any], ...] = ()
    bad_lines: int = 0
    #: Explicit collective calls (name, start, end) in monotonic seconds, sorted by start.
    collectives: tuple[tuple[str, float, float], ...] = ()
    #: How those calls were timed (the hook's CLOCKS: gpu, host, launch) and how many each way.
    collective_clocks: dict[str, int] = field(default_factory=dict)
    #: The last summary of the hook's stack samples of the loop's thread (its "stk" record).
    stacks: dict[str, Any] | None = None

    @property
    def rank(self) -> int | None:
        try:
            return int(self.env["RANK"])
        except (KeyError, ValueError):
            return None


_INT, _NUM, _STR, _BOOL = {"type": "integer"}, {"type": "number"}, {"type": "string"}, {"type": "boolean"}
_OPT_INT, _OPT_BOOL = {"type": ["integer", "null"]}, {"type": ["boolean", "null"]}
_OBJ = {"type": "object"}
#: The types of each record kind's keys, as the hook writes them (hostcheck/inside/job_hook.py), in the form of
#: hostcheck/schema.py. The job can write into its records folder, so a record is checked before it is read: one
#: with a key of the wrong type (a string pid, NaN batch times) is dropped and named, never trusted.
RECORD_SCHEMAS: dict[str, dict[str, Any]] = {
    "proc": {
        "pid": _INT,
        "ppid": _INT,
        "argv": {"type": "array", "items": _STR},
        "env": {"type": "object", "additionalProperties": _STR},
        "torch": {"type": ["string", "null"]},
        "cpus": _OPT_INT,
        "affinity": _OPT_INT,
    },
    "b": {"t": {"type": "array", "items": _NUM}, "it": _INT},
    "e": {"t": _NUM, "it": _INT},
    "sum": {"n": _INT, "wait": _NUM, "gaps": _NUM},
    "it": {
        "it": _INT,
        "workers": {"type": "array", "items": _INT},
        "num_workers": _OPT_INT,
        "pin_memory": _OPT_BOOL,
        "persistent_workers": _OPT_BOOL,
        "dataset": {"type": ["string", "null"]},
        "dataset_root": _STR,
    },
    "err": {"type": _STR, "message": _STR, "where": _STR},
    # Explicit collective calls: [name, start, end, clock] each (hooks before the clock wrote three).
    "c": {"c": {"type": "array", "items": {"type": "array", "items": {"type": ["string", "number"]}}}},
    # The loop thread's stack-sample summary (analyse._stacks re-checks every value it uses).
    "stk": {
        "interval": _NUM,
        "tid": _OPT_INT,
        "n": _INT,
        "where": _OBJ,
        "top": {"type": "array", "items": {"type": "array"}},
        "wchan": _OBJ,
        "state": _OBJ,
    },
    "model": {
        "param_devices": _OBJ,
        "conv_weights": _OPT_INT,
        "channels_last_weights": _OPT_INT,
        "threads": _OPT_INT,
        "cudnn_benchmark": _OPT_BOOL,
    },
    "final": {
        "autocast": {
            "type": ["object", "null"],
            "properties": {"device": _STR, "dtype": _STR, "enabled": _BOOL},
        },
        "collectives": _OBJ,
        "ddp": {"type": "array", "items": _OBJ},
        "threads": _OPT_INT,
        "cudnn_benchmark": _OPT_BOOL,
        "pil": {"type": "object", "properties": {"version": _STR, "simd": _BOOL}},
        "error": {"type": "object", "properties": {"type": _STR, "message": _STR}},
        "opt_steps": _INT,
    },
}


def record_error(rec: dict[str, Any]) -> str | None:
    """Why a record cannot be used (its first key of the wrong type), or None."""
    kind = rec.get("k")
    props = RECORD_SCHEMAS.get(kind) if isinstance(kind, str) else None
    wrong = type_errors(rec, {"type": "object", "properties": props}) if props else []
    return f"{kind} record: {wrong[0]}" if wrong else None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_lines(lines: list[str], dropped: list[str] | None = None) -> HookProcess | None:
    """One process's records; a line that is not a JSON object, or a record with a key of the wrong type, is
    skipped and counted (``bad_lines``), and the first reason of each kind is added to ``dropped``."""
    recs: list[dict[str, Any]] = []
    bad = 0
    reasons: list[str] = []
    for line in lines:
        try:
            rec = json.loads(line, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            bad += 1
            if not any(r.startswith("a line that is not JSON") for r in reasons):
                reasons.append(f"a line that is not JSON ({str(exc)[:60]})")
            continue
        why = record_error(rec) if isinstance(rec, dict) else "a line that is not a JSON object"
        if why is None:
            recs.append(rec)
        else:
            bad += 1
            if why not in reasons:
                reasons.append(why)
    if dropped is not None:
        dropped += reasons
    proc = next((r for r in recs if r.get("k") == "proc"), None)
    if proc is None:
        return None
    batches: list[tuple[float, float, int]] = []
    iters, ends, errors = [], [], []
    model = final = stacks = None
    colls: list[tuple[str, float, float]] = []
    clocks: dict[str, int] = {}
    n_sum, wait_sum, gap_sum = 0, 0.0, 0.0
    for r in recs:
        k = r.get("k")
        if k == "b":
            t = [float(x) for x in r.get("t", [])]
            it = int(r.get("it", 0))
            batches += [(t[i], t[i + 1], it) for i in range(0, len(t) - 1, 2)]
        elif k == "it":
            iters.append(r)
        elif k == "e":
            if "t" in r:
                ends.append(float(r["t"]))
            else:
                bad += 1
        elif k == "err":
            errors.append(r)
        elif k == "model":
            model = r
        elif k == "final":
            final = r
        elif k == "c":
            for c in r.get("c", []):
                # The schema checked the types; an entry of the wrong length is dropped alone.
                if (
                    len(c) in (3, 4)
                    and isinstance(c[0], str)
                    and not isinstance(c[1], str)
                    and not isinstance(c[2], str)
                    and (len(c) == 3 or c[3] in CLOCKS)
                ):
                    colls.append((c[0][:40], float(c[1]), float(c[2])))
                    # Three values: a hook from before the clock was recorded, which timed every call on the host.
                    clock = c[3] if len(c) == 4 else "host"
                    clocks[clock] = clocks.get(clock, 0) + 1
                else:
                    bad += 1
        elif k == "stk":
            stacks = r
        elif k == "sum":
            n_sum += int(r.get("n", 0))
            wait_sum += float(r.get("wait", 0.0))
            gap_sum += float(r.get("gaps", 0.0))
    if final and isinstance(final.get("error"), dict):
        errors.append({"where": "uncaught", **final["error"]})
    batches.sort()
    return HookProcess(
        pid=proc.get("pid", 0),
        ppid=proc.get("ppid", 0),
        argv=tuple(proc.get("argv") or ()),
        env=dict(proc.get("env") or {}),
        torch=proc.get("torch"),
        cpus=proc.get("cpus"),
        affinity=proc.get("affinity"),
        batches=tuple((s, e) for s, e, _ in batches),
        batch_iters=tuple(i for _, _, i in batches),
        summed=(n_sum, wait_sum, gap_sum),
        epoch_ends=tuple(sorted(ends)),
        iterators=tuple(iters),
        model=model,
        final=final,
        errors=tuple(errors),
        bad_lines=bad,
        collectives=tuple(sorted(colls, key=lambda c: c[1])),
        collective_clocks=clocks,
        stacks=stacks,
    )


def clock_counts(procs: Iterable[HookProcess]) -> dict[str, int]:
    """How many collective calls the processes had timed each way (CLOCKS: on the GPU, by the host clock, by
    their launch only)."""
    out = dict.fromkeys(CLOCKS, 0)
    for p in procs:
        for clock, n in p.collective_clocks.items():
            out[clock] += n
    return out


def read_run(run_dir: str, dropped: list[str] | None = None) -> list[HookProcess]:
    """Every process's records in ``run_dir``. The job can write into that folder, so each file goes through the
    one reader (hostcheck.infile) without following links: a FIFO, a link or an oversized file named like a
    record is not read, and what was skipped (a file, or records inside one) is added to ``dropped``."""
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "hook-*.jsonl"))):
        name = os.path.basename(path)
        try:
            text = infile.read_text(path, MAX_FILE_BYTES, follow=False, truncate=True, strict=False)
        except infile.ReadError as exc:
            if dropped is not None:
                dropped.append(f"{name}: {exc.why}")
            continue
        reasons: list[str] = []
        proc = parse_lines(text.splitlines(), reasons)
        if dropped is not None:
            dropped += [f"{name}: {r}" for r in reasons]
            if proc is None:
                dropped.append(f"{name}: no usable process record")
        if proc is not None:
            out.append(proc)
    return out


@dataclass(frozen=True)
class LoopTimes:
    """Where one process's main thread spent the training loop."""

    batches: int
    #: Seconds inside next() (the first batch left out: worker start-up).
    wait_s: float
    #: Seconds between one batch's arrival and the next request (the steps).
    step_s: float
    #: Seconds between the last batch of an epoch and the first of the next (evaluation, checkpoints).
    between_epochs_s: float
    first_batch_s: float
    #: The loop's span: from the first batch's request to the last batch's arrival.
    start: float | None
    end: float | None
    median_wait_ms: float | None
    median_step_ms: float | None
    #: Epochs after the first whose first batch waited (workers started again: persistent_workers=False).
    epoch_start_waits_s: tuple[float, ...] = ()

    @property
    def wait_share(self) -> float | None:
        busy = self.wait_s + self.step_s
        return self.wait_s / busy if busy > 0 else None


def _crossed(p: HookProcess, prev_end: float, start: float) -> bool:
    """An epoch ended between the two batches: the gap between them is not a step."""
    j = bisect.bisect_left(p.epoch_ends, prev_end)
    return j < len(p.epoch_ends) and p.epoch_ends[j] <= start


def step_spans(p: HookProcess) -> list[tuple[float, float]]:
    """The steps of one process (a batch's arrival to the next request), as :func:`loop_times` counts them."""
    b = p.batches
    out = []
    for i in range(1, len(b)):
        prev_end, start = b[i - 1][1], b[i][0]
        if start >= prev_end and not _crossed(p, prev_end, start):
            out.append((prev_end, start))
    return out


def loop_times(p: HookProcess) -> LoopTimes:
    """Wait and step times of one process: batches in time order, whichever iterator they came from."""
    b = p.batches
    if not b:
        n, w, g = p.summed
        return LoopTimes(n, w, g, 0.0, 0.0, None, None, None, None)
    first = b[0][1] - b[0][0]
    waits, steps = [], []
    between = 0.0
    epoch_starts: list[float] = []
    seen_iters = {p.batch_iters[0]} if p.batch_iters else set()
    for i in range(1, len(b)):
        prev_end, (start, end) = b[i - 1][1], b[i]
        gap = start - prev_end
        crossed = _crossed(p, prev_end, start)
        it = p.batch_iters[i] if i < len(p.batch_iters) else None
        new_iter = it is not None and it not in seen_iters
        if it is not None:
            seen_iters.add(it)
        if crossed or gap < 0:
            between += max(0.0, gap)
            if crossed and new_iter:
                epoch_starts.append(end - start)
        else:
            steps.append(gap)
        waits.append(end - start)
    n_sum, w_sum, g_sum = p.summed
    return LoopTimes(
        batches=len(b) + n_sum,
        wait_s=sum(waits) + w_sum,
        step_s=sum(steps) + g_sum,
        between_epochs_s=between,
        first_batch_s=first,
        start=b[0][0],
        end=b[-1][1],
        median_wait_ms=statistics.median(waits) * 1000 if waits else None,
        median_step_ms=statistics.median(steps) * 1000 if steps else None,
        epoch_start_waits_s=tuple(epoch_starts),
    )


def wait_in_bins(p: HookProcess, t0: float, width: float, n: int) -> list[float]:
    """Seconds of data wait inside each of ``n`` bins of ``width`` seconds from ``t0``."""
    out = [0.0] * n
    for start, end in p.batches:
        a, z = (start - t0) / width, (end - t0) / width  # in bins
        a, z = max(a, 0.0), min(z, float(n))
        k = int(a)
        while k < n and k < z:  # one step per bin the interval touches: ends however the floats round
            out[k] += (min(z, k + 1) - max(a, k)) * width
            k += 1
    return out
