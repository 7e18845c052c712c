"""A child's output files (hostcheck.child.launch.run_children writes a child's stdout and stderr to temporary
files), read back bounded: a child that floods them is stopped at OUTPUT_CAP, and only its record lines and the
tail of its stderr come back into memory, never the flood itself."""

from __future__ import annotations

import os
from typing import Any

#: What a child may write to its stdout or its stderr file before it is stopped (NCCL_DEBUG=INFO on 8 GPUs writes
#: a few MiB over a run): a child that floods it cannot fill the disk.
OUTPUT_CAP = 64 << 20
#: What is read back of a child's output: its record lines, at most this much, and the last TAIL_BYTES of stderr;
#: never the flood itself.
RECORDS_CAP = 8 << 20
TAIL_BYTES = 64 << 10


def read_records(f, marker: str) -> str:
    """The record lines (those starting with ``marker``) of a child's stdout file, at most RECORDS_CAP bytes of
    them: all that is read of it, without reading a flood into memory."""
    f.flush()
    f.seek(0)
    head = marker.encode()
    kept, size, whole = [], 0, True
    while line := f.readline(RECORDS_CAP + 1):
        starts = whole and line.startswith(head)
        whole = line.endswith(b"\n")  # a line longer than the cap goes on in the next piece: not a record
        if starts and whole and size + len(line) <= RECORDS_CAP:
            kept.append(line)
            size += len(line)
    return b"".join(kept).decode("utf-8", "replace")


def read_tail(f) -> str:
    """The last TAIL_BYTES of a child's stderr file."""
    f.flush()
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - TAIL_BYTES))
    return f.read().decode("utf-8", "replace")


def written(files: tuple[Any, Any]) -> int:
    """The larger of what a child wrote to its stdout and stderr files so far."""
    try:
        return max(os.fstat(f.fileno()).st_size for f in files)
    except (OSError, ValueError):
        return 0
