"""DCGM's profiling fields while the job runs: ``dcgmi dmon`` beside it, where a DCGM host engine answers.

The second GPU signal (docs/job.md): NVML's GPM metrics come first, then these, then NVML utilisation. ``dcgmi
dmon -e 1001,1002,1003 -d MS`` watches DCGM_FI_PROF_GR_ENGINE_ACTIVE (1001), DCGM_FI_PROF_SM_ACTIVE (1002) and
DCGM_FI_PROF_SM_OCCUPANCY (1003), ratios 0 to 1 (dcgmlib/dcgm_fields.h in NVIDIA/DCGM), and prints one row per
GPU every MS milliseconds. Its format (dcgmi/DeviceMonitor.cpp in NVIDIA/DCGM): a header ``#Entity`` followed
by each field's short name (dcgmlib/src/dcgm_fields.cpp: GRACT, SMACT, SMOCC), a units line ``ID``, then rows
``GPU 0`` followed by each value with three decimals or ``N/A``; the header comes again every 14 rows. Errors
(``Error setting watches. Result: -36: ...``, ``Error: unable to establish a connection to the specified host``
when no host engine runs) are lines that start with ``Error``.

It starts as every tool does (hostcheck.gather.base.Tool, through the one launcher): a session of its own, killed
with the run. Its output is a pipe read without blocking, at most :data:`MAX_OUTPUT` bytes in all (a dmon that
floods it blocks on the full pipe; one past the cap is stopped); lines longer than :data:`MAX_LINE` are dropped. The parser is a
pure function of the text. Nothing here raises: a dmon that is absent, fails, hangs or prints garbage gives no
rows and a sentence saying why, and the caller falls back.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hostcheck.child.launch import describe_rc
from hostcheck.gather.base import Tool, parse_int, parse_number
from hostcheck.gather.dcgm import find_dcgmi

#: DCGM_FI_PROF_GR_ENGINE_ACTIVE, DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_PROF_SM_OCCUPANCY (dcgmlib/dcgm_fields.h).
GR_ACTIVE, SM_ACTIVE, SM_OCCUPANCY = 1001, 1002, 1003
FIELDS = (GR_ACTIVE, SM_ACTIVE, SM_OCCUPANCY)
#: dmon's column names for them (dcgmlib/src/dcgm_fields.cpp, the fields' short names).
SHORT_NAMES = {"GRACT": GR_ACTIVE, "SMACT": SM_ACTIVE, "SMOCC": SM_OCCUPANCY}
#: Bytes of dmon output read in all (about 60 bytes a GPU a row: hours of 8 GPUs at 2 Hz); then it is stopped.
MAX_OUTPUT = 4 << 20
#: A longer line is not dmon's: dropped.
MAX_LINE = 4096
#: DCGM samples no faster than this (dmon's -d is in milliseconds).
MIN_DELAY_MS = 100


@dataclass(frozen=True)
class DcgmRow:
    """One GPU's row of dmon: the fields as percent (DCGM gives ratios), None for N/A or a value out of 0-1."""

    gpu: int
    gr_active_pct: float | None = None
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None


def _pct(text: str) -> float | None:
    v = parse_number(text)  # None: N/A, garbage
    if v is None or not 0.0 <= v <= 1.0:
        return None
    return round(100.0 * v, 3)


