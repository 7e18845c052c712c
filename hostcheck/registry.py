"""Checks registry: stable ids, statuses, frozen results and a runner with a per-check timeout.

A check is a small pure function ``fn(snapshot) -> Outcome`` registered with :func:`check`. It judges
gathered data only; gathering lives in :mod:`hostcheck.gather`, scoring in :mod:`hostcheck.score`. This module
imports nothing of hostcheck: the checks import it, never the reverse (hostcheck.checks.all_checks).

Every thread hostcheck starts is a :class:`Thread` (or :class:`Timer`) of this module, the runner's own first:
their start never waits for good on a thread that died before it ran (see :class:`Thread`).
"""

from __future__ import annotations

import enum
import os
import queue
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Callable

CATEGORIES = ("system", "gpu", "nvlink", "fabric", "torch", "tuning", "workload", "baseline")


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    @property
    def severity(self) -> int:
        """0 pass/skip, 1 warn, 2 fail/error (errors count as failures: the node could not be verified)."""
        return _SEVERITY[self]


_SEVERITY = {Status.PASS: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 2}
#: Least to most severe, for folding several statuses into one: within a severity an error (could not verify)
#: outranks a fail and a pass outranks a skip (something was judged).
_ORDER = (Status.SKIP, Status.PASS, Status.WARN, Status.FAIL, Status.ERROR)


def worst(statuses: Iterable[Status | str]) -> Status:
    """The most severe status (error > fail > warn > pass > skip); skip when empty."""
    return max((Status(s) for s in statuses), key=_ORDER.index, default=Status.SKIP)


@dataclass(frozen=True)
class Outcome:
    """What a judging function returns; the runner adds the check's identity to make a Result."""

    status: Status
    message: str
    value: Any = None
    unit: str | None = None
    expected: Any = None
    hint: str | None = None
    details: tuple[str, ...] = ()
    #: The finding in a few words for a Slurm drain reason or a one-line summary: the device, port or GPU and the
    #: key number ("mlx5_3 port 1 at 200 Gb/s of 400"); None: the message's start stands for it.
    brief: str | None = None


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and the noun in the form that count takes: "1 NIC", "2 NICs", "0 NICs" (``many``: the plural when it
    is not the noun and an s, "entries"). The one way a message counts something."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"


def passed(message: str, **kw: Any) -> Outcome:
    return Outcome(Status.PASS, message, **kw)


def warned(message: str, **kw: Any) -> Outcome:
    return Outcome(Status.WARN, message, **kw)


def failed(message: str, **kw: Any) -> Outcome:
    return Outcome(Status.FAIL, message, **kw)


def skipped(message: str, **kw: Any) -> Outcome:
    return Outcome(Status.SKIP, message, **kw)


def errored(message: str, **kw: Any) -> Outcome:
    return Outcome(Status.ERROR, message, **kw)


@dataclass(frozen=True)
class Result:
    id: str
    title: str
    category: str
    weight: float
    status: Status
    message: str
    value: Any = None
    unit: str | None = None
    expected: Any = None
    hint: str | None = None
    details: tuple[str, ...] = ()
    duration_s: float = 0.0
    brief: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "category": self.category,
            "weight": self.weight,
            "status": self.status.value,
            "message": self.message,
            "value": _jsonable(self.value),
            "unit": self.unit,
            "expected": _jsonable(self.expected),
            "hint": self.hint,
            "details": list(self.details),
            "duration_s": round(self.duration_s, 4),
            "brief": self.brief,
        }


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    category: str
    weight: float
    fn: Callable[[Any], Outcome] = field(compare=False, repr=False)
    #: Gatherers this check reads ("system", "nvml", "torch", "tuning", "facts"); only those run.
    needs: frozenset[str] = frozenset()
    timeout_s: float | None = None
    #: Workload checks run GPU jobs; ``--quick`` leaves them out.
    workload: bool = False


REGISTRY: dict[str, Check] = {}


def check(
    id: str,
    title: str,
    *,
    weight: float = 1.0,
    needs: tuple[str, ...] = (),
    timeout_s: float | None = None,
) -> Callable[[Callable[[Any], Outcome]], Callable[[Any], Outcome]]:
    """Register ``fn`` as check ``id`` (``<category>.E<nnn>``, stable forever once released)."""
    category = id.split(".", 1)[0]
    if category not in CATEGORIES:
        raise ValueError(f"check id {id!r}: category must be one of {CATEGORIES}")

    def deco(fn: Callable[[Any], Outcome]) -> Callable[[Any], Outcome]:
        if id in REGISTRY:
            raise ValueError(f"duplicate check id {id}")
        REGISTRY[id] = Check(
            id=id,
            title=title,
            category=category,
            weight=weight,
            fn=fn,
            needs=frozenset(needs),
            timeout_s=timeout_s,
            workload=category == "workload",
        )
        return fn

    return deco


