"""Counters kept between runs, so a check can say "rising since the last run".

One small JSON file (``/var/lib/hostcheck/state.json`` by default; ``--state-file`` or ``[hardware] state_file``)
holds the last value of every counter, grouped by namespace (``edac``, ``aer``, ``pcie_replay``, ``dstate``,
``nvlink``, ``rdma``), and when each namespace was last read (``read_at``): a run that reads only some namespaces
keeps the others' values and their times, so a rate per unit of time is never taken over the wrong interval.
Anyone with root could have put anything there, so it is read through the one bounded reader
(:func:`hostcheck.gather.facts.read_fact`: no FIFO, no device, no endless file) and written
through the one atomic writer (:func:`hostcheck.outfile.write_atomic`), with its folder locked and the file read
again first: a file that is not hostcheck's own (not JSON, another schema, a FIFO, a link: whatever it could not
use) is never overwritten, and neither is one that became such since it was read. A state that cannot be read is
no history (the run says why); one that cannot be written is kept as an error for system.E010 to report, never a
crash. A counter that went down (a reboot, a driver reload) starts a new baseline.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from dataclasses import dataclass, field
from typing import Any

from hostcheck.gather.base import ERROR, Unavailable
from hostcheck.gather.facts import read_fact
from hostcheck.outfile import locked, write_atomic

DEFAULT_STATE_FILE = "/var/lib/hostcheck/state.json"
SCHEMA = 1
#: Counters per namespace kept at most: a node has tens of devices, not thousands.
MAX_KEYS = 4096

FIRST, SAME, RISING, RESET = "first", "same", "rising", "reset"


@dataclass(frozen=True)
class Trend:
    """One counter against its last recorded value."""

    kind: str  # FIRST (no history), SAME, RISING, RESET (it went down: a new baseline)
    value: int
    previous: int | None = None

    @property
    def delta(self) -> int:
        return self.value - self.previous if self.kind == RISING and self.previous is not None else 0


@dataclass(frozen=True)
class CounterState:
    """The last run's counters (as read) and what happened to this run's."""

    path: str = DEFAULT_STATE_FILE
    #: namespace -> key -> value, from the last run; {} on a first run.
    previous: dict[str, dict[str, int]] = field(default_factory=dict)
    #: When the last run took them (seconds since the epoch), or None.
    previous_at: float | None = None
    #: Why the state file could not be used (it was then ignored: a new baseline), or None.
    read_error: Unavailable | None = None
    #: Why this run's counters could not be kept, or None.
    write_error: Unavailable | None = None
    #: True when there was no state file at all.
    first_run: bool = False
    #: namespace -> when the last run read it (seconds since the epoch); absent in files written before it was kept.
    read_at: dict[str, float] = field(default_factory=dict)

    def trend(self, namespace: str, key: str, value: int) -> Trend:
        prev = self.previous.get(namespace, {}).get(key)
        if prev is None:
            return Trend(FIRST, value)
        if value < prev:
            return Trend(RESET, value, prev)
        return Trend(RISING if value > prev else SAME, value, prev)

    def elapsed_s(self, now: float, namespace: str | None = None) -> float | None:
        """Seconds since the last run (``namespace``: since that namespace was last read; None when the file does
        not say, never a guess)."""
        at = self.previous_at if namespace is None else self.read_at.get(namespace)
        return None if at is None else max(0.0, now - at)


def _counters(raw: Any) -> dict[str, dict[str, int]]:
    """The namespaces of a parsed state, with every value that is not a sane counter dropped."""
    out: dict[str, dict[str, int]] = {}
    if not isinstance(raw, dict):
        return out
    for ns, values in list(raw.items())[:64]:
        if not isinstance(ns, str) or not isinstance(values, dict):
            continue
        good = {
            k: v
            for k, v in list(values.items())[:MAX_KEYS]
            if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63
        }
        out[ns] = good
    return out


def load_state(path: str) -> CounterState:
    """The last run's counters from ``path`` (the one load of a run)."""
    return _read(path)


def _read(path: str) -> CounterState:
    text = read_fact(path)
    if text is None:
        return CounterState(path=path, first_run=True)
    if isinstance(text, Unavailable):
        return CounterState(path=path, read_error=text)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return CounterState(path=path, read_error=Unavailable(ERROR, f"{path} is not JSON: {str(exc)[:80]}"))
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return CounterState(path=path, read_error=Unavailable(ERROR, f"{path} is not a hostcheck state file"))
    at = doc.get("taken_at")
    raw_read = doc.get("read_at")
    read_at = {
        ns: float(t)
        for ns, t in (list(raw_read.items())[:64] if isinstance(raw_read, dict) else ())
        if isinstance(ns, str) and _time(t)
    }
    return CounterState(
        path=path,
        previous=_counters(doc.get("counters")),
        previous_at=at if _time(at) else None,
        read_at=read_at,
    )


def _time(t: Any) -> bool:
    return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0


def not_ours(path: str) -> str | None:
    """Why the file at ``path`` is not a state file hostcheck may replace (a link, not a regular file, not its
    JSON), or None: absent, or one it wrote."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be looked at ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link (hostcheck keeps its state in a file of its own)"
    loaded = _read(path)
    return loaded.read_error.reason if loaded.read_error is not None else None


def save_state(state: CounterState, current: dict[str, dict[str, int]], now: float) -> CounterState:
    """Keep ``current`` (the namespaces this run read; the others keep their last values) and return the state
    with the write's error, if any. Only hostcheck's own file is replaced: one it could not use when the run began,
    or that is not its own now (read again with the folder locked), is left as it is and the error says why."""
    merged = {ns: dict(v) for ns, v in state.previous.items()}
    merged.update({ns: dict(v) for ns, v in current.items()})
    read_at = {ns: t for ns, t in state.read_at.items() if ns in merged}
    read_at.update(dict.fromkeys(current, now))
    doc = {"schema": SCHEMA, "taken_at": now, "counters": merged, "read_at": read_at}

    def refused(why: str) -> CounterState:
        return dataclasses.replace(
            state, write_error=Unavailable(ERROR, f"{state.path} left as it is: {why}")
        )

    if state.read_error is not None:
        return refused(state.read_error.reason)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(state.path)), mode=0o755, exist_ok=True)
        with locked(state.path):
            why = not_ours(state.path)
            if why is not None:
                return refused(why)
            write_atomic(state.path, json.dumps(doc, sort_keys=True, indent=1) + "\n", keep=True)
    except OSError as exc:
        return dataclasses.replace(
            state, write_error=Unavailable(ERROR, f"{state.path} not written: {exc.strerror or exc}")
        )
    return state
