"""One progress line on a terminal while a run works: the step, the time so far and the estimate, redrawn in place
on standard error, as apt, pip and rsync show theirs.

Shown only to a person: standard error is a terminal, TERM is not "dumb", the run's output is not for a program
(``--json``, ``--summary``) and it does not run under Slurm (a prolog, an epilog or a HealthCheckProgram with
``--slurm-drain``: any SLURM_* variable). Anywhere else this is a no-op, so a log or a pipe gets nothing of it.
A run shorter than DELAY_S never shows the line (a passive run ends in a fraction of a second); when the run ends
the line is erased, so what comes after starts on a clean line.

Standard library only, by choice: hostcheck's runtime depends on nothing (pyproject: dependencies = []) and runs on
nodes without an index; a progress library (tqdm, rich) would be one more package to install, or an optional extra
whose absence changes what a person sees, for what is a carriage return, an erase-line escape (ECMA-48 EL, CSI K)
and a thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable

from hostcheck.registry import Thread

#: Nothing is drawn before the run has taken this long: a quick run stays quiet.
DELAY_S = 1.0
#: How often the line is redrawn (the elapsed time moves on).
INTERVAL_S = 0.5
#: Carriage return, then ECMA-48's Erase in Line (CSI K): the line is rewritten in place.
_ERASE = "\r\x1b[K"


def wanted(
    stream: Any, machine_output: bool = False, slurm: bool = False, environ: Mapping | None = None
) -> bool:
    """Whether a progress line belongs on ``stream``: a terminal, a person reading it, no Slurm around."""
    env = os.environ if environ is None else environ
    if machine_output or slurm or env.get("TERM") == "dumb":
        return False
    if any(
        k.startswith("SLURM_") for k in env
    ):  # a prolog/epilog (slurmd sets SLURM_JOB_ID, ...) or a job step
        return False
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, OSError, ValueError):  # closed or not a file
        return False


def duration(seconds: float) -> str:
    """42 s, 3 min 05 s, 1 h 02 min."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """The line. ``begin``/``end`` name the steps running now (several at once: the torch probe beside the others),
    ``estimate`` sets the expected total (None: unknown), ``note`` what is done of how many. Use as a context
    manager; outside a terminal use :func:`progress`, which gives the silent :class:`Quiet` instead."""

    def __init__(
        self,
        stream: Any,
        label: str,
        estimate_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
        limit_s: float | None = None,
    ) -> None:
        self.stream, self.label, self.clock = stream, label, clock
        self.estimate_s, self.limit_s = estimate_s, limit_s
        self.started = clock()
        self.steps: list[str] = []
        self.count = ""
        self.width = width
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Thread | None = None
        self._drawn = False

    def __enter__(self) -> Progress:
        # No thread to be had (or no memory for one): no line, the run goes on.
        with contextlib.suppress(RuntimeError, MemoryError):
            self._thread = Thread(target=self._run, daemon=True, name="hostcheck-progress")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(2.0)
        with self._lock:
            if self._drawn:
                self._write(_ERASE)
                self._drawn = False

    def begin(self, step: str) -> None:
        with self._lock:
            self.steps.append(step)

    def end(self, step: str) -> None:
        with self._lock:
            if step in self.steps:
                self.steps.remove(step)

    def note(self, done: int, total: int) -> None:
        with self._lock:
            self.count = f"{done}/{total}"

    def print(self, text: str) -> None:
        """A line of its own above the progress line (a log line): the progress line is redrawn after it."""
        with self._lock:
            self._write((_ERASE if self._drawn else "") + text + "\n")
            self._drawn = False

    def estimate(self, total_s: float | None) -> None:
        with self._lock:
            self.estimate_s = total_s

    def line(self) -> str:
        """What the line says now: ``hostcheck: torch probe, DCGM  [3/10]  12 s of about 40 s``."""
        elapsed = self.clock() - self.started
        when = duration(elapsed)
        if self.estimate_s:
            left = self.estimate_s - elapsed
            when += f" of about {duration(self.estimate_s)}" if left > 0 else ", longer than estimated"
        elif self.limit_s:
            when += f" (ends by {duration(self.limit_s)} at the latest)"
        parts = [f"{self.label}: {', '.join(self.steps) or 'working'}"]
        if self.count:
            parts.append(f"[{self.count}]")
        parts.append(when)
        text = "  ".join(parts)
        width = self.width or _columns(self.stream)
        # One character short of the width: a line that fills the terminal would wrap and leave a copy behind.
        return text if len(text) < width else text[: max(10, width - 4)] + "..."

    def _run(self) -> None:
        if self._stop.wait(DELAY_S):
            return
        while not self._stop.is_set():
            with self._lock:
                self._write(_ERASE + self.line())
                self._drawn = True
            self._stop.wait(INTERVAL_S)

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # the terminal went away: the run goes on
            self.stream.write(text)
            self.stream.flush()


class Quiet:
    """Progress where no person reads it: every call does nothing but :meth:`print`, which writes its line."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream

    def print(self, text: str) -> None:
        if self.stream is not None:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write(text + "\n")
                self.stream.flush()

    def __enter__(self) -> Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def begin(self, step: str) -> None: ...

    def end(self, step: str) -> None: ...

    def note(self, done: int, total: int) -> None: ...

    def estimate(self, total_s: float | None) -> None: ...


def progress(
    label: str,
    stream: Any,
    machine_output: bool = False,
    slurm: bool = False,
    estimate_s: float | None = None,
    environ: Mapping | None = None,
    limit_s: float | None = None,
) -> Progress | Quiet:
    """A progress line on ``stream`` when :func:`wanted`, else a silent stand-in with the same methods.
    ``estimate_s``: what the run is expected to take; ``limit_s``: what it may take at most (a deadline)."""
    if wanted(stream, machine_output, slurm, environ):
        return Progress(stream, label, estimate_s, limit_s=limit_s)
    return Quiet(stream)


def _columns(stream: Any) -> int:
    """The terminal's width: COLUMNS, else its size, else 80 (a pty nobody sized says 0)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return 80