def registered() -> list[Check]:
    """Every registered check in report order (import hostcheck.checks first: it registers the built-in ones)."""
    return sorted(REGISTRY.values(), key=lambda c: (CATEGORIES.index(c.category), c.id))


def select(
    checks: list[Check], only: list[str] | None = None, skip: list[str] | None = None, quick: bool = False
) -> list[Check]:
    """Filter by id or category (``gpu``, ``gpu.E003``), either in any case; unknown selectors raise ValueError."""

    def matches(c: Check, sel: str) -> bool:
        return sel.lower() in (c.category, c.id.lower())

    for sel in (only or []) + (skip or []):
        if sel.lower() not in CATEGORIES and not any(matches(c, sel) for c in checks):
            raise ValueError(f"unknown check id or category: {sel!r} (see --list)")
    out = [c for c in checks if not (quick and c.workload)]
    if only:
        out = [c for c in out if any(matches(c, s) for s in only)]
    if skip:
        out = [c for c in out if not any(matches(c, s) for s in skip)]
    return out


def _call_into(fn: Callable[[], Any], box: dict[str, Any]) -> None:
    """``fn()`` into ``box``: its value, or its exception and traceback (a thread must never die silently)."""
    try:
        box["value"] = fn()
    except BaseException as exc:
        box["exc"] = exc
        try:
            box["tb"] = traceback.format_exc()
        except BaseException:  # no memory left even to format it (ulimit -v): the exception is enough
            box["tb"] = ""


def _unboxed(box: dict[str, Any]) -> tuple[bool, Any]:
    return True, box["exc"] if "exc" in box else box.get("value")


# --- threads ------------------------------------------------------------------------------------------------

#: Where the kernel lists this process's threads (one folder per thread id, gone once the thread has ended).
TASKS_DIR = "/proc/self/task"
#: How often a start that waits on its new thread looks whether the thread is still there.
START_POLL_S = 0.05
#: A start that cannot tell its new thread apart (TASKS_DIR unreadable: no descriptor or memory left; or another
#: thread started beside it outside this module) gives up on it after this long.
START_BLIND_S = 30.0
#: Starts one at a time, so that a start tells its new thread from the others by the id that appeared.
_START_LOCK = threading.Lock()
ENDED_BEFORE_IT_RAN = "can't start new thread: it ended before it ran (no memory left for it?)"


class ThreadStartError(RuntimeError):
    """No thread could be started: none to be had (``can't start new thread``), or it ended before it ran."""


def _thread_ids() -> set[str] | None:
    try:
        return set(os.listdir(TASKS_DIR))
    except (OSError, MemoryError):
        return None


class _Started(threading.Event):
    """A thread's "it runs" event (``Thread._started``) whose wait without a timeout (Thread.start's) ends with
    ThreadStartError once the new thread is gone without having set it."""

    def __init__(self) -> None:
        super().__init__()
        #: This process's thread ids just before the start (None: not known).
        self.before: set[str] | None = None

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            return super().wait(timeout)
        now = _thread_ids()
        new = now - self.before if now is not None and self.before is not None else None
        blind_until = time.monotonic() + START_BLIND_S
        while not self._waited():
            try:
                if new is not None:
                    new = {t for t in new if os.path.exists(f"{TASKS_DIR}/{t}")}
            except MemoryError:
                new = None
            if new is not None and not new:
                raise ThreadStartError(ENDED_BEFORE_IT_RAN)
            if (new is None or len(new) > 1) and time.monotonic() >= blind_until:
                raise ThreadStartError(
                    f"can't start new thread: not running {START_BLIND_S:g} s after its start"
                )
        return True

    def _waited(self) -> bool:
        """Set, within START_POLL_S."""
        try:
            return super().wait(START_POLL_S)
        except (RuntimeError, MemoryError):  # no lock to wait with ("can't allocate lock"): look, sleep, look
            if not self.is_set():
                time.sleep(START_POLL_S)
            return self.is_set()


class _BoundedStart:
    """What :class:`Thread` and :class:`Timer` add to threading's: a start that raises ThreadStartError instead
    of waiting for good.

    threading.Thread.start waits without a limit for the new thread to say that it runs. A thread that dies before
    it says so (a MemoryError in its bootstrap, which a small address-space limit, ulimit -v, brings: CPython issue
    gh-140746, open) left hostcheck waiting forever, until its caller's own timeout. Here the wait ends when the
    new thread (the id that appeared in /proc/self/task with the start) is gone."""

    _started: threading.Event

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._started = _Started()

    def start(self) -> None:
        started = self._started
        if not isinstance(started, _Started) or started.is_set():
            super().start()  # type: ignore[misc]  # threading's own answer ("can only be started once")
            return
        with _START_LOCK:
            started.before = _thread_ids()
            try:
                super().start()  # type: ignore[misc]
            except ThreadStartError:
                raise
            except RuntimeError as exc:  # pthread_create failed: "can't start new thread"
                raise ThreadStartError(str(exc)) from None
            except MemoryError:
                raise ThreadStartError("can't start new thread: no memory left") from None