class DmonParser:
    """dmon's output fed in pieces as it comes; :meth:`feed` returns the complete rows in it. Rows before a
    header, rows of other entities (MIG instances: ``GPU-I``), rows with the wrong number of columns and lines
    over :data:`MAX_LINE` are dropped; ``error`` keeps the last ``Error`` line."""

    def __init__(self) -> None:
        self.columns: list[int | None] | None = None
        self.error: str | None = None
        self._partial = ""

    def feed(self, text: str) -> list[DcgmRow]:
        text = self._partial + text
        lines = text.split("\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            self._partial = ""
        rows = []
        for line in lines:
            if len(line) <= MAX_LINE:
                row = self._line(line.strip())
                if row is not None:
                    rows.append(row)
        return rows

    def _line(self, s: str) -> DcgmRow | None:
        if s.startswith("#Entity"):
            self.columns = [SHORT_NAMES.get(name) for name in s.split()[1:]]
            return None
        if s.lower().startswith("error"):
            self.error = s[:300]
            return None
        f = s.split()
        gpu = parse_int(f[1], digits=4) if len(f) > 1 else None
        if self.columns is None or len(f) != 2 + len(self.columns) or f[0] != "GPU" or gpu is None:
            return None
        vals = {fid: _pct(v) for fid, v in zip(self.columns, f[2:]) if fid is not None}
        return DcgmRow(gpu, vals.get(GR_ACTIVE), vals.get(SM_ACTIVE), vals.get(SM_OCCUPANCY))


def parse_dmon(text: str) -> tuple[list[DcgmRow], str | None]:
    """The rows of a whole dmon output, and its last error line."""
    p = DmonParser()
    rows = p.feed(text + "\n")
    return rows, p.error


class DcgmSampler:
    """``dcgmi dmon`` running beside the job; :meth:`poll` returns the rows printed since the last call.

    ``error`` says why there are no rows (dmon failed, ended, or printed too much); ``absent`` is True where
    there is no ``dcgmi`` at all (nothing to say: most nodes have no DCGM)."""

    def __init__(self, interval_s: float, dcgmi: str | None = None) -> None:
        self.error: str | None = None
        self.absent = False
        self.rows = 0
        #: Bytes dmon printed so far.
        self.read_bytes = 0
        self._parser = DmonParser()
        self._tool: Tool | None = None
        path = find_dcgmi(dcgmi)
        if path is None:
            self.absent = True
            self.error = "dcgmi not found (no DCGM)"
            return
        ms = max(MIN_DELAY_MS, round(interval_s * 1000))
        argv = [path, "dmon", "-e", ",".join(str(f) for f in FIELDS), "-d", str(ms)]
        # Its errors are lines among its rows: one stream. Never waited on: read() takes what is there.
        tool = Tool(argv, MAX_OUTPUT, merge=True)
        if tool.error is not None:
            self.error = f"dcgmi could not start: {tool.error.reason}"
            return
        self._tool = tool

    def poll(self) -> list[DcgmRow]:
        """The complete rows dmon printed since the last call; sets ``error`` when it failed or ended."""
        tool = self._tool
        if tool is None:
            return []
        closed = tool.read(0)
        self.read_bytes = tool.total
        rows = self._parser.feed(tool.take().decode("utf-8", "replace"))
        self.rows += len(rows)
        if self._parser.error:
            self.error = f"dcgmi dmon: {self._parser.error}"
        if tool.over:
            self.error = f"dcgmi dmon printed more than {MAX_OUTPUT} bytes: stopped"
            self._stop()
        elif closed:
            assert tool.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                tool.proc.wait(0.5)  # closed its output: exiting; its own status, not our SIGKILL
            rc = tool.proc.returncode
            self._stop()
            if not self.error:
                said = f"dcgmi dmon ended ({describe_rc(rc)})" if rc is not None else "dcgmi dmon ended"
                self.error = said + ("" if self.rows else " without a row")
        return rows

    def _stop(self) -> None:
        if self._tool is not None:
            self._tool.close()  # kills its group and reaps it
        self._tool = None

    def close(self) -> None:
        """Stop dmon (its whole group) and say why there were no rows, if there were none."""
        self._stop()
        if not self.rows and not self.error:
            self.error = "dcgmi dmon gave no row (no answer from the host engine)"


# --- from rows to the report's figures (hostcheck.job.analyse) --------------------------------------------------


def dcgm_by_gpu(
    samples: Sequence[tuple[float, DcgmRow]], s0: float, s1: float, gpus: set[int]
) -> dict[int, list[DcgmRow]]:
    """The rows read between ``s0`` and ``s1`` (all of them when none was), by GPU. DCGM's GPU ids are taken as
    NVML's indices (they are, unless GPUs are hidden from the host engine); where NVML named GPUs (``gpus``),
    only those."""
    rows = [r for t, r in samples if s0 <= t <= s1] or [r for _t, r in samples]
    out: dict[int, list[DcgmRow]] = {}
    for r in rows:
        if not gpus or r.gpu in gpus:
            out.setdefault(r.gpu, []).append(r)
    return out


def dcgm_means(rows: Sequence[DcgmRow]) -> dict[str, Any]:
    """One GPU's figures for the report: its rows and their means (None without a value)."""

    def mean(attr: str) -> float | None:
        vals = [getattr(r, attr) for r in rows if getattr(r, attr) is not None]
        return round(sum(vals) / len(vals), 1) if vals else None

    return {
        "dcgm_samples": len(rows),
        "dcgm_sm_active_mean": mean("sm_active_pct"),
        "dcgm_sm_occupancy_mean": mean("sm_occupancy_pct"),
        "dcgm_gr_active_mean": mean("gr_active_pct"),
    }


def dcgm_line(samples: Sequence[tuple[float, DcgmRow]], gpus: set[int], t0: float) -> list[list[float]]:
    """The timeline's GPU line from DCGM: [seconds since ``t0``, mean SM activity of ``gpus`` (all: empty)]."""
    by_t: dict[float, list[float]] = {}
    for t, r in samples:
        if r.sm_active_pct is not None and (not gpus or r.gpu in gpus):
            by_t.setdefault(t, []).append(r.sm_active_pct)
    return [[round(t - t0, 3), round(sum(v) / len(v), 1)] for t, v in sorted(by_t.items())]