class Thread(_BoundedStart, threading.Thread):
    """threading.Thread with a bounded start (:class:`_BoundedStart`): the thread class of hostcheck."""


class Timer(_BoundedStart, threading.Timer):
    """threading.Timer with a bounded start (:class:`_BoundedStart`)."""


def call_with_timeout(fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
    """Run ``fn`` in a daemon thread; return (finished, value-or-exception).

    A hung call (a stuck NVML or CUDA call) is abandoned, not killed: the daemon thread cannot keep
    the process alive at exit.
    """
    box: dict[str, Any] = {}
    try:
        t = Thread(target=_call_into, args=(fn, box), daemon=True, name="hostcheck-call")
        t.start()
    except (RuntimeError, MemoryError) as exc:  # no thread, or no memory for one (a small ulimit -v): say why
        return True, exc
    t.join(timeout_s)
    if t.is_alive():
        return False, None
    return _unboxed(box)


class SequentialCaller:
    """:func:`call_with_timeout` for many calls in a row, made one after another in one daemon thread: a run's
    checks pay for one thread start instead of one each (4 ms each on a busy 2-core machine, most of a passive
    run). A call that overruns its timeout keeps its thread, abandoned as call_with_timeout abandons one; the next
    call starts a new thread. :meth:`close` lets the last thread end."""

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue | None = None
        self._thread: Thread | None = None

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            job = inbox.get()
            if job is None:
                return
            fn, box, done = job
            _call_into(fn, box)
            done.set()

    def __call__(self, fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
        if self._inbox is None:
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            try:
                t = Thread(target=self._serve, args=(inbox,), daemon=True, name="hostcheck-checks")
                t.start()
            except (
                RuntimeError,
                MemoryError,
            ) as exc:  # no thread, or no memory for one: fn did not run, say why
                return True, exc
            self._inbox, self._thread = inbox, t
        box: dict[str, Any] = {}
        done = threading.Event()
        self._inbox.put((fn, box, done))
        if not done.wait(timeout_s):
            # That thread is stuck in fn: it ends when fn returns, if ever; the next call gets a thread of its own.
            self._inbox.put(None)
            self._inbox = self._thread = None
            return False, None
        return _unboxed(box)

    def close(self) -> None:
        """The idle thread ends now (not while the interpreter finalizes); an abandoned one stays as it is."""
        if self._inbox is not None and self._thread is not None:
            self._inbox.put(None)
            self._thread.join(1.0)
        self._inbox = self._thread = None


def run_check(
    c: Check,
    snapshot: Any,
    default_timeout_s: float = 30.0,
    call: Callable[[Callable[[], Any], float], tuple[bool, Any]] = call_with_timeout,
) -> Result:
    timeout = c.timeout_s or default_timeout_s
    start = time.monotonic()
    finished, value = call(lambda: c.fn(snapshot), timeout)
    dur = time.monotonic() - start
    if not finished:
        out = errored(
            f"check timed out after {timeout:g} s",
            hint="re-run with a longer --timeout; a hung driver call needs the node looked at",
        )
    elif isinstance(value, BaseException):
        out = errored(
            f"check raised {type(value).__name__}: {value}",
            hint="this is a hostcheck bug: report it with the --json output",
        )
    elif not isinstance(value, Outcome):
        out = errored(f"check returned {type(value).__name__}, not an Outcome")
    else:
        out = value
    return Result(
        id=c.id,
        title=c.title,
        category=c.category,
        weight=c.weight,
        status=out.status,
        message=out.message,
        value=out.value,
        unit=out.unit,
        expected=out.expected,
        hint=out.hint,
        details=tuple(out.details),
        duration_s=dur,
        brief=out.brief,
    )


def run_checks(
    checks: list[Check], snapshot: Any, default_timeout_s: float = 30.0, deadline: float | None = None
) -> list[Result]:
    """Judge every check; past ``deadline`` (time.monotonic()) the rest are cut off as errors."""
    out = []
    call = SequentialCaller()
    try:
        for c in checks:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                out.append(cut_off(c))
                continue
            timeout = c.timeout_s or default_timeout_s
            if left is None or left >= timeout:
                out.append(run_check(c, snapshot, default_timeout_s, call))
                continue
            r = run_check(replace(c, timeout_s=left), snapshot, default_timeout_s, call)
            if r.status is Status.ERROR and r.message.startswith("check timed out"):
                r = replace(cut_off(c), duration_s=r.duration_s)
            out.append(r)
    finally:
        call.close()
    return out


def cut_off(c: Check) -> Result:
    """The result of a check the run's deadline left no time for."""
    return Result(
        id=c.id,
        title=c.title,
        category=c.category,
        weight=c.weight,
        status=Status.ERROR,
        message="cut off: the run's deadline passed before this check could finish",
        hint="the node answered too slowly (a hung driver call or a stuck file system is likely); "
        "re-run with a longer --deadline to see which part is slow",
    )
